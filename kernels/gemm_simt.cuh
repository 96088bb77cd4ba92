// The exact fp32 GEMM on the CUDA cores (SIMT) behind the generated MatMul and FusedLinear kernels:
// register micro-tiles, double-buffered shared tiles, blocked summation; split-K and the tail split.
/*
 *
 * Note on the fp32 SIMT path (simtGemm): a BM×BN block tile, BK-deep K slices staged global -> registers ->
 * shared memory (double-buffered shared tiles in the dynamic shared memory, one barrier per
 * slice), shared tiles stored k-major (As[k][m], Bs[k][n]) so that every thread reads its TM×TN
 * micro-tile's operands as float4s, those of k row kk + 1 while row kk's products run. Thread
 * (ty, tx) owns rows ty·4 + c·(BM/TM·4) + i and columns tx·4 + d·(BN/TN·4) + j (c < TM/4,
 * d < TN/4, i, j < 4): each warp's float4 reads of a k row are then broadcasts of a few
 * contiguous 16-byte words, conflict-free. k-contiguous operands are transposed on their way into
 * shared memory; rows are padded by 4 floats so that those scalar stores are conflict-free for
 * BK = 8 (2-way for BK = 16, immaterial). A block whose tile lies wholly inside both operands
 * (all but the edge tiles) loads without bounds checks, from one pointer per operand advanced by
 * a constant per slice: the general loads' checks and 64-bit index arithmetic cost issue slots
 * (bench/RESULTS.md, "The GEMM kernels' notes").
 *
 * Load placement (fp32 path). A slice's global loads must be in flight during a whole slice of
 * products. Written at the top of slice s for slice s + 1 (their stores at its end), they are
 * where ptxas chooses to put them, which for some layouts (dX = dY·Wᵀ, dW = Xᵀ·dY) is two thirds
 * of the way down the loop, where they then stall the stores. So slice s + 2's loads are issued
 * just before slice s's barrier, which they cannot move past, and stored at the end of slice s + 1.
 *
 * Across the barrier (fp32 path). Right after a barrier every warp reads its first fragments of
 * the new slice, and with two warps a scheduler nothing hid that latency. A slice's last k row
 * therefore has its products after the barrier, from operands read before it, while the next
 * slice's first fragments load. The summation order is unchanged (that row still ends its
 * slice's products before the chunk's blocked sum).
 *
 * FFMA order (fp32 path). The micro-tile's products run column by column, down one column and up
 * the next, so that consecutive FFMAs share an operand through the operand reuse cache and few
 * FFMAs read three registers from the register file.
 *
 * Blocked summation (fp32 path). Each thread sums kChunk = BK·kSlicesPerChunk products into
 * `part` and only then adds `part` into `acc`. A plain running sum over K = 8192 (the weight
 * gradient of a batch-8192 layer) has a rounding error that grows like K·ε; blocked, it grows
 * like (kChunk + K/kChunk)·ε: (64 + 128)·ε at K = 8192, comparable to OpenBLAS's own K-blocking,
 * which the whole-training-step GPU tests measure us against. It costs one FADD per output per
 * kChunk products (1.6% of the FFMAs at kChunk = 64) and TM·TN registers.
 *
 * Shared memory is dynamic (SimtConfig::kDynamicShared, the launch's), the rest is in
 * kernels/gemm_common.cuh ("Note on the problem").
 */
#pragma once

#include "kernels/gemm_common.cuh"

namespace pa {
namespace gemm {

// One operand's R×BK tile (R = BM for A, BN for B). Element (r, k) of the operand lives at
// base[r·LD + k] when KCONTIG, else at base[k·LD + r]; EXT is the operand's extent along r.
template <int R, int BK, int THREADS, bool KCONTIG, long long EXT, long long K, long long LD>
struct TileOperand {
  static constexpr int kVecs = R * BK / 4 / THREADS;  // float4 groups per thread and slice
  static_assert(R * BK % (4 * THREADS) == 0, "a slice must split evenly into float4 groups");
  static constexpr int kPadded = R + 4;  // shared row length (k-major shared layout)

