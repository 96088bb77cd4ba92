// Kernel templates of the row-normalisation and rotary-embedding emitters (codegen/emit_norm.cpp);
// ${NAME} and ${PARAMS} are filled by codegen/emit_kernel.cpp's finish().
#pragma once

namespace pa::codegen::templates {

// LayerNorm / RmsNorm forward: T threads per row, W = BLOCK / T rows per block, each thread
// holding chunks lane + k·T (k < V) of N consecutive features of its row in registers
// (kernels/norm.cuh's row layout); ${LOAD} sets v[k] from the chunk at feature j (x, or x +
// residual), then ${SUM} stores that sum and rounds it as stored. Two-pass statistics (mean, then
// squares about it) in fp32. The row's code is compiled twice, with vector accesses and element
// by element, and ${ALIGNED} picks one for the whole block, so no branch splits a phase's loads;
// each phase issues its loads before its stores (pa::norm::store).
inline constexpr const char* kNormForward = R"(
#include "kernels/norm.cuh"
template <bool vec>
__device__ __forceinline__ void ${NAME}_row(${PARAMS}, float* sh) {
  constexpr int T = ${TPR}, V = ${VPT}, N = ${VEC}, W = ${BLOCK} / T;
  constexpr long long F = ${F};
  const int lane = threadIdx.x % T;
  const long long row = (long long)blockIdx.x * W + threadIdx.x / T;
  if (row >= ${ROWS}) return;  // the row's threads leave together (kernels/norm.cuh: its own barriers)
  const long long base = row * F;
  float v[V][N];
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const long long j = (lane + (long long)k * T) * N;
    if (j < F) {
${LOAD}    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) v[k][e] = 0.0f;
    }
  }
${SUM}  float mu = 0.0f;
  if (${CENTER}) {
    float s = 0.0f, unused = 0.0f;
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) {
#pragma unroll
      for (int e = 0; e < N; ++e) s += v[k][e];
    }
    pa::norm::rowSum2<T, W>(s, unused, sh);
    mu = s / (float)F;
  }
  float q = 0.0f, unused2 = 0.0f;
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    if ((lane + (long long)k * T) * N >= F) continue;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float d = v[k][e] - mu;
      q += d * d;
    }
  }
  pa::norm::rowSum2<T, W>(q, unused2, sh);
  const float rs = 1.0f / sqrtf(q / (float)F + ${EPS});
  float g[V][N]${BIASDECL};
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const long long j = (lane + (long long)k * T) * N;
    if (j >= F) continue;
    pa::norm::load(in1, j, g[k], vec);
${BIASLOAD}  }
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const long long j = (lane + (long long)k * T) * N;
    if (j >= F) continue;
    float y[N];
#pragma unroll
    for (int e = 0; e < N; ++e) y[e] = (v[k][e] - mu) * rs * g[k][e]${BIAS};
    pa::norm::store(out0, base + j, y, vec);
  }
  if (lane == 0) {
${STATS}  }
}

extern "C" __global__ void __launch_bounds__(${BLOCK}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ float sh[${SH}];
  if (${ALIGNED}) ${NAME}_row<true>(${ARGS}, sh);
  else ${NAME}_row<false>(${ARGS}, sh);
}
)";

