"""Shared fixtures of the Python tests: the source tree, the built commands, a small config."""
import os
import pathlib
import shutil

import pytest

SOURCE = pathlib.Path(os.environ.get("PA_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


def _binary(var, name):
    """The command `name` (from $var, PATH or build/), or the test is skipped."""
    path = os.environ.get(var) or shutil.which(name) or str(SOURCE / "build" / name)
    if not os.path.exists(path):
        pytest.skip(f"the {name} command is not built")
    return path


@pytest.fixture
def source():
    return SOURCE


@pytest.fixture
def train_bin():
    return _binary("PA_TRAIN_BINARY", "train")


@pytest.fixture
def predict_bin():
    return _binary("PA_PREDICT_BINARY", "predict")


# A small, fast model: the sine data, two linear layers, CPU.
SMALL = """
name: small
seed: 3
device: cpu
data: {kind: sine, window: 16, samples: 512, validation: 0.125}
model:
  input: [16]
  layers:
    - linear: {units: 16, activation: relu}
    - linear: {units: 1}
train:
  batch_size: 32
  steps: 20
  log_every: 5
compiler: {fuse: true}
"""


@pytest.fixture
def small_yaml(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return p


def has_gpu():
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")
