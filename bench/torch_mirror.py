#!/usr/bin/env python3
"""PyTorch mirror: `train`'s loss trajectory against the same model trained by PyTorch on the
very same batches from the very same weights.

    torch_mirror.py --train PATH [--device cuda|cpu] [--steps 100] [--gemm generated]
                    [--configs DIR] [--only sine_attention,attn_block,mlp_tiny] [--set k=v ...]
                    [--workdir DIR] [--out FILE.md] [--no-torch]

For each config (default: sine_attention, attn_block, mlp_tiny; fp32, TF32 off on both sides):
 1. `train --steps 0 --checkpoint-dir ck0`: the project's own initial weights and, in the
    checkpoint's metadata, the resolved config (every default filled in) and the sample shapes;
 2. `train --init-from ck0/.../model.safetensors --steps N --device D --set compiler.gemm=G
    --dump-batches b.safetensors --metrics m.csv`: our trajectory, and the rows of every step;
 3. a PyTorch module written here from the config (nn.Linear layers, loaded by name with the
    transpose: ours computes x @ W + b with W [in, out], nn.Linear x @ weight.T + bias) trains N
    steps with torch.optim.Adam (AdamW where weight_decay > 0: ours decays decoupled,
    p *= 1 - lr*wd before the update, as AdamW does) with the same lr, betas and eps, the
    learning rate set before each step from the config's schedule (constant or cosine after a
    linear warm-up), on train.x[batches[k]] at step k;
 4. per step: ours, torch, relative difference. A config fails when a step among the first 20
    differs by more than 1e-4 relative (the bar the project's GPU-vs-CPU trajectory test uses).
Checks beside the trajectory, to tell a wrong mirror from a wrong `train`: the learning rate of
every step in m.csv against the schedule computed here (must agree within 1e-8 relative: the
column has 9 significant digits), and the mirror's step-1 loss against the float64 NumPy model
of tests/interop/pa_numpy.py (shown). The times are wall-clock seconds of the whole `train` run
(start-up and kernel compilation included) and of the mirror's loop, not a benchmark.

The mirror's attention is explicit (no scaled_dot_product_attention: sink logits need their own
softmax column): q, k, v projections; KV head h // (heads / kv_heads) for query head h
(repeat_interleave); scores q k^T / sqrt(head_dim); the boolean mask of README "Attention masks"
(pa_numpy.visible) as -inf; with sink_logits one extra column per head holding the sink logit,
dropped after the softmax; a row that sees nothing gives 0; p v, merged heads, output
projection, residual.

--no-torch runs everything but PyTorch (train, the dumps, the schedule check, the parameter
mapping, the table with an empty torch column), for machines without it. Writes the markdown to
stdout and --out. Exit 1 if any config fails, 0 otherwise.

On the GPU machine, from the repository root after building:
    python3 bench/torch_mirror.py --train build/train --device cuda --steps 100 --out bench/logs/torch_mirror.md
"""
import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "interop"))
import pa_numpy as pn  # noqa: E402  (config parsing, the mask predicate, the float64 reference)

REL_BAR = 1e-4        # trajectory: relative difference allowed over the first GATED_STEPS steps
GATED_STEPS = 20
LR_REL_TOL = 1e-8     # the lr column is printed with 9 significant digits
DEFAULT_CONFIGS = ["sine_attention", "attn_block", "mlp_tiny"]


# ---------------------------------------------------------------------------------------------
# What needs no PyTorch: running train, reading its files, the schedule, the parameter mapping.

def run(cmd, cwd):
    """Runs a command; on failure raises with the end of its output."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n    ".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n    {tail}")
    return proc.stdout


def train_config(meta):
    """The optimizer and schedule settings of a checkpoint's resolved config."""
    import yaml
    cfg = yaml.safe_load(meta["config"])
    if cfg.get("precision", "fp32") != "fp32":
        raise ValueError(f"precision {cfg.get('precision')}: the mirror is fp32 only")
    tr = cfg["train"]
    if tr.get("loss", "mse") != "mse":
        raise ValueError(f"train.loss {tr.get('loss')}: the mirror knows mse only")
    opt = tr["optimizer"]
    if opt.get("type", "adam") != "adam":
        raise ValueError(f"optimizer {opt.get('type')}: the mirror knows adam only")
    return {"lr": float(opt["lr"]), "betas": tuple(float(b) for b in opt["betas"]),
            "eps": float(opt["eps"]), "weight_decay": float(opt.get("weight_decay", 0)),
            "clip_grad_norm": float(opt.get("clip_grad_norm", 0)),
            "schedule": tr.get("lr_schedule", "constant"), "warmup": int(tr.get("warmup_steps", 0))}