  float4 reg[kVecs];

  // Global -> registers: slice k0 of the tile whose first row is r0.
  __device__ __forceinline__ void load(const float* __restrict__ base, long long r0, long long k0, bool vec, int tid) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int f = tid + v * THREADS;
      if (KCONTIG) {
        const long long r = r0 + f / (BK / 4), k = k0 + (f % (BK / 4)) * 4;
        const float* p = base + r * LD + k;
        if (vec && r < EXT && k < K) {
          reg[v] = *reinterpret_cast<const float4*>(p);
        } else {
          const bool row = r < EXT;
          reg[v].x = row && k + 0 < K ? p[0] : 0.0f;
          reg[v].y = row && k + 1 < K ? p[1] : 0.0f;
          reg[v].z = row && k + 2 < K ? p[2] : 0.0f;
          reg[v].w = row && k + 3 < K ? p[3] : 0.0f;
        }
      } else {
        const long long k = k0 + f / (R / 4), r = r0 + (f % (R / 4)) * 4;
        const float* p = base + k * LD + r;
        if (vec && k < K && r < EXT) {
          reg[v] = *reinterpret_cast<const float4*>(p);
        } else {
          const bool kin = k < K;
          reg[v].x = kin && r + 0 < EXT ? p[0] : 0.0f;
          reg[v].y = kin && r + 1 < EXT ? p[1] : 0.0f;
          reg[v].z = kin && r + 2 < EXT ? p[2] : 0.0f;
          reg[v].w = kin && r + 3 < EXT ? p[3] : 0.0f;
        }
      }
    }
  }

