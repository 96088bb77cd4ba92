// Row reductions of the normalisation kernels (codegen/templates/norm.h: LayerNorm, RmsNorm and
// their gradients), in a header so that a program holding many of those kernels defines them once.
/*
 * Note on the row sums. A row belongs to T threads: a warp (T = 32, several rows per block) or the
 * whole block (T = blockDim.x, one row per block, for wide rows). rowSum2 adds two floats over the
 * row: a butterfly of shuffles inside each warp, then (T > 32) the warps' partials through shared
 * memory, added in warp order, so every thread of the row ends with the same bits and the result
 * does not depend on scheduling. Trap: `sh` (2 * (T / 32) floats) is reused by the next call; its
 * first barrier keeps a fast warp from overwriting partials a slow one still reads.
 */
#pragma once

namespace pa {
namespace norm {

template <int T>
__device__ __forceinline__ void rowSum2(float& a, float& b, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if (T > 32) {
    const int w = threadIdx.x / 32;
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
      sh[w] = a;
      sh[T / 32 + w] = b;
    }
    __syncthreads();
    a = 0.0f;
    b = 0.0f;
#pragma unroll
    for (int i = 0; i < T / 32; ++i) {
      a += sh[i];
      b += sh[T / 32 + i];
    }
  }
}

}  // namespace norm
}  // namespace pa
