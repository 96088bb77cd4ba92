// FlashAttention-2 backward, the parts every kernel family shares: the algorithm, the preprocess
// (rowsum(dO*O), sink-logit gradient), the dQ conversion and dK/dV reduction kernels, and the
// dK/dV block's work split. The dK/dV and dQ kernels: flash_attention_bwd_mma.cuh (mma.sync),
// flash_attention_bwd_ffma.cuh (exact fp32 FFMA), flash_attention_bwd_wgmma.cuh (sm_90a).
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
 * the H100 it measured slower than the default (bench/RESULTS_flash.md). fp32 (FFMA, where
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
// Grid (qTiles, batch * heads), 256 threads: four threads a row (64 rows a block), each summing
// 16-byte chunks c, c + 4, ... of its row in order, then the four partial sums (a fixed order).
// Rows whose strides or start are not whole 16-byte chunks are read one element at a time.
template <typename Tag>
__device__ __forceinline__ void flashBackwardPreprocess(const FlashKernelParams& p) {
  typedef typename Elem<Tag>::Storage T;
  constexpr int kVec = 16 / sizeof(T);     // elements of a 16-byte chunk
  constexpr int kMaxChunks = 256 / kVec / 4;  // a thread's chunks at head dim 256
  __shared__ float rowTerms[kPreprocessRows];
  const int r = threadIdx.x >> 2, t = threadIdx.x & 3;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const T* gO = slicePtr<T>(p.o, b, h);
  const T* gdO = slicePtr<T>(p.dO, b, h);
  const float* lse = (const float*)p.lse + (long long)bh * p.qLen;
  float* delta = (float*)p.delta + (long long)bh * p.qLen;
  const bool sinkGrad = p.sinkLogits != 0 && p.dSinkLogits != 0;
  const int q = blockIdx.x * kPreprocessRows + r;
  float a = 0.f;
  if (q < p.qLen) {
    const T* o = gO + (long long)q * p.o.seqStride;
    const T* dO = gdO + (long long)q * p.dO.seqStride;
    const bool vec = p.headDim % kVec == 0 && p.headDim <= 256 && ((unsigned long long)o & 15) == 0 && ((unsigned long long)dO & 15) == 0;
    if (vec) {
      uint4 vo[kMaxChunks], vd[kMaxChunks];  // every chunk's loads first
      const int chunks = p.headDim / kVec;
#pragma unroll
      for (int i = 0; i < kMaxChunks; ++i) {
        const int c = t + 4 * i;
        if (c < chunks) vo[i] = *(const uint4*)(o + c * kVec), vd[i] = *(const uint4*)(dO + c * kVec);
      }
#pragma unroll
      for (int i = 0; i < kMaxChunks; ++i) {
        if (t + 4 * i >= chunks) break;
        const T* eo = (const T*)&vo[i];
        const T* ed = (const T*)&vd[i];
#pragma unroll
        for (int e = 0; e < kVec; ++e) a += Elem<Tag>::toFloat(eo[e]) * Elem<Tag>::toFloat(ed[e]);
      }
    } else {
      for (int d = t; d < p.headDim; d += 4) a += Elem<Tag>::toFloat(o[d]) * Elem<Tag>::toFloat(dO[d]);
    }
  }
  a += __shfl_xor_sync(0xffffffffu, a, 1);
  a += __shfl_xor_sync(0xffffffffu, a, 2);
  if (q < p.qLen && t == 0) delta[q] = a;
  if (sinkGrad && t == 0) rowTerms[r] = q < p.qLen ? -expf(((const float*)p.sinkLogits)[h] - lse[q]) * a : 0.f;
  if (p.dQAccum) {  // the atomic-dQ dK/dV kernel adds into these rows next
    float* rows = (float*)p.dQAccum + ((long long)bh * p.qLen + blockIdx.x * kPreprocessRows) * p.headDim;
    const int n = min(kPreprocessRows, p.qLen - blockIdx.x * kPreprocessRows) * p.headDim;
    for (int i = threadIdx.x; i < n; i += 256) rows[i] = 0.f;
  }
  if (!sinkGrad) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < kPreprocessRows; ++i) s += rowTerms[i];
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
// Grid (ceil(kLen / 64), batch * kvHeads), 256 threads. The fp32 dK/dV kernel's query parts
// (FlashKernelSpec::querySplit) are summed by the same kernel: the launcher passes heads =
// kvHeads · parts, the layout of their partials.
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
  // Four consecutive elements a thread (float4 loads of the partials) where the head dim and the
  // workspace's alignment allow; the sums run over the group in order either way.
  const int w = p.headDim % 4 == 0 && ((unsigned long long)partK & 15) == 0 && ((unsigned long long)partV & 15) == 0 ? 4 : 1;
  for (int i = threadIdx.x * w; i < n; i += 256 * w) {
    const int k = k0 + i / p.headDim, d = i % p.headDim;
    const long long off = (long long)k * p.headDim + d;
    float sk[4] = {0.f, 0.f, 0.f, 0.f}, sv[4] = {0.f, 0.f, 0.f, 0.f};
    if (w == 4) {
      for (int g = 0; g < group; ++g) {
        const float4 vk = *(const float4*)(partK + g * headElems + off), vv = *(const float4*)(partV + g * headElems + off);
        sk[0] += vk.x, sk[1] += vk.y, sk[2] += vk.z, sk[3] += vk.w;
        sv[0] += vv.x, sv[1] += vv.y, sv[2] += vv.z, sv[3] += vv.w;
      }
    } else {
      for (int g = 0; g < group; ++g) sk[0] += partK[g * headElems + off], sv[0] += partV[g * headElems + off];
    }
    for (int e = 0; e < w; ++e) {
      gdK[(long long)k * p.dK.seqStride + d + e] = Elem<Tag>::fromFloat(sk[e]);
      gdV[(long long)k * p.dV.seqStride + d + e] = Elem<Tag>::fromFloat(sv[e]);
    }
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
    int slice, kb;
    gridItem(p, false, slice, kb);  // the first key blocks first: a causal mask shows them the most queries
    initAt(p, bn, bqRows, slice, kb);
  }
  // Slice `slice` (batch · heads + query head with split GQA, else batch · kvHeads + KV head),
  // key block `kb` of bn keys; split GQA where the launcher gave the kernel partials to write.
  __device__ __forceinline__ void initAt(const FlashKernelParams& p, int bn, int bqRows, int slice, int kb) {
    initAt(p, bn, bqRows, slice, kb, p.dKVPartial != 0);
  }
  __device__ __forceinline__ void initAt(const FlashKernelParams& p, int bn, int bqRows, int slice, int kb, bool perQueryHead) {
    const int group = p.heads / p.kvHeads;
    splitHeads = perQueryHead;
    b = slice / (splitHeads ? p.heads : p.kvHeads);
    hFirst = splitHeads ? slice % p.heads : (slice % p.kvHeads) * group;
    hk = hFirst / group;
    n0 = kb * bn;
    n1 = min(n0 + bn, p.kLen);
    bq = bqRows;
    tm = TileMask{p.mask, p.qLen, p.kLen};
    nQT = ceilDiv(p.qLen, bq);
    nItems = (splitHeads ? 1 : group) * nQT;
  }
  __device__ __forceinline__ int head(int it) const { return hFirst + it / nQT; }
  __device__ __forceinline__ int q0(int it) const { return (it % nQT) * bq; }
  // The first of items it, it + step, ... with a visible (query, key) pair, or one >= nItems.
  __device__ __forceinline__ int next(int it, int step = 1) const {
    while (it < nItems && !tm.anyVisible(q0(it), min(q0(it) + bq, (int)tm.qLen), n0, n1)) it += step;
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
  // One of dK (scaled; isK) and dV, as storeKeys stores both: `pair(dt, r)` gives row r's pair. For
  // the wgmma kernel at head dim 256, whose consumer warpgroups hold one each. A member of its own
  // because it picks the tensor once: storeKeys with a flag per tensor unrolls both stores and
  // made that kernel 1.6 times the code.
  template <typename Tag, int DT, class Pair>
  __device__ __forceinline__ void storeKeysOf(const FlashKernelParams& p, bool isK, int keyA, int t, const Pair& pair) const {
    typedef typename Elem<Tag>::Storage T;
    auto pairs = [&](int dt, int r) {
      const float2 v = pair(dt, r);
      return make_float4(v.x, v.y, v.x, v.y);
    };
    if (splitHeads) {
      float* part = (float*)p.dKVPartial + ((long long)b * p.heads + hFirst) * p.kLen * p.headDim +
                    (isK ? 0 : (long long)p.batch * p.heads * p.kLen * p.headDim);
      forEachPair<DT>(p, keyA, t, pairs, [&](int k, int col, float2 dk, float2 dv) {
        *(float2*)(part + (long long)k * p.headDim + col) = isK ? dk : dv;
      });
    } else {
      T* out = isK ? sliceMutPtr<T>(p.dK, b, hk) : sliceMutPtr<T>(p.dV, b, hk);
      const long long stride = isK ? p.dK.seqStride : p.dV.seqStride;
      forEachPair<DT>(p, keyA, t, pairs, [&](int k, int col, float2 dk, float2 dv) {
        const float2 v = isK ? dk : dv;
        Elem<Tag>::storePair(out + k * stride + col, v.x, v.y);
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

}  // namespace flash
}  // namespace pa
