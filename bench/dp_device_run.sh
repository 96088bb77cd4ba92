#!/usr/bin/env bash
# Issue 29 on the GPU machine: data-parallel training through NCCL. Run from the repository root
# (configs/ is read from here) with the binaries in $B (default /tmp/b): train, libpa_mpi.so
# (beside train: a multi-rank launch loads it) and tests/gpu's nccl_gpu_tests; logs go to $OUT.
#   1. the one-rank NCCL test (ctest label gpu; needs no mpirun),
#   2. attn_block and tiny_gpt with --distributed (one-rank NCCL) against the plain run,
#   3. with 2 GPUs and mpirun: 2 ranks against 1 rank on the same global batches, and step-time
#      scaling from 1 to 2 GPUs at a fixed per-GPU batch.
# NCCL comes from $PA_NCCL_LIBRARY, else PyTorch's nvidia-nccl wheel. Without mpirun, Open MPI is
# unpacked from $OMPI_TARBALL (a tar.xz of Debian's openmpi-bin and the libraries it needs, made on
# the build machine) when given; else step 3 is skipped with a note. The script keeps going after
# a failure and ends with a summary.
set -uo pipefail
B=${B:-/tmp/b}
OUT=${OUT:-/tmp/dp_out}
STEPS=${STEPS:-200}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PA_SOURCE_DIR="$PWD"
export PA_KERNEL_CACHE_DIR="${PA_KERNEL_CACHE_DIR:-$OUT/kernel-cache}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

if [ -z "${PA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -f "$lib" ] || lib=$(find / -xdev -name libnccl.so.2 2>/dev/null | head -1)
  [ -n "$lib" ] && export PA_NCCL_LIBRARY="$lib"
fi
note "NCCL: ${PA_NCCL_LIBRARY:-not found}"
nvidia-smi -L >"$OUT/gpus.txt" 2>&1
NGPU=$(grep -c '^GPU ' "$OUT/gpus.txt")
note "GPUs: $NGPU ($(head -1 "$OUT/gpus.txt"))"

# 1. The one-rank NCCL test.
"$B/nccl_gpu_tests" >"$OUT/nccl_gpu_tests.log" 2>&1
note "nccl_gpu_tests: exit $? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/nccl_gpu_tests.log" | tr '\n' ' '))"
grep -E '^  (sine_attention|attn_block):' "$OUT/nccl_gpu_tests.log" | tee -a "$SUMMARY"

# ms/step from a run's summary line "done: N steps in ... (X ms/step)".
msPerStep() { sed -n 's/^done: .*(\([0-9.]*\) ms\/step).*/\1/p' "$1" | head -1; }
# The largest relative difference of two metrics files' losses (column 2), and the last step's.
compareLosses() {
  python3 - "$1" "$2" <<'PY'
import csv, sys
a = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
b = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[2]))]
n = min(len(a), len(b))
rel = [abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a[:n], b[:n])]
print(f"{n} steps: loss max rel diff {max(rel):.3g} (first 10 steps {max(rel[:10]):.3g}); last {a[n-1]:.6e} vs {b[n-1]:.6e}")
PY
}

# 2. One rank through NCCL against the plain run.
for cfg in attn_block tiny_gpt; do
  "$B/train" -c "configs/$cfg.yaml" --device cuda --steps "$STEPS" --progress none --metrics "$OUT/${cfg}_plain.csv" \
    >"$OUT/${cfg}_plain.log" 2>&1
  "$B/train" -c "configs/$cfg.yaml" --device cuda --steps "$STEPS" --progress none --distributed \
    --metrics "$OUT/${cfg}_nccl1.csv" >"$OUT/${cfg}_nccl1.log" 2>&1
  note "$cfg, 1 GPU: plain $(msPerStep "$OUT/${cfg}_plain.log") ms/step, --distributed (NCCL) $(msPerStep "$OUT/${cfg}_nccl1.log") ms/step; $(compareLosses "$OUT/${cfg}_plain.csv" "$OUT/${cfg}_nccl1.csv" 2>&1)"
done

# 3. Two GPUs.
if [ "$NGPU" -lt 2 ]; then
  note "one GPU: the 2-rank runs need a machine with 2 (nvidia-h100-x2)"
  exit 0
fi
if ! command -v mpirun >/dev/null && [ -f "${OMPI_TARBALL:-}" ]; then
  # Debian's Open MPI and the libraries it needs, at their own paths; files already there stay.
  xz -dc "$OMPI_TARBALL" | tar -C / --skip-old-files -xf - >"$OUT/openmpi-install.log" 2>&1
  note "unpacked Open MPI from $OMPI_TARBALL: exit $? ($(mpirun --version 2>&1 | head -1))"
fi
if ! command -v mpirun >/dev/null; then
  note "no mpirun: the 2-rank runs are skipped (carry Debian's Open MPI as OMPI_TARBALL, or install openmpi-bin)"
  exit 0
fi
MPI=(mpirun --allow-run-as-root --bind-to none -np 2 -x LD_LIBRARY_PATH -x PA_SOURCE_DIR -x PA_KERNEL_CACHE_DIR -x NCCL_NVLS_ENABLE=0)
[ -n "${PA_NCCL_LIBRARY:-}" ] && MPI+=(-x PA_NCCL_LIBRARY)
for cfg in attn_block tiny_gpt; do
  batch=$(sed -n 's/^ *batch_size: *\([0-9]*\).*/\1/p' "configs/$cfg.yaml" | head -1)
  # 2 ranks against 1 on the same global batch (the config's): equal within rounding.
  "${MPI[@]}" "$B/train" -c "configs/$cfg.yaml" --device cuda --steps "$STEPS" --progress none \
    --metrics "$OUT/${cfg}_2ranks.csv" >"$OUT/${cfg}_2ranks.log" 2>&1
  note "$cfg, 2 ranks (exit $?), global batch $batch: $(compareLosses "$OUT/${cfg}_plain.csv" "$OUT/${cfg}_2ranks.csv" 2>&1); $(grep -h 'parameters identical' "$OUT/${cfg}_2ranks.log")"
  # Scaling at a fixed per-GPU batch: 1 GPU with the config's batch, 2 GPUs with twice it.
  "${MPI[@]}" "$B/train" -c "configs/$cfg.yaml" --device cuda --steps "$STEPS" --progress none \
    --set "train.batch_size=$((2 * batch))" >"$OUT/${cfg}_2ranks_scaled.log" 2>&1
  one=$(msPerStep "$OUT/${cfg}_plain.log")
  two=$(msPerStep "$OUT/${cfg}_2ranks_scaled.log")
  note "$cfg scaling at $batch rows per GPU: 1 GPU $one ms/step, 2 GPUs $two ms/step: throughput x$(python3 -c "print(f'{2 * $one / $two:.2f}')" 2>/dev/null)"
done
