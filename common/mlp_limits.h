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

// Where fuse-mlp builds the node: the rows a step runs through the chain (the input's elements
// over its width) at most mlpMaxRows(widest layer input or output, whether the layers' products
// would run on 16-bit tensor cores). Beyond, the separate layers' GEMMs are faster: the node's
// FFMA products against the tensor cores' (bf16, TF32) or the FP64 tensor cores' (fp32). The
// limits are the training step's measured crossovers on the H200 (bench/RESULTS.md, thirty-first
// session): 64 wide, fused faster up to 8,192 rows in every precision (16,384 in fp32); wider,
// up to 1,024 rows in fp32 and TF32 (2,048 in fp32), while in bf16 the layers were as fast at
// 512-1,024 rows and 11-17 % faster at 256.
constexpr int64_t kMlpNarrowWidth = 64;
constexpr int64_t kMlpNarrowMaxRows = 8192;
constexpr int64_t kMlpWideMaxRows = 1024;
inline int64_t mlpMaxRows(int64_t widest, bool operands16Bit) {
  return widest <= kMlpNarrowWidth ? kMlpNarrowMaxRows : operands16Bit ? 0 : kMlpWideMaxRows;
}

// fused-mlp-train runs a tile's forward and backward back to back, so the CUDA kernel keeps every
// layer's weights and biases in shared memory at once: at most this many floats by
// mlpTrainLayerFloats, which counts each weight row padded by the most the emitter pads it (to a
// bank-friendly stride). sm_80's 163 KB of shared memory, less 1 KB and the tile buffers of a
// 16-layer node 128 wide at one row, is 38,832 floats.
constexpr int64_t kMlpTrainMaxFloats = 37 * 1024;
inline int64_t mlpTrainLayerFloats(int64_t k, int64_t n, bool bias) { return k * (n + 36) + (bias ? n + 8 : 0); }

}  // namespace pa
