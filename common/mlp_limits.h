// The shapes a fused-mlp node may have: every target runs them (the CUDA kernels keep one layer's
// weights and a tile of rows of every width in shared memory), so shape inference refuses wider
// or deeper nodes and fuse-mlp builds none (a config that trains on the CPU trains on the GPU).
#pragma once

#include <cstdint>

namespace pa {

// Widest layer input or output (K_i, N_i): a 128 × 129 fp32 weight tile is 66 KB of shared memory.
constexpr int64_t kMlpMaxWidth = 128;
// Most layers in one node (the node takes x, then a weight and a bias per layer).
constexpr int64_t kMlpMaxLayers = 16;

}  // namespace pa
