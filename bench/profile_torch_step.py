#!/usr/bin/env python3
"""Where PyTorch's training step spends its GPU time: the kernels of N steps of one anchor model
(bench/train_vs_torch.py's definitions), by torch.profiler, grouped and per step.

usage: profile_torch_step.py [--model attn_block] [--precision fp32] [--mode eager|reduce-overhead]
"""
import argparse
import collections

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from train_vs_torch import MODELS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="attn_block")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--mode", default="eager")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    factory, xs, ys, lr = MODELS[a.model]
    torch.manual_seed(0)
    model = factory().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    x, y = torch.randn(xs, device="cuda"), torch.randn(ys, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()

    fn = step if a.mode == "eager" else torch.compile(step, mode="reduce-overhead")
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            fn()
        torch.cuda.synchronize()
    per = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / 1000.0 / a.steps  # ms per step
    total = sum(per.values())
    print(f"{a.model} {a.precision} {a.mode}: {total:.3f} ms of kernels per step")
    for name, ms in per.most_common(25):
        print(f"  {ms:8.4f} ms  {100 * ms / total:5.1f}%  {name[:110]}")


if __name__ == "__main__":
    main()