// LayerNormGrad / RmsNormGrad, first kernel: dx row by row (the row layout of kNormForward and
// its two copies of the code, W = BLOCK / T row groups per block, each taking ${RPG} rows: row
// (block·RPG + i)·W + group), while every thread sums dy·x̂ and dy over its rows for its own
// features: in registers when W = 1, else in its group's slice of the shared partial rows `part`
// ([q][group][F], which keeps the registers to the row itself). The block's partial row is then
// written to scratch[q][block][F] (q = 0: d gain, 1: d bias), for W > 1 each feature adding the
// W groups' sums in group order. No atomics: the second kernel adds the partial rows in order.
// With a d sum (the sum's other gradient), ${DSUMLOAD} loads its chunk beside dy and x, and
// ${DSUMFOLD} folds it into ĝ once the row sums have read ĝ:
// dx = (rs·ĝ + d sum) − rs·(mean ĝ + x̂·mean ĝx̂), so the row needs no third array of registers.
// ${MINBLOCKS} asks, for W > 1, for the blocks per SM that the emitter sizes the grid for.
inline constexpr const char* kNormGradRows = R"(
#include "kernels/norm.cuh"
template <bool vec>
__device__ __forceinline__ void ${NAME}_rows(${PARAMS}, float* sh, float* part) {
  constexpr int T = ${TPR}, V = ${VPT}, N = ${VEC}, W = ${BLOCK} / T, Q = ${CENTER} ? 2 : 1;
  constexpr long long F = ${F};
  const int lane = threadIdx.x % T, group = threadIdx.x / T;
  float* const partG = W > 1 ? part + group * F : part;                // this group's d gain sums
  float* const partB = W > 1 ? part + ((Q - 1) * W + group) * F : part;  // and d bias sums (Q = 2)
  float accG[W == 1 ? V : 1][N], accB[W == 1 ? V : 1][N];
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const long long j = (lane + (long long)k * T) * N;
    if constexpr (W == 1) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        accG[k][e] = 0.0f;
        accB[k][e] = 0.0f;
      }
    } else if (j < F) {
      const float zero[N] = {};
      pa::norm::storeShared(partG, j, zero);
      if constexpr (Q == 2) pa::norm::storeShared(partB, j, zero);
    }
  }
  for (int i = 0; i < ${RPG}; ++i) {
    const long long row = ((long long)blockIdx.x * ${RPG} + i) * W + group;
    if (row >= ${ROWS}) break;  // the same for every thread of the row
    const long long base = row * F;
    const float mu = ${MEAN}, rs = ${RSTD};
    float gh[V][N], xh[V][N];     // ĝ = dy·gain and x̂ of the thread's chunks
    float sg = 0.0f, sgx = 0.0f;  // Σ ĝ and Σ ĝ·x̂ over the row
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) {
      const long long j = (lane + (long long)k * T) * N;
      if (j >= F) {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          gh[k][e] = 0.0f;
          xh[k][e] = 0.0f;
        }
        continue;
      }
      float dy[N], g[N];
      pa::norm::load(in0, base + j, dy, vec);
      pa::norm::load(in1, base + j, xh[k], vec);
      pa::norm::load(in2, j, g, vec);
${DSUMLOAD}#pragma unroll
      for (int e = 0; e < N; ++e) {
        xh[k][e] = (xh[k][e] - mu) * rs;
        gh[k][e] = dy[e] * g[e];
        sg += gh[k][e];
        sgx += gh[k][e] * xh[k][e];
${DSUMFOLD}      }
      if constexpr (W == 1) {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          accG[k][e] += dy[e] * xh[k][e];
          accB[k][e] += dy[e];
        }
      } else {
        float a[N];
        pa::norm::load(partG, j, a, true);
#pragma unroll
        for (int e = 0; e < N; ++e) a[e] += dy[e] * xh[k][e];
        pa::norm::storeShared(partG, j, a);
        if constexpr (Q == 2) {
          pa::norm::load(partB, j, a, true);
#pragma unroll
          for (int e = 0; e < N; ++e) a[e] += dy[e];
          pa::norm::storeShared(partB, j, a);
        }
      }
    }
    pa::norm::rowSum2<T, W>(sg, sgx, sh);
    const float mg = ${CENTER} ? sg / (float)F : 0.0f, mgx = sgx / (float)F;
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) {
      const long long j = (lane + (long long)k * T) * N;
      if (j >= F) continue;
      float d[N];
#pragma unroll
      for (int e = 0; e < N; ++e) d[e] = ${DX};
      pa::norm::store(out0, base + j, d, vec);
    }
  }
  if constexpr (W == 1) {
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) {
      const long long j = (lane + (long long)k * T) * N;
      if (j >= F) continue;
      pa::norm::store(scratch, (long long)blockIdx.x * F + j, accG[k], vec);
      if constexpr (Q == 2) pa::norm::store(scratch, ((long long)gridDim.x + blockIdx.x) * F + j, accB[k], vec);
    }
  } else {
    __syncthreads();
    for (long long f = threadIdx.x; f < F; f += ${BLOCK}) {
      float g = 0.0f, b = 0.0f;
      for (int w = 0; w < W; ++w) {
        g += part[w * F + f];
        if constexpr (Q == 2) b += part[(W + w) * F + f];
      }
      scratch[(long long)blockIdx.x * F + f] = g;
      if constexpr (Q == 2) scratch[((long long)gridDim.x + blockIdx.x) * F + f] = b;
    }
  }
}

