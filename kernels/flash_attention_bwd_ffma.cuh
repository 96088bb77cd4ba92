// FlashAttention-2 backward in exact fp32 on FFMA: the dK/dV kernel with its part in dQ
// (Fp32DqMode), the dQ reduction of per-key-block shares, and the separate dQ kernel. The
// algorithm and its traps: flash_attention_bwd_common.cuh.
#pragma once

#include "kernels/flash_attention_bwd_common.cuh"

namespace pa {
namespace flash {

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
// block's part in dQ (Fp32DqMode). QS > 1 (FlashKernelSpec::querySplit): QS blocks share a key
// block, part r taking its items r, r + QS, ... and writing fp32 partials of dK and dV
// ([2][batch, kvHeads * QS, kLen, headDim] at p.dKVPartial) that flashBackwardDkDvReduce sums in
// part order, so short sequences get R = 4's tiles and enough blocks both.
template <int DPAD, int R, int DQ, int QS = 1>
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
  int slice, tile;
  gridItem(p, false, slice, tile);  // tile: key block * QS + part
  const int part = tile % QS;
  blk.initAt(p, BN, BQ, slice, tile / QS, false);
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

  int it = blk.next(part, QS);
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
    const int itn = blk.next(it + QS, QS);
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
          float* part = (float*)p.dQPartial + ((long long)(n0 / BN) * p.batch * p.heads * p.qLen + bhRow + q) * p.headDim;
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

  // dK and dV, or with parts this part's partials (every part writes them, zeros where it saw no
  // visible item).
  float* gdK = sliceMutPtr<float>(p.dK, b, hk);
  float* gdV = sliceMutPtr<float>(p.dV, b, hk);
  long long strideK = p.dK.seqStride, strideV = p.dV.seqStride;
  if constexpr (QS > 1) {
    const long long headElems = (long long)p.kLen * p.headDim;
    gdK = (float*)p.dKVPartial + (((long long)b * p.kvHeads + hk) * QS + part) * headElems;
    gdV = gdK + (long long)p.batch * p.kvHeads * QS * headElems;
    strideK = strideV = p.headDim;
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int k = n0 + ffmaRow(i, ty);
    if (k >= p.kLen) continue;
    storeNNRow<DPAD>(gdK + (long long)k * strideK, dK[i], p.scale, tx, p.headDim);
    storeNNRow<DPAD>(gdV + (long long)k * strideV, dV[i], 1.f, tx, p.headDim);
  }
}

// dQ = scale * the sum of the key blocks' dS.K shares (flashBackwardDkDvF32<..., kDqPartial>, or
// flashBackwardDkDvMma<..., PARTIAL_DQ> on the FP64 tensor cores), in key-block order, over the
// blocks that saw the row's QT-row query tile (the dK/dV kernel's own test: 64-row tiles on FFMA,
// BQ on the mma.sync kernel). Grid (ceil(qLen / kDqReduceRows), batch * heads), 256 threads, a
// block a slice of a tile; BN = 16 R keys per block, at most kMaxDqPartialBlocks blocks: every
// share of an element is loaded before the first is added, so the loads are in flight together.
constexpr int kDqReduceRows = 16;
template <int R, int QT = 64>
__device__ __forceinline__ void flashBackwardDqReduceF32(const FlashKernelParams& p) {
  constexpr int BN = 16 * R, BQ = kDqReduceRows, KB = 8;  // KB: codegen's kMaxDqPartialBlocks
  static_assert(QT % BQ == 0, "a reduce block lies in one query tile");
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int q0 = blockIdx.x * BQ, q1 = min(q0 + BQ, p.qLen);
  const int t0 = q0 / QT * QT, t1 = min(t0 + QT, p.qLen);  // the query tile whose visibility counts
  const TileMask tm{p.mask, p.qLen, p.kLen};
  const int blocks = min(ceilDiv(p.kLen, BN), KB);
  unsigned visible = 0;
  for (int kb = 0; kb < blocks; ++kb)
    if (tm.anyVisible(t0, t1, kb * BN, min(kb * BN + BN, p.kLen))) visible |= 1u << kb;
  const long long slice = (long long)p.batch * p.heads * p.qLen * p.headDim;
  const float* part = (const float*)p.dQPartial + (long long)bh * p.qLen * p.headDim;
  float* gdQ = sliceMutPtr<float>(p.dQ, b, h);
  const int n = (q1 - q0) * p.headDim;
  for (int i = threadIdx.x; i < n; i += 256) {
    const int q = q0 + i / p.headDim, d = i % p.headDim;
    const long long at = (long long)q * p.headDim + d;
    float share[KB];
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) share[kb] = visible >> kb & 1u ? part[kb * slice + at] : 0.f;
    float s = 0.f;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb)
      if (visible >> kb & 1u) s += share[kb];
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
  int bh, qt;
  gridItem(p, true, bh, qt);
  const int b = bh / p.heads, h = bh % p.heads;
  const int hk = h / (p.heads / p.kvHeads);
  const int m0 = qt * BM, m1 = min(m0 + BM, p.qLen);
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
