#!/usr/bin/env python3
"""Self-check of the Python side of the transformer-block layers, without `train`:
tests/interop/pa_numpy.py (the float64 reference) against bench/pa_torch_blocks.py (the PyTorch
modules that torch_mirror.py trains and train_vs_torch.py times), on resolved configs written as
fixtures (bench/fixtures/*_resolved.yaml, or any given with --config).

    check_torch_blocks.py [--config FILE.yaml --input S,F --target S,1] [--set k=v ...] [--no-torch]

For each config, with random weights from pa_numpy.init_params (non-trivial gains, biases, sink
logits and position tables) on random inputs:
 - NumPy: parses it, lists the layers with their parameter prefixes, runs the forward pass
   with its float32 error scale, and counts the step's FLOPs (pa_numpy.step_flops);
 - torch float64 ("explicit" attention) against NumPy float64: must agree within 1e-10 relative
   (the two are independent formulations of the same definitions: a wrong rope pairing, norm,
   override or parameter name is off by far more);
 - torch float64 with the "auto" attention (SDPA where PyTorch supports the mask) against the
   same, within 1e-10; and its gradients against the explicit form's, within 1e-9 relative;
 - torch float32 against NumPy float64 per element within 6 sigma of pa_numpy's derived float32
   error scale (what check_interop demands of `predict`), which checks the scale for the new
   layers as well.
`--set key.path=value` edits the fixture before parsing (e.g. --set data.window=64 together
with --input 64,8 --target 64,1 to shrink). Exit 0 when all pass, 1 otherwise.
"""
import argparse
import os
import sys

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "interop"))
sys.path.insert(0, HERE)
import pa_numpy as pn  # noqa: E402

FIXTURES = [  # file, input shape, target shape, batch, edits (--set) that shrink it for a CPU
    ("all_layers_resolved.yaml", [12, 3], [12, 1], 4, []),
    ("tiny_llama_resolved.yaml", [64, 8], [64, 1], 2, ["model.input=[64, 8]"]),
    ("tiny_gpt_resolved.yaml", [64, 8], [64, 1], 2,
     ["model.input=[64, 8]", "model.layers.1.repeat.overrides=[{attention: {window: 16}}, {}]"]),
]


def check(name, cfg, xs, ys, batch, use_torch, failures):
    model = pn.Model.from_config(cfg, xs, ys)
    shapes = model.param_shapes()
    print(f"\n== {name}: {len(model.layers)} layers, {len(shapes)} tensors, "
          f"{sum(int(np.prod(s)) for s in shapes.values()):,} parameters, input {list(xs)}")
    for p, spec in zip(model.prefixes, model.layers):
        print(f"   {p:22s} {spec}")
    params = model.init_params(7)
    rng = np.random.default_rng(3)
    x = rng.normal(size=[batch] + list(xs)).astype(np.float32)
    y = rng.normal(size=[batch] + list(ys)).astype(np.float32)
    ref, scale = model.forward_with_error_scale(params, x)
    loss = pn.mse(ref, y)
    print(f"   step FLOPs at batch {batch}: {pn.step_flops(model, batch):.4g}")
    print(f"   numpy: loss {loss:.12g}, |pred| mean {np.abs(ref).mean():.3g}, "
          f"f32 scale / |pred| median {np.median(scale / np.maximum(np.abs(ref), 1e-30)):.2e}")
    if not np.isfinite(ref).all() or not np.isfinite(scale).all():
        failures.append(f"{name}: NumPy forward not finite")
    if not use_torch:
        return
    import torch
    import pa_torch_blocks as tb

    def run(dtype, attention):
        m = tb.build(model, attention, dtype)
        m.load_pa(params)
        xt = torch.from_numpy(x).to(dtype)
        pred = m(xt)
        loss_t = torch.nn.functional.mse_loss(pred, torch.from_numpy(y).to(dtype).reshape(pred.shape))
        loss_t.backward()
        return m, pred.detach().double().numpy(), loss_t.item(), m.pa_grads()

    m64, p64, l64, g64 = run(torch.float64, "explicit")
    rel = np.abs(p64 - ref).max() / np.abs(ref).max()
    print(f"   torch float64 explicit vs numpy: max |diff| / max |pred| {rel:.2e}, loss rel {abs(l64 - loss) / loss:.2e}")
    if not rel <= 1e-10:
        failures.append(f"{name}: torch float64 vs NumPy {rel:.2e} > 1e-10")
    ma, pa, la, ga = run(torch.float64, "auto")
    print(f"   formulations (auto): {'; '.join(ma.attention_formulations())}")
    rel_a = np.abs(pa - p64).max() / np.abs(p64).max()
    grad_a = max(np.linalg.norm(ga[k] - g64[k]) / max(np.linalg.norm(g64[k]), 1e-300) for k in g64)
    print(f"   torch float64 auto vs explicit: pred {rel_a:.2e}, worst tensor's gradient {grad_a:.2e}")
    if not rel_a <= 1e-10 or not grad_a <= 1e-9:
        failures.append(f"{name}: SDPA formulation differs from the explicit one ({rel_a:.2e}, grads {grad_a:.2e})")
    zero = [k for k, g in g64.items() if not np.any(g)]
    if zero:
        failures.append(f"{name}: parameters with all-zero gradients {zero}")
    _, p32, _, _ = run(torch.float32, "explicit")
    ratio = float((np.abs(p32 - ref) / (6 * scale + 5e-9 * np.abs(ref))).max())
    print(f"   torch float32 vs numpy: max |diff| / (6 sigma) {ratio:.2e}")
    if not ratio <= 1.0:
        failures.append(f"{name}: torch float32 beyond 6 sigma of the derived error scale ({ratio:.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="a resolved config (default: the fixtures)")
    ap.add_argument("--input", help="one sample's input shape, e.g. 64,8 (with --config)")
    ap.add_argument("--target", help="one sample's target shape, e.g. 64,1 (with --config)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args(argv)
    use_torch = not a.no_torch
    if use_torch:
        try:
            import torch
            torch.manual_seed(0)
        except ImportError:
            print("torch is not installed: NumPy checks only (--no-torch)")
            use_torch = False
    if a.config:
        shp = lambda s: [int(v) for v in s.split(",")]
        cases = [(a.config, shp(a.input), shp(a.target), a.batch, [])]
    else:
        cases = [(os.path.join(HERE, "fixtures", f), xs, ys, b, sets) for f, xs, ys, b, sets in FIXTURES]
    failures = []
    for path, xs, ys, batch, sets in cases:
        with open(path) as f:
            cfg = yaml.safe_load(f)
        for s in sets + a.set:
            pn.apply_set(cfg, s)
        try:
            check(os.path.basename(path), cfg, xs, ys, batch, use_torch, failures)
        except Exception as e:  # report and go on with the next config
            failures.append(f"{os.path.basename(path)}: {type(e).__name__}: {e}")
    for f in failures:
        print(f"FAIL {f}")
    print(f"\ncheck_torch_blocks: {len(cases) - len({f.split(':')[0] for f in failures})} passed, "
          f"{len({f.split(':')[0] for f in failures})} failed" + ("" if use_torch else " (no torch: NumPy only)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
