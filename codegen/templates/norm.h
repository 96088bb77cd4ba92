// Kernel templates of the row-normalisation and rotary-embedding emitters (codegen/emit_norm.cpp);
// ${NAME} and ${PARAMS} are filled by codegen/emit_kernel.cpp's finish().
#pragma once

namespace pa::codegen::templates {

// LayerNorm / RmsNorm forward: T threads per row (a warp, or the block), each holding features
// lane + k·T (k < V) of its row in registers; ${LOAD} sets v[k] from feature j (x, or the rounded
// x + residual, which it also stores). Two-pass statistics (mean, then squares about it) in fp32.
inline constexpr const char* kNormForward = R"(
#include "kernels/norm.cuh"
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${NAME}(${PARAMS}) {
  constexpr int T = ${TPR}, V = ${VPT};
  constexpr long long F = ${F};
  __shared__ float sh[2 * (T / 32)];
  const int lane = threadIdx.x % T;
  const long long row = (long long)blockIdx.x * (${BLOCK} / T) + threadIdx.x / T;
  if (row >= ${ROWS}) return;  // the row's threads leave together (a warp, or the block)
  const long long base = row * F;
  float v[V];
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const long long j = lane + (long long)k * T;
    v[k] = 0.0f;
    if (j < F) {
${LOAD}    }
  }
  float mu = 0.0f;
  if (${CENTER}) {
    float s = 0.0f, unused = 0.0f;
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) s += v[k];
    pa::norm::rowSum2<T>(s, unused, sh);
    mu = s / (float)F;
  }
  float q = 0.0f, unused2 = 0.0f;
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const float d = lane + (long long)k * T < F ? v[k] - mu : 0.0f;
    q += d * d;
  }
  pa::norm::rowSum2<T>(q, unused2, sh);
  const float rs = 1.0f / sqrtf(q / (float)F + ${EPS});
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    const long long j = lane + (long long)k * T;
    if (j < F) out0[base + j] = (v[k] - mu) * rs * in1[j]${BIAS};
  }
  if (lane == 0) {
${STATS}  }
}
)";

// LayerNormGrad / RmsNormGrad, first kernel: dx row by row (the row mapping of kNormForward,
// W = BLOCK / T row groups per block, each taking ${RPG} rows: row (block·RPG + i)·W + group),
// while every thread sums dy·x̂ and dy over its rows for its own features. The W groups' sums
// are then added in group order and the block writes its partial row: scratch[q][block][F]
// (q = 0: d gain, 1: d bias). No atomics: the second kernel adds the partial rows in order.
inline constexpr const char* kNormGradRows = R"(
#include "kernels/norm.cuh"
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${NAME}(${PARAMS}) {
  constexpr int T = ${TPR}, V = ${VPT}, W = ${BLOCK} / T;
  constexpr long long F = ${F};
  __shared__ float sh[2 * (T / 32)];
  __shared__ float part[2][${BLOCK}];
  const int lane = threadIdx.x % T, group = threadIdx.x / T;
  float accG[V], accB[V];
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    accG[k] = 0.0f;
    accB[k] = 0.0f;
  }
  for (int i = 0; i < ${RPG}; ++i) {
    const long long row = ((long long)blockIdx.x * ${RPG} + i) * W + group;
    if (row >= ${ROWS}) break;  // the same for every thread of the row (a warp, or the block)
    const long long base = row * F;
    const float mu = ${MEAN}, rs = ${RSTD};
    float dyv[V], xh[V], gh[V];
    float sg = 0.0f, sgx = 0.0f;  // Σ ĝ and Σ ĝ·x̂ over the row, ĝ = dy·gain
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) {
      const long long j = lane + (long long)k * T;
      dyv[k] = 0.0f;
      xh[k] = 0.0f;
      gh[k] = 0.0f;
      if (j < F) {
        dyv[k] = in0[base + j];
        xh[k] = (in1[base + j] - mu) * rs;
        gh[k] = dyv[k] * in2[j];
      }
      sg += gh[k];
      sgx += gh[k] * xh[k];
    }
    pa::norm::rowSum2<T>(sg, sgx, sh);
    const float mg = ${CENTER} ? sg / (float)F : 0.0f, mgx = sgx / (float)F;
#pragma unroll ${UNROLL}
    for (int k = 0; k < V; ++k) {
      const long long j = lane + (long long)k * T;
      if (j < F) out0[base + j] = rs * (gh[k] - mg - xh[k] * mgx)${DSUM};
      accG[k] += dyv[k] * xh[k];
      accB[k] += dyv[k];
    }
  }
#pragma unroll ${UNROLL}
  for (int k = 0; k < V; ++k) {
    __syncthreads();  // the previous feature's sums have been read
    part[0][threadIdx.x] = accG[k];
    part[1][threadIdx.x] = accB[k];
    __syncthreads();
    const long long j = lane + (long long)k * T;
    if (group == 0 && j < F) {
      float g = 0.0f, b = 0.0f;
      for (int w = 0; w < W; ++w) {
        g += part[0][w * T + lane];
        b += part[1][w * T + lane];
      }
      scratch[(long long)blockIdx.x * F + j] = g;
      if (${CENTER}) scratch[((long long)gridDim.x + blockIdx.x) * F + j] = b;
    }
  }
}
)";

// The norm gradients' second kernel: block (x, y) adds, for 32 features and quantity y (0: d
// gain, 1: d bias), the ${PARTS} partial rows in double: 8 strided slices, then the slices in order.
inline constexpr const char* kNormGradColumns = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  __shared__ double red[8][32];
  const int lane = threadIdx.x % 32, ty = threadIdx.x / 32;
  const long long j = (long long)blockIdx.x * 32 + lane;
  const float* src = scratch + (long long)blockIdx.y * ${PARTS} * ${F};
  double acc = 0.0;
  if (j < ${F})
    for (long long p = ty; p < ${PARTS}; p += 8) acc += (double)src[p * ${F} + j];
  red[ty][lane] = acc;
  __syncthreads();
  if (ty == 0 && j < ${F}) {
    double s = 0.0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s += red[t][lane];
${STORE}  }
}
)";

// Rope: a thread per (row, item); items < HALF are the feature pairs, which turn (${TURN}: see
// ropeTurn in codegen/emit_norm.cpp), the rest the features from DIMS on, copied.
inline constexpr const char* kRope = R"(
__device__ const double ${NAME}_invFreq[${FREQCOUNT}] = {${INVFREQ}};

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256) {
    const long long row = idx / ${ITEMS}, item = idx % ${ITEMS};
    const long long base = row * ${D};
    if (item >= ${HALF}) {
      const long long f = base + ${DIMS} + (item - ${HALF});
      out0[f] = in0[f];
      continue;
    }
    const long long pos = ${POS};
    const long long i0 = base + ${I0}, i1 = base + ${I1};
    float a = in0[i0], b = in0[i1];
${TURN}    out0[i0] = a;
    out0[i1] = b;
  }
}
)";

}  // namespace pa::codegen::templates
