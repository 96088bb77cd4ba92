// FlashAttention-2 backward templates: preprocess (rowsum(dO*O), sink-logit gradient), dK/dV per
// key tile and dQ per query tile, each as an exact fp32 FFMA kernel and an mma.sync kernel.
/*
 * Algorithm. With x = scale * q.k, P = exp(x - lse) (lse saved by the forward, sink included):
 *   dV_k  = sum_q P_qk dO_q                 dP_qk = dO_q . V_k
 *   dS_qk = P_qk (dP_qk - Delta_q),          Delta_q = dO_q . O_q   (= sum_k P_qk dP_qk)
 *   dQ_q  = scale * sum_k dS_qk K_k          dK_k  = scale * sum_q dS_qk Q_q
 *   dSink_h = -sum_{b,q} exp(sink_h - lse_q) Delta_q
 * The identity Delta = dO.O holds with a sink because the sink only adds to the denominator.
 *
 * Two schemes. Default for fp16/bf16: three kernels and no atomics, described next. Opt-in there
 * (`atomicDq`, FlashAttention-2's scheme): the dK/dV kernel also adds dQ = dS.K into an fp32
 * buffer with atomics and a small kernel converts it; the order of those additions varies, and on
 * the H100 it measured 10-20% slower than the default (bench/RESULTS_flash.md). fp32 (FFMA, where
 * the two recomputed products cost more than the atomics) takes dQ from the dK/dV kernel either
 * way: per-key-block shares summed in order while there are at most 8 key blocks, atomics beyond
 * unless `deterministic` asks for the separate dQ kernel (Fp32DqMode).
 *
 * Why three kernels and no atomics. FlashAttention-2 computes dQ inside the dK/dV loop and
 * accumulates it with fp32 atomics; the result then depends on the order of the atomics. Here the
 * dK/dV kernel (one block per key tile and KV head; it loops over the query tiles of every query
 * head of its GQA group, so dK/dV of a shared KV head are summed in registers) and the dQ kernel
 * (one block per query tile; it loops over the visible key tiles) recompute P and dP separately.
 * That costs two extra matrix products per tile pair (7 instead of 5), buys bit-for-bit
 * reproducible gradients, needs no fp32 dQ buffer and no conversion pass, and makes the
 * `deterministic` flag free to honour. With GQA (16-bit types) the dK/dV kernel runs one block per
 * query head and writes fp32 partials that flashBackwardDkDvReduce sums per KV head in a fixed
 * order: a causal grid of few, unequal per-KV-head blocks otherwise ends in a long tail. The
 * sink gradient is reduced in a fixed order too: partial sums per (head, batch, query tile), then
 * one block per head.
 *
 * Traps: rows with lse = -inf saw no key; backwardLse2 turns their lse into +inf so that the
 * recomputed P is exactly 0 and the row contributes nothing. Rows past qLen and keys past kLen are
 * zero-filled in shared memory and get P = 0 from the mask / the +inf lse, never NaN.
 */
#pragma once

#include "kernels/flash_attention_fwd.cuh"

