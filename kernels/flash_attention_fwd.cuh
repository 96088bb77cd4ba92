// FlashAttention-2 forward templates: an exact fp32 FFMA kernel and an mma.sync (bf16/fp16) kernel.
/*
 * Algorithm (FlashAttention-2). One thread block owns BM query rows of one (batch, head) and
 * streams the key/value tiles of BN rows that the mask leaves (partly) visible through shared
 * memory. Scores S = Q.K^T stay in registers; an online softmax keeps, per row, the running max m
 * and the running sum l in the log2 domain (scale * log2(e) is folded into one multiply, so every
 * exponential is an exp2). When m grows, the output accumulator and l are rescaled by
 * exp2(m_old - m_new). At the end O = acc / l and lse = (m + log2 l) * ln 2 is saved for the
 * backward. A learnable sink logit (gpt-oss) joins only the denominator: l += exp2(sink - m).
 *
 * Pipeline: Q once; then per tile, K_j is awaited, V_j is requested, S and the softmax run while
 * V_j flies; V_j is awaited, K_{j+1} is requested, and P.V runs while K_{j+1} flies. Two barriers
 * per tile; shared memory holds one Q, one K and one V tile.
 *
 * Masking: tiles the mask hides entirely are never loaded and tiles it shows entirely skip the
 * per-element test (BlockTiles, from the band of the block's first and last rows); partial tiles
 * test each element against the row's band (TileMask::rowBand), which is keyVisible() of
 * attention_mask.h in three integers, so the semantics are those of the CPU reference by
 * construction.
 *
 * Traps: see flash_attention_common.cuh (empty rows, zero-filled padding). Rows past qLen are
 * computed on zero queries and never stored. The fp32 kernel uses exp2f and plain FFMA so that it
 * reproduces the fp64 reference to ~1e-6; the mma kernel uses ex2.approx and rounds P to the
 * input type before P.V, as FlashAttention does (the l sum uses the unrounded P).
 */
#pragma once

#include "kernels/flash_attention_common.cuh"

namespace pa {
namespace flash {

// Row statistics -> final normalisation shared by both kernels. `m` is the running max (log2
// domain, -inf if nothing was seen), `l` the sum of exp2(s - m) over visible keys.
struct RowFinal {
  float outScale;  // multiply the accumulator by this (0 for an empty row)
  float lse;       // natural-log log-sum-exp, sink included
};
__device__ __forceinline__ RowFinal finishRow(float m, float l, bool hasSink, float sink2) {
  RowFinal r;
  float mF = m, lTot = l;
  if (hasSink) {
    mF = m > sink2 ? m : sink2;
    lTot = (l > 0.f ? l * exp2f(m - mF) : 0.f) + exp2f(sink2 - mF);
  }
  if (lTot == 0.f) {  // no visible key and no sink: O = 0, lse = -inf
    r.outScale = 0.f;
    r.lse = negInf();
    return r;
  }
  const float lse2 = mF + log2f(lTot);
  r.outScale = l > 0.f ? exp2f(m - lse2) : 0.f;
  r.lse = lse2 * 0.6931471805599453f;
  return r;
}

template <typename T>
__device__ __forceinline__ const T* slicePtr(const FlashTensorView& v, int b, int h) {
  return (const T*)v.ptr + (long long)b * v.batchStride + (long long)h * v.headStride;
}
template <typename T>
__device__ __forceinline__ T* sliceMutPtr(const FlashTensorView& v, int b, int h) {
  return (T*)v.ptr + (long long)b * v.batchStride + (long long)h * v.headStride;
}

// =============================================================================================
// Tensor-core forward. WARPS warps, each owning MT m-tiles of 16 query rows; BN keys per tile.
// MT = 2 (FlashAttention-2's 128-row block with 4 warps) halves the K/V fragment loads from shared
// memory per mma and the K/V traffic from L2 per flop, at the price of twice the accumulators.
template <typename Tag, int DPAD, int WARPS, int BN, int MT>
__device__ __forceinline__ void flashForwardMma(const FlashKernelParams& p) {
  typedef MmaStep<Tag> F;
  typedef typename F::T T;
  typedef typename F::Acc Acc;  // S and O: fp32, or fp64 for F64Tag
  constexpr int BM = 16 * MT * WARPS;
  constexpr int THREADS = 32 * WARPS;
  constexpr int LD = DPAD + F::kPad;  // +16 bytes per row: ldmatrix rows land in distinct banks
  constexpr int NT = BN / 8;    // n-tiles of S
  constexpr int DT = DPAD / 8;  // n-tiles of O
  extern __shared__ __align__(16) unsigned char smemRaw[];
  T* sQ = (T*)smemRaw;
  T* sK = sQ + BM * LD;
  T* sV = sK + BN * LD;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  QueryBlock blk;
  blk.init(p, BM, BN);
  const int bh = blk.bh, b = blk.b, h = blk.h, hk = blk.hk, m0 = blk.m0;
  const T* gQ = slicePtr<T>(p.q, b, h);
  const T* gK = slicePtr<T>(p.k, b, hk);
  const T* gV = slicePtr<T>(p.v, b, hk);
  const TileMask& tm = blk.tm;
  const BlockTiles& tiles = blk.tiles;
  const int nTiles = tiles.nTiles;
  auto nextTile = [&](int j) { return tiles.next(j); };

  Acc o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < DT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float rowMax[MT][2], rowSum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) rowMax[mt][0] = rowMax[mt][1] = negInf(), rowSum[mt][0] = rowSum[mt][1] = 0.f;

