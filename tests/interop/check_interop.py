#!/usr/bin/env python3
"""Interoperability check: `train` and `predict` against an independent NumPy model, through
safetensors files that Python writes and reads.

    check_interop.py --train PATH --predict PATH --configs DIR [--only name,...] [--workdir DIR]

For every example config in DIR (shrunk with --set so that each case takes about a second on two
cores; see CASES), plus a few variants that reach the options the examples leave at their
defaults (VARIANTS):

 1. Python writes random weights (safetensors.numpy.save_file; one case writes float64 and one
    float16, since --init-from takes any float dtype), then
    `train --init-from w.safetensors --steps 1 --dump-batches b.safetensors --metrics m.csv`:
    the loss of step 1 must equal the float64 NumPy MSE on the rows that step trained on (the
    dump's `batches[0]`) within 1e-6 relative, the bar the issue sets for fp32. The table also
    shows the float32 error scale derived for that loss (pa_numpy "Note on the float32 error
    scale"), to judge a failure: a relative difference far above it is a bug, not rounding.
 2. `train --steps 5 --checkpoint-dir ck --dump-batches b5.safetensors`: the checkpoint's names,
    shapes and dtypes must be the NumPy model's (built from the checkpoint's own `config`,
    `input_shape` and `target_shape` metadata, which must match the dump's data and say step 5);
    then ~20 validation rows (topped up from training rows where the split is smaller) go into
    a CSV, and `predict --weights ck --input rows.csv` must reproduce the NumPy forward pass of
    the step-5 weights. Tolerance, per element: 6 sigma + 5e-9 |y|, sigma the one-sigma float32
    error that pa_numpy derives for that element from the model's reductions (pa_numpy, "Note
    on the float32 error scale": rounding errors of at most 2^-24 per operation, growing like
    sqrt(n) over n-term sums, propagated through the layers), and 5e-9 the rounding of 9 printed
    significant digits. On the example configs the largest difference was 0.04 of that allowance;
    a mask shifted by one key or a dropped sink logit gives 10^3-10^5. A per-element relative bar
    would not do: outputs near zero (cancellation) carry relative errors of 1e-3 in any correct
    float32 program. The MSE that predict prints (with targets) must match NumPy's within 1e-6
    relative plus 6 sigma, and the same rows without the target columns (and --batch 7, so that
    several batches and a remainder are used) must give the same predictions, and so must
    `predict --split validation` for every row of the dump's validation split, in its order.
    predict's header must be y0..y{T-1}, or, with target columns in the input, their names (what
    predict writes today).

Prints one row per case: step-1 loss (ours, NumPy, relative difference, derived float32 scale),
predict's largest difference relative to the largest |prediction|, and the largest
|difference| / (6 sigma) (must be <= 1). Exits 0 when all pass, 1 on any failure, 77 when numpy,
safetensors or yaml cannot be imported (ctest's SKIP_RETURN_CODE). The workdir is deleted unless
--workdir is given or a case failed.
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

LOSS_REL_TOL = 1e-6      # the issue's bar for the step-1 loss in fp32
SIGMAS = 6.0             # predictions: allowed multiple of the derived float32 error scale
PRINT_REL = 5e-9         # 9 significant digits in predict's CSV and the metrics' loss
INIT_SEED = 20240611
TIMEOUT_S = 120


@dataclass
class Case:
    """One check: a config file of --configs, the --set flags that shrink (or vary) it."""
    name: str
    config: str
    sets: list
    init_dtype: str = "float32"   # dtype of the --init-from file
    predict_rows: int = 20


# Shrunk for speed; model shapes are the examples' own except where said.
CASES = [
    Case("sine_mlp", "sine_mlp.yaml", ["data.samples=256"]),
    Case("sine_attention", "sine_attention.yaml", ["data.samples=256"]),
    Case("function_mlp", "function_mlp.yaml", ["data.samples=256"], init_dtype="float64"),
    Case("mlp_tiny", "mlp_tiny.yaml", ["data.samples=512"], init_dtype="float16"),
    # batch 8192 -> 32: a step at full batch takes ~1 s here and the NumPy float64 forward more
    Case("mlp_wide", "mlp_wide.yaml", ["data.samples=256", "train.batch_size=32"]),
    # batch 32 -> 8, 64 samples (8 for validation) and 8 predicted rows: S = 256 and d = 256 are
    # kept (a step takes ~0.2 s on two cores), but one row is 65,536 inputs, and the NumPy float64
    # forward with its error scale takes ~0.3 s a row on this machine
    Case("attn_block", "attn_block.yaml", ["data.samples=64", "train.batch_size=8"], predict_rows=8),
    # S 1024 -> 48 (delay 200 -> 20), batch 8 -> 4: the blocks' widths (512, 8 x 64 heads over 2
    # KV heads, SwiGLU 1536) are kept; the window of 128 is shrunk to 8 so that it masks
    Case("tiny_gpt", "tiny_gpt.yaml",
         ["data.samples=64", "data.window=48", "model.input=[48, 8]", "data.delay=20", "train.batch_size=4",
          "model.layers.1.repeat.overrides=[{attention: {window: 8}}, {}]"], predict_rows=8),
    Case("tiny_llama", "tiny_llama.yaml",
         ["data.samples=64", "data.window=48", "model.input=[48, 8]", "data.delay=20", "train.batch_size=4"],
         predict_rows=8),
]

# Options that no example sets: an unfused attention (head dim 12 is not a multiple of 8, so
# fuse-attention leaves it primitive) with one KV head for three query heads, no causality, a
# two-sided window, a sink without sink logits, no residual, and GELU; a fused one that is not
# causal, with a two-sided window, sinks and sink logits; linear layers with GELU, sigmoid, tanh
# and no bias, on three inputs.
BLOCK_LAYERS = (
    "[{linear: {units: 16, activation: gelu_tanh}}, {position: {kind: sinusoidal}}, {position: {kind: learned}}, "
    "{norm: {kind: layer}}, "
    "{attention: {heads: 4, kv_heads: 2, head_dim: 6, causal: true, window: 3, sinks: 1, sink_logits: true, "
    "bias: false, rope: {base: 500, dims: 4}, residual: true, post_norm: {kind: layer, eps: 0.001}}}, "
    "{repeat: {times: 3, layers: ["
    "{attention: {heads: 2, causal: false, window: {left: 2, right: 1}, rope: {interleaved: true}, residual: true, "
    "pre_norm: rms}}, "
    "{mlp: {hidden: 24, activation: swiglu, residual: true, pre_norm: layer}}, "
    "{mlp: {hidden: 20, activation: gelu, bias: false, post_norm: rms}}, {norm: rms}], "
    "overrides: [{attention: {causal: true, window: {}}, mlp_1: {activation: relu}}, {mlp_0: {activation: silu}}, "
    "{mlp_1: {activation: gelu_tanh, residual: true}}]}}, "
    "{linear: {units: 16, activation: silu, bias: false, residual: true, pre_norm: {kind: rms, eps: 1e-6}}}, "
    "{linear: {units: 1}}]")

VARIANTS = [
    # Every layer kind and option of the transformer blocks in one small model (the fixture
    # bench/fixtures/all_layers_resolved.yaml): positions, both norms as layers and as pre/post
    # norms, rope half-split on part of the head and interleaved, bias-free and GQA attention
    # with a window, sinks and sink logits, a two-sided window, each mlp activation, a linear
    # residual block, and a repeat whose overrides cycle over three patterns.
    Case("blocks_opts", "tiny_llama.yaml",
         ["data.samples=128", "data.window=12", "data.channels=3", "data.delay=3", "model.input=[12, 3]",
          "train.batch_size=8", "model.layers=" + BLOCK_LAYERS]),
    Case("attn_unfused_opts", "sine_attention.yaml",
         ["data.samples=128", "model.layers.1.attention={heads: 3, kv_heads: 1, head_dim: 12, "
          "causal: false, window: {left: 5, right: 3}, sinks: 1, sink_logits: false, residual: false}",
          "model.layers.2.linear.activation=gelu"]),
    Case("attn_fused_opts", "sine_attention.yaml",
         ["data.samples=128", "model.layers.1.attention={heads: 4, kv_heads: 2, head_dim: 8, "
          "causal: false, window: {left: 2, right: 6}, sinks: 2, sink_logits: true, residual: true}"]),
    Case("mlp_activations", "function_mlp.yaml",
         ["data.samples=128", "train.batch_size=32", "data.inputs=3", "model.layers.0.linear.activation=gelu",
          "model.layers.1.linear.activation=sigmoid", "model.layers.1.linear.bias=false",
          "model.layers.2.linear.activation=tanh"]),
]


@dataclass
class Result:
    name: str
    ok: bool = True
    skipped: str = ""
    loss_ours: float = float("nan")
    loss_numpy: float = float("nan")
    loss_rel: float = float("nan")
    loss_sigma_rel: float = float("nan")
    predict_rel: float = float("nan")
    predict_ratio: float = float("nan")
    seconds: float = 0.0
    errors: list = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.ok = False
        self.errors.append(message)


class ToolError(Exception):
    """A child process failed: its command and the end of its output."""


def run_tool(cmd, cwd):
    started = time.time()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise ToolError(f"exit {proc.returncode} after {time.time() - started:.1f} s: "
                        f"{' '.join(cmd)}\n    " + "\n    ".join(tail))
    return proc.stdout


def set_flags(sets):
    flags = []
    for s in sets:
        flags += ["--set", s]
    return flags


def write_rows_csv(path, x, y=None):
    """One row per sample: its flattened input values, then (if y) its flattened targets; returns
    the target columns' names. repr() of a float32 value's float64 reads back exactly."""
    x = x.reshape(len(x), -1)
    header = [f"x{i}" for i in range(x.shape[1])]
    target_names = []
    if y is not None:
        y = y.reshape(len(y), -1)
        target_names = [f"t{i}" for i in range(y.shape[1])]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header + target_names)
        for i in range(len(x)):
            row = x[i].tolist() + (y[i].tolist() if y is not None else [])
            w.writerow([repr(float(v)) for v in row])
    return target_names


def read_predictions(path, rows, width, np, target_names=None):
    """predict's CSV as [rows, width]. Its header is y0..y{width-1}; with target columns in the
    input, their names are accepted too (predict names its columns after them)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        data = [[float(v) for v in row] for row in reader if row]
    valid = [[f"y{i}" for i in range(width)]] + ([target_names] if target_names else [])
    if header not in valid:
        raise ValueError(f"{path}: header {header[:4]}... is not y0..y{width - 1}"
                         + (f" nor the target names {target_names[:4]}..." if target_names else ""))
    out = np.array(data, dtype=np.float64).reshape(-1, width) if data else np.zeros((0, width))
    if out.shape != (rows, width):
        raise ValueError(f"{path}: {out.shape[0]} rows of {out.shape[1]}, expected {rows} of {width}")
    return out


