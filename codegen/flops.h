// The model FLOPs of a training step, counted on its graph (for TFLOP/s in gpu_train_bench and
// --compare).
#pragma once

#include "graph/graph.h"

namespace pa::codegen {

// Note on what counts. The model FLOPs of a step are those of its forward pass (the nodes the
// graph output "loss" depends on; every node where there is no such output) times the usual
// factors, whatever the backward actually runs. A GEMM node (matmul, fused-linear) counts
// 2·M·N·K (batched: times the batch) times 3, so a linear layer makes 6 × weights × tokens, its
// input gradient counted even where the first layer needs none. A flash-attention node counts
// 4·B·Hq·D per visible query-key pair (QKᵀ and PV; a causal mask about halves the pairs, a
// window counts what it leaves) times 3.5, the backward's five products (the recomputed QKᵀ
// among them) being 2.5 times the forward's, as FlashAttention's papers count. Elementwise work,
// norms, softmax, the loss and Adam are not counted. An unfused attention's products are matmul
// nodes over every pair, masked or not: compare rates of one model on its fused graph's count
// (as --compare does).
double modelFlops(const Graph& g);

}  // namespace pa::codegen