  int j = nextTile(0);
  loadTile<T, BM, DPAD, LD, THREADS>(sQ, gQ, p.q.seqStride, m0, p.qLen, p.headDim);
  if (j < nTiles) loadTile<T, BN, DPAD, LD, THREADS>(sK, gK, p.k.seqStride, j * BN, p.kLen, p.headDim);
  cpAsyncCommit();

  const int warpRow0 = warp * 16 * MT;        // first row of this warp inside the block
  const int rowA = m0 + warpRow0 + g;         // rows of m-tile mt: rowA + 16*mt and rowA + 16*mt + 8
  int bandLo[MT][2], bandHi[MT][2], bandSink[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) tm.rowBand(rowA + 16 * mt + 8 * r, bandLo[mt][r], bandHi[mt][r], bandSink[mt][r]);
  while (j < nTiles) {
    const int n0 = j * BN, n1 = min(n0 + BN, p.kLen);
    cpAsyncWait<0>();
    __syncthreads();  // K_j (and Q) landed; every warp is done with V_{j-1}
    loadTile<T, BN, DPAD, LD, THREADS>(sV, gV, p.v.seqStride, n0, p.kLen, p.headDim);
    cpAsyncCommit();

    Acc s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < NT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DPAD / 16; ++kk) {
      typename F::A a[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) F::loadA(a[mt], sQ, LD, warpRow0 + 16 * mt, kk * 16);
#pragma unroll
      for (int nn = 0; nn < BN / 16; ++nn) {
        typename F::B bf;
        F::loadBNK(bf, sK, LD, nn * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          F::mma(s[mt][2 * nn], a[mt], bf, 0);
          F::mma(s[mt][2 * nn + 1], a[mt], bf, 1);
        }
      }
    }

