// The description of a TMA tensor map that a generated kernel takes as an argument; the runtime
// encodes it through the driver (runtime/cuda/tensor_map.h).
#pragma once

#include <cstdint>

namespace pa::codegen {

// A bf16 (elementBytes 2) or fp32 (4) tensor as a kernel's TMA copies see it: three dimensions,
// innermost first, the byte strides of dimensions 1 and 2, and the box one copy moves. Maps are
// encoded with 128-byte swizzle and zero fill out of range (what kernels/gemm_wgmma.cuh expects).
struct TensorMapSpec {
  uint64_t dims[3] = {1, 1, 1};
  uint64_t strideBytes[2] = {16, 16};
  uint32_t box[3] = {1, 1, 1};
  uint32_t elementBytes = 2;
};

}  // namespace pa::codegen