namespace pa {
namespace flash {

constexpr int kPreprocessRows = 64;  // query rows per preprocess block (FlashKernelParams::qTiles)

// Delta = rowsum(dO * O) in fp32, and per-block partial sums of the sink-logit gradient.
// Grid (qTiles, batch * heads), 256 threads.
template <typename Tag>
__device__ __forceinline__ void flashBackwardPreprocess(const FlashKernelParams& p) {
  typedef typename Elem<Tag>::Storage T;
  __shared__ float warpSums[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const T* gO = slicePtr<T>(p.o, b, h);
  const T* gdO = slicePtr<T>(p.dO, b, h);
  const float* lse = (const float*)p.lse + (long long)bh * p.qLen;
  float* delta = (float*)p.delta + (long long)bh * p.qLen;
  const bool sinkGrad = p.sinkLogits != 0 && p.dSinkLogits != 0;
  const float sink = sinkGrad ? ((const float*)p.sinkLogits)[h] : 0.f;
  float sinkAcc = 0.f;
  for (int r = warp; r < kPreprocessRows; r += 8) {
    const int q = blockIdx.x * kPreprocessRows + r;
    if (q >= p.qLen) break;
    float acc = 0.f;
    for (int d = lane; d < p.headDim; d += 32)
      acc += Elem<Tag>::toFloat(gO[(long long)q * p.o.seqStride + d]) *
             Elem<Tag>::toFloat(gdO[(long long)q * p.dO.seqStride + d]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
      delta[q] = acc;
      if (sinkGrad) sinkAcc -= expf(sink - lse[q]) * acc;
    }
    if (p.dQAccum) {  // the atomic-dQ dK/dV kernel adds into this row next
      float* row = (float*)p.dQAccum + ((long long)bh * p.qLen + q) * p.headDim;
      for (int d = lane; d < p.headDim; d += 32) row[d] = 0.f;
    }
  }
  if (!sinkGrad) return;
  if (lane == 0) warpSums[warp] = sinkAcc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < 8; ++w) s += warpSums[w];
    ((float*)p.sinkPartial)[(long long)h * p.batch * p.qTiles + (long long)b * p.qTiles + blockIdx.x] = s;
  }
}

// dSinkLogits[h] = sum of the partials of head h, in a fixed order. Grid (heads), 256 threads.
__device__ __forceinline__ void flashBackwardSinkReduce(const FlashKernelParams& p) {
  __shared__ float sums[256];
  const int h = blockIdx.x;
  const long long n = (long long)p.batch * p.qTiles;
  const float* part = (const float*)p.sinkPartial + (long long)h * n;
  float s = 0.f;
  for (long long i = threadIdx.x; i < n; i += 256) s += part[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) ((float*)p.dSinkLogits)[h] = sums[0];
}

// dQ = scale * dQAccum in the element type (atomic-dQ path). Grid (qTiles, batch * heads), 256 threads.
template <typename Tag>
__device__ __forceinline__ void flashBackwardDqConvert(const FlashKernelParams& p) {
  typedef typename Elem<Tag>::Storage T;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  T* gdQ = sliceMutPtr<T>(p.dQ, b, h);
  const float* acc = (const float*)p.dQAccum + (long long)bh * p.qLen * p.headDim;
  const int q0 = blockIdx.x * kPreprocessRows;
  const int n = min(kPreprocessRows, p.qLen - q0) * p.headDim;
  for (int i = threadIdx.x; i < n; i += 256) {
    const int q = q0 + i / p.headDim, d = i % p.headDim;
    gdQ[(long long)q * p.dQ.seqStride + d] = Elem<Tag>::fromFloat(acc[(long long)q * p.headDim + d] * p.scale);
  }
}

// dK, dV of each KV head = sum of the per-query-head partials of its group, in a fixed order.
// Grid (ceil(kLen / 64), batch * kvHeads), 256 threads.
template <typename Tag>
__device__ __forceinline__ void flashBackwardDkDvReduce(const FlashKernelParams& p) {
  const int b = blockIdx.y / p.kvHeads, hk = blockIdx.y % p.kvHeads, group = p.heads / p.kvHeads;
  const int k0 = blockIdx.x * 64;
  const int n = min(64, p.kLen - k0) * p.headDim;
  const long long headElems = (long long)p.kLen * p.headDim;
  const float* partK = (const float*)p.dKVPartial + ((long long)b * p.heads + hk * group) * headElems;
  const float* partV = partK + (long long)p.batch * p.heads * headElems;
  typename Elem<Tag>::Storage* gdK = sliceMutPtr<typename Elem<Tag>::Storage>(p.dK, b, hk);
  typename Elem<Tag>::Storage* gdV = sliceMutPtr<typename Elem<Tag>::Storage>(p.dV, b, hk);
  for (int i = threadIdx.x; i < n; i += 256) {
    const int k = k0 + i / p.headDim, d = i % p.headDim;
    const long long off = (long long)k * p.headDim + d;
    float sk = 0.f, sv = 0.f;
    for (int g = 0; g < group; ++g) {
      sk += partK[g * headElems + off];
      sv += partV[g * headElems + off];
    }
    gdK[(long long)k * p.dK.seqStride + d] = Elem<Tag>::fromFloat(sk);
    gdV[(long long)k * p.dV.seqStride + d] = Elem<Tag>::fromFloat(sv);
  }
}

// Loads lse (as backwardLse2) and Delta of query rows [q0, q0 + ROWS) into shared memory, and, when
// `band` is given, each row's visible band (TileMask::rowBand) as three ints per row.
template <int ROWS, int THREADS>
__device__ __forceinline__ void loadRowStats(float* sLse2, float* sDelta, const float* lse,
                                             const float* delta, int q0, int qLen, const TileMask* band = nullptr,
                                             int* sBand = nullptr) {
  for (int r = threadIdx.x; r < ROWS; r += THREADS) {
    const int q = q0 + r;
    sLse2[r] = q < qLen ? backwardLse2(lse[q]) : posInf();
    sDelta[r] = q < qLen ? delta[q] : 0.f;
    if (band) band->rowBand(q, sBand[r], sBand[ROWS + r], sBand[2 * ROWS + r]);
  }
}

// The work of one dK/dV block: keys [n0, n1) of KV head hk in batch b, and the (query head, query
// tile of BQ rows) items it visits: every query head of the group, or with split GQA (dKVPartial
// set: one block per query head, partial dK/dV summed by a reduce kernel, so that a causal grid of
// few heavy blocks does not end in a long tail) its own head only; tiles the mask hides from these
// keys are skipped.
struct DkDvBlock {
  int b, hFirst, hk, n0, n1, nQT, nItems, bq;
  bool splitHeads;
  TileMask tm;
  __device__ __forceinline__ void init(const FlashKernelParams& p, int bn, int bqRows) {
    const int group = p.heads / p.kvHeads;
    splitHeads = p.dKVPartial != 0;
    b = blockIdx.y / (splitHeads ? p.heads : p.kvHeads);
    hFirst = splitHeads ? blockIdx.y % p.heads : (blockIdx.y % p.kvHeads) * group;
    hk = hFirst / group;
    n0 = blockIdx.x * bn;
    n1 = min(n0 + bn, p.kLen);
    bq = bqRows;
    tm = TileMask{p.mask, p.qLen, p.kLen};
    nQT = ceilDiv(p.qLen, bq);
    nItems = (splitHeads ? 1 : group) * nQT;
  }
  __device__ __forceinline__ int head(int it) const { return hFirst + it / nQT; }
  __device__ __forceinline__ int q0(int it) const { return (it % nQT) * bq; }
  // The first item >= it with a visible (query, key) pair, or nItems.
  __device__ __forceinline__ int next(int it) const {
    while (it < nItems && !tm.anyVisible(q0(it), min(q0(it) + bq, (int)tm.qLen), n0, n1)) ++it;
    return it;
  }
  // Stores a thread's two accumulator rows of dK (scaled) and dV, keys keyA and keyA + 8, column
  // pairs dt * 8 + 2t (dt < DT): the fp32 partials of this block's query head with split GQA,
  // else dK and dV. `pairs(dt, r)` gives {dK pair, dV pair} of row r; the mma.sync and wgmma
  // kernels differ only in their accumulator layout there.
  template <typename Tag, int DT, class Pairs>
  __device__ __forceinline__ void storeKeys(const FlashKernelParams& p, int keyA, int t, const Pairs& pairs) const {
    typedef typename Elem<Tag>::Storage T;
    if (splitHeads) {  // the branch stays outside the loops
      float* partK = (float*)p.dKVPartial + ((long long)b * p.heads + hFirst) * p.kLen * p.headDim;
      float* partV = partK + (long long)p.batch * p.heads * p.kLen * p.headDim;
      forEachPair<DT>(p, keyA, t, pairs, [&](int k, int col, float2 dk, float2 dv) {
        *(float2*)(partK + (long long)k * p.headDim + col) = dk;
        *(float2*)(partV + (long long)k * p.headDim + col) = dv;
      });
    } else {
      T* gdK = sliceMutPtr<T>(p.dK, b, hk);
      T* gdV = sliceMutPtr<T>(p.dV, b, hk);
      forEachPair<DT>(p, keyA, t, pairs, [&](int k, int col, float2 dk, float2 dv) {
        Elem<Tag>::storePair(gdK + (long long)k * p.dK.seqStride + col, dk.x, dk.y);
        Elem<Tag>::storePair(gdV + (long long)k * p.dV.seqStride + col, dv.x, dv.y);
      });
    }
  }
  template <int DT, class Pairs, class Store>
  __device__ __forceinline__ void forEachPair(const FlashKernelParams& p, int keyA, int t, const Pairs& pairs,
                                              const Store& store) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int k = keyA + 8 * r;
      if (k >= p.kLen) continue;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col >= p.headDim) continue;
        const float4 kv = pairs(dt, r);
        store(k, col, make_float2(kv.x * p.scale, kv.y * p.scale), make_float2(kv.z, kv.w));
      }
    }
  }
};