def lr_at(step, total, t):
    """The learning rate of step `step` (counted from 1) of `total`: a linear warm-up
    lr * step / warmup for step <= warmup, then constant or
    lr * 0.5 * (1 + cos(pi * min(1, (step - warmup) / max(1, total - warmup))))."""
    lr, warm = t["lr"], t["warmup"]
    if warm > 0 and step <= warm:
        return lr * step / warm
    if t["schedule"] == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
    if t["schedule"] != "constant":
        raise ValueError(f"train.lr_schedule {t['schedule']}: the mirror knows constant and cosine")
    return lr


def read_metrics(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], [float(r["lr"]) for r in rows]


def torch_target(name):
    """Where a checkpoint tensor goes in the mirror: (layer index, attribute path, transpose).
    `layers.<i>.weight` -> layers[i].linear.weight (transposed), `layers.<i>.q_weight` ->
    layers[i].q.weight (transposed), `layers.<i>.q_bias` -> layers[i].q.bias, and
    `layers.<i>.sink_logits` -> layers[i].sink_logits."""
    _, index, what = name.split(".", 2)
    if what in ("weight", "bias"):
        return int(index), ("linear", what), what == "weight"
    if what == "sink_logits":
        return int(index), ("sink_logits",), False
    proj, kind = what.split("_")
    return int(index), (proj, kind), kind == "weight"


def prepare(name, args, workdir):
    """Runs train twice for one config and loads what the mirror needs."""
    d = os.path.join(workdir, name)
    shutil.rmtree(d, ignore_errors=True)  # a reused --workdir: no checkpoint of an earlier run
    os.makedirs(d)
    cfg = os.path.join(args.configs, f"{name}.yaml")
    sets = []
    for s in args.set:
        sets += ["--set", s]
    common = ["--config", cfg, "--progress", "none"] + sets
    # The initial weights are the seed's on any device; the CPU saves compiling GPU kernels.
    run([args.train] + common + ["--device", "cpu", "--steps", "0", "--checkpoint-dir", "ck0"], d)
    init_file = os.path.join(d, "ck0", "step-00000000", "model.safetensors")
    with safe_open(init_file, "np") as f:
        meta = f.metadata()
    started = time.time()
    run([args.train] + common + ["--device", args.device, "--set", f"compiler.gemm={args.gemm}", "--init-from", init_file,
                                 "--steps", str(args.steps), "--dump-batches", "b.safetensors",
                                 "--metrics", "m.csv"], d)
    ours_s = time.time() - started
    steps, losses, lrs = read_metrics(os.path.join(d, "m.csv"))
    if steps != list(range(1, args.steps + 1)):
        raise ValueError(f"m.csv: steps {steps[:3]}...{steps[-3:]}, expected 1..{args.steps}")
    tcfg = train_config(meta)
    want_lr = [lr_at(k, args.steps, tcfg) for k in steps]
    lr_err = max((abs(a - b) / max(abs(b), 1e-30) for a, b in zip(lrs, want_lr) if a or b), default=0.0)
    model, weights = pn.Model.from_metadata(meta), load_file(init_file)
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    if shapes != model.param_shapes():
        raise ValueError(f"checkpoint parameters {shapes} are not the config's {model.param_shapes()}")
    for tensor in weights:
        torch_target(tensor)  # every name must map to a mirror attribute
    return {"name": name, "meta": meta, "train": tcfg, "weights": weights,
            "dump": load_file(os.path.join(d, "b.safetensors")), "ours": losses, "lr": want_lr,
            "lr_err": lr_err, "ours_s": ours_s, "model": model}


# ---------------------------------------------------------------------------------------------
# The PyTorch side: the module, loading by name, the training loop.