extern "C" __global__ void __launch_bounds__(${BLOCK}${MINBLOCKS}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ float sh[${SH}];
  __shared__ __align__(16) float part[${PART}];
  if (${ALIGNED}) ${NAME}_rows<true>(${ARGS}, sh, part);
  else ${NAME}_rows<false>(${ARGS}, sh, part);
}
)";

// The norm gradients' second kernel: block (x, y) adds, for 8 features and quantity y (0: d gain,
// 1: d bias), the ${PARTS} partial rows in double: ${SLICES} strided slices (slice s: rows s,
// s + ${SLICES}, ...), every slice's loads issued together, then the slices pairwise in a fixed
// tree (slice s takes s + w for w = ${SLICES} / 2, ..., 1), so the sums are the same run to run.
inline constexpr const char* kNormGradColumns = R"(
extern "C" __global__ void __launch_bounds__(8 * ${SLICES}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double red[${SLICES}][8];
  const int lane = threadIdx.x % 8, slice = threadIdx.x / 8;
  const long long j = (long long)blockIdx.x * 8 + lane;
  const float* src = scratch + (long long)blockIdx.y * ${PARTS} * ${F};
  double acc = 0.0;
  if (j < ${F}) {
#pragma unroll 4
    for (long long p = slice; p < ${PARTS}; p += ${SLICES}) acc += (double)src[p * ${F} + j];
  }
  red[slice][lane] = acc;
#pragma unroll
  for (int w = ${SLICES} / 2; w > 0; w /= 2) {
    __syncthreads();
    if (slice < w) red[slice][lane] += red[slice + w][lane];
  }
  if (slice == 0 && j < ${F}) {
    const double s = red[0][lane];
${STORE}  }
}
)";

// Rope over (row, item)s, four a thread, 256 apart, all four's loads first (as kElementwise);
// items < HALF are the feature pairs, which turn (${TURN}: see ropeTurn in codegen/emit_norm.cpp),
// the rest the features from DIMS on, copied.
inline constexpr const char* kRope = R"(
__device__ const double ${NAME}_invFreq[${FREQCOUNT}] = {${INVFREQ}};

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long first = (long long)blockIdx.x * 1024 + threadIdx.x; first < ${COUNT}; first += (long long)gridDim.x * 1024) {
    float ra[4] = {0.0f, 0.0f, 0.0f, 0.0f}, rb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // the four items' loads first
      const long long idx = first + q * 256;
      if (idx >= ${COUNT}) continue;
      const long long row = idx / ${ITEMS}, item = idx % ${ITEMS}, base = row * ${D};
      if (item >= ${HALF}) {
        ra[q] = in0[base + ${DIMS} + (item - ${HALF})];
      } else {
        ra[q] = in0[base + ${I0}], rb[q] = in0[base + ${I1}];
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const long long idx = first + q * 256;
      if (idx >= ${COUNT}) continue;
      const long long row = idx / ${ITEMS}, item = idx % ${ITEMS};
      const long long base = row * ${D};
      if (item >= ${HALF}) {
        out0[base + ${DIMS} + (item - ${HALF})] = ra[q];
        continue;
      }
      const long long pos = ${POS};
      const long long i0 = base + ${I0}, i1 = base + ${I1};
      float a = ra[q], b = rb[q];
${PASSHEAD}${TURN}      out0[i0] = a;
      out0[i1] = b;
    }
  }
}
)";