// =============================================================================================
// Tensor-core dK/dV. WARPS warps x 16 keys = one key tile; query tiles of BQ rows, double-buffered.
// ATOMIC_DQ: also adds this key tile's share of dQ = dS.K into the fp32 dQAccum with atomics
// (FlashAttention-2's scheme, 5 products per tile pair instead of the 7 of the separate dQ
// kernel; the summation order of dQ then varies from run to run).
template <typename Tag, int DPAD, int WARPS, int BQ, bool ATOMIC_DQ>
__device__ __forceinline__ void flashBackwardDkDvMma(const FlashKernelParams& p) {
  typedef MmaStep<Tag> F;
  typedef typename F::T T;
  constexpr int BN = 16 * WARPS, THREADS = 32 * WARPS, LD = DPAD + F::kPad;
  constexpr int QT = BQ / 8, DT = DPAD / 8;
  constexpr int LDS = BQ + F::kPad;  // dS^T tile [BN][BQ] (atomic-dQ only)
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sK = (T*)smemRaw;
  T* sV = sK + BN * LD;
  T* sQb = sV + BN * LD;            // [2][BQ][LD]
  T* sdOb = sQb + 2 * BQ * LD;      // [2][BQ][LD]
  float* sLse2b = (float*)(sdOb + 2 * BQ * LD);  // [2][BQ]
  float* sDeltab = sLse2b + 2 * BQ;              // [2][BQ]
  int* sBandb = (int*)(sDeltab + 2 * BQ);        // [2][3][BQ]: lo, hi, sinkHi per query row
  T* sdS = (T*)(sBandb + 2 * 3 * BQ);            // [BN][LDS], atomic-dQ only

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
    if constexpr (ATOMIC_DQ) {
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
    if constexpr (ATOMIC_DQ) {
      // dQ[q0 + i][:] += dS[i][:] . K over this block's BN keys. Warps split the BQ/16 row groups
      // and, when there are more warps than row groups, the head dim.
      constexpr int kRowGroups = BQ / 16, kColSplit = WARPS / kRowGroups, kCols = DPAD / kColSplit;
      static_assert(WARPS % kRowGroups == 0 && kCols % 16 == 0, "dQ split");
      __syncthreads();  // every warp's dS^T rows are in sdS
      const int rg = warp % kRowGroups, c0 = (warp / kRowGroups) * kCols;
      const int h = blk.head(it);
      float* dqRow = (float*)p.dQAccum + (((long long)b * p.heads + h) * p.qLen + q0 + rg * 16 + g) * p.headDim;
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
          if (col < p.headDim) {
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

// =============================================================================================
// How the fp32 dK/dV kernel takes part in dQ (FlashKernelSpec::dqPartial, ::atomicDq).
enum Fp32DqMode : int {
  kDqSeparate = 0,  // not at all: the dQ kernel recomputes S and dP (7 products per tile pair)
  kDqPartial = 1,   // writes its key block's share dS.K; flashBackwardDqReduceF32 sums the shares
                    // in key-block order (5 products, deterministic; workspace: blocks x dQ)
  kDqAtomic = 2     // adds its share into the fp32 dQAccum with vector reductions (5 products,
                    // FlashAttention-2's scheme; the order of the additions varies from run to run)
};

// dst[0..3] += v with one 16-byte reduction on sm_90 (red.global.add.v4.f32), four below.
__device__ __forceinline__ void redAddF32x4(float* dst, float4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

// A key block's share of dQ for a step's 64 queries, summed over its `keys` real keys (past kLen,
// sK and sS hold no data): acc[i][c] = sum_j dS^T[j][4 ty + i] * K[j][nnCol(c)], so thread
// (ty, tx) owns queries 4 ty .. 4 ty + 3 and the NN accumulators' float4 column groups.
template <int DPAD, int LD, int LDP>
__device__ __forceinline__ void dqShareF32(float (&acc)[4][DPAD / 8], const float* sS, const float* sK, int keys, int ty,
                                           int tx) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < DPAD / 8; ++c) acc[i][c] = 0.f;
#pragma unroll 4
  for (int j = 0; j < keys; ++j) {
    const float4 s4 = *(const float4*)(sS + j * LDP + 4 * ty);
    const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
    for (int cg = 0; cg < DPAD / 32; ++cg) {
      const float4 kv = *(const float4*)(sK + j * LD + 32 * cg + 4 * tx);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[i][4 * cg + 0] = fmaf(sv[i], kv.x, acc[i][4 * cg + 0]);
        acc[i][4 * cg + 1] = fmaf(sv[i], kv.y, acc[i][4 * cg + 1]);
        acc[i][4 * cg + 2] = fmaf(sv[i], kv.z, acc[i][4 * cg + 2]);
        acc[i][4 * cg + 3] = fmaf(sv[i], kv.w, acc[i][4 * cg + 3]);
      }
    }
  }
}

// Exact fp32 dK/dV: 128 threads, 16R keys (rows ffmaRow(i, ty)) x 64 queries (tx + 8*j) per step.
// R (1, 2, 4) trades blocks for shared-memory traffic per FFMA, as in the forward. DQ: the
// block's part in dQ (Fp32DqMode).
template <int DPAD, int R, int DQ>
__device__ __forceinline__ void flashBackwardDkDvF32(const FlashKernelParams& p) {
  constexpr int BN = 16 * R, BQ = 64, THREADS = 128, LD = DPAD + 4, LDP = 68, DC = DPAD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  float* sK = (float*)smemRaw;
  float* sV = sK + BN * LD;
  float* sQ = sV + BN * LD;
  float* sdO = sQ + BQ * LD;
  float* sP = sdO + BQ * LD;   // P^T  [key][query]
  float* sS = sP + BN * LDP;   // dS^T [key][query]
  float* sLse2 = sS + BN * LDP;
  float* sDelta = sLse2 + BQ;

  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  DkDvBlock blk;  // fp32 has no split-GQA partials: one block per KV head, over its query heads
  blk.init(p, BN, BQ);
  const int b = blk.b, hk = blk.hk, n0 = blk.n0, n1 = blk.n1, nItems = blk.nItems;
  const TileMask& tm = blk.tm;

  float dK[R][DC], dV[R][DC];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int c = 0; c < DC; ++c) dK[i][c] = dV[i][c] = 0.f;

  // Items (DkDvBlock): (query head, query tile); the next visible one is prefetched while this
  // step's dQ share runs (Q and dO by cp.async, its row stats into registers of threads < BQ).
  auto loadItem = [&](int it) {
    const int h = blk.head(it), q0 = blk.q0(it);
    loadTile<float, BQ, DPAD, LD, THREADS>(sQ, slicePtr<float>(p.q, b, h), p.q.seqStride, q0, p.qLen, p.headDim);
    loadTile<float, BQ, DPAD, LD, THREADS>(sdO, slicePtr<float>(p.dO, b, h), p.dO.seqStride, q0, p.qLen, p.headDim);
  };
  // Raw lse (-inf past qLen, which backwardLse2 maps to +inf) and Delta of row threadIdx.x of an
  // item: plain loads whose results are first needed at the next step's top.
  float rawLse = 0.f, rawDelta = 0.f;
  auto loadStats = [&](int it) {
    const int h = blk.head(it), q = blk.q0(it) + (int)threadIdx.x;
    const long long row = ((long long)b * p.heads + h) * p.qLen + q;
    rawLse = q < p.qLen ? ((const float*)p.lse)[row] : negInf();
    rawDelta = q < p.qLen ? ((const float*)p.delta)[row] : 0.f;
  };
  static_assert(BQ <= THREADS, "one row statistic per thread");

  int it = blk.next(0);
  loadTile<float, BN, DPAD, LD, THREADS>(sK, slicePtr<float>(p.k, b, hk), p.k.seqStride, n0, p.kLen, p.headDim);
  loadTile<float, BN, DPAD, LD, THREADS>(sV, slicePtr<float>(p.v, b, hk), p.v.seqStride, n0, p.kLen, p.headDim);
  if (it < nItems) {
    loadItem(it);
    if (threadIdx.x < BQ) loadStats(it);
  }
  cpAsyncCommit();
  while (it < nItems) {
    const int h = blk.head(it), q0 = blk.q0(it), q1 = min(q0 + BQ, p.qLen);
    if (threadIdx.x < BQ) {  // the previous step's last reads of the stats were before its barrier
      sLse2[threadIdx.x] = backwardLse2(rawLse);
      sDelta[threadIdx.x] = rawDelta;
    }
    cpAsyncWait<0>();
    __syncthreads();  // Q, dO and the stats of this item are in shared memory
    const bool full = tm.allVisible(q0, q1, n0, n1) && q1 - q0 == BQ;

    float acc[R][8];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) acc[i][jj] = 0.f;
    ffmaNT<DPAD, LD, R>(acc, sK, sQ, ty, tx);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int ql = tx + 8 * jj;
        float x = acc[i][jj] * p.scaleLog2;
        if (!full && !tm.visible(q0 + ql, n0 + ffmaRow(i, ty))) x = negInf();
        sP[ffmaRow(i, ty) * LDP + ql] = exp2f(x - sLse2[ql]);
        acc[i][jj] = 0.f;
      }
    ffmaNT<DPAD, LD, R>(acc, sV, sdO, ty, tx);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int ql = tx + 8 * jj;
        const float pe = sP[ffmaRow(i, ty) * LDP + ql];
        sS[ffmaRow(i, ty) * LDP + ql] = pe * (acc[i][jj] - sDelta[ql]);
      }
    __syncwarp();  // rows of sP / sS are written and read by the same 8 lanes
    ffmaNN<DPAD, LD, LDP, BQ, R>(dV, sP, sdO, ty, tx);
    ffmaNN<DPAD, LD, LDP, BQ, R>(dK, sS, sQ, ty, tx);
    const int itn = blk.next(it + 1);
    __syncthreads();  // sQ, sdO and the stats are free; every key row of sS is written
    if (itn < nItems) {
      loadItem(itn);
      if (threadIdx.x < BQ) loadStats(itn);
    }
    cpAsyncCommit();
    if constexpr (DQ != kDqSeparate) {
      float acc[4][DC];
      dqShareF32<DPAD, LD, LDP>(acc, sS, sK, n1 - n0, ty, tx);
      const long long bhRow = ((long long)b * p.heads + h) * p.qLen;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int q = q0 + 4 * ty + i;
        if (q >= p.qLen) continue;
        if constexpr (DQ == kDqPartial) {
          float* part = (float*)p.dQPartial + ((long long)blockIdx.x * p.batch * p.heads * p.qLen + bhRow + q) * p.headDim;
          storeNNRow<DPAD>(part, acc[i], 1.f, tx, p.headDim);
        } else {
          float* row = (float*)p.dQAccum + (bhRow + q) * p.headDim;
#pragma unroll
          for (int cg = 0; cg < DPAD / 32; ++cg)
            if (32 * cg + 4 * tx < p.headDim)
              redAddF32x4(row + 32 * cg + 4 * tx, make_float4(acc[i][4 * cg], acc[i][4 * cg + 1], acc[i][4 * cg + 2], acc[i][4 * cg + 3]));
        }
      }
    }
    it = itn;
  }
  cpAsyncWait<0>();

  float* gdK = sliceMutPtr<float>(p.dK, b, hk);
  float* gdV = sliceMutPtr<float>(p.dV, b, hk);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int k = n0 + ffmaRow(i, ty);
    if (k >= p.kLen) continue;
    storeNNRow<DPAD>(gdK + (long long)k * p.dK.seqStride, dK[i], p.scale, tx, p.headDim);
    storeNNRow<DPAD>(gdV + (long long)k * p.dV.seqStride, dV[i], 1.f, tx, p.headDim);
  }
}

