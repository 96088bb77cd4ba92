#!/usr/bin/env bash
# Peak activation memory of one sine_attention training step, fused against unfused, at
# S = 1024, 2048, 4096 (issue 3). Batch 1: at batch 32 the unfused graph's S×S scores alone
# would take 8 GiB per tensor at S = 4096, more than the 2-core machine's memory allows for
# the several such tensors a step keeps. Prints one table row per S.
set -euo pipefail
cd "$(dirname "$0")/.."
train=${TRAIN:-./build/train}
echo "| S | fused peak activation memory | unfused peak activation memory | fused nodes | unfused nodes | fused ms/step | unfused ms/step | compare |"
echo "|---|---|---|---|---|---|---|---|"
for s in 1024 2048 4096; do
  out=$("$train" --config configs/sine_attention.yaml --compare --steps 2 \
        --set data.window=$s --set "model.input=[$s, 1]" --set data.samples=64 --set train.batch_size=1 --set train.log_every=1)
  mem=$(grep "peak activation memory" <<<"$out" | awk '{print $4" "$5"|"$6" "$7}')
  nodes=$(grep "nodes per step" <<<"$out" | awk '{print $4"|"$5}')
  ms=$(grep "time per step" <<<"$out" | awk '{print $5"|"$6}')
  verdict=$(tail -1 <<<"$out" | cut -d: -f1)
  echo "| $s | ${mem%%|*} | ${mem##*|} | ${nodes%%|*} | ${nodes##*|} | ${ms%%|*} | ${ms##*|} | $verdict |"
done
