// The mma.sync GEMMs behind the generated MatMul and FusedLinear kernels: TF32 (m16n8k8, sm_80+)
// under precision tf32 and for bf16 operands widened to fp32 where wgmma is not used, and FP64
// (m16n8k4) for fp32 products on devices that run FP64 at full rate ("Note on the FP64 path").
/*
 * Note on the TF32 path (tf32Gemm): mma.sync.m16n8k8 (sm_80+) on warp tiles of (BM/WARPS_M)×(BN/WARPS_N),
 * operands rounded to TF32 with cvt.rna (round to nearest, ties away) as they leave shared memory,
 * fp32 accumulation in the tensor cores across the whole K (no blocked sum: the TF32 rounding of
 * the operands, ~2^-11 relative, dominates every accumulation error). Shared tiles keep the
 * global orientation, so global -> shared is cp.async (16 bytes where aligned, 4 otherwise, with
 * zero-fill past the edges) in a STAGES-deep ring. Padding (4 floats for k-contiguous rows, 8 for
 * row-contiguous ones) makes the fragment reads conflict-free: lane (g = lane/4, t = lane%4)
 * reads word g·S + t (k-contiguous, S = BK + 4 ≡ 4 mod 8, so g·S/4 = g·odd covers 0..7 mod 8)
 * or t·S + g (row-contiguous, S = R + 8 ≡ 8 mod 32 for R a multiple of 32).
 *
 * Shared memory stays within the 48 KB a block gets without an opt-in (the graph runner launches
 * without raising the limit), which caps the TF32 ring at 2 stages of BK = 16 or 4 of BK = 8.
 *
 * The problem contract is kernels/gemm_common.cuh's ("Note on the problem").
 *
 * Note on the FP64 path (f64Gemm). The same tiles, ring and fragment reads, with each fp32 element
 * widened to fp64 (exact) as it leaves shared memory instead of rounded to TF32, and two
 * mma.sync.m16n8k4.f64 (kernels/mma_f64.cuh; k 0-3 and 4-7 of the same fragments, whose layout is
 * TF32's) in place of each m16n8k8. Every product is exact and the sums are fp64 across the whole
 * K (or a split's share of it), rounded to fp32 once, before the epilogue: no less accurate than
 * the SIMT kernel's blocked fp32 sums. On sm_80 and sm_90 parts the FP64 tensor pipe's rate
 * equals the FP32 FFMA rate (128 FMA an SM and clock) at a sixteenth of the instructions. fp64
 * accumulators double a warp tile's registers: large tiles run one 256-thread block an SM (two
 * warps a scheduler), which keeps the pipe about three quarters busy; widening each value once a
 * block into fp64 stages instead was slower (bench/RESULTS.md, "fp32 GEMMs on the FP64 tensor
 * cores").
 */
#pragma once

#include "kernels/gemm_common.cuh"
#include "kernels/gemm_ptx.cuh"
#include "kernels/mma_f64.cuh"

namespace pa {
namespace gemm {

// One operand's R×BK shared tile in its global orientation: [R][BK + 4] when k-contiguous, else
// [BK][R + 8] (see the note for why these pads).
template <int R, int BK, int THREADS, bool KCONTIG, long long EXT, long long K, long long LD>
struct Tf32Operand {
  static constexpr int kFloats = KCONTIG ? R * (BK + 4) : BK * (R + 8);
  static constexpr int kGroups = R * BK / 4 / THREADS;
  static_assert(R * BK % (4 * THREADS) == 0, "a slice must split evenly into 4-float groups");

  static __device__ __forceinline__ int at(int r, int k) { return KCONTIG ? r * (BK + 4) + k : k * (R + 8) + r; }