// dQ = scale * the sum of the key blocks' dS.K shares (flashBackwardDkDvF32<..., kDqPartial>), in
// key-block order, over the blocks that saw the query tile (the dK/dV kernel's own test).
// Grid (ceil(qLen / 64), batch * heads), 256 threads; BN = 16 R keys per block.
template <int R>
__device__ __forceinline__ void flashBackwardDqReduceF32(const FlashKernelParams& p) {
  constexpr int BN = 16 * R, BQ = 64;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int q0 = blockIdx.x * BQ, q1 = min(q0 + BQ, p.qLen);
  const TileMask tm{p.mask, p.qLen, p.kLen};
  const int blocks = ceilDiv(p.kLen, BN);
  const long long slice = (long long)p.batch * p.heads * p.qLen * p.headDim;
  const float* part = (const float*)p.dQPartial + (long long)bh * p.qLen * p.headDim;
  float* gdQ = sliceMutPtr<float>(p.dQ, b, h);
  const int n = (q1 - q0) * p.headDim;
  for (int i = threadIdx.x; i < n; i += 256) {
    const int q = q0 + i / p.headDim, d = i % p.headDim;
    float s = 0.f;
    for (int kb = 0; kb < blocks; ++kb)
      if (tm.anyVisible(q0, q1, kb * BN, min(kb * BN + BN, p.kLen))) s += part[kb * slice + (long long)q * p.headDim + d];
    gdQ[(long long)q * p.dQ.seqStride + d] = s * p.scale;
  }
}