    // Mask, online softmax (a row is spread over the 4 lanes of a quad). S stays unscaled: the
    // max is taken on raw scores (scale > 0 keeps the order) and exp2(s * scale2 - max2) is one
    // FFMA + one MUFU per element.
    const bool full = tiles.full(n0, n1) && n1 - n0 == BN;
    if (!full) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, k = n0 + nt * 8 + 2 * t + (e & 1);
            if (!bandVisible(k, bandLo[mt][r], bandHi[mt][r], bandSink[mt][r])) s[mt][nt][e] = negInf();
          }
    }
    bool rescale = false;
    float base[MT][2], corr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tileMax = negInf();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          tileMax = fmaxf(tileMax, fmaxf((float)s[mt][nt][2 * r], (float)s[mt][nt][2 * r + 1]));
        tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
        tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 2));
        const float newMax = fmaxf(rowMax[mt][r], tileMax * p.scaleLog2);
        base[mt][r] = softmaxBase(newMax);
        corr[mt][r] = rowMax[mt][r] == negInf() ? 0.f : fastExp2(rowMax[mt][r] - base[mt][r]);
        rescale |= newMax != rowMax[mt][r];
        rowMax[mt][r] = newMax;
        rowSum[mt][r] *= corr[mt][r];
      }
    }
    // The running max settles after a few tiles; skip the O rescale (DPAD/2 multiplies per row
    // pair) whenever no row of the warp moved.
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < DT; ++i) {
          o[mt][i][0] *= corr[mt][0];
          o[mt][i][1] *= corr[mt][0];
          o[mt][i][2] *= corr[mt][1];
          o[mt][i][3] *= corr[mt][1];
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pe = fastExp2(fmaf((float)s[mt][nt][e], p.scaleLog2, -base[mt][e >> 1]));
          s[mt][nt][e] = pe;
          rowSum[mt][e >> 1] += pe;
        }

    cpAsyncWait<0>();
    __syncthreads();  // V_j landed; every warp is done with K_j
    const int jn = nextTile(j + 1);
    if (jn < nTiles) loadTile<T, BN, DPAD, LD, THREADS>(sK, gK, p.k.seqStride, jn * BN, p.kLen, p.headDim);
    cpAsyncCommit();

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      typename F::A a[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) F::fromAcc(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < DPAD / 16; ++dd) {
        typename F::B bf;
        F::loadBKN(bf, sV, LD, dd * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          F::mma(o[mt][2 * dd], a[mt], bf, 0);
          F::mma(o[mt][2 * dd + 1], a[mt], bf, 1);
        }
      }
    }
    j = jn;
  }
  cpAsyncWait<0>();

  const bool hasSink = p.sinkLogits != 0;
  const float sink2 = hasSink ? ((const float*)p.sinkLogits)[h] * 1.4426950408889634f : 0.f;
  T* gO = sliceMutPtr<T>(p.o, b, h);
  float* gLse = (float*)p.lse + (long long)bh * p.qLen;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = rowSum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const RowFinal fin = finishRow(rowMax[mt][r], l, hasSink, sink2);
      const int q = rowA + 16 * mt + r * 8;
      if (q < p.qLen) {
        T* dst = gO + (long long)q * p.o.seqStride;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int col = dt * 8 + 2 * t;
          if (col < p.headDim)
            Elem<Tag>::storePair(dst + col, (float)(o[mt][dt][2 * r] * fin.outScale),
                                 (float)(o[mt][dt][2 * r + 1] * fin.outScale));
        }
        if (t == 0) gLse[q] = fin.lse;
      }
    }
  }
}

// =============================================================================================
// Exact fp32 forward: 128 threads, 64x64 tiles, each thread a 4x8 block of S (rows 4*ty + i,
// keys tx + 8*j: the 8 lanes sharing a row are one aligned group of a warp, so a row reduction
// is three shuffles and P needs only a warp barrier between its write and its read) and a 4 x
// DPAD/8 block of O (columns nnCol()).
template <typename T, int DPAD>
struct Fp32Tiles {
  static constexpr int BM = 64, BN = 64, THREADS = 128;
  static constexpr int LD = DPAD + 4;  // float4 rows, shifted by 4 banks per row
  static constexpr int LDP = BN + 4;
};

// Row i (of R) of thread row ty (of 16) in the FFMA tiles: the 4 thread rows of a warp read 4
// consecutive rows, whose float4s lie in distinct banks (row stride LD = 4 mod 32 words), so a
// warp's A or P load is one shared-memory wavefront. (Rows R*ty + i put them R rows apart: 2-way
// conflicts at R = 4, 4-way at R = 8.)
__device__ __forceinline__ int ffmaRow(int i, int ty) { return ty + 16 * i; }