  // Interior tiles (every element of every slice in bounds, vector access allowed): the thread's
  // float4 groups of a slice are at origin + v·kVecStep, and slice s + 1 is kSliceStep further.
  static_assert(THREADS % (BK / 4) == 0 && THREADS % (R / 4) == 0, "groups of a thread are a fixed stride apart");
  static constexpr long long kVecStep = KCONTIG ? (THREADS / (BK / 4)) * LD : (THREADS / (R / 4)) * LD;
  static constexpr long long kSliceStep = KCONTIG ? BK : BK * LD;
  static __device__ __forceinline__ const float* origin(const float* base, long long r0, long long k0, int tid) {
    return KCONTIG ? base + (r0 + tid / (BK / 4)) * LD + k0 + (tid % (BK / 4)) * 4
                   : base + (k0 + tid / (R / 4)) * LD + r0 + (tid % (R / 4)) * 4;
  }
  __device__ __forceinline__ void loadInterior(const float* __restrict__ p) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) reg[v] = *reinterpret_cast<const float4*>(p + v * kVecStep);
  }

  // Registers -> shared tile sm[BK][kPadded] (k-major).
  __device__ __forceinline__ void store(float* sm, int tid) const {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int f = tid + v * THREADS;
      if (KCONTIG) {
        const int r = f / (BK / 4), k = (f % (BK / 4)) * 4;
        sm[(k + 0) * kPadded + r] = reg[v].x;
        sm[(k + 1) * kPadded + r] = reg[v].y;
        sm[(k + 2) * kPadded + r] = reg[v].z;
        sm[(k + 3) * kPadded + r] = reg[v].w;
      } else {
        const int k = f / (R / 4), r = (f % (R / 4)) * 4;
        *reinterpret_cast<float4*>(sm + k * kPadded + r) = reg[v];
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// fp32 SIMT GEMM. Launch: grid (TilesM·TilesN, 1, batch), block kThreads, dynamic shared memory
// Cfg::kDynamicShared bytes.
template <int BM_, int BN_, int BK_, int TM_, int TN_, int kSlicesPerChunk_>
struct SimtConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int kSlicesPerChunk = kSlicesPerChunk_;
  static constexpr int kThreadsM = BM / TM, kThreadsN = BN / TN;
  static constexpr int kThreads = kThreadsM * kThreadsN;
  static constexpr int kDynamicShared = 2 * BK * (BM + 4 + BN + 4) * 4;  // A's two tiles, then B's
  static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tiles are made of float4 groups");
  static_assert(BM % TM == 0 && BN % TN == 0, "the block tile must split into micro-tiles");
};

// The K loop of simtGemm: slices [sBegin, sEnd) of the block's tile into `part` and, once per
// chunk, `acc` (the blocked summation, see the note). INTERIOR: the tile lies wholly inside A
// and B, so the loads skip the bounds checks.
template <class Cfg, class OpA, class OpB>
struct SimtSlices {
  const float* A;
  const float* B;
  float* shared;  // A's two tiles, then B's
  long long m0, n0, sBegin, sEnd;
  bool vecA, vecB;
  int tid, tx, ty;
  OpA& opA;
  OpB& opB;
  float (&acc)[Cfg::TM][Cfg::TN];
  float (&part)[Cfg::TM][Cfg::TN];

  __device__ __forceinline__ float* sharedA(int buf) const { return shared + buf * (Cfg::BK * OpA::kPadded); }
  __device__ __forceinline__ float* sharedB(int buf) const {
    return shared + 2 * Cfg::BK * OpA::kPadded + buf * (Cfg::BK * OpB::kPadded);
  }

  // The micro-tile's operands of k row kk of the shared tiles as, bs.
  __device__ __forceinline__ void fragments(const float* as, const float* bs, int kk, float (&fa)[Cfg::TM],
                                            float (&fb)[Cfg::TN]) const {
#pragma unroll
    for (int c = 0; c < Cfg::TM / 4; ++c) {
      const float4 t = *reinterpret_cast<const float4*>(as + kk * OpA::kPadded + ty * 4 + c * Cfg::kThreadsM * 4);
      fa[c * 4 + 0] = t.x, fa[c * 4 + 1] = t.y, fa[c * 4 + 2] = t.z, fa[c * 4 + 3] = t.w;
    }
#pragma unroll
    for (int d = 0; d < Cfg::TN / 4; ++d) {
      const float4 t = *reinterpret_cast<const float4*>(bs + kk * OpB::kPadded + tx * 4 + d * Cfg::kThreadsN * 4);
      fb[d * 4 + 0] = t.x, fb[d * 4 + 1] = t.y, fb[d * 4 + 2] = t.z, fb[d * 4 + 3] = t.w;
    }
  }

  // One k row's products into `part`, column by column, down one column and up the next (see
  // "FFMA order" in the note).
  __device__ __forceinline__ void products(const float (&a)[Cfg::TM], const float (&b)[Cfg::TN]) const {
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j)
#pragma unroll
      for (int i0 = 0; i0 < Cfg::TM; ++i0) {
        const int i = j & 1 ? Cfg::TM - 1 - i0 : i0;
        part[i][j] = fmaf(a[i], b[j], part[i][j]);
      }
  }

  // After slice s's products: the blocked summation's chunk boundary.
  __device__ __forceinline__ void endSlice(long long s) const {
    if ((s - sBegin) % Cfg::kSlicesPerChunk != Cfg::kSlicesPerChunk - 1) return;
#pragma unroll
    for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::TN; ++j) {
        acc[i][j] += part[i][j];
        part[i][j] = 0.0f;
      }
  }

  template <bool INTERIOR>
  __device__ __forceinline__ void run() const {
    constexpr int BK = Cfg::BK, TM = Cfg::TM, TN = Cfg::TN;
    const float* pa = INTERIOR ? OpA::origin(A, m0, sBegin * BK, tid) : A;
    const float* pb = INTERIOR ? OpB::origin(B, n0, sBegin * BK, tid) : B;
    auto load = [&](long long s) {
      if (INTERIOR) {
        opA.loadInterior(pa), opB.loadInterior(pb);
        pa += OpA::kSliceStep, pb += OpB::kSliceStep;
      } else {
        opA.load(A, m0, s * BK, vecA, tid), opB.load(B, n0, s * BK, vecB, tid);
      }
    };
    // Slice s + 2's global loads are issued before slice s's barrier (see "Load placement").
    // (An empty split range, possible when there are more splits than slices, loads zeros.)
    load(sBegin);
    opA.store(sharedA(0), tid);
    opB.store(sharedB(0), tid);
    if (sBegin + 1 < sEnd) load(sBegin + 1);
    __syncthreads();

    // Operands of two k rows: row kk + 1's are read while row kk's products run. A slice's last
    // row (in a[1], bv[1]) has its products after the barrier, while the next slice's first
    // fragments are read (see "Across the barrier" in the note).
    static_assert(BK % 2 == 0, "the last k row's operands are in a[1], bv[1]");
    float a[2][TM], bv[2][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) a[1][i] = 0.0f;  // (before the first slice: products of zeros, exact)
#pragma unroll
    for (int j = 0; j < TN; ++j) bv[1][j] = 0.0f;
    for (long long s = sBegin; s < sEnd; ++s) {
      const int cur = (int)((s - sBegin) & 1);
      const float* as = sharedA(cur);
      const float* bs = sharedB(cur);
      fragments(as, bs, 0, a[0], bv[0]);
      products(a[1], bv[1]);
      if (s > sBegin) endSlice(s - 1);
#pragma unroll
      for (int kk = 0; kk + 1 < BK; ++kk) {
        fragments(as, bs, kk + 1, a[(kk + 1) & 1], bv[(kk + 1) & 1]);
        products(a[kk & 1], bv[kk & 1]);
      }
      if (s + 1 < sEnd) {  // into the tiles that slice s - 1 used
        opA.store(sharedA(cur ^ 1), tid);
        opB.store(sharedB(cur ^ 1), tid);
      }
      if (s + 2 < sEnd) load(s + 2);
      __syncthreads();
    }
    if (sBegin < sEnd) {
      products(a[1], bv[1]);
      endSlice(sEnd - 1);
    }
  }
};