// Exact fp32 dQ: 128 threads, 16R query rows (ffmaRow(i, ty)) x 64 keys (tx + 8*j) per step.
template <int DPAD, int R>
__device__ __forceinline__ void flashBackwardDqF32(const FlashKernelParams& p) {
  constexpr int BM = 16 * R, BN = 64, THREADS = 128, LD = DPAD + 4, LDP = 68, DC = DPAD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  float* sQ = (float*)smemRaw;
  float* sdO = sQ + BM * LD;
  float* sK = sdO + BM * LD;
  float* sV = sK + BN * LD;
  float* sS = sV + BN * LD;  // dS [query][key]

  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int hk = h / (p.heads / p.kvHeads);
  const int m0 = heavyFirstTile() * BM, m1 = min(m0 + BM, p.qLen);
  const TileMask tm{p.mask, p.qLen, p.kLen};
  const int nTiles = ceilDiv(p.kLen, BN);
  const float* lse = (const float*)p.lse + (long long)bh * p.qLen;
  const float* delta = (const float*)p.delta + (long long)bh * p.qLen;
  float lse2[R], dl[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int q = m0 + ffmaRow(i, ty);
    lse2[i] = q < p.qLen ? backwardLse2(lse[q]) : posInf();
    dl[i] = q < p.qLen ? delta[q] : 0.f;
  }
  float dQ[R][DC];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int c = 0; c < DC; ++c) dQ[i][c] = 0.f;

  loadTile<float, BM, DPAD, LD, THREADS>(sQ, slicePtr<float>(p.q, b, h), p.q.seqStride, m0, p.qLen, p.headDim);
  loadTile<float, BM, DPAD, LD, THREADS>(sdO, slicePtr<float>(p.dO, b, h), p.dO.seqStride, m0, p.qLen, p.headDim);
  cpAsyncCommit();
  BlockTiles tiles;
  tiles.init(tm, m0, m1, BN);
  for (int j = tiles.next(0); j < nTiles; j = tiles.next(j + 1)) {
    const int n0 = j * BN, n1 = min(n0 + BN, p.kLen);
    __syncthreads();
    loadTile<float, BN, DPAD, LD, THREADS>(sK, slicePtr<float>(p.k, b, hk), p.k.seqStride, n0, p.kLen, p.headDim);
    loadTile<float, BN, DPAD, LD, THREADS>(sV, slicePtr<float>(p.v, b, hk), p.v.seqStride, n0, p.kLen, p.headDim);
    cpAsyncCommit();
    cpAsyncWait<0>();
    __syncthreads();
    const bool full = tiles.full(n0, n1) && n1 - n0 == BN;

    float acc[R][8], pr[R][8];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) acc[i][jj] = 0.f;
    ffmaNT<DPAD, LD, R>(acc, sQ, sK, ty, tx);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        float x = acc[i][jj] * p.scaleLog2;
        if (!full && !tm.visible(m0 + ffmaRow(i, ty), n0 + tx + 8 * jj)) x = negInf();
        pr[i][jj] = exp2f(x - lse2[i]);
        acc[i][jj] = 0.f;
      }
    ffmaNT<DPAD, LD, R>(acc, sdO, sV, ty, tx);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) sS[ffmaRow(i, ty) * LDP + tx + 8 * jj] = pr[i][jj] * (acc[i][jj] - dl[i]);
    __syncwarp();
    ffmaNN<DPAD, LD, LDP, BN, R>(dQ, sS, sK, ty, tx);
  }
  cpAsyncWait<0>();

  float* gdQ = sliceMutPtr<float>(p.dQ, b, h);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int q = m0 + ffmaRow(i, ty);
    if (q >= p.qLen) continue;
    storeNNRow<DPAD>(gdQ + (long long)q * p.dQ.seqStride, dQ[i], p.scale, tx, p.headDim);
  }
}

}  // namespace flash
}  // namespace pa
