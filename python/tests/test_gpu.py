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
    assert run.device.startswith("cuda")
    out = tmp_path / "m.jsonl"
    args = [train_bin, "-c", str(cfg), "--device", "cuda", "--steps", "100", "--metrics", str(out), "--progress", "none"]
    for s in sets:
        args += ["--set", s]
    subprocess.run(args, check=True, capture_output=True)
    import json
    cli = [json.loads(line)["loss"] for line in open(out)]
    assert np.array_equal(np.array(cli), run.loss)


def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    return torch


def _trained_gpu_model(source):
    m = pa.Model.from_yaml(source / "configs" / "sine_mlp.yaml").to("cuda")
    m.train(steps=5)
    return m


def test_dlpack_from_torch(source):
    torch = _cuda_torch()
    m = _trained_gpu_model(source)
    x = torch.randn(100, 64, device="cuda")  # train.batch_size 64: two batches, the second padded
    host = m.predict(x.cpu().numpy())        # the same GPU kernels and batches, fed from host memory
    out = m.predict(x)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.device == x.device
    assert out.dtype == torch.float32 and tuple(out.shape) == (100, 1) and out.is_contiguous()
    assert torch.from_dlpack(out) is not None and torch.from_dlpack(out).is_cuda
    assert np.array_equal(out.cpu().numpy(), host)


def test_dlpack_results_are_fresh_allocations(source):
    torch = _cuda_torch()
    m = _trained_gpu_model(source)
    x = torch.randn(10, 64, device="cuda")
    first = m.predict(x)
    kept = first.clone()
    second = m.predict(x * 2)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, kept)  # the second call wrote elsewhere
    assert not torch.equal(first, second)
    for _ in range(50):              # freed with their tensors: no growth
        m.predict(x)
    torch.cuda.synchronize()


def test_dlpack_framework_neutral_result(source):
    torch = _cuda_torch()
    m = _trained_gpu_model(source)
    x = torch.randn(7, 64, device="cuda")
    raw = pa.DLPackArray(m._m.predict_cuda(x), (2, x.device.index or 0))  # what other frameworks get
    assert raw.__dlpack_device__() == (2, x.device.index or 0)
    t = torch.from_dlpack(raw)
    with pytest.raises(BufferError, match="read already"):
        raw.__dlpack__()
    assert t.is_cuda and tuple(t.shape) == (7, 1)
    assert np.array_equal(t.cpu().numpy(), m.predict(x.cpu().numpy()))


def test_dlpack_waits_for_the_producers_stream(source):
    torch = _cuda_torch()
    m = _trained_gpu_model(source)
    x = torch.randn(64, 64, device="cuda")
    expected = m.predict(x.cpu().numpy())
    side = torch.cuda.Stream()
    y = torch.zeros_like(x)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(50_000_000)  # keeps the copy below queued for a while
        y.copy_(x)
        out = m.predict(y)               # no synchronisation by the caller
    assert np.array_equal(out.cpu().numpy(), expected)


def test_dlpack_zero_rows_and_wrong_inputs(source):
    torch = _cuda_torch()
    m = _trained_gpu_model(source)
    empty = m.predict(torch.empty(0, 64, device="cuda"))
    assert isinstance(empty, torch.Tensor) and empty.is_cuda and tuple(empty.shape) == (0, 1)
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(TypeError, match="float64.*float32"):
        m.predict(x.double())
    with pytest.raises(TypeError, match="float32"):
        m.predict(x.half())
    with pytest.raises(ValueError, match="C-contiguous"):
        m.predict(torch.randn(64, 4, device="cuda").t())
    with pytest.raises(ValueError, match=r"rows of shape \(64, 1\)"):
        m.predict(torch.randn(4, 63, device="cuda"))
    assert tuple(m.predict(x).shape) == (4, 1)  # the model still works after the errors
    assert tuple(m.predict(torch.randn(3, 64, device="cuda", requires_grad=True)).shape) == (3, 1)


def test_unreadable_cuda_array_on_a_gpu_model_raises(source):
    class Unreadable:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise BufferError("nothing behind it")
    m = pa.Model.from_yaml(source / "configs" / "sine_mlp.yaml").to("cuda")
    with pytest.raises(TypeError, match="could not be read through DLPack"):
        m.predict(Unreadable())


def test_dlpack_on_another_gpu_raises(source):
    torch = _cuda_torch()
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device")
    m = _trained_gpu_model(source)
    with pytest.raises(ValueError, match="CUDA device 1"):
        m.predict(torch.randn(4, 64, device="cuda:1"))


def test_cpu_model_copies_cuda_input_to_host(source):
    torch = _cuda_torch()
    gpu = _trained_gpu_model(source)
    cpu = pa.Model.from_yaml(source / "configs" / "sine_mlp.yaml").to("cpu")
    cpu.load_state_dict(gpu.state_dict())
    x = torch.randn(5, 64, device="cuda")
    out = cpu.predict(x)
    assert isinstance(out, np.ndarray) and out.shape == (5, 1)
    assert np.array_equal(out, cpu.predict(x.cpu().numpy()))
