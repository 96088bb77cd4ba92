// FlashAttention-2 backward on the mma.sync tensor cores: the dK/dV and dQ kernels of fp16 / bf16,
// and of fp32 inputs with TF32 operands or FP64 fragments (MmaStep<Tag>). The algorithm and its
// traps: flash_attention_bwd_common.cuh.
#pragma once

#include "kernels/flash_attention_bwd_common.cuh"

namespace pa {
namespace flash {

// Tensor-core dK/dV. WARPS warps x 16 keys = one key tile; query tiles of BQ rows, double-buffered.
// ATOMIC_DQ: also adds this key tile's share of dQ = dS.K into the fp32 dQAccum with atomics
// (FlashAttention-2's scheme, 5 products per tile pair instead of the 7 of the separate dQ
// kernel; the summation order of dQ then varies from run to run). PARTIAL_DQ (fp32 on the FP64
// tensor cores, at most kMaxDqPartialBlocks key tiles): writes the share instead, to the key
// tile's slab of dQPartial, which flashBackwardDqReduceF32<WARPS, BQ> sums in key-tile order
// (deterministic); it writes the rows of the query tiles it visits, which the reduce's visibility
// test (the same TileMask test on the same BQ-row tiles) reads.
template <typename Tag, int DPAD, int WARPS, int BQ, bool ATOMIC_DQ, bool PARTIAL_DQ = false>
__device__ __forceinline__ void flashBackwardDkDvMma(const FlashKernelParams& p) {
  typedef MmaStep<Tag> F;
  typedef typename F::T T;
  static_assert(!(ATOMIC_DQ && PARTIAL_DQ), "one way to take part in dQ");
  constexpr bool kDqShare = ATOMIC_DQ || PARTIAL_DQ;
  constexpr int BN = 16 * WARPS, THREADS = 32 * WARPS, LD = DPAD + F::kPad;
  constexpr int QT = BQ / 8, DT = DPAD / 8;
  constexpr int LDS = BQ + F::kPad;  // dS^T tile [BN][BQ] (dQ shares only)
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sK = (T*)smemRaw;
  T* sV = sK + BN * LD;
  T* sQb = sV + BN * LD;            // [2][BQ][LD]
  T* sdOb = sQb + 2 * BQ * LD;      // [2][BQ][LD]
  float* sLse2b = (float*)(sdOb + 2 * BQ * LD);  // [2][BQ]
  float* sDeltab = sLse2b + 2 * BQ;              // [2][BQ]
  int* sBandb = (int*)(sDeltab + 2 * BQ);        // [2][3][BQ]: lo, hi, sinkHi per query row
  T* sdS = (T*)(sBandb + 2 * 3 * BQ);            // [BN][LDS], dQ shares only

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  DkDvBlock blk;
  blk.init(p, BN, BQ);
  const int b = blk.b, hk = blk.hk, n0 = blk.n0, n1 = blk.n1, nItems = blk.nItems;
  const TileMask& tm = blk.tm;
  auto nextItem = [&](int it) { return blk.next(it); };
  auto loadItem = [&](int it, int buf) {
    const int h = blk.head(it), q0 = blk.q0(it);
    loadTile<T, BQ, DPAD, LD, THREADS>(sQb + buf * BQ * LD, slicePtr<T>(p.q, b, h), p.q.seqStride, q0, p.qLen, p.headDim);
    loadTile<T, BQ, DPAD, LD, THREADS>(sdOb + buf * BQ * LD, slicePtr<T>(p.dO, b, h), p.dO.seqStride, q0, p.qLen, p.headDim);
    const long long rowBase = ((long long)b * p.heads + h) * p.qLen;
    loadRowStats<BQ, THREADS>(sLse2b + buf * BQ, sDeltab + buf * BQ, (const float*)p.lse + rowBase,
                              (const float*)p.delta + rowBase, q0, p.qLen, &tm, sBandb + buf * 3 * BQ);
  };

  float dK[DT][4], dV[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK[i][e] = dV[i][e] = 0.f;

  int it = nextItem(0);
  loadTile<T, BN, DPAD, LD, THREADS>(sK, slicePtr<T>(p.k, b, hk), p.k.seqStride, n0, p.kLen, p.headDim);
  loadTile<T, BN, DPAD, LD, THREADS>(sV, slicePtr<T>(p.v, b, hk), p.v.seqStride, n0, p.kLen, p.headDim);
  if (it < nItems) loadItem(it, 0);
  cpAsyncCommit();
  int buf = 0;
  const int keyA = n0 + warp * 16 + g;  // this thread's keys: keyA, keyA + 8
  while (it < nItems) {
    const int itn = nextItem(it + 1);
    if (itn < nItems) loadItem(itn, buf ^ 1);
    cpAsyncCommit();
    cpAsyncWait<1>();
    __syncthreads();
    const T* sQ = sQb + buf * BQ * LD;
    const T* sdO = sdOb + buf * BQ * LD;
    const float* sLse2 = sLse2b + buf * BQ;
    const float* sDelta = sDeltab + buf * BQ;
    const int* sBand = sBandb + buf * 3 * BQ;
    const int q0 = blk.q0(it), q1 = min(q0 + BQ, p.qLen);
    const bool full = tm.allVisible(q0, q1, n0, n1) && q1 - q0 == BQ;

    float pT[QT][4], dpT[QT][4];
#pragma unroll
    for (int i = 0; i < QT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) pT[i][e] = dpT[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DPAD / 16; ++kk) {
      typename F::A aK, aV;
      F::loadA(aK, sK, LD, warp * 16, kk * 16);
      F::loadA(aV, sV, LD, warp * 16, kk * 16);
#pragma unroll
      for (int nn = 0; nn < BQ / 16; ++nn) {
        typename F::B bq, bo;
        F::loadBNK(bq, sQ, LD, nn * 16, kk * 16);
        F::loadBNK(bo, sdO, LD, nn * 16, kk * 16);
        F::mma(pT[2 * nn], aK, bq, 0);
        F::mma(pT[2 * nn + 1], aK, bq, 1);
        F::mma(dpT[2 * nn], aV, bo, 0);
        F::mma(dpT[2 * nn + 1], aV, bo, 1);
      }
    }
    // P^T and dS^T (kept in dpT), element e of n-tile nt: key keyA + 8*(e>>1), query
    // q0 + 8*nt + 2t + (e&1).
#pragma unroll
    for (int nt = 0; nt < QT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nt * 8 + 2 * t + (e & 1);
        float x = pT[nt][e];
        if (!full && !bandVisible(keyA + 8 * (e >> 1), sBand[ql], sBand[BQ + ql], sBand[2 * BQ + ql])) x = negInf();
        const float pe = fastExp2(fmaf(x, p.scaleLog2, -sLse2[ql]));
        pT[nt][e] = pe;
        dpT[nt][e] = pe * (dpT[nt][e] - sDelta[ql]);
      }
    }
    if constexpr (kDqShare) {
      // dS^T rows of this warp's keys into shared memory, for the block-wide dQ product below.
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          Elem<Tag>::storePair(sdS + (warp * 16 + g + 8 * r) * LDS + nt * 8 + 2 * t, dpT[nt][2 * r], dpT[nt][2 * r + 1]);
    }
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      typename F::A aP, aS;
      F::fromAcc(aP, pT[2 * kk], pT[2 * kk + 1]);
      F::fromAcc(aS, dpT[2 * kk], dpT[2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < DPAD / 16; ++dd) {
        typename F::B bo, bq;
        F::loadBKN(bo, sdO, LD, dd * 16, kk * 16);
        F::loadBKN(bq, sQ, LD, dd * 16, kk * 16);
        F::mma(dV[2 * dd], aP, bo, 0);
        F::mma(dV[2 * dd + 1], aP, bo, 1);
        F::mma(dK[2 * dd], aS, bq, 0);
        F::mma(dK[2 * dd + 1], aS, bq, 1);
      }
    }
    if constexpr (kDqShare) {
      // dQ[q0 + i][:] += dS[i][:] . K over this block's BN keys (PARTIAL_DQ: the share itself, to
      // this key tile's slab). Warps split the BQ/16 row groups and, when there are more warps than
      // row groups, the head dim.
      constexpr int kRowGroups = BQ / 16, kColSplit = WARPS / kRowGroups, kCols = DPAD / kColSplit;
      static_assert(WARPS % kRowGroups == 0 && kCols % 16 == 0, "dQ split");
      __syncthreads();  // every warp's dS^T rows are in sdS
      const int rg = warp % kRowGroups, c0 = (warp / kRowGroups) * kCols;
      const int h = blk.head(it);
      const long long slab = PARTIAL_DQ ? (long long)(blk.n0 / BN) * p.batch * p.heads * p.qLen * p.headDim : 0;
      float* dqRow = (float*)(PARTIAL_DQ ? p.dQPartial : p.dQAccum) + slab +
                     (((long long)b * p.heads + h) * p.qLen + q0 + rg * 16 + g) * p.headDim;
      const bool row0ok = q0 + rg * 16 + g < p.qLen, row1ok = q0 + rg * 16 + g + 8 < p.qLen;
#pragma unroll
      for (int dd = 0; dd < kCols / 16; ++dd) {
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          typename F::A a;
          typename F::B bk;
          F::loadATrans(a, sdS, LDS, rg * 16, kk * 16);
          F::loadBKN(bk, sK, LD, c0 + dd * 16, kk * 16);
          F::mma(acc[0], a, bk, 0);
          F::mma(acc[1], a, bk, 1);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = c0 + dd * 16 + nt * 8 + 2 * t;
          if constexpr (PARTIAL_DQ) {  // stores: nothing past the row (an odd head dim's pad column)
            if (row0ok && col < p.headDim) dqRow[col] = acc[nt][0];
            if (row0ok && col + 1 < p.headDim) dqRow[col + 1] = acc[nt][1];
            if (row1ok && col < p.headDim) dqRow[8 * p.headDim + col] = acc[nt][2];
            if (row1ok && col + 1 < p.headDim) dqRow[8 * p.headDim + col + 1] = acc[nt][3];
          } else if (col < p.headDim) {
            if (row0ok) {
              atomicAdd(dqRow + col, acc[nt][0]);
              atomicAdd(dqRow + col + 1, acc[nt][1]);
            }
            if (row1ok) {
              atomicAdd(dqRow + 8 * p.headDim + col, acc[nt][2]);
              atomicAdd(dqRow + 8 * p.headDim + col + 1, acc[nt][3]);
            }
          }
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
    buf ^= 1;
    it = itn;
  }
  cpAsyncWait<0>();

  blk.storeKeys<Tag, DT>(p, keyA, t, [&](int dt, int r) {
    return make_float4(dK[dt][2 * r], dK[dt][2 * r + 1], dV[dt][2 * r], dV[dt][2 * r + 1]);
  });
}

// Tensor-core dQ. WARPS warps x MT m-tiles of 16 query rows; key tiles of BN rows, double-buffered.
// MT = 2 halves the K/V fragment loads per mma, as in the forward.
template <typename Tag, int DPAD, int WARPS, int BN, int MT>
__device__ __forceinline__ void flashBackwardDqMma(const FlashKernelParams& p) {
  typedef MmaStep<Tag> F;
  typedef typename F::T T;
  constexpr int BM = 16 * MT * WARPS, THREADS = 32 * WARPS, LD = DPAD + F::kPad;
  constexpr int NT = BN / 8, DT = DPAD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sQ = (T*)smemRaw;
  T* sdO = sQ + BM * LD;
  T* sKb = sdO + BM * LD;      // [2][BN][LD]
  T* sVb = sKb + 2 * BN * LD;  // [2][BN][LD]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  QueryBlock blk;
  blk.init(p, BM, BN);
  const int bh = blk.bh, b = blk.b, h = blk.h, hk = blk.hk, m0 = blk.m0;
  const T* gK = slicePtr<T>(p.k, b, hk);
  const T* gV = slicePtr<T>(p.v, b, hk);
  const TileMask& tm = blk.tm;
  const BlockTiles& tiles = blk.tiles;
  const int nTiles = tiles.nTiles;
  auto loadKV = [&](int j, int buf) {
    loadTile<T, BN, DPAD, LD, THREADS>(sKb + buf * BN * LD, gK, p.k.seqStride, j * BN, p.kLen, p.headDim);
    loadTile<T, BN, DPAD, LD, THREADS>(sVb + buf * BN * LD, gV, p.v.seqStride, j * BN, p.kLen, p.headDim);
  };

  const int warpRow0 = warp * 16 * MT;
  const int rowA = m0 + warpRow0 + g;  // rows of m-tile mt: rowA + 16*mt (+8)
  const float* lse = (const float*)p.lse + (long long)bh * p.qLen;
  const float* delta = (const float*)p.delta + (long long)bh * p.qLen;
  float lse2[MT][2], dl[MT][2];
  int bandLo[MT][2], bandHi[MT][2], bandSink[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = rowA + 16 * mt + 8 * r;
      lse2[mt][r] = q < p.qLen ? backwardLse2(lse[q]) : posInf();
      dl[mt][r] = q < p.qLen ? delta[q] : 0.f;
      tm.rowBand(q, bandLo[mt][r], bandHi[mt][r], bandSink[mt][r]);
    }
  float dQ[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < DT; ++i) dQ[mt][i][0] = dQ[mt][i][1] = dQ[mt][i][2] = dQ[mt][i][3] = 0.f;

  int j = tiles.next(0);
  loadTile<T, BM, DPAD, LD, THREADS>(sQ, slicePtr<T>(p.q, b, h), p.q.seqStride, m0, p.qLen, p.headDim);
  loadTile<T, BM, DPAD, LD, THREADS>(sdO, slicePtr<T>(p.dO, b, h), p.dO.seqStride, m0, p.qLen, p.headDim);
  if (j < nTiles) loadKV(j, 0);
  cpAsyncCommit();
  int buf = 0;
  while (j < nTiles) {
    const int jn = tiles.next(j + 1);
    if (jn < nTiles) loadKV(jn, buf ^ 1);
    cpAsyncCommit();
    cpAsyncWait<1>();
    __syncthreads();
    const T* sK = sKb + buf * BN * LD;
    const T* sV = sVb + buf * BN * LD;
    const int n0 = j * BN, n1 = min(n0 + BN, p.kLen);
    const bool full = tiles.full(n0, n1) && n1 - n0 == BN;

    float s[MT][NT][4], dp[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][i][e] = dp[mt][i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DPAD / 16; ++kk) {
      typename F::A aQ[MT], aO[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        F::loadA(aQ[mt], sQ, LD, warpRow0 + 16 * mt, kk * 16);
        F::loadA(aO[mt], sdO, LD, warpRow0 + 16 * mt, kk * 16);
      }
#pragma unroll
      for (int nn = 0; nn < BN / 16; ++nn) {
        typename F::B bk, bv;
        F::loadBNK(bk, sK, LD, nn * 16, kk * 16);
        F::loadBNK(bv, sV, LD, nn * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          F::mma(s[mt][2 * nn], aQ[mt], bk, 0);
          F::mma(s[mt][2 * nn + 1], aQ[mt], bk, 1);
          F::mma(dp[mt][2 * nn], aO[mt], bv, 0);
          F::mma(dp[mt][2 * nn + 1], aO[mt], bv, 1);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float x = s[mt][nt][e];
          if (!full && !bandVisible(n0 + nt * 8 + 2 * t + (e & 1), bandLo[mt][r], bandHi[mt][r], bandSink[mt][r]))
            x = negInf();
          const float pe = fastExp2(fmaf(x, p.scaleLog2, -lse2[mt][r]));
          dp[mt][nt][e] = pe * (dp[mt][nt][e] - dl[mt][r]);
        }
      }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      typename F::A aS[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) F::fromAcc(aS[mt], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < DPAD / 16; ++dd) {
        typename F::B bk;
        F::loadBKN(bk, sK, LD, dd * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          F::mma(dQ[mt][2 * dd], aS[mt], bk, 0);
          F::mma(dQ[mt][2 * dd + 1], aS[mt], bk, 1);
        }
      }
    }
    __syncthreads();
    buf ^= 1;
    j = jn;
  }
  cpAsyncWait<0>();

  T* gdQ = sliceMutPtr<T>(p.dQ, b, h);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = rowA + 16 * mt + 8 * r;
      if (q >= p.qLen) continue;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < p.headDim)
          Elem<Tag>::storePair(gdQ + (long long)q * p.dQ.seqStride + col, dQ[mt][dt][2 * r] * p.scale,
                               dQ[mt][dt][2 * r + 1] * p.scale);
      }
    }
}

}  // namespace flash
}  // namespace pa
