#!/usr/bin/env python3
"""Training step time of the three anchor models: PureAttention against PyTorch, in one run.

For each model of ../shared/anchors-pytorch-h100.md (mlp_tiny, mlp_wide, attn_block) and each
precision (fp32 with TF32 off; tf32; bf16: torch.autocast(bfloat16) with fp32 parameters and
Adam state, as `precision: bf16` is), runs this project's gpu_train_bench on configs/<model>.yaml
and, in the same process run on the same GPU, the same model in PyTorch: eager, and
torch.compile(mode="reduce-overhead") (CUDA graphs). Both sides use Adam (fused in PyTorch) on
MSE, the same shapes and batch sizes. Both are timed the same way: N steps queued back to back,
then one wait; the median over repetitions of (elapsed / N). torch._dynamo is reset between models.
Ours runs with the default compiler.gemm (auto: the faster of the generated GEMM and cuBLASLt per
node, measured at start) and again with the generated GEMMs only.

usage: train_vs_torch.py [--bench build/bench/gpu_train_bench] [--steps 200] [--reps 5] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, x):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class AttnBlock(nn.Module):
    """configs/attn_block.yaml: x + causal MHA(x) (4 heads, projections with bias), then
    Linear 256->1024 ReLU, Linear 1024->256, Linear 256->1 per position."""

    def __init__(self, d=256, heads=4):
        super().__init__()
        self.h = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.mlp = MLP([d, 1024, d, 1])

    def forward(self, x):
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.h, d // self.h).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return self.mlp(x)


MODELS = {
    # name: (module factory, input shape, target shape, lr)
    "mlp_tiny": (lambda: MLP([1, 64, 64, 1]), (256, 1), (256, 1), 1e-3),
    "mlp_wide": (lambda: MLP([256, 1024, 1024, 1024, 256]), (8192, 256), (8192, 256), 1e-3),
    "attn_block": (lambda: AttnBlock(), (32, 256, 256), (32, 256, 1), 3e-4),
}


def time_steps(step, steps, reps):
    """Median over `reps` of the mean step time of `steps` queued steps (CUDA events)."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            step()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / steps)
    return statistics.median(out)


def torch_step_time(name, mode, steps, reps, precision="fp32"):
    factory, xs, ys, lr = MODELS[name]
    torch.manual_seed(0)
    model = factory().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    x = torch.randn(xs, device="cuda")
    y = torch.randn(ys, device="cuda")

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.mse_loss(model(x), y)  # autocast runs mse_loss in fp32
        loss.backward()
        opt.step()
        return loss

    if mode == "eager":
        fn = train_step
    else:
        fn = torch.compile(train_step, mode="reduce-overhead")
    return time_steps(fn, steps, reps)


def ours(bench, root, name, precision, steps, reps, graph=True, gemm="auto"):
    cmd = [bench, os.path.join(root, "configs", name + ".yaml"), "--set", "precision=" + precision,
           "--set", "compiler.gemm=" + gemm, "--steps", str(steps), "--reps", str(reps)]
    if not graph:
        cmd.append("--no-cuda-graph")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(root, "build", "bench", "gpu_train_bench"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--models", default="mlp_tiny,mlp_wide,attn_block")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    a = ap.parse_args()
    print(f"# training step, ms (median of {a.reps} x {a.steps} queued steps); {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print("| model | precision | ours | ours, generated GEMMs only | ours, no CUDA graph | launches/step | torch eager "
          "| torch reduce-overhead | eager / ours | reduce-overhead / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in a.models.split(","):
        for prec in a.precisions.split(","):
            torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
            torch.backends.cudnn.allow_tf32 = prec == "tf32"
            mine = ours(a.bench, root, name, prec, a.steps, a.reps)
            generated = ours(a.bench, root, name, prec, a.steps, a.reps, gemm="generated")
            eager_graphless = ours(a.bench, root, name, prec, max(a.steps // 4, 20), 3, graph=False)
            torch._dynamo.reset()
            eager = torch_step_time(name, "eager", a.steps, a.reps, prec)
            torch._dynamo.reset()
            try:
                ro = torch_step_time(name, "reduce-overhead", a.steps, a.reps, prec)
            except Exception as e:  # report, do not hide
                print(f"torch.compile failed for {name}: {e}", file=sys.stderr)
                ro = float("nan")
            ms = mine.get("ms_per_step", float("nan"))
            gen_ms = generated.get("ms_per_step", float("nan"))
            row = {"model": name, "precision": prec, "ours_ms": ms, "ours_generated_ms": gen_ms,
                   "ours_no_graph_ms": eager_graphless.get("ms_per_step", float("nan")),
                   "launches": mine.get("launches_per_step"), "torch_eager_ms": eager, "torch_reduce_overhead_ms": ro,
                   "ours": mine}
            rows.append(row)
            print(f"| {name} | {prec} | {ms:.3f} | {gen_ms:.3f} | {row['ours_no_graph_ms']:.3f} | {row['launches']} | {eager:.3f} | "
                  f"{ro:.3f} | {eager / ms:.2f}x | {ro / ms:.2f}x |", flush=True)
            if "error" in mine:
                print(f"  ours failed: {mine['error']}", flush=True)
            else:
                print(f"  {mine.get('gemm', '')}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
