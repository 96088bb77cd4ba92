// The last step of the one-launch column reductions (codegen/templates/pointwise.h: the column
// product and the column sums). Every block has written its chunk's partial sums of its columns
// to sums[part · stride + column]; the last block of a column block to finish (a ticket after a
// fence) adds all the chunks' sums of its columns in a fixed order, so the result has the same
// bits every run whatever order the blocks ran in.
#pragma once

namespace pa {
namespace colreduce {

// Whether this block is the last of `parts` to take `ticket` (all threads get the answer; the
// last block's reads of the others' sums come after their fences). The caller resets the ticket.
__device__ __forceinline__ bool lastOfParts(unsigned* ticket, long long parts) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == parts - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// In the last block (256 threads): column threadIdx.x % CB of the block's, `col` in the sums
// (`inside`: within the matrix), its parts added by thread group h = threadIdx.x / CB (parts h,
// h + G, ... in order), then the G groups' sums in a fixed tree through `red` (256 doubles).
// Threads below CB return their column's sum.
template <int CB>
__device__ __forceinline__ double sumParts(const double* sums, long long parts, long long stride, long long col, bool inside,
                                           double* red) {
  constexpr int G = 256 / CB;
  const int h = threadIdx.x / CB;
  double s = 0.0;
  if (inside) {
#pragma unroll 8
    for (long long p = h; p < parts; p += G) s += __ldcg(sums + p * stride + col);
  }
  red[threadIdx.x] = s;
  for (int t = G / 2; t > 0; t >>= 1) {
    __syncthreads();
    if (h < t) red[threadIdx.x] += red[threadIdx.x + t * CB];
  }
  __syncthreads();
  return red[threadIdx.x];
}

}  // namespace colreduce
}  // namespace pa