def check_case(case, args, workdir, np, pn, st):
    """Runs both checks of one case; fills and returns its Result."""
    from safetensors.numpy import load_file, save_file
    res = Result(case.name)
    started = time.time()
    cfg = os.path.join(args.configs, case.config)
    base = [args.train, "--config", cfg, "--device", "cpu", "--progress", "none"] + set_flags(case.sets)
    d = os.path.join(workdir, case.name)
    shutil.rmtree(d, ignore_errors=True)  # a reused --workdir: no checkpoint of an earlier run
    os.makedirs(d)
    try:
        # --- (2a) train's own weights, 5 steps, checkpoint: gives the resolved config first ---
        run_tool(base + ["--steps", "5", "--checkpoint-dir", "ck", "--dump-batches", "b5.safetensors"], d)
        ck_file = os.path.join(d, "ck", "step-00000005", "model.safetensors")
        with st.safe_open(ck_file, "np") as f:
            meta = f.metadata() or {}
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
        weights5 = load_file(ck_file)
        try:
            model = pn.Model.from_metadata(meta)
        except pn.NotSupported as e:
            res.skipped = str(e)
            return res
        dump5 = load_file(os.path.join(d, "b5.safetensors"))
        check_checkpoint(res, model, meta, weights5, dtypes, dump5)

        # --- (1) random weights from Python, one step: the loss against NumPy ---
        init = model.init_params(INIT_SEED)
        init = {k: v.astype(case.init_dtype) for k, v in init.items()}
        save_file(init, os.path.join(d, "w.safetensors"))
        run_tool(base + ["--init-from", "w.safetensors", "--steps", "1", "--dump-batches", "b1.safetensors",
                         "--metrics", "m1.csv"], d)
        with open(os.path.join(d, "m1.csv"), newline="") as f:
            first = next(csv.DictReader(f))
        if first["step"] != "1":
            res.fail(f"m1.csv: first row is step {first['step']}, expected 1")
        dump1 = load_file(os.path.join(d, "b1.safetensors"))
        rows = dump1["batches"][0]
        pred, scale = model.forward_with_error_scale(init, dump1["train.x"][rows])
        target = dump1["train.y"][rows]
        res.loss_ours, res.loss_numpy = float(first["loss"]), pn.mse(pred, target)
        res.loss_rel = abs(res.loss_ours - res.loss_numpy) / abs(res.loss_numpy)
        res.loss_sigma_rel = pn.mse_error_scale(pred, scale, target) / abs(res.loss_numpy)
        if not res.loss_rel <= LOSS_REL_TOL:
            res.fail(f"step-1 loss {res.loss_ours!r} vs NumPy {res.loss_numpy!r}: relative difference "
                     f"{res.loss_rel:.3e} > {LOSS_REL_TOL:g} (derived float32 scale {res.loss_sigma_rel:.2e})")

        # --- (2b) predict on ~20 rows with the step-5 checkpoint ---
        check_predict(res, args, d, model, weights5, dump5, case.predict_rows, np, pn)
    except (ToolError, ValueError, KeyError, OSError, subprocess.TimeoutExpired, StopIteration) as e:
        res.fail(f"{type(e).__name__}: {e}")
    finally:
        res.seconds = time.time() - started
    return res


