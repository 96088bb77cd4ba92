// Row access and row reductions of the normalisation kernels (codegen/templates/norm.h: LayerNorm,
// RmsNorm and their gradients), in a header so that a program holding many of those kernels
// defines them once.
/*
 * Note on the row layout. A row of F features is cut into chunks of N consecutive features, N = 8,
 * 4 or 1 (codegen picks one that divides F). The row belongs to T threads, whole warps: W rows
 * of a block of W·T threads (T = 32, 64 or 128 with W = 256 / T), or one row per block for wide
 * rows (W = 1, T = blockDim.x). Thread `lane` holds chunks lane + k·T (k < V) in registers, so a
 * warp's access covers 32·N consecutive features, one chunk per lane:
 *
 *     features  | 0 .. N-1 | N .. 2N-1 | ... | 31N .. 32N-1 | 32N .. 33N-1 | ...
 *     lane, k   |  0, 0    |   1, 0    | ... |    31, 0     |    0, 1      | ...   (T = 32)
 *
 * Chunks at or past F (the last k of a row whose chunk count is not a multiple of T) are skipped
 * whole: N divides F, so a chunk is either all in the row or all past it.
 *
 * Note on vector access. load and store move a chunk in 16-byte accesses (bf16 chunks of 4: one
 * 8-byte access) when `vec` is set, else one element at a time. Both give the same values and the
 * same rounding (cvt.rn to bf16), so a kernel's results do not depend on which ran. A kernel
 * compiles its row code for both (a template on `vec`) and picks one per block by checking that
 * every tensor it moves in chunks starts at a multiple of 16 bytes (allAligned16); the runner
 * places every tensor at a multiple of 256 bytes, but the kernels do not rely on it. Given that,
 * a chunk at element offset row·F + c·N (or c·N in a per-feature tensor such as the gain) is
 * aligned to its access width, since N divides F and the width divides N·sizeof(element).
 *
 * Note on the row sums. rowSum2 adds two floats over the row's T threads: a butterfly of shuffles
 * inside each warp, then (T > 32) the warps' partials through shared memory, added in warp order,
 * so every thread of the row ends with the same bits and the result does not depend on scheduling.
 * With one row per block the barriers are __syncthreads; with W > 1 rows of T > 32 threads, row r
 * of the block waits on named barrier 1 + r over its T threads only, so a row that has left (past
 * the last row) or runs ahead never blocks another. Trap: the row's slice of `sh` (2 * (T / 32)
 * floats) is reused by the next call; its first barrier keeps a fast warp from overwriting
 * partials a slow one still reads.
 */
#pragma once

#include "kernels/storage.cuh"

