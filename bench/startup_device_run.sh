#!/bin/bash
# Start-up of every example config on the GPU machine (issue 28's targets: first step < 1 s with a
# warm cache, < 5 s cold): `train --steps 2 --verbose` with a fresh kernel cache (cold: kernels and
# GEMM choices measured), then again (warm). Wall time of the whole process and the --verbose
# start-up line. Usage: bench/startup_device_run.sh TRAIN_BINARY OUT_DIR
set -u
train=$1
out=$2
mkdir -p "$out"
for c in configs/*.yaml; do
  name=$(basename "$c" .yaml)
  dir=$(mktemp -d)
  for pass in cold warm; do
    t0=$(date +%s.%N)
    PA_KERNEL_CACHE_DIR=$dir "$train" --config "$c" --device cuda --steps 2 --verbose --progress none > "$out/startup_${name}_$pass.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    printf '%-16s %-5s rc=%d wall %6.2f s  %s\n' "$name" "$pass" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" \
      "$(grep -o 'start-up .*' "$out/startup_${name}_$pass.log" | head -1)"
  done
  rm -rf "$dir"
done
