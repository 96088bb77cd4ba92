#!/usr/bin/env bash
# Writes the generated CUDA source of every example config's training step, for each precision
# and GEMM provider setting, into OUT/<config>-<precision>-<gemm>/ (train --dump-kernels, no GPU
# needed). Refactors diff two such trees to show that generated kernels did not change.
# Usage: scripts/dump_all_kernels.sh TRAIN_BINARY OUT
set -euo pipefail
train=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
for cfg in "$root"/configs/*.yaml "$root"/tests/configs/*.yaml; do
  name=$(basename "$cfg" .yaml)
  for precision in fp32 tf32 bf16; do
    for gemm in generated auto; do
      dir="$out/$name-$precision-$gemm"
      mkdir -p "$dir"
      "$train" --config "$cfg" --device cpu --steps 0 --progress none --set precision=$precision \
        --set compiler.gemm=$gemm --dump-kernels "$dir" >/dev/null 2>"$dir.err" || echo "$name $precision $gemm: exit $?" >>"$out/failures.txt"
    done
  done
done