namespace pa {
namespace norm {

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }
__device__ __forceinline__ bool aligned16(pa_bf16_in x) { return aligned16(x.p); }
__device__ __forceinline__ bool aligned16(pa_bf16_out x) { return aligned16(x.p); }
// Every argument starts at a multiple of 16 bytes.
template <class... A>
__device__ __forceinline__ bool allAligned16(A... a) {
  return (aligned16(a) && ...);
}

// v = the N elements at p + i, as float (i a multiple of N; vector accesses when `vec`).
template <int N>
__device__ __forceinline__ void load(const float* __restrict__ p, long long i, float (&v)[N], bool vec) {
  if constexpr (N % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int e = 0; e < N; e += 4) {
        const float4 q = *reinterpret_cast<const float4*>(p + i + e);
        v[e] = q.x;
        v[e + 1] = q.y;
        v[e + 2] = q.z;
        v[e + 3] = q.w;
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = p[i + e];
}

// bf16 pairs in a 32-bit word, the lower address in the low half.
__device__ __forceinline__ float bf16Lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16Hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

template <int N>
__device__ __forceinline__ void load(pa_bf16_in x, long long i, float (&v)[N], bool vec) {
  if constexpr (N % 8 == 0) {
    if (vec) {
#pragma unroll
      for (int e = 0; e < N; e += 8) {
        const uint4 q = *reinterpret_cast<const uint4*>(x.p + i + e);
        v[e] = bf16Lo(q.x);
        v[e + 1] = bf16Hi(q.x);
        v[e + 2] = bf16Lo(q.y);
        v[e + 3] = bf16Hi(q.y);
        v[e + 4] = bf16Lo(q.z);
        v[e + 5] = bf16Hi(q.z);
        v[e + 6] = bf16Lo(q.w);
        v[e + 7] = bf16Hi(q.w);
      }
      return;
    }
  } else if constexpr (N % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int e = 0; e < N; e += 4) {
        const uint2 q = *reinterpret_cast<const uint2*>(x.p + i + e);
        v[e] = bf16Lo(q.x);
        v[e + 1] = bf16Hi(q.x);
        v[e + 2] = bf16Lo(q.y);
        v[e + 3] = bf16Hi(q.y);
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) v[e] = x[i + e];
}

// Global p[i .. i + N) = v (i a multiple of N; vector accesses when `vec`). The vector stores are
// PTX: NVVM may split a plain 16-byte store into 32-bit ones. Their "memory" clobber keeps every
// other access in program order, so a kernel issues a phase's loads before its stores.
__device__ __forceinline__ void stGlobal(void* p, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void stGlobal(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void stGlobal(void* p, unsigned a, unsigned b) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}

template <int N>
__device__ __forceinline__ void store(float* __restrict__ p, long long i, const float (&v)[N], bool vec) {
  if constexpr (N % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int e = 0; e < N; e += 4) stGlobal(p + i + e, v[e], v[e + 1], v[e + 2], v[e + 3]);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) p[i + e] = v[e];
}

template <int N>
__device__ __forceinline__ void store(pa_bf16_out x, long long i, const float (&v)[N], bool vec) {
  using pa::storage::packBf16x2;
  if constexpr (N % 8 == 0) {
    if (vec) {
#pragma unroll
      for (int e = 0; e < N; e += 8)
        stGlobal(x.p + i + e, packBf16x2(v[e], v[e + 1]), packBf16x2(v[e + 2], v[e + 3]), packBf16x2(v[e + 4], v[e + 5]),
                 packBf16x2(v[e + 6], v[e + 7]));
      return;
    }
  } else if constexpr (N % 4 == 0) {
    if (vec) {
#pragma unroll
      for (int e = 0; e < N; e += 4) stGlobal(x.p + i + e, packBf16x2(v[e], v[e + 1]), packBf16x2(v[e + 2], v[e + 3]));
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) x[i + e] = v[e];
}

// Shared p[i .. i + N) = v, p 16-byte aligned: plain stores, which the compiler keeps ordered with
// the loads that read them back (the PTX stores above address global memory only).
template <int N>
__device__ __forceinline__ void storeShared(float* p, long long i, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int e = 0; e < N; e += 4) *reinterpret_cast<float4*>(p + i + e) = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) p[i + e] = v[e];
  }
}

// A barrier over the T threads of this thread's row: the block (W = 1 row per block), or named
// barrier 1 + row of the block.
template <int T, int W>
__device__ __forceinline__ void rowBarrier() {
  if constexpr (W == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + static_cast<int>(threadIdx.x) / T), "n"(T) : "memory");
  }
}

// a and b summed over the row's T threads (W rows per block); `sh` holds 2 * (T / 32) floats per
// row of the block when T > 32.
template <int T, int W>
__device__ __forceinline__ void rowSum2(float& a, float& b, float* sh) {
  static_assert(T % 32 == 0 && W <= 15, "whole warps per row; a named barrier per row (ids 1 to 15)");
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if constexpr (T > 32) {
    float* row = sh + static_cast<int>(threadIdx.x) / T * 2 * (T / 32);
    const int w = static_cast<int>(threadIdx.x) % T / 32;
    rowBarrier<T, W>();
    if (threadIdx.x % 32 == 0) {
      row[w] = a;
      row[T / 32 + w] = b;
    }
    rowBarrier<T, W>();
    a = 0.0f;
    b = 0.0f;
#pragma unroll
    for (int i = 0; i < T / 32; ++i) {
      a += row[i];
      b += row[T / 32 + i];
    }
  }
}

}  // namespace norm
}  // namespace pa
