"""PureAttention from Python: models from YAML or dicts, training with per-step metrics as NumPy
arrays, checkpoints, predictions, the fused-vs-unfused comparison, graph and kernel dumps.

Everything runs the C++ that the `train` and `predict` commands run (README "Python").
"""
import json
import os
import warnings

import numpy as np

from . import _pureattention as _pa
from ._errors import ConfigError

__all__ = ["Model", "Run", "CompareResult", "ConfigError", "DLPackArray", "plot"]
__version__ = "0.4.0"


def _float32(name, a):
    """`a` as a float32 C-contiguous array; a copy, with a warning, when it is not one already."""
    if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous:
        return a
    arr = np.asarray(a)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name}: expected an array of numbers, got dtype {arr.dtype}")
    warnings.warn(f"{name}: copied to a float32 C-contiguous array (it is {arr.dtype}"
                  f"{', not C-contiguous' if not arr.flags.c_contiguous else ''})", stacklevel=3)
    return np.ascontiguousarray(arr, dtype=np.float32)


_KDL_CPU, _KDL_CUDA = 1, 2  # DLPack device types


def _dlpack_device(x):
    """(DLPack device type, ordinal) of `x`; host memory when it does not say."""
    if not hasattr(x, "__dlpack_device__"):
        return _KDL_CPU, 0
    try:
        kind, ordinal = x.__dlpack_device__()
        return int(kind), int(ordinal)
    except Exception as e:  # a broken producer: an error naming it, not a crash
        raise TypeError(f"x: __dlpack_device__() of {type(x).__name__} failed: {e}") from e


def _to_host(x, kind, ordinal):
    """`x` (on DLPack device `kind`) copied to host memory: its framework's ``.cpu()``, else the
    DLPack request for a host copy."""
    where = "CUDA memory" if kind == _KDL_CUDA else f"DLPack device type {kind}"
    try:
        if hasattr(x, "cpu"):
            return x.cpu()
        return np.from_dlpack(x, device="cpu", copy=True)
    except Exception as e:
        raise TypeError(f"predict: x is in {where} (device {ordinal}) and this model runs on the CPU; "
                        f"it could not be copied to host memory ({type(e).__name__}: {e}): pass a host "
                        "array (PyTorch: x.cpu(); CuPy: x.get()), or run the model on the GPU "
                        "(model.to(\"cuda\"))") from e


class DLPackArray:
    """A CUDA array for any ``from_dlpack`` (``torch.from_dlpack``, ``cupy.from_dlpack``,
    ``jax.dlpack.from_dlpack``): ``__dlpack__`` hands out its DLPack capsule, once (a capsule is
    consumed by its reader), and ``__dlpack_device__`` says where it lives. The memory is freed
    when the array that read it is (or this one, unread)."""

    def __init__(self, capsule, device):
        self._capsule = capsule
        self._device = tuple(device)

    def __dlpack__(self, stream=None, **kwargs):
        if self._capsule is None:
            raise BufferError("this DLPack array was read already (it can be read once)")
        capsule, self._capsule = self._capsule, None
        return capsule

    def __dlpack_device__(self):
        return self._device


def _as_framework_of(x, out, device):
    """`out` (a DLPack capsule of CUDA memory) as an array of x's framework where that is
    PyTorch or CuPy (zero-copy, through DLPack); else a `DLPackArray`."""
    import sys
    root = type(x).__module__.partition(".")[0]
    framework = sys.modules.get(root) if root in ("torch", "cupy") else None
    return framework.from_dlpack(out) if framework is not None else DLPackArray(out, device)


class Run:
    """The metrics of one `Model.train` call, one entry a step, as NumPy arrays.

    ``step`` (float64 step numbers), ``loss``, ``val_loss`` (NaN on steps without validation),
    ``lr`` and ``step_ms``; ``final_validation`` (NaN without a validation split),
    ``seconds_per_step``, ``device``, ``stopped_early`` (a callback returned False).
    """

    def __init__(self, d, name=""):
        self.name = name
        self.step = d["step"].astype(np.int64)
        self.loss = d["loss"]
        self.val_loss = d["val_loss"]
        self.lr = d["lr"]
        self.step_ms = d["step_ms"]
        self.final_validation = d["final_validation"]
        self.seconds_per_step = d["seconds_per_step"]
        self.device = d["device"]
        self.parameters = d["parameters"]
        self.stopped_early = d["stopped_early"]

    def __len__(self):
        return len(self.step)

    def __repr__(self):
        last = f", final loss {self.loss[-1]:.6e}" if len(self) else ""
        return f"<Run {self.name}: {len(self)} steps on {self.device}{last}>"


