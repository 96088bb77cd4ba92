// Shared by the generated GEMM kernels (kernels/gemm_simt.cuh, gemm_tf32.cuh, gemm_wgmma.cuh): the
// problem and epilogue contract, the output stores, the block-tile raster and the split-K reduce.
/*
 * Note on the problem, the layouts and the traps.
 *
 * C[b] = op(A[b]) · op(B[b]) for b < batch, row-major, with op = identity or transpose. The
 * generated kernel describes its node with a problem struct P (all compile-time constants):
 *
 *   struct P { static constexpr long long M, N, K, strideA, strideB;   // batch strides, 0 = shared
 *              static constexpr bool transA, transB;
 *              static constexpr int splits; };   // split-K (batch 1 only), see splitReduce
 *
 * A is [M, K] (transA: [K, M]), B is [K, N] (transB: [N, K]), C is [batch, M, N]. An operand whose
 * contiguous dimension is K ("k-contiguous": A plain, B transposed) and one whose contiguous
 * dimension is M or N ("row-contiguous") are loaded differently; each path's operand loader
 * (TileOperand, Tf32Operand, the wgmma kernel's TMA maps) hides that.
 *
 * The epilogue is a functor with  float operator()(float v, long long m, long long n, long long i)
 * returning the value stored at C[i] (i = b·M·N + m·N + n); it may also write side outputs
 * (FusedLinear's pre-activation). It is called exactly once for every element of C.
 *
 * Pair epilogues. A functor whose `kPairs` is true sees C's elements two at a time instead:
 * pair(v0, v1, m, n, i) with n even replaces v0 and v1 (C[i] and C[i + 1]) and may write side
 * outputs from both (SwiGLU's silu(gate)·up of a (gate, up) column pair). Such a node has N even,
 * so every thread that holds column n even also holds n + 1 (the SIMT micro-tiles hold groups of
 * 4, the mma.sync and wgmma fragments pairs, the reduce kernels walk pairs), and the transposed
 * wgmma epilogue (pairs along M) is never used with one. epiPair() calls either kind.
 *
 * Where the wgmma kernel runs the functor. `kStageRaw` false: on the accumulators in registers,
 * a thread's two rows at a time, before the results are staged for 16-byte stores. true: after
 * staging the raw fp32 sums, as each thread takes 4 consecutive columns of one row from the
 * staging, so that the functor's reads and side writes are coalesced across a warp (codegen's
 * choice: epilogues that read or write more than C). `kAux` (with kStageRaw): the functor is
 * exactly v ↦ withAux(v, aux[i]), `aux` an input laid out as C (MatMulActGrad's saved
 * activation), withAux pure; the wgmma kernel then brings each tile's aux into L2 while the
 * products run, loads it 4 values at a time and may evaluate withAux on elements outside C
 * (discarded), so that one copy of the formula serves whole and partial chunks.
 *
 * Vector access. A float4 load of 4 consecutive elements needs the contiguous dimension (the
 * leading dimension, since tensors are dense) and the batch stride to be multiples of 4 (known at
 * compile time) and the base pointer 16-byte aligned (checked once per block); otherwise, and at
 * the edges of the matrices, elements are loaded one by one with bounds checks and zero-filled.
 * Because the leading dimension is the contiguous extent itself, a 4-aligned group of 4 is then
 * either wholly inside or wholly outside the matrix.
 *
 * Grid: blockIdx.x enumerates the output tiles in groups of kGroupM tile rows (consecutive blocks
 * share B column panels and a few A row panels in L2); blockIdx.z is the batch. With a tail split
 * (simtGemmTail), blockIdx.x goes on past the tiles computed whole to the tail tiles' K pieces.
 */
#pragma once

#include "kernels/storage.cuh"