def check_checkpoint(res, model, meta, weights, dtypes, dump):
    """The checkpoint holds the NumPy model's parameters (names, shapes, F32) and says what it is."""
    want = model.param_shapes()
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(got) & set(want) if got[k] != want[k])
        res.fail(f"checkpoint parameters differ from pa_numpy's: missing {missing}, unexpected {extra}, "
                 f"shapes differ {[(k, got[k], want[k]) for k in wrong]}")
    not_f32 = sorted(k for k, t in dtypes.items() if t != "F32")
    if not_f32:
        res.fail(f"checkpoint tensors not F32: {not_f32}")
    if meta.get("step") != "5":
        res.fail(f"checkpoint metadata step {meta.get('step')!r}, expected '5'")
    for key, tensor in (("input_shape", "train.x"), ("target_shape", "train.y")):
        shape = json.loads(meta.get(key, "null") or "null")
        if shape != list(dump[tensor].shape[1:]):
            res.fail(f"checkpoint metadata {key} {shape} but the data's samples are {list(dump[tensor].shape[1:])}")


def check_predict(res, args, d, model, weights, dump, rows, np, pn):
    """predict on `rows` rows as CSV (with and without targets) and on --split validation."""
    n_val = len(dump["validation.x"])
    x, y = dump["validation.x"], dump["validation.y"]
    if n_val < rows:  # a small split: top up with training rows
        x = np.concatenate([x, dump["train.x"][:rows - n_val]])
        y = np.concatenate([y, dump["train.y"][:rows - n_val]])
    pred, scale = model.forward_with_error_scale(weights, x)
    pred, scale = pred.reshape(len(x), -1), scale.reshape(len(x), -1)
    allowed = SIGMAS * scale + PRINT_REL * np.abs(pred)
    width = pred.shape[1]
    res.predict_ratio = 0.0

    def compare(what, ours, n):
        """Largest |ours - NumPy| / allowed over the first n rows; a failure names the element."""
        ratio = np.abs(ours - pred[:n]) / np.maximum(allowed[:n], 1e-300)
        worst = float(ratio.max())
        if not worst <= 1.0:
            i, j = np.unravel_index(np.argmax(ratio), ratio.shape)
            res.fail(f"{what}: row {i} y{j}: {float(ours[i, j])!r} vs NumPy {float(pred[i, j])!r} (|diff| "
                     f"{abs(ours[i, j] - pred[i, j]):.3e}, allowed {allowed[i, j]:.3e} = "
                     f"{SIGMAS:g} sigma + printing)")
        res.predict_ratio = max(res.predict_ratio, worst)
        return ours

    target_names = write_rows_csv(os.path.join(d, "rows.csv"), x[:rows], y[:rows])
    out = run_tool([args.predict, "--weights", "ck", "--input", "rows.csv", "--output", "p.csv", "--device", "cpu"], d)
    ours = compare("predict --input rows.csv",
                   read_predictions(os.path.join(d, "p.csv"), rows, width, np, target_names), rows)
    res.predict_rel = float(np.abs(ours - pred[:rows]).max() / max(np.abs(pred[:rows]).max(), 1e-30))
    ref_mse = pn.mse(pred[:rows], y[:rows])
    m = re.search(r"MSE ([-+0-9.eEinfa]+)", out)
    if not m:
        res.fail(f"predict printed no MSE with target columns: {out.strip()!r}")
    else:
        mse_allowed = 1e-6 * ref_mse + SIGMAS * pn.mse_error_scale(pred[:rows], scale[:rows], y[:rows])
        if not abs(float(m.group(1)) - ref_mse) <= mse_allowed:
            res.fail(f"predict's MSE {m.group(1)} vs NumPy {ref_mse!r} (allowed {mse_allowed:.2e})")

    # The same rows without targets, several batches and a remainder: the same predictions.
    write_rows_csv(os.path.join(d, "rows_x.csv"), x[:rows])
    run_tool([args.predict, "--weights", "ck", "--input", "rows_x.csv", "--output", "p_x.csv", "--device", "cpu",
              "--batch", "7"], d)
    compare("predict --input rows_x.csv --batch 7", read_predictions(os.path.join(d, "p_x.csv"), rows, width, np),
            rows)

    # The config's own validation split, in the dump's order.
    run_tool([args.predict, "--weights", "ck", "--split", "validation", "--output", "p_val.csv", "--device", "cpu"], d)
    compare("predict --split validation", read_predictions(os.path.join(d, "p_val.csv"), n_val, width, np), n_val)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="the train binary")
    ap.add_argument("--predict", required=True, help="the predict binary")
    ap.add_argument("--configs", required=True, help="the folder of example configs (configs/)")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--workdir", default="", help="keep every case's files here (default: a temporary folder)")
    args = ap.parse_args(argv)

    try:
        import numpy as np
        import safetensors as st
        import safetensors.numpy  # noqa: F401  (save_file / load_file)
        import yaml  # noqa: F401  (pa_numpy reads the checkpoint's config)
    except ImportError as e:
        print(f"check_interop skipped: {e} (python3 -m pip install numpy safetensors pyyaml)")
        return 77
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pa_numpy as pn

    args.train, args.predict = os.path.abspath(args.train), os.path.abspath(args.predict)
    args.configs = os.path.abspath(args.configs)
    present = {f for f in os.listdir(args.configs) if f.endswith(".yaml")}
    known = {c.config for c in CASES}
    # Every example config: those without a tuned case get a generic shrink.
    cases = [c for c in CASES if c.config in present]
    cases += [Case(f[:-5], f, ["data.samples=256", "train.batch_size=16"])
              for f in sorted(present - known)]
    cases += [v for v in VARIANTS if v.config in present]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in {c.name for c in cases}]
        if unknown:
            print(f"--only: unknown case(s) {unknown}; cases: {', '.join(c.name for c in cases)}")
            return 2
        cases = [c for c in cases if c.name in wanted]

    # Small models run far faster on one thread when the machine is shared (README, "The train
    # command"), and ctest may run this beside other tests.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="pa_interop_")
    os.makedirs(workdir, exist_ok=True)

    results = []
    for case in cases:
        r = check_case(case, args, workdir, np, pn, st)
        results.append(r)
        print_row(r, header=len(results) == 1)
        sys.stdout.flush()

    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"\nFAILED {r.name}:")
        for e in r.errors:
            print(f"  {e}")
    passed = sum(1 for r in results if r.ok and not r.skipped)
    skipped = sum(1 for r in results if r.skipped)
    print(f"\nstep-1 loss bar {LOSS_REL_TOL:g} relative; predict bar {SIGMAS:g} sigma of the derived float32 "
          f"error + {PRINT_REL:g} relative (ratio column <= 1)")
    print(f"interop: {passed} passed, {len(failed)} failed" + (f", {skipped} skipped" if skipped else ""))
    if failed and not args.workdir:
        print(f"files kept in {workdir}")
    elif not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def print_row(r, header):
    if header:
        print(f"{'config':18s} {'loss ours':>12s} {'loss numpy':>16s} {'rel diff':>9s} {'f32 scale':>9s} "
              f"{'pred rel':>9s} {'/allowed':>8s} {'time':>5s}  status")
    if r.skipped:
        print(f"{r.name:18s} {'':>12s} {'':>16s} {'':>9s} {'':>9s} {'':>9s} {'':>8s} {r.seconds:5.1f}  skip: {r.skipped}")
        return
    print(f"{r.name:18s} {r.loss_ours:12.9g} {r.loss_numpy:16.12g} {r.loss_rel:9.2e} {r.loss_sigma_rel:9.1e} "
          f"{r.predict_rel:9.2e} {r.predict_ratio:8.3f} {r.seconds:5.1f}  {'ok' if r.ok else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