// One block's work in simtGemm and simtGemmTail: tile `pid` (tileOf order) over K slices
// [sBegin, sEnd) of operands A and B (already offset to their batch entry). The sums go through
// `epi` to C ([M, N]; `i0` is the entry's offset in the epilogue's element index) or, where `piece`
// is not null, raw into piece (the tile's BM×BN sums, row-major: a tail split's share).
template <class P, class Cfg, class Epi, class CPtr>
__device__ __forceinline__ void simtTile(const float* __restrict__ A, const float* __restrict__ B, CPtr C, float* __restrict__ piece,
                                         const Epi& epi, long long pid, long long i0, long long sBegin, long long sEnd) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, TM = Cfg::TM, TN = Cfg::TN, kThreads = Cfg::kThreads;
  constexpr long long M = P::M, N = P::N, K = P::K;
  constexpr long long TilesM = (M + BM - 1) / BM, TilesN = (N + BN - 1) / BN;
  // A k-contiguous when plain ([M, K]); B k-contiguous when transposed ([N, K]).
  typedef TileOperand<BM, BK, kThreads, !P::transA, M, K, (P::transA ? M : K)> OpA;
  typedef TileOperand<BN, BK, kThreads, P::transB, N, K, (P::transB ? K : N)> OpB;
  constexpr bool kVecA = (P::transA ? M : K) % 4 == 0 && P::strideA % 4 == 0;
  constexpr bool kVecB = (P::transB ? K : N) % 4 == 0 && P::strideB % 4 == 0;
  constexpr bool kVecC = N % 4 == 0;

  extern __shared__ __align__(16) float simtDynamicShared[];
  const int tid = threadIdx.x;
  const int tx = tid % Cfg::kThreadsN, ty = tid / Cfg::kThreadsN;
  long long tm, tn;
  tileOf<TilesM, TilesN>(pid, tm, tn);
  const long long m0 = tm * BM, n0 = tn * BN;
  const bool vecA = kVecA && aligned16(A), vecB = kVecB && aligned16(B);

  OpA opA;
  OpB opB;
  float acc[TM][TN], part[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = part[i][j] = 0.0f;
  const SimtSlices<Cfg, OpA, OpB> loop{A, B, simtDynamicShared, m0, n0, sBegin, sEnd, vecA, vecB, tid, tx, ty, opA, opB, acc, part};
  // The tile lies wholly inside A and B (and the split's slices exist: an empty one reads nothing).
  if (vecA && vecB && K % BK == 0 && m0 + BM <= M && n0 + BN <= N && sBegin < sEnd)
    loop.template run<true>();
  else
    loop.template run<false>();

  const bool vecC = kVecC && alignedC(C);
#pragma unroll
  for (int c = 0; c < TM / 4; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const long long m = m0 + ty * 4 + c * Cfg::kThreadsM * 4 + i;
      if (m >= M) continue;
#pragma unroll
      for (int d = 0; d < TN / 4; ++d) {
        const long long n = n0 + tx * 4 + d * Cfg::kThreadsN * 4;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = acc[c * 4 + i][d * 4 + j] + part[c * 4 + i][d * 4 + j];
        if (piece) {  // (BN is a multiple of 4: the piece's rows are 16-byte aligned)
          const long long at = (m - m0) * BN + (n - n0);
          if (n + 3 < N) {
            *reinterpret_cast<float4*>(piece + at) = make_float4(v[0], v[1], v[2], v[3]);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (n + j < N) piece[at + j] = v[j];
          }
          continue;
        }
        const long long at = m * N + n;
        if (vecC && n + 3 < N) {
          epiPair(epi, v[0], v[1], m, n, i0 + at);
          epiPair(epi, v[2], v[3], m, n + 2, i0 + at + 2);
          storeC4(C, at, make_float4(v[0], v[1], v[2], v[3]));
        } else if constexpr (Epi::kPairs) {  // N is even: a pair starting inside C ends inside it
#pragma unroll
          for (int j = 0; j < 4; j += 2)
            if (n + j < N) {
              epiPair(epi, v[j], v[j + 1], m, n + j, i0 + at + j);
              C[at + j] = v[j], C[at + j + 1] = v[j + 1];
            }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (n + j < N) C[at + j] = epi(v[j], m, n + j, i0 + at + j);
        }
      }
    }
}

