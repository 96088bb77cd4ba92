// The description of a TMA tensor map that a generated kernel takes as an argument; the runtime
// encodes it through the driver (runtime/cuda/tensor_map.h).
#pragma once

#include <cstdint>

namespace pa::codegen {

// A 16-bit (elementBytes 2) or fp32 (4) tensor as a kernel's TMA copies see it: `rank` (3 or 4)
// dimensions, innermost first, the byte strides of dimensions 1 and up, and the box one copy
// moves. Maps are encoded with 128-byte swizzle and zero fill out of range (what
// kernels/gemm_wgmma.cuh and the wgmma flash forward expect).
struct TensorMapSpec {
  uint32_t rank = 3;
  uint64_t dims[4] = {1, 1, 1, 1};
  uint64_t strideBytes[3] = {16, 16, 16};
  uint32_t box[4] = {1, 1, 1, 1};
  uint32_t elementBytes = 2;
};

}  // namespace pa::codegen