  // Issues the cp.asyncs of slice k0 of the tile whose first row is r0.
  static __device__ __forceinline__ void load(float* sm, const float* __restrict__ base, long long r0, long long k0, bool vec,
                                              int tid) {
#pragma unroll
    for (int v = 0; v < kGroups; ++v) {
      const int f = tid + v * THREADS;
      int rr, kk;
      if (KCONTIG) {
        rr = f / (BK / 4), kk = (f % (BK / 4)) * 4;
      } else {
        kk = f / (R / 4), rr = (f % (R / 4)) * 4;
      }
      const long long r = r0 + rr, k = k0 + kk;
      float* dst = sm + at(rr, kk);
      if (vec) {  // a 4-group lies wholly inside or wholly outside (see the note)
        const bool in = r < EXT && k < K;
        cpAsync16(dst, in ? base + (KCONTIG ? r * LD + k : k * LD + r) : base, in);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const long long rj = KCONTIG ? r : r + j, kj = KCONTIG ? k + j : k;
          const bool in = rj < EXT && kj < K;
          cpAsync4(dst + j, in ? base + (KCONTIG ? rj * LD + kj : kj * LD + rj) : base, in);
        }
      }
    }
  }
};

// Launch: grid (TilesM·TilesN, 1, batch), block kThreads, no dynamic shared memory.
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct Tf32Config {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
  static constexpr int MT = WM / 16, NT = WN / 8;             // mma tiles per warp
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static_assert(WM % 16 == 0 && WN % 8 == 0 && BK % 8 == 0, "warp tiles are made of m16n8k8 tiles");
  static_assert(STAGES >= 2, "the ring needs a stage to fill while another is read");
};

// One k8 step of a warp's m16n8 tiles. A fragment holds A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]
// and B[t][g], B[t+4][g] of the step (g = lane/4, t = lane%4), as the step's operand type.
struct Tf32Step {
  typedef u32 Frag;
  typedef float Acc;
  static __device__ __forceinline__ Frag frag(float x) { return toTf32(x); }
  static __device__ __forceinline__ void mma(Acc (&d)[4], const Frag (&a)[4], const Frag (&b)[2]) { mmaTf32(d, a, b); }
};
struct F64Step {
  typedef double Frag;
  typedef double Acc;
  static __device__ __forceinline__ Frag frag(float x) { return static_cast<double>(x); }
  static __device__ __forceinline__ void mma(Acc (&d)[4], const Frag (&a)[4], const Frag (&b)[2]) {
    mmaF64(d, a[0], a[1], b[0]);  // k 0-3
    mmaF64(d, a[2], a[3], b[1]);  // k 4-7
  }
};

template <class P, class Cfg, class Step, class Epi, class CPtr, class Sums>
__device__ __forceinline__ void mmaSyncGemm(const float* __restrict__ A, const float* __restrict__ B, CPtr C, const Epi& epi,
                                            const Sums& sums) {
  typedef typename Step::Frag Frag;
  typedef typename Step::Acc Acc;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, MT = Cfg::MT, NT = Cfg::NT, STAGES = Cfg::STAGES;
  constexpr int kThreads = Cfg::kThreads;
  constexpr long long M = P::M, N = P::N, K = P::K;
  constexpr long long TilesM = (M + BM - 1) / BM, TilesN = (N + BN - 1) / BN;
  constexpr long long kSlices = (K + BK - 1) / BK;
  constexpr long long kPerSplit = (kSlices + P::splits - 1) / P::splits;
  typedef Tf32Operand<BM, BK, kThreads, !P::transA, M, K, (P::transA ? M : K)> OpA;
  typedef Tf32Operand<BN, BK, kThreads, P::transB, N, K, (P::transB ? K : N)> OpB;
  constexpr bool kVecA = (P::transA ? M : K) % 4 == 0 && P::strideA % 4 == 0;
  constexpr bool kVecB = (P::transB ? K : N) % 4 == 0 && P::strideB % 4 == 0;
  constexpr bool kVecC = N % 2 == 0;

  __shared__ __align__(16) float As[STAGES][OpA::kFloats];
  __shared__ __align__(16) float Bs[STAGES][OpB::kFloats];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp / Cfg::WARPS_N) * Cfg::WM, wn0 = (warp % Cfg::WARPS_N) * Cfg::WN;
  long long tm, tn;
  tileOf<TilesM, TilesN>(blockIdx.x, tm, tn);
  const long long m0 = tm * BM, n0 = tn * BN;
  const long long b = P::splits > 1 ? 0 : blockIdx.z, split = P::splits > 1 ? blockIdx.z : 0;
  const long long sBegin = split * kPerSplit, sEnd = sBegin + kPerSplit < kSlices ? sBegin + kPerSplit : kSlices;
  const long long count = sEnd > sBegin ? sEnd - sBegin : 0;  // slices of this block's split
  A += b * P::strideA;
  B += b * P::strideB;
  C += (b + split) * M * N;
  const bool vecA = kVecA && aligned16(A), vecB = kVecB && aligned16(B);
  // Operand sums (gemm_common.cuh, "Operand sums"): thread r < R of a first-column (A) or
  // first-row (B) block adds row r of each of its slices (out-of-range elements are the copies'
  // zeros), in fp32 within a slice and fp64 across slices.
  constexpr int kSum = Sums::kOperand;
  constexpr int kSumRows = kSum == 1 ? BM : BN;
  static_assert(kSum == 0 || (P::batch == 1 && kSumRows <= kThreads), "operand sums: one product, a thread per tile row");
  static_assert(kSum == 0 || (sizeof(typename Sums::T) == 8) == (P::splits > 1), "split products write fp64 partial sums");
  const bool summing = kSum == 1 ? tn == 0 && tid < kSumRows : kSum == 2 ? tm == 0 && tid < kSumRows : false;
  double operandSum = 0.0;