// acc[i][j] += sum_d A[ffmaRow(i, ty)][d] * B[tx+8j][d]   (A: 16R x DPAD, B: 64 x DPAD, row stride LD)
template <int DPAD, int LD, int R = 4>
__device__ __forceinline__ void ffmaNT(float (&acc)[R][8], const float* sA, const float* sB, int ty, int tx) {
#pragma unroll 4
  for (int d = 0; d < DPAD; d += 4) {
    float4 a[R], bv[8];
#pragma unroll
    for (int i = 0; i < R; ++i) a[i] = *(const float4*)(sA + ffmaRow(i, ty) * LD + d);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) bv[jj] = *(const float4*)(sB + (tx + 8 * jj) * LD + d);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        acc[i][jj] = fmaf(a[i].x, bv[jj].x, acc[i][jj]);
        acc[i][jj] = fmaf(a[i].y, bv[jj].y, acc[i][jj]);
        acc[i][jj] = fmaf(a[i].z, bv[jj].z, acc[i][jj]);
        acc[i][jj] = fmaf(a[i].w, bv[jj].w, acc[i][jj]);
      }
  }
}

// Columns of the NN accumulators: thread tx owns float4 groups 4*tx + 32*g, so a row of B is read
// as one 128-byte line by the 8 lanes sharing a row (conflict-free 16-byte loads and stores).
__device__ __forceinline__ int nnCol(int c, int tx) { return 32 * (c >> 2) + 4 * tx + (c & 3); }

// acc[i][c] += sum_n P[ffmaRow(i, ty)][n] * B[n][nnCol(c)]   (P: 16R x NK, row stride LDP; B: NK x DPAD)
template <int DPAD, int LD, int LDP, int NK, int R = 4>
__device__ __forceinline__ void ffmaNN(float (&acc)[R][DPAD / 8], const float* sP, const float* sB, int ty, int tx) {
#pragma unroll 2
  for (int n = 0; n < NK; n += 4) {
    float4 pr[R];
#pragma unroll
    for (int i = 0; i < R; ++i) pr[i] = *(const float4*)(sP + ffmaRow(i, ty) * LDP + n);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int cg = 0; cg < DPAD / 32; ++cg) {
        const float4 bv = *(const float4*)(sB + (n + u) * LD + 32 * cg + 4 * tx);
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const float pv = u == 0 ? pr[i].x : u == 1 ? pr[i].y : u == 2 ? pr[i].z : pr[i].w;
          acc[i][4 * cg + 0] = fmaf(pv, bv.x, acc[i][4 * cg + 0]);
          acc[i][4 * cg + 1] = fmaf(pv, bv.y, acc[i][4 * cg + 1]);
          acc[i][4 * cg + 2] = fmaf(pv, bv.z, acc[i][4 * cg + 2]);
          acc[i][4 * cg + 3] = fmaf(pv, bv.w, acc[i][4 * cg + 3]);
        }
      }
    }
  }
}

// Stores row `i` of an NN accumulator (scaled) as float4 groups; headDim is a multiple of 8.
template <int DPAD>
__device__ __forceinline__ void storeNNRow(float* dst, const float (&acc)[DPAD / 8], float scale, int tx, int headDim) {
#pragma unroll
  for (int cg = 0; cg < DPAD / 32; ++cg) {
    const int col = 32 * cg + 4 * tx;
    if (col < headDim)
      *(float4*)(dst + col) = make_float4(acc[4 * cg] * scale, acc[4 * cg + 1] * scale, acc[4 * cg + 2] * scale,
                                          acc[4 * cg + 3] * scale);
  }
}

