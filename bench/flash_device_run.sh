#!/usr/bin/env bash
# One device-machine pass over the flash attention work: GPU tests, compute-sanitizer on a small
# configuration, forward tile sweep and the side-by-side benchmark. Logs go to $OUT (or ./out).
# usage: bench/flash_device_run.sh BUILD_DIR [tests] [sanitize] [fp64mma] [fp64bench] [fp32default] [fp32bench] [f64ncu] [tune] [f32tune] [f32bwdtune] [bwdtune] [bench] [quick] | all
#   fp64mma: the fp64Mma path's first pass: the throughput probe, its tests (every *f64mma* case
#   and the tests that loop over precisions), memcheck on one case. fp64bench: the fp32 seeds'
#   benchmark (with the fp64mma table) and S = 4096 with 4- and 8-warp fp64Mma forward blocks.
#   (Each fits one device call of 600 s; run them as two calls.)
#   fp32default: the fp32 default (forward on the FP64 tensor cores, backward on FFMA): the probe,
#   every flash GPU test and the graph's attention GPU tests. fp32bench: the fp32 seeds' benchmark
#   (default, FFMA, TF32 and fp64Mma tables) and the forward sweep behind kAuto's grid rule.
#   f64ncu: Nsight Compute on the fp64Mma forward and dK/dV kernels.
set -u
B=${1:-build}; shift
OUT=${OUT:-out}; mkdir -p "$OUT"
want() { [[ " $* " == *" all "* ]] || [[ " $ARGS " == *" $1 "* ]]; }
ARGS=" $* "
T=$B/tests/gpu/flash_gpu_tests
LIB=$B/bench/libpa_flash_bench.so
if want tests; then
  timeout 330 "$T" > "$OUT/gpu.log" 2>&1
  grep -E "^\[  FAILED|PASSED|tests ran" "$OUT/gpu.log" | head -30
  grep -E "Failure" -A4 "$OUT/gpu.log" | head -30
fi
if want sanitize; then
  F='AllMasks/FlashMaskSweep.*/bf16_mask6_shape2:AllMasks/FlashMaskSweep.*/f32_mask6_shape2:AllMasks/FlashMaskSweep.*/f16_mask4_shape4:FlashAttentionGpu.PersistentForwardSeveralItemsABlock:FlashAttentionGpu.PersistentBackwardSeveralItemsABlock'
  timeout 120 compute-sanitizer --tool memcheck "$T" --gtest_filter="$F" > "$OUT/memcheck.log" 2>&1; tail -2 "$OUT/memcheck.log"
  timeout 150 compute-sanitizer --tool racecheck "$T" --gtest_filter="$F" > "$OUT/racecheck.log" 2>&1; tail -2 "$OUT/racecheck.log"
fi
if want fp64mma; then
  timeout 60 "$B/bench/fp64_mma_probe" > "$OUT/fp64_probe.log" 2>&1; cat "$OUT/fp64_probe.log"
  F='*f64mma*:FlashAttentionGpu.*'
  timeout 300 "$T" --gtest_filter="$F" > "$OUT/gpu_fp64mma.log" 2>&1
  grep -E "^\[  FAILED|PASSED|tests ran" "$OUT/gpu_fp64mma.log" | head -30
  grep -E "Failure" -A4 "$OUT/gpu_fp64mma.log" | head -30
  timeout 120 compute-sanitizer --tool memcheck "$T" --gtest_filter='AllMasks/FlashMaskSweep.*/f64mma_mask6_shape2' \
    > "$OUT/memcheck_fp64mma.log" 2>&1; tail -2 "$OUT/memcheck_fp64mma.log"
fi
if want fp64bench; then
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp32 --out "$OUT/bench_fp32.md" \
    > "$OUT/bench_fp32.log" 2>&1
  cat "$OUT/bench_fp32.md"
  for w in 4 8; do
    PA_FLASH_F64_FWD_WARPS=$w timeout 60 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp64tune 2>&1 | grep fp64tune
  done