  Acc acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0;

  // Prologue: slices 0 .. STAGES-2 in flight (a group is committed even when empty, so that
  // wait_group's count always names the slice about to be read).
#pragma unroll
  // Local slice s (global sBegin + s) lives in stage s % STAGES.
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < count) {
      OpA::load(As[s], A, m0, (sBegin + s) * BK, vecA, tid);
      OpB::load(Bs[s], B, n0, (sBegin + s) * BK, vecB, tid);
    }
    cpAsyncCommit();
  }

  for (long long s = 0; s < count; ++s) {
    cpAsyncWait<STAGES - 2>();
    __syncthreads();  // slice s has landed for every thread; stage (s-1) % STAGES is free again
    {
      const long long next = s + STAGES - 1;
      if (next < count) {
        const int st = (int)(next % STAGES);
        OpA::load(As[st], A, m0, (sBegin + next) * BK, vecA, tid);
        OpB::load(Bs[st], B, n0, (sBegin + next) * BK, vecB, tid);
      }
      cpAsyncCommit();
    }
    const float* as = As[s % STAGES];
    const float* bs = Bs[s % STAGES];
    if constexpr (kSum != 0) {
      if (summing) {
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < BK; ++k) part += kSum == 1 ? as[OpA::at(tid, k)] : bs[OpB::at(tid, k)];
        operandSum += part;
      }
    }
#pragma unroll
    for (int k8 = 0; k8 < BK; k8 += 8) {
      Frag af[MT][4], bf[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm0 + i * 16 + g;
        af[i][0] = Step::frag(as[OpA::at(r, k8 + t)]);
        af[i][1] = Step::frag(as[OpA::at(r + 8, k8 + t)]);
        af[i][2] = Step::frag(as[OpA::at(r, k8 + t + 4)]);
        af[i][3] = Step::frag(as[OpA::at(r + 8, k8 + t + 4)]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int c = wn0 + j * 8 + g;
        bf[j][0] = Step::frag(bs[OpB::at(c, k8 + t)]);
        bf[j][1] = Step::frag(bs[OpB::at(c, k8 + t + 4)]);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) Step::mma(acc[i][j], af[i], bf[j]);
    }
  }
  cpAsyncWait<0>();  // nothing is left in flight at exit (only empty groups, but be explicit)
  if constexpr (kSum != 0) {
    constexpr long long kExtent = kSum == 1 ? M : N;
    const long long r = (kSum == 1 ? m0 : n0) + tid;
    if (summing && r < kExtent) sums.out[split * kExtent + r] = static_cast<typename Sums::T>(operandSum);
  }

  const bool vecC = kVecC && alignedC(C);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long m = m0 + wm0 + i * 16 + g + h * 8;
      if (m >= M) continue;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const long long n = n0 + wn0 + j * 8 + 2 * t;
        const long long at = m * N + n;
        const float v0 = static_cast<float>(acc[i][j][2 * h]), v1 = static_cast<float>(acc[i][j][2 * h + 1]);
        if ((vecC || Epi::kPairs) && n + 1 < N) {
          float2 o = make_float2(v0, v1);
          epiPair(epi, o.x, o.y, m, n, b * M * N + at);
          if (vecC) storeC2(C, at, o);
          else C[at] = o.x, C[at + 1] = o.y;
        } else {
          if (n < N) C[at] = epi(v0, m, n, b * M * N + at);
          if (n + 1 < N) C[at + 1] = epi(v1, m, n + 1, b * M * N + at + 1);
        }
      }
    }
}

template <class P, class Cfg, class Epi, class CPtr, class Sums = NoSums>
__device__ __forceinline__ void tf32Gemm(const float* __restrict__ A, const float* __restrict__ B, CPtr C, const Epi& epi,
                                         const Sums& sums = Sums()) {
  mmaSyncGemm<P, Cfg, Tf32Step>(A, B, C, epi, sums);
}
// (Note on the FP64 path.)
template <class P, class Cfg, class Epi, class CPtr, class Sums = NoSums>
__device__ __forceinline__ void f64Gemm(const float* __restrict__ A, const float* __restrict__ B, CPtr C, const Epi& epi,
                                        const Sums& sums = Sums()) {
  mmaSyncGemm<P, Cfg, F64Step>(A, B, C, epi, sums);
}

}  // namespace gemm
}  // namespace pa