class CompareResult:
    """`Model.compare`: what `train --compare` prints, as fields; str() is its table.

    ``fused`` and ``unfused``: dicts of ``loss`` (per step), ``seconds_per_step``, ``nodes``,
    ``forward_nodes``, ``activation_bytes`` (peak), ``device``; ``grad_rel_diff`` (per parameter,
    first step), ``max_loss_rel_diff``, ``max_grad_rel_diff``, ``max_free_loss_rel_diff``,
    ``tolerance``, ``agree``.
    """

    def __init__(self, d, name=""):
        self.name = name
        self.table = d.pop("table")
        self.__dict__.update(d)

    def __str__(self):
        return self.table

    def __bool__(self):
        return bool(self.agree)

    def __repr__(self):
        return (f"<CompareResult {self.name}: {len(self.fused['loss'])} steps, max loss difference "
                f"{self.max_loss_rel_diff:.2e}, {'agree' if self.agree else 'DISAGREE'}>")


class Model:
    """A model of a PureAttention config, with its parameters and optimizer state in memory."""

    def __init__(self, impl):
        self._m = impl
        self.last_run = None

    # -- making one ---------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path_or_text, overrides=()):
        """A model from a YAML file's path, or from YAML text (anything with a newline or a
        ``:`` that names no file). `overrides` are ``key.path=value`` strings, as ``--set``."""
        s = os.fspath(path_or_text)
        if "\n" not in s and (os.path.exists(s) or s.endswith((".yaml", ".yml"))):
            return cls(_pa._Model.from_file(s, list(overrides)))
        return cls(_pa._Model.from_text(s, "<yaml text>", list(overrides)))

    @classmethod
    def from_config(cls, config, overrides=()):
        """A model from a dict of the YAML schema. Errors are located in the dict written as
        JSON, one key a line (``<config dict>:LINE:COL``), and name the key path."""
        if not isinstance(config, dict):
            raise TypeError(f"from_config: expected a dict, got {type(config).__name__}")
        text = json.dumps(config, indent=1)
        return cls(_pa._Model.from_text(text, "<config dict>", list(overrides)))

    @classmethod
    def load(cls, path, overrides=()):
        """A model from a checkpoint: a checkpoint folder, a file in one, or a folder of them
        (its highest step); training continues it as ``train --resume`` does."""
        return cls(_pa._Model.load(os.fspath(path), list(overrides)))

    # -- facts ----------------------------------------------------------------------------------
    @property
    def name(self):
        return self._m.name

    @property
    def config_yaml(self):
        """The resolved config (every key, defaults filled in), as checkpoints keep it."""
        return self._m.config_yaml

    @property
    def steps_taken(self):
        return self._m.steps_taken

    def to(self, device):
        """Runs on ``"auto"``, ``"cpu"`` or ``"cuda"`` from now on (``--device``); returns self."""
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device {device!r}: valid choices are auto, cpu, cuda")
        self._m.set_device(device)
        return self

    # -- training -------------------------------------------------------------------------------
    def train(self, steps=None, callback=None, x=None, y=None, verbose=False):
        """Trains `steps` more steps (None: the config's ``train.steps``) and returns a `Run`.

        `callback(metrics)` is called with a dict (step, loss, val_loss, lr, step_ms) for every
        step; returning False stops after that step. `x`, `y`: the samples (rows first), which
        become the model's data (``data.kind: arrays``, split by ``data.validation``). Ctrl-C
        stops after the step in flight and raises KeyboardInterrupt; the model keeps the state of
        the steps taken. The GIL is released while steps run.
        """
        if callback is not None and not callable(callback):
            raise TypeError("callback: expected a callable or None")
        if (x is None) != (y is None):
            raise ValueError("give both x and y (inputs and targets), or neither")
        if x is not None:
            x, y = _float32("x", x), _float32("y", y)
        if steps is not None:
            steps = int(steps)
        run = Run(self._m.train(steps, callback, x, y, verbose), self.name)
        self.last_run = run
        return run

    # -- weights ----------------------------------------------------------------------------------
    def state_dict(self):
        """The parameters by their checkpoint names (``model.safetensors``), as NumPy arrays
        (float32; float64 for ``precision: fp64``): copies."""
        return dict(self._m.state_dict())

    def load_state_dict(self, state):
        """Sets every parameter from `state` (names and shapes as `state_dict` gives; a missing,
        extra or mis-shaped tensor is a ValueError listing them all); the optimizer state stays."""
        d = {}
        for k, v in state.items():
            a = np.asarray(v)
            if not np.issubdtype(a.dtype, np.floating):
                raise TypeError(f"load_state_dict: '{k}' has dtype {a.dtype}; expected floating point")
            d[str(k)] = np.ascontiguousarray(a, dtype=np.float64)
        self._m.load_state_dict(d)

    def save(self, directory):
        """Writes a checkpoint ``directory/step-NNNNNNNN/`` (the format of ``train
        --checkpoint-dir``) and returns its folder."""
        return self._m.save(os.fspath(directory))

    # -- using it ---------------------------------------------------------------------------------
    def predict(self, x):
        """Predictions for the rows of `x` (shape (rows, *input)), as ``predict`` computes them.

        Host input (NumPy, or any DLPack array in host memory) gives a NumPy array
        (rows, *target). Input in CUDA memory (a ``__dlpack__`` array on a CUDA device, e.g. a
        torch.cuda tensor) on a model that runs on the GPU stays there: the predictions are a
        new CUDA array, a PyTorch tensor or CuPy array for input of those, else a DLPack array
        (``__dlpack__``, ``__dlpack_device__``) for any ``from_dlpack``. It must be float32 and
        C-contiguous on the model's device. A model that runs on the CPU copies CUDA input to
        host memory first. See README "Python": DLPack and CUDA memory.
        """
        if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
            return self._m.predict(_float32("x", x))
        kind, ordinal = _dlpack_device(x)
        if kind == _KDL_CUDA and self._m.runs_on_cuda:
            if getattr(x, "requires_grad", False):
                x = x.detach()  # PyTorch exports no tensor that requires grad; predict needs none
            try:
                out = self._m.predict_cuda(x)
            except TypeError as e:
                if "incompatible function arguments" not in str(e):
                    raise
                raise TypeError(f"predict: x ({type(x).__name__}, in CUDA memory) could not be read "
                                "through DLPack: its __dlpack__() failed") from None
            return _as_framework_of(x, out, (kind, ordinal))
        if kind != _KDL_CPU:
            x = _to_host(x, kind, ordinal)
        return self._m.predict(_float32("x", np.from_dlpack(x)))

    def compare(self, steps=None, x=None, y=None):
        """``train --compare`` from the model's current weights: a `CompareResult`."""
        if x is not None:
            x, y = _float32("x", x), _float32("y", y)
        return CompareResult(self._m.compare(None if steps is None else int(steps), x, y), self.name)

    def graph(self, stage="final", format="text"):
        """The graph after `stage` as ``--dump-graph`` writes it: ``"frontend"`` (as lowered), a
        pass's name (``"fuse-linear"``, ``"autodiff"``, ...), or ``"final"``; `format` ``"text"``
        or ``"dot"``."""
        if format not in ("text", "dot"):
            raise ValueError(f"format {format!r}: valid choices are text, dot")
        stages = self._m.graphs()
        names = [s[0] for s in stages]
        if stage == "final":
            chosen = stages[-1]
        elif stage in names:
            chosen = stages[names.index(stage)]
        else:
            raise ValueError(f"stage {stage!r}: valid choices are final, {', '.join(names)}")
        return chosen[1] if format == "text" else chosen[2]

    def kernels(self):
        """The CUDA source of every kernel of the training step by kernel name, as
        ``--dump-kernels`` writes it (no GPU needed)."""
        return dict(self._m.kernels())

    def __repr__(self):
        return f"<pureattention.Model {self.name}: {self.steps_taken} steps taken>"


def __getattr__(name):
    # `pureattention.plot` on first use: matplotlib is only needed for pictures, and
    # `python3 -m pureattention.plot` must not find the module imported already.
    if name == "plot":
        import importlib
        return importlib.import_module(".plot", __name__)
    raise AttributeError(f"module 'pureattention' has no attribute {name!r}")
