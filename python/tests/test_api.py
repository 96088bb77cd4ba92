"""The module's API against the commands: round trips, errors, interrupts (README "Python")."""
import csv
import json
import os
import signal
import subprocess
import threading
import time
import warnings

import numpy as np
import pytest

import pureattention as pa
from conftest import SMALL, has_gpu


def test_train_returns_metrics_as_arrays(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    seen = []
    run = m.train(steps=12, callback=lambda d: seen.append(d["step"]))
    assert isinstance(run.loss, np.ndarray) and run.loss.shape == (12,)
    assert list(run.step) == list(range(1, 13)) and seen == list(range(1, 13))
    for a in (run.val_loss, run.lr, run.step_ms):
        assert a.shape == (12,)
    # validation every train.log_every steps, NaN on the others
    assert np.isfinite(run.val_loss[[4, 9, 11]]).all() and np.isnan(run.val_loss[0])
    assert m.steps_taken == 12


def test_train_matches_the_command(small_yaml, train_bin, tmp_path):
    m = pa.Model.from_yaml(small_yaml)
    run = m.train(steps=20)
    out = tmp_path / "m.jsonl"  # JSON numbers read back as the same doubles
    subprocess.run([train_bin, "-c", str(small_yaml), "--steps", "20", "--metrics", str(out), "--progress", "none"],
                   check=True, capture_output=True)
    rows = [json.loads(line) for line in open(out)]
    assert np.array_equal([r["loss"] for r in rows], run.loss)
    assert [r["step"] for r in rows] == run.step.tolist()
    val = [np.nan if r["val_loss"] is None else r["val_loss"] for r in rows]
    assert np.array_equal(val, run.val_loss, equal_nan=True)


def test_train_continues_like_resume(small_yaml):
    whole = pa.Model.from_yaml(small_yaml).train(steps=20)
    m = pa.Model.from_yaml(small_yaml)
    a, b = m.train(steps=8), m.train(steps=12)
    assert np.array_equal(np.concatenate([a.loss, b.loss]), whole.loss)
    assert list(b.step) == list(range(9, 21))


def test_state_dict_round_trip(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    m.train(steps=10)
    sd = m.state_dict()
    assert all(v.dtype == np.float32 for v in sd.values())
    x = np.random.default_rng(0).standard_normal((37, 16)).astype(np.float32)
    before = m.predict(x)
    other = pa.Model.from_yaml(small_yaml)
    other.load_state_dict(sd)
    assert np.array_equal(other.predict(x), before)
    assert before.shape == (37, 1)


def test_save_and_load(small_yaml, tmp_path):
    m = pa.Model.from_yaml(small_yaml)
    m.train(steps=10)
    folder = m.save(tmp_path / "ck")
    assert os.path.basename(folder) == "step-00000010"
    assert os.path.exists(os.path.join(folder, "model.safetensors"))
    back = pa.Model.load(tmp_path / "ck")
    x = np.linspace(-1, 1, 16 * 5, dtype=np.float32).reshape(5, 16)
    assert np.array_equal(back.predict(x), m.predict(x))
    for k, v in m.state_dict().items():
        assert np.array_equal(back.state_dict()[k], v)
    # continuing the loaded model is continuing the run
    assert np.array_equal(back.train(steps=5).loss, m.train(steps=5).loss)


def test_predict_matches_the_command_bit_for_bit(small_yaml, predict_bin, tmp_path):
    m = pa.Model.from_yaml(small_yaml)
    m.train(steps=15)
    folder = m.save(tmp_path / "ck")
    x = np.random.default_rng(1).standard_normal((45, 16)).astype(np.float32)
    rows = tmp_path / "rows.csv"
    with open(rows, "w") as f:
        f.write(",".join(f"x{i}" for i in range(16)) + "\n")
        for r in x:
            f.write(",".join(repr(float(v)) for v in r) + "\n")
    out = tmp_path / "p.csv"
    subprocess.run([predict_bin, "--weights", folder, "--input", str(rows), "--output", str(out)], check=True,
                   capture_output=True)
    cli = np.array([float(r[0]) for r in list(csv.reader(open(out)))[1:]], dtype=np.float32)
    ours = m.predict(x).ravel()
    # the command writes %.9g, which reads back as the same float32
    assert np.array_equal(cli, ours)


def test_from_config_dict_and_errors():
    cfg = {"name": "d", "device": "cpu", "data": {"kind": "sine", "window": 8, "samples": 128},
           "model": {"input": [8], "layers": [{"linear": {"units": 1}}]}, "train": {"batch_size": 16, "steps": 3}}
    assert len(pa.Model.from_config(cfg).train()) == 3
    bad = dict(cfg, train={"batch_size": "many"})
    with pytest.raises(pa.ConfigError) as e:
        pa.Model.from_config(bad)
    assert e.value.key_path == "train.batch_size" and e.value.line is not None
    assert isinstance(e.value, ValueError)


def test_config_error_is_located(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(SMALL.replace("units: 16, activation: relu", "units: 16, activation: relux"))
    with pytest.raises(pa.ConfigError) as e:
        pa.Model.from_yaml(p)
    err = e.value
    assert err.file == str(p) and err.line == 9 and err.column is not None
    assert "activation" in err.key_path and "relu" in str(err)
    with pytest.raises(pa.ConfigError) as e:
        pa.Model.from_yaml(p, overrides=["train.steps=abc"])
    with pytest.raises(pa.ConfigError):
        pa.Model.from_yaml("name: x\ndata: {kind: nope}\n")


def test_wrong_arrays_raise_clearly(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    with pytest.raises(ValueError, match=r"rows of shape \(16, 1\)"):
        m.predict(np.zeros((4, 15), np.float32))
    with pytest.raises(TypeError, match="array of numbers"):
        m.predict(np.array([["a"]]))
    with pytest.raises(ValueError, match="rows of x"):
        m.train(steps=1, x=np.zeros((10, 3), np.float32), y=np.zeros((9, 1), np.float32))
    with pytest.raises(ValueError, match="both x and y"):
        m.train(steps=1, x=np.zeros((10, 3), np.float32))
    with pytest.raises(ValueError, match="do not fit"):
        m.load_state_dict({"nope": np.zeros(3)})
    with pytest.warns(UserWarning, match="copied"):
        m.predict(np.zeros((2, 16), np.float64))


class _FakeCudaArray:
    """Claims CUDA memory through DLPack and cannot be exported: what a machine without a GPU
    sees of a CUDA array."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        raise BufferError("no device memory behind this fake")


class _HostDlpackArray:
    """A host array seen only through DLPack (another framework's CPU tensor)."""

    def __init__(self, a):
        self._a = a

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)


def test_cuda_input_on_a_cpu_model_is_a_clear_error_when_it_cannot_be_copied(small_yaml):
    m = pa.Model.from_yaml(small_yaml)  # device: cpu
    with pytest.raises(TypeError, match=r"CUDA memory \(device 0\) and this model runs on the CPU.*x\.cpu\(\)"):
        m.predict(_FakeCudaArray())

    class BrokenDevice(_FakeCudaArray):
        def __dlpack_device__(self):
            raise RuntimeError("broken")
    with pytest.raises(TypeError, match="__dlpack_device__"):
        m.predict(BrokenDevice())


def test_cuda_input_on_a_cuda_model_without_a_gpu_names_the_missing_gpu(small_yaml):
    if has_gpu():
        pytest.skip("this machine has a GPU")
    m = pa.Model.from_yaml(small_yaml).to("cuda")
    with pytest.raises(ValueError, match="no GPU"):
        m.predict(_FakeCudaArray())


def test_the_cuda_entry_refuses_host_memory(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    with pytest.raises(TypeError, match="not in CUDA memory"):
        m._m.predict_cuda(np.zeros((2, 16), np.float32))


def test_host_dlpack_input_predicts_as_numpy(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    out = m.predict(_HostDlpackArray(x))
    assert isinstance(out, np.ndarray) and np.array_equal(out, m.predict(x))


def test_train_from_arrays(small_yaml):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (256, 3)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
    m = pa.Model.from_config({"name": "arr", "device": "cpu", "data": {"kind": "arrays", "validation": 0.25},
                              "model": {"layers": [{"linear": {"units": 1}}]},
                              "train": {"batch_size": 32, "steps": 200, "optimizer": {"lr": 0.05}}})
    with pytest.raises(ValueError, match="arrays"):
        m.train(steps=1)  # data.kind arrays, and none given
    run = m.train(steps=200, x=x, y=y)
    assert run.loss[-1] < 1e-3 and np.isfinite(run.final_validation)
    assert m.predict(x[:4]).shape == (4, 1)
    with pytest.warns(UserWarning):  # Fortran order: copied
        m.train(steps=1, x=np.asfortranarray(x), y=y)


def test_callback_stops_and_raises(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    run = m.train(steps=20, callback=lambda d: d["step"] < 4)
    assert len(run) == 4 and run.stopped_early and m.steps_taken == 4

    def boom(d):
        if d["step"] == 7:
            raise RuntimeError("from the callback")
    with pytest.raises(RuntimeError, match="from the callback"):
        m.train(steps=10, callback=boom)
    assert m.steps_taken == 7  # the state after the step in flight is kept


def test_ctrl_c_raises_keyboard_interrupt_after_the_step(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    steps = []

    def cb(d):
        steps.append(d["step"])
        if d["step"] == 5:
            threading.Timer(0.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            threading.Event().wait(0.2)
    with pytest.raises(KeyboardInterrupt):
        m.train(steps=100000, callback=cb)
    taken = m.steps_taken
    assert 5 <= taken < 100000 and taken == steps[-1]
    # the state is consistent: training goes on from it
    assert m.train(steps=2).step.tolist() == [taken + 1, taken + 2]


def test_gil_is_released_while_training(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    ticks = []
    stop = threading.Event()

    def ticker():  # pure Python: it runs only while nobody holds the GIL
        while not stop.is_set():
            ticks.append(time.perf_counter())
    t = threading.Thread(target=ticker)
    m.state_dict()  # compile outside the measured window
    t.start()
    start = time.perf_counter()
    m.train(steps=3000)
    end = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    assert len(during) > 1000, (len(during), end - start)


def test_compare_is_the_command_table(small_yaml, train_bin):
    m = pa.Model.from_yaml(small_yaml)
    r = m.compare(steps=6)
    assert r.agree and len(r.fused["loss"]) == 6 and len(r.unfused["loss"]) == 6
    assert r.fused["nodes"] < r.unfused["nodes"] and r.grad_rel_diff
    cli = subprocess.run([train_bin, "-c", str(small_yaml), "--compare", "--steps", "6"], capture_output=True,
                         text=True, check=True).stdout
    # the table is the command's, except the measured times (and the rates made from them)
    measured = ("time per step", "launches", "TFLOP/s")
    first = [line for line in str(r).splitlines() if not any(w in line for w in measured)]
    theirs = [line for line in cli.splitlines() if not any(w in line for w in measured)]
    assert first == theirs


def test_graph_and_kernels(small_yaml):
    m = pa.Model.from_yaml(small_yaml)
    text = m.graph("frontend")
    assert "matmul" in text.lower()
    assert m.graph().strip() and m.graph("fuse-linear", format="dot").lstrip().startswith("digraph")
    with pytest.raises(ValueError, match="valid choices"):
        m.graph("nope")
    k = m.kernels()
    assert k and all("__global__" in src for src in k.values())


def test_dlpack_array_hands_out_its_capsule_once():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = pa.DLPackArray(a.__dlpack__(), (1, 0))
    assert d.__dlpack_device__() == (1, 0)
    assert np.array_equal(np.from_dlpack(d), a)
    with pytest.raises(BufferError, match="read already"):
        np.from_dlpack(d)
