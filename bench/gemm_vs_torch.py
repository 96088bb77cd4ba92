#!/usr/bin/env python3
"""PyTorch beside bench/gemm_bench: the same shapes through torch.matmul (cuBLAS), fp32 with
TF32 off and on, and bf16 (bf16 outputs; fp32 accumulation in cuBLAS), timed the same way (CUDA
events around 20 queued calls, so Python's launch cost hides behind the kernels; warm-up, median of
30 samples, rotating input sets below 200 MB), then the ratio torch_ms / ours_ms (1.0 = as fast as
cuBLAS; the issue-6 bar is 0.9).

    gemm_vs_torch.py gemm_bench.csv
"""
import csv
import statistics
import sys

import torch


QUEUED = 20  # calls between one pair of events (as gemm_bench's kQueued)


def time_ms(fn, sets, warmup=5, reps=30):
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    times = []
    for i in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for q in range(QUEUED):
            fn(*sets[(i * QUEUED + q) % len(sets)])
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / QUEUED)
    return statistics.median(times)


def torch_case(m, n, k, ta, tb, fused, dtype, name=""):
    """The inputs in our layout and the PyTorch call that computes the same node."""
    def rand(*shape):
        return torch.empty(*shape, device="cuda").uniform_(-1, 1).to(dtype)
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    nbytes = 4 * (m * k + k * n + (n if fused else 0))
    count = 3 if nbytes < (200 << 20) else 1
    sets = [(rand(*a_shape), rand(*b_shape), rand(n)) for _ in range(count)]
    if name == "swiglu_fwd":  # the pre-activations' (gate, up) column pairs: silu(gate) * up
        def swiglu(a, b, bias):
            pre = torch.matmul(a, b)
            return torch.nn.functional.silu(pre[:, 0::2]) * pre[:, 1::2]
        return swiglu, sets
    if name.endswith("_dXrelu") or name.endswith("_dXgelu"):  # matmul-act-grad: dY·Wᵀ times act'(x)
        sets = [(a, b, rand(m, n)) for a, b, _ in sets]
        if name.endswith("_dXrelu"):
            return (lambda a, b, x: torch.ops.aten.threshold_backward(torch.matmul(a, b.t()), x, 0.0)), sets
        return (lambda a, b, x: torch.ops.aten.gelu_backward(torch.matmul(a, b.t()), x)), sets
    if name.endswith("_dWdb"):  # matmul-bias-grad: Xᵀ·dY and dY's column sums
        return (lambda a, b, bias: (torch.matmul(a.t(), b), b.sum(0, dtype=torch.float32))), sets
    if fused:
        return (lambda a, b, bias: torch.relu(torch.addmm(bias, a, b.t() if tb else b))), sets
    return (lambda a, b, bias: torch.matmul(a.t() if ta else a, b.t() if tb else b)), sets


def main():
    rows = list(csv.DictReader(open(sys.argv[1] if len(sys.argv) > 1 else "gemm_bench.csv")))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    torch_ms = {}
    for r in rows:
        key = (r["name"], r["precision"])
        if key in torch_ms:
            continue
        torch.backends.cuda.matmul.allow_tf32 = r["precision"] == "tf32"
        dtype = torch.bfloat16 if r["precision"] == "bf16" else torch.float32
        fn, sets = torch_case(int(r["m"]), int(r["n"]), int(r["k"]), r["ta"] == "1", r["tb"] == "1", r["fused"] == "1", dtype,
                              r["name"])
        torch_ms[key] = time_ms(fn, sets)
        del sets
    print()
    print(f"{'shape':15} {'prec':5} {'variant':34} {'ours ms':>9} {'TFLOP/s':>8} {'torch ms':>9} {'TFLOP/s':>8} {'ratio':>6}")
    for r in rows:
        t = torch_ms[(r["name"], r["precision"])]
        flops = 2.0 * int(r["m"]) * int(r["n"]) * int(r["k"])
        ours = float(r["ms"])
        print(f"{r['name']:15} {r['precision']:5} {r['variant']:34} {ours:9.4f} {float(r['tflops']):8.1f} {t:9.4f} "
              f"{flops / t / 1e9:8.1f} {t / ours:6.2f}")


if __name__ == "__main__":
    main()