// R rows per thread, 16 R rows per block (R in 1, 2, 4, 8). R = 8 halves the shared-memory
// wavefronts per FFMA against R = 4, which is shared-memory bound at long sequences (the Q and P
// reads are 8-lane broadcasts); R = 1, 2 give short sequences enough blocks to fill the GPU.
template <int DPAD, int R>
__device__ __forceinline__ void flashForwardF32(const FlashKernelParams& p) {
  typedef Fp32Tiles<float, DPAD> Tl;
  constexpr int BM = 16 * R, BN = Tl::BN, THREADS = Tl::THREADS, LD = Tl::LD, LDP = Tl::LDP;
  constexpr int DC = DPAD / 8;
  extern __shared__ __align__(16) unsigned char smemRaw[];
  float* sQ = (float*)smemRaw;
  float* sK = sQ + BM * LD;
  float* sV = sK + BN * LD;
  float* sP = sV + BN * LD;

  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  QueryBlock blk;
  blk.init(p, BM, BN);
  const int bh = blk.bh, b = blk.b, h = blk.h, hk = blk.hk, m0 = blk.m0;
  const float* gQ = slicePtr<float>(p.q, b, h);
  const float* gK = slicePtr<float>(p.k, b, hk);
  const float* gV = slicePtr<float>(p.v, b, hk);
  const TileMask& tm = blk.tm;
  const BlockTiles& tiles = blk.tiles;
  const int nTiles = tiles.nTiles;
  auto nextTile = [&](int j) { return tiles.next(j); };

  float o[R][DC];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int c = 0; c < DC; ++c) o[i][c] = 0.f;
  float rowMax[R], rowSum[R];
#pragma unroll
  for (int i = 0; i < R; ++i) rowMax[i] = negInf(), rowSum[i] = 0.f;

  int j = nextTile(0);
  loadTile<float, BM, DPAD, LD, THREADS>(sQ, gQ, p.q.seqStride, m0, p.qLen, p.headDim);
  if (j < nTiles) loadTile<float, BN, DPAD, LD, THREADS>(sK, gK, p.k.seqStride, j * BN, p.kLen, p.headDim);
  cpAsyncCommit();

  while (j < nTiles) {
    const int n0 = j * BN, n1 = min(n0 + BN, p.kLen);
    cpAsyncWait<0>();
    __syncthreads();
    loadTile<float, BN, DPAD, LD, THREADS>(sV, gV, p.v.seqStride, n0, p.kLen, p.headDim);
    cpAsyncCommit();

    float s[R][8];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) s[i][jj] = 0.f;
    ffmaNT<DPAD, LD, R>(s, sQ, sK, ty, tx);

    const bool full = tiles.full(n0, n1) && n1 - n0 == BN;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float tileMax = negInf();
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        float x = s[i][jj] * p.scaleLog2;
        if (!full && !tm.visible(m0 + ffmaRow(i, ty), n0 + tx + 8 * jj)) x = negInf();
        s[i][jj] = x;
        tileMax = fmaxf(tileMax, x);
      }
      tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
      tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 2));
      tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 4));
      const float newMax = fmaxf(rowMax[i], tileMax);
      const float base = softmaxBase(newMax);
      const float corr = rowMax[i] == negInf() ? 0.f : exp2f(rowMax[i] - base);
      rowMax[i] = newMax;
      rowSum[i] *= corr;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[i][c] *= corr;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const float pe = exp2f(s[i][jj] - base);
        rowSum[i] += pe;
        sP[ffmaRow(i, ty) * LDP + tx + 8 * jj] = pe;
      }
    }

    cpAsyncWait<0>();
    __syncthreads();  // V_j landed, K_j free; P rows are private to the warp that wrote them
    const int jn = nextTile(j + 1);
    if (jn < nTiles) loadTile<float, BN, DPAD, LD, THREADS>(sK, gK, p.k.seqStride, jn * BN, p.kLen, p.headDim);
    cpAsyncCommit();
    ffmaNN<DPAD, LD, LDP, BN, R>(o, sP, sV, ty, tx);
    j = jn;
  }
  cpAsyncWait<0>();

  const bool hasSink = p.sinkLogits != 0;
  const float sink2 = hasSink ? ((const float*)p.sinkLogits)[h] * 1.4426950408889634f : 0.f;
  float* gO = sliceMutPtr<float>(p.o, b, h);
  float* gLse = (float*)p.lse + (long long)bh * p.qLen;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float l = rowSum[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    const RowFinal fin = finishRow(rowMax[i], l, hasSink, sink2);
    const int q = m0 + ffmaRow(i, ty);
    if (q < p.qLen) {
      storeNNRow<DPAD>(gO + (long long)q * p.o.seqStride, o[i], fin.outScale, tx, p.headDim);
      if (tx == 0) gLse[q] = fin.lse;
    }
  }
}

}  // namespace flash
}  // namespace pa