// The fp32 SIMT GEMM: block (x, z) computes tile x of batch entry z, or with P::splits > 1 of
// split z (its raw sums to C + z·M·N, for splitReduce).
template <class P, class Cfg, class Epi, class CPtr>
__device__ __forceinline__ void simtGemm(const float* __restrict__ A, const float* __restrict__ B, CPtr C, const Epi& epi) {
  constexpr long long kSlices = (P::K + Cfg::BK - 1) / Cfg::BK;
  constexpr long long kPerSplit = (kSlices + P::splits - 1) / P::splits;
  const long long b = P::splits > 1 ? 0 : blockIdx.z, split = P::splits > 1 ? blockIdx.z : 0;
  const long long sBegin = split * kPerSplit, sEnd = sBegin + kPerSplit < kSlices ? sBegin + kPerSplit : kSlices;
  C += (b + split) * P::M * P::N;
  simtTile<P, Cfg>(A + b * P::strideA, B + b * P::strideB, C, static_cast<float*>(nullptr), epi, blockIdx.x, b * P::M * P::N,
                   sBegin, sEnd);
}

// Tail split (one unbatched product; see "tail split" in codegen/gemm_plan.cpp). The last
// P::tailTiles tiles (tileOf order) are split along K, P::tailSplits ways: blocks below the other
// tiles' count compute their tile whole, through the epilogue; the rest compute piece
// z·tailTiles + t (split z of tail tile t, split-major, so that concurrent blocks share K ranges
// in L2) into parts (tailSplits·tailTiles pieces of BM·BN floats). simtTailReduce then adds each
// tail tile's pieces in split order (deterministic) and applies the epilogue.
template <class P, class Cfg, class Epi, class CPtr>
__device__ __forceinline__ void simtGemmTail(const float* __restrict__ A, const float* __restrict__ B, CPtr C,
                                             float* __restrict__ parts, const Epi& epi) {
  constexpr long long kTiles = ((P::M + Cfg::BM - 1) / Cfg::BM) * ((P::N + Cfg::BN - 1) / Cfg::BN);
  constexpr long long kWhole = kTiles - P::tailTiles, kSlices = (P::K + Cfg::BK - 1) / Cfg::BK;
  // Pieces of whole blocked-sum chunks (codegen's tailTime assumes the same).
  constexpr long long kChunk = Cfg::kSlicesPerChunk;
  constexpr long long kPerSplit = ((kSlices + P::tailSplits - 1) / P::tailSplits + kChunk - 1) / kChunk * kChunk;
  static_assert(P::tailTiles > 0 && P::tailTiles <= kTiles && P::tailSplits > 1, "a tail of existing tiles, split");
  // (One call for both kinds of block: the main loop is instantiated once.)
  const long long x = blockIdx.x, piece = x - kWhole, split = piece / P::tailTiles, t = piece % P::tailTiles;
  const bool whole = x < kWhole;
  const long long sBegin = whole ? 0 : split * kPerSplit;
  const long long sEnd = whole || sBegin + kPerSplit > kSlices ? kSlices : sBegin + kPerSplit;
  simtTile<P, Cfg>(A, B, C, whole ? static_cast<float*>(nullptr) : parts + piece * (Cfg::BM * Cfg::BN), epi, whole ? x : kWhole + t,
                   0, sBegin, sEnd);
}

