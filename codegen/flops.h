// The model FLOPs of a training step, counted on its graph (for TFLOP/s in gpu_train_bench and
// --compare), each node's work, and the GPU runner's second-stream nodes chosen by it.
#pragma once

#include <vector>

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

// The tensor-core work node `id` itself does, in the same units: 2·M·N·K (times the batch) for a
// GEMM node of any kind (matmul, fused-linear, their gradients), 4·B·Hq·D per visible pair for a
// flash-attention forward and 2.5 times that for its gradient; 0 for everything else. For the GPU
// runner's rough scheduling choices.
double nodeFlops(const Graph& g, NodeId id);

// A product beside the chain pays where the chain's products after it do at least this many
// times its work (else it runs mostly alone, behind a fork and a join), and up to
// kSecondStreamMaxFlops (the default limit; bench/RESULTS.md, "A second stream for the backward's
// branches").
constexpr double kSecondStreamChainRatio = 4;
constexpr double kSecondStreamMaxFlops = 8e9;
// The nodes the GPU runner queues on its second stream (CudaRunnerOptions::sideStream): the
// backward's leaves (gradientLeafNodes), less the products whose work is above `maxFlops` (0: no
// limit; a larger one fills the GPU by itself and only takes the chain's multiprocessors) or
// above 1 / kSecondStreamChainRatio of the work of the products after it on the step's stream.
// Closed under consumers: whatever reads a second-stream node's results is one too. Indexed by
// NodeId.
std::vector<char> secondStreamNodes(const Graph& g, double maxFlops);

}  // namespace pa::codegen
