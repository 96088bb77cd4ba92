"""GPU parts: skipped without a CUDA device."""
import csv
import subprocess

import numpy as np
import pytest

import pureattention as pa
from conftest import has_gpu

pytestmark = pytest.mark.skipif(not has_gpu(), reason="no CUDA device")


def test_100_gpu_steps_match_the_command(source, train_bin, tmp_path):
    cfg = source / "configs" / "sine_mlp.yaml"
    sets = ["compiler.gemm=generated", "compiler.deterministic=true"]
    m = pa.Model.from_yaml(cfg, overrides=sets).to("cuda")
    run = m.train(steps=100)
    assert run.device == "cuda"
    out = tmp_path / "m.jsonl"
    args = [train_bin, "-c", str(cfg), "--device", "cuda", "--steps", "100", "--metrics", str(out), "--progress", "none"]
    for s in sets:
        args += ["--set", s]
    subprocess.run(args, check=True, capture_output=True)
    import json
    cli = [json.loads(line)["loss"] for line in open(out)]
    assert np.array_equal(np.array(cli), run.loss)


def test_dlpack_from_torch(source):
    torch = pytest.importorskip("torch")
    m = pa.Model.from_yaml(source / "configs" / "sine_mlp.yaml").to("cuda")
    m.train(steps=5)
    x = torch.randn(8, 64, device="cuda")
    out = torch.from_dlpack(m.predict(x))
    assert tuple(out.shape) == (8, 1)
    assert np.array_equal(out.numpy(), m.predict(x.cpu().numpy()))