template <class P, class Cfg, class Epi, class CPtr>
__device__ __forceinline__ void simtTailReduce(const float* __restrict__ parts, CPtr C, const Epi& epi) {
  constexpr long long BM = Cfg::BM, BN = Cfg::BN, M = P::M, N = P::N;
  constexpr long long TilesM = (M + BM - 1) / BM, TilesN = (N + BN - 1) / BN;
  constexpr long long kWhole = TilesM * TilesN - P::tailTiles, kCount = P::tailTiles * BM * BN;
  constexpr long long kStep = Epi::kPairs ? 2 : 1;  // pairs: e even, so col and n are even (BN is)
  for (long long e = kStep * ((long long)blockIdx.x * blockDim.x + threadIdx.x); e < kCount; e += kStep * (long long)gridDim.x * blockDim.x) {
    const long long t = e / (BM * BN), r = e % (BM * BN) / BN, col = e % BN;
    long long tm, tn;
    tileOf<TilesM, TilesN>(kWhole + t, tm, tn);
    const long long m = tm * BM + r, n = tn * BN + col;
    if (m >= M || n >= N) continue;  // (never written by the pieces)
    float v = parts[e];
#pragma unroll
    for (int z = 1; z < P::tailSplits; ++z) v += parts[z * kCount + e];
    if constexpr (Epi::kPairs) {
      float v1 = parts[e + 1];
#pragma unroll
      for (int z = 1; z < P::tailSplits; ++z) v1 += parts[z * kCount + e + 1];
      epi.pair(v, v1, m, n, m * N + n);
      C[m * N + n] = v, C[m * N + n + 1] = v1;
    } else {
      C[m * N + n] = epi(v, m, n, m * N + n);
    }
  }
}

}  // namespace gemm
}  // namespace pa