namespace pa {
namespace gemm {

typedef unsigned int u32;

// C is `float*`, or pa_bf16_out for a bf16 output (precision: bf16): these store 4 or 2
// consecutive results with one vector store where C is fp32, one rounded value at a time where not.
__device__ __forceinline__ void storeC4(float* C, long long at, float4 o) { *reinterpret_cast<float4*>(C + at) = o; }
__device__ __forceinline__ void storeC4(pa_bf16_out C, long long at, float4 o) {
  C[at] = o.x, C[at + 1] = o.y, C[at + 2] = o.z, C[at + 3] = o.w;
}
__device__ __forceinline__ void storeC2(float* C, long long at, float2 o) { *reinterpret_cast<float2*>(C + at) = o; }
// (at is even wherever the kernels store pairs: N is even there, so the pair is one 4-byte word.)
__device__ __forceinline__ void storeC2(pa_bf16_out C, long long at, float2 o) {
  *reinterpret_cast<unsigned*>(C.p + at) = pa::storage::packBf16x2(o.x, o.y);
}
__device__ __forceinline__ bool alignedC(const float* C) { return (reinterpret_cast<unsigned long long>(C) & 15) == 0; }
__device__ __forceinline__ bool alignedC(pa_bf16_out) { return true; }

// The epilogue of a plain product.
struct Identity {
  static constexpr bool kPairs = false, kStageRaw = false, kAux = false;
  __device__ __forceinline__ float operator()(float v, long long, long long, long long) const { return v; }
};

// SiLU, x / (1 + e^-x), for a bf16 result (SwiGLU's h): e^-x and the reciprocal on the
// approximate units with subnormals flushed (ex2.approx.ftz, rcp.approx.ftz: 2 ulp each, CUDA's
// bounds; a bf16 result rounds away 2^-9). The flush changes nothing a bf16 result keeps: an e^-x
// below 2^-126 leaves 1 + e^-x = 1 either way, and x itself is multiplied unflushed. Five
// instructions where __fdividef(x, 1 + __expf(-x)) takes about a dozen (their subnormal handling).
__device__ __forceinline__ float siluBf16(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return x * r;
}

// C's elements n and n + 1 (n even) of row m, at i and i + 1, through the epilogue.
template <class Epi>
__device__ __forceinline__ void epiPair(const Epi& epi, float& v0, float& v1, long long m, long long n, long long i) {
  if constexpr (Epi::kPairs) {
    epi.pair(v0, v1, m, n, i);
  } else {
    v0 = epi(v0, m, n, i);
    v1 = epi(v1, m, n + 1, i + 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Block-tile raster: output tile (tm, tn) of block `pid`, grouped by kGroupM tile rows.
constexpr int kGroupM = 8;

template <long long TilesM, long long TilesN>
__device__ __forceinline__ void tileOf(long long pid, long long& tm, long long& tn) {
  const long long perGroup = (long long)kGroupM * TilesN;
  const long long group = pid / perGroup, first = group * kGroupM;
  const long long rows = TilesM - first < kGroupM ? TilesM - first : kGroupM;
  const long long inGroup = pid % perGroup;
  tm = first + inGroup % rows;
  tn = inGroup / rows;
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((unsigned long long)p & 15ull) == 0; }

// ---------------------------------------------------------------------------------------------
// Operand sums (MatMulBiasGrad's bias gradient, kernels/gemm_tf32.cuh and gemm_wgmma.cuh): the
// mma.sync and wgmma kernels can sum one operand over K as its tiles pass through shared memory,
// A per row m (OPERAND 1) or B per column n (OPERAND 2). T = float: the sums themselves (one K
// split; the blocks of the first tile column (A) or row (B) write them); T = double: a split
// product's fp64 partial sums, part p at out[p·extent + i], which splitReduceSums adds in order
// (part = the split on the mma.sync kernels; split × tiles along the operand + the tile on the
// wgmma kernel, whose tiles share a split's slices: its note).
struct NoSums {
  static constexpr int kOperand = 0;
  typedef float T;
  float* out = nullptr;
};
template <int OPERAND, class T_>
struct OperandSums {
  static_assert(OPERAND == 1 || OPERAND == 2, "operand 1 (A) or 2 (B)");
  static constexpr int kOperand = OPERAND;
  typedef T_ T;
  T_* out;
};

// ---------------------------------------------------------------------------------------------
// Split-K: the GEMM kernels (simtGemm, tf32Gemm, wgmmaGemm), given P::splits = S > 1, treat blockIdx.z as the split and
// write the raw sum over their share of K to parts[split] (S·M·N floats, no epilogue); this
// adds the S partial sums in split order (deterministic) and applies the epilogue. W (1, 2 or 4,
// the emitter's choice) consecutive elements a thread: every split's W-element chunk is loaded
// (one vector load each; the emitter keeps S·W within 32 registers) before any is added, so a
// thread waits on memory once per round. W > 1 needs N to be a multiple of W (a thread's
// elements share a row; with pairs, n is even at every pair) and `parts` 4·W-byte aligned.
template <int W>
struct ReduceChunk;
template <>
struct ReduceChunk<2> {
  typedef float2 T;
};
template <>
struct ReduceChunk<4> {
  typedef float4 T;
};
template <class P, int W = 1, class Epi, class CPtr>
__device__ __forceinline__ void splitReduce(const float* __restrict__ parts, CPtr C, const Epi& epi) {
  constexpr long long MN = P::M * P::N, N = P::N;
  constexpr int S = P::splits;
  static_assert(W == 1 || W == 2 || W == 4, "1, 2 or 4 elements a thread");
  static_assert(W == 1 || N % W == 0, "a thread's elements in one row");
  if constexpr (W > 1) {
    typedef typename ReduceChunk<W>::T Chunk;
    const long long stride = W * (long long)gridDim.x * blockDim.x;
    for (long long i = W * ((long long)blockIdx.x * blockDim.x + threadIdx.x); i < MN; i += stride) {
      Chunk c[S];
#pragma unroll
      for (int z = 0; z < S; ++z) c[z] = *reinterpret_cast<const Chunk*>(parts + z * MN + i);
      float v[W];
#pragma unroll
      for (int e = 0; e < W; ++e) v[e] = reinterpret_cast<const float*>(&c[0])[e];
#pragma unroll
      for (int z = 1; z < S; ++z)
#pragma unroll
        for (int e = 0; e < W; ++e) v[e] += reinterpret_cast<const float*>(&c[z])[e];
      if constexpr (Epi::kPairs) {
#pragma unroll
        for (int e = 0; e < W; e += 2) {
          epi.pair(v[e], v[e + 1], (i + e) / N, (i + e) % N, i + e);
          C[i + e] = v[e], C[i + e + 1] = v[e + 1];
        }
      } else {
#pragma unroll
        for (int e = 0; e < W; ++e) C[i + e] = epi(v[e], (i + e) / N, (i + e) % N, i + e);
      }
    }
  } else if constexpr (Epi::kPairs) {
    static_assert(N % 2 == 0, "a pair epilogue needs N even");
    for (long long i = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x); i < MN; i += 2 * (long long)gridDim.x * blockDim.x) {
      float v0 = parts[i], v1 = parts[i + 1];
#pragma unroll
      for (int z = 1; z < S; ++z) v0 += parts[z * MN + i], v1 += parts[z * MN + i + 1];
      epi.pair(v0, v1, i / N, i % N, i);
      C[i] = v0, C[i + 1] = v1;
    }
  } else {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < MN; i += (long long)gridDim.x * blockDim.x) {
      float v = parts[i];
#pragma unroll
      for (int z = 1; z < S; ++z) v += parts[z * MN + i];
      C[i] = epi(v, i / N, i % N, i);
    }
  }
}

// The operand sums of a split product (OperandSums<., double>): `extent` sums of PARTS partial
// sums each (the splits on the mma.sync kernels; splits × the tiles that share the operand's
// tile on the wgmma kernel: tens of parts), rounded to fp32 once. A warp per sum: lane l adds
// parts l, l + 32, ... in order, then the lanes' totals meet in a fixed butterfly of shuffles, so
// the sum is deterministic and no thread waits on more than one round of ⌈PARTS / 32⌉ loads. The
// reduce kernel runs these before its share of C, its first warps taking one sum each.
template <class P, int PARTS = P::splits>
__device__ __forceinline__ void splitReduceSums(const double* __restrict__ parts, float* __restrict__ out, long long extent) {
  constexpr int R = (PARTS + 31) / 32;
  const int lane = threadIdx.x % 32;
  const long long warps = (long long)gridDim.x * blockDim.x / 32;
  for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < extent; i += warps) {  // (warp-uniform)
    double t[R];
#pragma unroll
    for (int r = 0; r < R; ++r) t[r] = lane + 32 * r < PARTS ? parts[(long long)(lane + 32 * r) * extent + i] : 0.0;
    double v = t[0];
#pragma unroll
    for (int r = 1; r < R; ++r) v += t[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[i] = static_cast<float>(v);
  }
}

}  // namespace gemm
}  // namespace pa
