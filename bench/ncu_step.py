#!/usr/bin/env python3
"""Where one training step's GPU time goes, kernel by kernel, under Nsight Compute.

usage: ncu_step.py --bench build/bench/gpu_train_bench CONFIG [--set KEY=VALUE]... [--out DIR]
                   [--ncu /usr/local/cuda/bin/ncu] [--metrics M,...]
       ncu_step.py --summarize FILE.csv [--launches N]

The first form runs gpu_train_bench twice with a kernel and autotune cache of its own (DIR/cache):
once plainly, so that the start-up choices (GEMM providers, tiles) are measured without the
profiler and cached, and once under ncu, which then reads them from the cache and times the
launches of step 10 (the bench's warm-up steps are 10; one step is the bench's
`launches_per_step` launches, CUDA graphs off). It writes DIR/ncu.csv, DIR/launches.txt (one line a
launch) and DIR/kernels.txt (one line a kernel, its launches in the step added up, slowest
first), and prints the latter. The second form summarizes such a CSV again.

ncu's defaults hold: clocks locked to the base clock, caches flushed before each kernel, kernels
serialized. So every time is longer than in the step, most for kernels that read what the kernel
before them left in L2; read the table for shares and DRAM rates, and judge speed-ups in the step
(gpu_train_bench). A shared cache directory would take ncu's serialized timings into later runs'
start-up choices: keep DIR/cache to this script.
"""
import argparse
import collections
import csv
import io
import json
import os
import re
import subprocess
import sys

DEFAULT_METRICS = ("gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,"
                   "dram__throughput.avg.pct_of_peak_sustained_elapsed")
WARMUP_STEPS = 10  # gpu_train_bench's, before its timed steps


def number(text):
    text = text.replace(",", "")
    return float(text) if re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?", text) else None


def read_launches(csv_text):
    """[(id, kernel, grid, {metric: value})] in launch order, from ncu's --csv output."""
    rows = [line for line in csv_text.splitlines() if line.startswith('"')]
    launches = collections.OrderedDict()
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        key = int(r["ID"])
        if key not in launches:
            launches[key] = (r["Kernel Name"], r["Grid Size"], {})
        value = number(r["Metric Value"])
        if value is not None:
            launches[key][2][r["Metric Name"]] = value
    return [(k, name, grid, m) for k, (name, grid, m) in launches.items()]


def kernel_of(name):
    """A generated kernel's name without its 16-digit source hash (its launches group together)."""
    return re.sub(r"_[0-9a-f]{16}$", "", name)


def tables(launches):
    """The per-launch and the per-kernel tables, as lines of text."""
    def us(m):
        return m.get("gpu__time_duration.sum", 0.0) / 1000.0

    def mb(m, key):
        return m.get(key, 0.0) / 1e6

    total = sum(us(m) for _, _, _, m in launches) or 1.0
    per_launch = ["%-4s %-56s %-14s %9s %8s %8s %6s" % ("id", "kernel", "grid", "us", "rd MB", "wr MB", "dram%")]
    for i, name, grid, m in launches:
        per_launch.append("%-4d %-56s %-14s %9.2f %8.1f %8.1f %6.1f" % (
            i, name[:56], grid.replace(" ", ""), us(m), mb(m, "dram__bytes_read.sum"), mb(m, "dram__bytes_write.sum"),
            m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)))
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for _, name, _, m in launches:
        g = groups[kernel_of(name)]
        g[0] += 1
        g[1] += us(m)
        g[2] += mb(m, "dram__bytes_read.sum")
        g[3] += mb(m, "dram__bytes_write.sum")
    per_kernel = ["%-56s %8s %9s %7s %9s %9s" % ("kernel", "launches", "us", "share", "rd MB", "wr MB")]
    for name, (count, t, rd, wr) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        per_kernel.append("%-56s %8d %9.1f %6.1f%% %9.1f %9.1f" % (name[:56], count, t, 100.0 * t / total, rd, wr))
    per_kernel.append("%-56s %8d %9.1f" % ("total", len(launches), total))
    return per_launch, per_kernel


def run_step(args):
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, PA_KERNEL_CACHE_DIR=os.path.join(args.out, "cache"))
    sets = [x for s in args.set for x in ("--set", s)]
    plain = subprocess.run([args.bench, args.config] + sets + ["--steps", "1", "--reps", "1", "--no-cuda-graph"], env=env,
                           capture_output=True, text=True)
    if plain.returncode != 0:
        sys.exit("ncu_step: gpu_train_bench failed:\n" + plain.stderr)
    launches = json.loads(plain.stdout.strip().splitlines()[-1])["launches_per_step"]
    cmd = [args.ncu, "--metrics", args.metrics, "--launch-skip", str(WARMUP_STEPS * launches), "--launch-count", str(launches),
           "--csv", args.bench, args.config] + sets + ["--steps", "1", "--reps", "1", "--no-cuda-graph"]
    profiled = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if profiled.returncode != 0:
        sys.exit("ncu_step: ncu failed:\n" + profiled.stderr[-4000:])
    with open(os.path.join(args.out, "ncu.csv"), "w") as f:
        f.write(profiled.stdout)
    return profiled.stdout, launches


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?")
    ap.add_argument("--bench", default="build/bench/gpu_train_bench")
    ap.add_argument("--set", action="append", default=[], help="a config override, as gpu_train_bench's --set")
    ap.add_argument("--out", default="ncu_step_out")
    ap.add_argument("--ncu", default="/usr/local/cuda/bin/ncu")
    ap.add_argument("--metrics", default=DEFAULT_METRICS)
    ap.add_argument("--summarize", help="an ncu --csv file to summarize instead of running")
    ap.add_argument("--launches", type=int, default=0, help="with --summarize: only the first N launches (one step)")
    args = ap.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            launches = read_launches(f.read())
        if args.launches > 0:
            launches = launches[:args.launches]
        print("\n".join(tables(launches)[1]))
        return
    if not args.config:
        ap.error("a config file, or --summarize FILE")
    text, count = run_step(args)
    launches = read_launches(text)
    if len(launches) != count:
        print("ncu_step: %d launches profiled, %d expected (one step)" % (len(launches), count), file=sys.stderr)
    per_launch, per_kernel = tables(launches)
    with open(os.path.join(args.out, "launches.txt"), "w") as f:
        f.write("\n".join(per_launch) + "\n")
    with open(os.path.join(args.out, "kernels.txt"), "w") as f:
        f.write("\n".join(per_kernel) + "\n")
    print("\n".join(per_kernel))


if __name__ == "__main__":
    main()