// Rope in chunks (pairs split in halves; HALF and the copied tail multiples of N): thread
// (group, head batch, chunk c) of a position's group of rows (its ${HEADS} heads, HB a batch).
// Chunk c < HC holds pairs c·N .. c·N + N − 1, their sines and cosines formed once (${SINCOS}:
// ropeSinCos in codegen/emit_norm.cpp) for the batch's heads below ${TURNHEADS}, which turn; the
// other heads, and chunks c ≥ HC (the features from DIMS on), are copied. The batch's loads come
// before its stores; vector accesses when the tensors are 16-byte aligned (norm.cuh).
inline constexpr const char* kRopeChunks = R"(
#include "kernels/norm.cuh"
__device__ const double ${NAME}_invFreq[${FREQCOUNT}] = {${INVFREQ}};

template <bool vec>
__device__ __forceinline__ void ${NAME}_chunk(${PARAMS}, long long group, int h0, int c) {
  constexpr int N = ${VEC}, HB = ${HB}, H = ${HEADS}, TH = ${TURNHEADS};
  const long long pos = ${POS};
  auto base = [&](int h) { return (${ROW}) * ${D}; };  // the first feature of head h's row
  if (c >= ${HC}) {  // the tail past DIMS: copied
    const long long off = ${DIMS} + (long long)(c - ${HC}) * N;
    float v[HB][N];
#pragma unroll
    for (int k = 0; k < HB; ++k)
      if (h0 + k < H) pa::norm::load(in0, base(h0 + k) + off, v[k], vec);
#pragma unroll
    for (int k = 0; k < HB; ++k)
      if (h0 + k < H) pa::norm::store(out0, base(h0 + k) + off, v[k], vec);
    return;
  }
  const long long lo = (long long)c * N, hi = lo + ${HALF};
  float a[HB][N], b[HB][N];
#pragma unroll
  for (int k = 0; k < HB; ++k)
    if (h0 + k < H) {
      pa::norm::load(in0, base(h0 + k) + lo, a[k], vec);
      pa::norm::load(in0, base(h0 + k) + hi, b[k], vec);
    }
  if (h0 < TH) {
    float cosv[N], sinv[N];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int item = c * N + e;
${SINCOS}    }
#pragma unroll
    for (int k = 0; k < HB; ++k)
      if (h0 + k < TH) {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          const float a0 = a[k][e], b0 = b[k][e];
          a[k][e] = a0 * cosv[e] - b0 * sinv[e];
          b[k][e] = a0 * sinv[e] + b0 * cosv[e];
        }
      }
  }
#pragma unroll
  for (int k = 0; k < HB; ++k)
    if (h0 + k < H) {
      pa::norm::store(out0, base(h0 + k) + lo, a[k], vec);
      pa::norm::store(out0, base(h0 + k) + hi, b[k], vec);
    }
}

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  const bool vec = pa::norm::allAligned16(in0, out0);
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256) {
    const int c = (int)(idx % ${CHUNKS});
    const long long rest = idx / ${CHUNKS};
    const int h0 = (int)(rest % ${BATCHES}) * ${HB};
    const long long group = rest / ${BATCHES};
    if (vec) ${NAME}_chunk<true>(${ARGS}, group, h0, c);
    else ${NAME}_chunk<false>(${ARGS}, group, h0, c);
  }
}
)";

}  // namespace pa::codegen::templates