fi
if want fp32default; then
  timeout 60 "$B/bench/fp64_mma_probe" > "$OUT/fp64_probe.log" 2>&1; cat "$OUT/fp64_probe.log"
  timeout 330 "$T" > "$OUT/gpu.log" 2>&1
  grep -E "^\[  FAILED|PASSED|tests ran" "$OUT/gpu.log" | head -30
  grep -E "Failure" -A4 "$OUT/gpu.log" | head -30
  timeout 150 "$B/tests/gpu/graph_gpu_tests" --gtest_filter='*Attention*:*Flash*:*Trains*:*Tracks*' > "$OUT/graph_gpu.log" 2>&1
  grep -E "^\[  FAILED|PASSED|tests ran" "$OUT/graph_gpu.log" | head -30
fi
if want fp32bench; then
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp32 --out "$OUT/bench_fp32.md" \
    > "$OUT/bench_fp32.log" 2>&1
  cat "$OUT/bench_fp32.md"
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp64sweep 2>&1 | tee "$OUT/fp64sweep.log" | grep fp64sweep
fi
if want f64ncu; then  # Nsight Compute on the fp64Mma forward and dK/dV kernels (b4 h16 s4096 d64)
  PA_FLASH_FP64MMA=1 timeout 240 ncu --clock-control none --kernel-name regex:f64mma --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section InstructionStats --section SchedulerStats --section Occupancy \
    --section LaunchStats python3 bench/attention_vs_torch.py --lib "$LIB" --only probe > "$OUT/ncu_f64mma.txt" 2>&1
  grep -E "f64mma|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Pipe|Stall|No Eligible|Registers|Achieved Occupancy" \
    "$OUT/ncu_f64mma.txt" | head -60
fi
if want tune; then
  for cfg in "32 2" "64 2" "64 1"; do
    set -- $cfg
    PA_FLASH_FWD_TILE=$1 PA_FLASH_FWD_MT=$2 timeout 60 python3 bench/attention_vs_torch.py --lib "$LIB" --only tune 2>&1 | grep tune
  done
fi
if want f32tune; then  # forward R sweep, then backward R sweep (forward left to its heuristic)
  for r in 1 2 4 8 auto; do
    if [ $r = auto ]; then unset PA_FLASH_F32_FWD_R; else export PA_FLASH_F32_FWD_R=$r; fi
    timeout 100 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp32 2>&1 | grep "^| [0-9]" | sort -u | sed "s/^/fwd R=$r /"
  done
  unset PA_FLASH_F32_FWD_R
  for r in 1 2 4 auto; do
    if [ $r = auto ]; then unset PA_FLASH_F32_BWD_R; else export PA_FLASH_F32_BWD_R=$r; fi
    timeout 100 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp32 2>&1 | grep "^| [0-9]" | sort -u | sed "s/^/bwd R=$r /"
  done
  unset PA_FLASH_F32_BWD_R
fi
if want f32bwdtune; then
  for r in 1 2 4 auto; do
    if [ $r = auto ]; then unset PA_FLASH_F32_BWD_R; else export PA_FLASH_F32_BWD_R=$r; fi
    timeout 100 python3 bench/attention_vs_torch.py --lib "$LIB" --only fp32 2>&1 | grep "^| [0-9]" | sort -u | sed "s/^/bwd R=$r /"
  done
  unset PA_FLASH_F32_BWD_R
fi
if want bwdtune; then
  for cfg in "0 2" "0 1" "1 2"; do
    set -- $cfg
    PA_FLASH_ATOMIC_DQ=$1 PA_FLASH_DQ_MT=$2 timeout 90 python3 bench/attention_vs_torch.py --lib "$LIB" --only bwdtune 2>&1 | grep bwdtune
  done
fi
if want bench; then
  Q=""; want quick && Q="--quick"
  PYTHONUNBUFFERED=1 timeout 280 python3 bench/attention_vs_torch.py --lib "$LIB" $Q --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1
  cat "$OUT/bench.md"
fi