def torch_mirror(case, device, steps):
    """Trains the mirror on the dump's batches; returns (losses, seconds)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    acts = {"none": lambda x: x, "relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="none"),
            "tanh": torch.tanh, "sigmoid": torch.sigmoid}

    class MirrorLinear(nn.Module):
        def __init__(self, spec, width):
            super().__init__()
            self.linear = nn.Linear(width, spec.units, bias=spec.bias)
            self.act = acts[spec.activation]

        def forward(self, x):
            return self.act(self.linear(x))

    class MirrorAttention(nn.Module):
        def __init__(self, spec, seq, width):
            super().__init__()
            self.hq = spec.heads
            self.hk = spec.kv_heads or spec.heads
            self.hd = spec.head_dim or width // spec.heads
            self.q = nn.Linear(width, self.hq * self.hd)
            self.k = nn.Linear(width, self.hk * self.hd)
            self.v = nn.Linear(width, self.hk * self.hd)
            self.o = nn.Linear(self.hq * self.hd, width)
            self.sink_logits = nn.Parameter(torch.zeros(self.hq)) if spec.sink_logits else None
            self.residual = spec.residual
            vis = pn.visible(seq, seq, spec.causal, spec.align, spec.window_left, spec.window_right,
                             spec.sinks)
            self.register_buffer("visible", torch.from_numpy(vis))
            self.register_buffer("row_sees", torch.from_numpy(vis.any(axis=1)))

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, self.hq, self.hd).transpose(1, 2)
            k = self.k(x).view(b, s, self.hk, self.hd).transpose(1, 2)
            v = self.v(x).view(b, s, self.hk, self.hd).transpose(1, 2)
            group = self.hq // self.hk  # query head h reads KV head h // group
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            scores = scores.masked_fill(~self.visible, float("-inf"))
            # a row that sees no key: finite scores for the softmax, zeroed after
            scores = scores.masked_fill(~self.row_sees[:, None], 0.0)
            if self.sink_logits is not None:
                sink = self.sink_logits.view(1, self.hq, 1, 1).expand(b, self.hq, s, 1)
                p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            else:
                p = torch.softmax(scores, dim=-1)
            p = p.masked_fill(~self.row_sees[:, None], 0.0)
            out = (p @ v).transpose(1, 2).reshape(b, s, self.hq * self.hd)
            out = self.o(out)
            return out + x if self.residual else out

    class Mirror(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.input_shape = model.input_shape
            layers, shape = [], model.input_shape
            for spec in model.layers:
                if isinstance(spec, pn.Linear):
                    layers.append(MirrorLinear(spec, shape[-1]))
                    shape = shape[:-1] + (spec.units,)
                else:
                    layers.append(MirrorAttention(spec, shape[0], shape[1]))
            self.layers = nn.ModuleList(layers)

        def forward(self, x):
            x = x.reshape((x.shape[0],) + self.input_shape)
            for layer in self.layers:
                x = layer(x)
            return x

    def load(mirror, tensors):
        """Copies every checkpoint tensor into the mirror by name; nothing may be left over."""
        filled = set()
        with torch.no_grad():
            for name, value in tensors.items():
                index, path, transpose = torch_target(name)
                target = mirror.layers[index]
                for attr in path:
                    target = getattr(target, attr)
                t = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
                t = t.t() if transpose else t
                if tuple(target.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: {list(value.shape)} does not fit {list(target.shape)}")
                target.copy_(t)
                filled.add(id(target))
        unfilled = [n for n, p in mirror.named_parameters() if id(p) not in filled]
        if unfilled:
            raise ValueError(f"mirror parameters with no checkpoint tensor: {unfilled}")

    dev = torch.device(device)
    mirror = Mirror(case["model"])
    load(mirror, case["weights"])
    mirror.to(dev)
    t = case["train"]
    opt_class = torch.optim.AdamW if t["weight_decay"] > 0 else torch.optim.Adam
    opt = opt_class(mirror.parameters(), lr=t["lr"], betas=t["betas"], eps=t["eps"],
                    weight_decay=t["weight_decay"])
    xs = torch.from_numpy(case["dump"]["train.x"]).to(dev)
    ys = torch.from_numpy(case["dump"]["train.y"]).to(dev)
    batches = torch.from_numpy(case["dump"]["batches"]).to(dev)
    if batches.shape[0] < steps:
        raise ValueError(f"the dump holds {batches.shape[0]} steps' batches, fewer than {steps}")
    losses = []
    started = time.time()
    for k in range(steps):
        for g in opt.param_groups:
            g["lr"] = case["lr"][k]
        opt.zero_grad(set_to_none=True)
        pred = mirror(xs[batches[k]])
        loss = F.mse_loss(pred, ys[batches[k]].reshape(pred.shape))
        loss.backward()
        if t["clip_grad_norm"] > 0:
            # torch divides by (norm + 1e-6); a difference of ~1e-6 relative where clipping acts
            torch.nn.utils.clip_grad_norm_(mirror.parameters(), t["clip_grad_norm"])
        opt.step()
        losses.append(loss.item())
    return losses, time.time() - started


# ---------------------------------------------------------------------------------------------
# Comparison and report.

def compare(ours, theirs):
    """Per-step relative differences, the first step beyond REL_BAR, the max of the gated steps."""
    rel = [abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ours, theirs)]
    first = next((i + 1 for i, r in enumerate(rel) if not r <= REL_BAR), None)
    return rel, first, max(rel[:GATED_STEPS], default=0.0)


def report(cases, args, device_name):
    lines = [f"# PyTorch mirror: loss trajectories, {args.steps} steps, fp32 (TF32 off), "
             f"device {device_name}, compiler.gemm={args.gemm}", ""]
    lines += ["| config | first step > 1e-4 | max rel, steps 1-20 | max rel, all | "
              "torch vs NumPy float64, step 1 | lr column vs schedule | train run s | torch s | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        if "error" in c:
            lines.append(f"| {c['name']} | | | | | | | | FAIL: {c['error']} |")
            continue
        if c.get("torch") is None:
            lines.append(f"| {c['name']} | (no torch) | | | | {c['lr_err']:.1e} | {c['ours_s']:.1f} | | "
                         f"{'ok' if c['ok'] else 'FAIL'} |")
            continue
        first = "none" if c["first"] is None else str(c["first"])
        lines.append(f"| {c['name']} | {first} | {c['max20']:.2e} | {max(c['rel']):.2e} | "
                     f"{c['torch_vs_numpy']:.1e} | {c['lr_err']:.1e} | {c['ours_s']:.1f} | "
                     f"{c['torch_s']:.1f} | {'ok' if c['ok'] else 'FAIL'} |")
    for c in cases:
        if "error" in c:
            continue
        lines += ["", f"## {c['name']}", "", "| step | lr | ours | torch | rel diff |", "|---|---|---|---|---|"]
        theirs = c.get("torch") or [float("nan")] * len(c["ours"])
        rel = c.get("rel") or [float("nan")] * len(c["ours"])
        for k, (a, b, r) in enumerate(zip(c["ours"], theirs, rel)):
            lines.append(f"| {k + 1} | {c['lr'][k]:.6g} | {a:.9g} | {b:.9g} | {r:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="the train binary")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--gemm", default="generated", choices=["generated", "cublaslt", "auto"])
    ap.add_argument("--configs", default=os.path.join(REPO, "configs"))
    ap.add_argument("--only", default=",".join(DEFAULT_CONFIGS), help="comma-separated config names")
    ap.add_argument("--set", action="append", default=[], help="extra --set for train (e.g. to shrink on a CPU)")
    ap.add_argument("--workdir", default="", help="keep train's files here (default: a temporary folder)")
    ap.add_argument("--out", default="", help="also write the markdown here")
    ap.add_argument("--no-torch", action="store_true", help="everything but PyTorch")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    args.train = os.path.abspath(args.train)
    args.configs = os.path.abspath(args.configs)

    device_name = args.device
    if not args.no_torch:
        import torch
        if args.device == "cuda":
            if not torch.cuda.is_available():
                print("torch sees no CUDA device; use --device cpu or run on the GPU machine")
                return 2
            device_name = f"cuda ({torch.cuda.get_device_name(0)}), torch {torch.__version__}"
        else:
            device_name = f"cpu, torch {torch.__version__}"

    workdir = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="pa_mirror_")
    cases = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        try:
            c = prepare(name, args, workdir)
            c["ok"] = c["lr_err"] <= LR_REL_TOL
            if not args.no_torch:
                c["torch"], c["torch_s"] = torch_mirror(c, args.device, args.steps)
                c["rel"], c["first"], c["max20"] = compare(c["ours"], c["torch"])
                rows = c["dump"]["batches"][0]
                ref = pn.mse(c["model"].forward(c["weights"], c["dump"]["train.x"][rows]),
                             c["dump"]["train.y"][rows])
                c["torch_vs_numpy"] = abs(c["torch"][0] - ref) / ref
                c["ok"] = c["ok"] and c["max20"] <= REL_BAR
        except Exception as e:  # one config's failure is reported in its row; the others run
            c = {"name": name, "error": f"{type(e).__name__}: {e}".replace("\n", " ")}
        cases.append(c)

    text = report(cases, args, device_name)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    failed = [c["name"] for c in cases if "error" in c or not c["ok"]]
    print(f"\nmirror: {len(cases) - len(failed)} passed, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
