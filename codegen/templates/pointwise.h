// Kernel templates of the pointwise, gather, reduction, softmax, mask and MSE emitters
// (codegen/emit_pointwise.cpp); ${NAME} and ${PARAMS} are filled by codegen/emit_kernel.cpp's finish().
#pragma once

namespace pa::codegen::templates {

// Four output elements a thread, 256 apart (grid-stride over groups of 1024): every thread
// computes its four values, all loads first, then stores them, so four loads of each input are in
// flight at once (a thread per element kept too few bytes in flight to reach memory speed: bench/
// RESULTS.md, issue 30, eighth session). The expression is over temporaries t<i>; inputs
// broadcast against the output read at offsets o<i> (codegen/emit_pointwise.cpp, elementwise).
inline constexpr const char* kElementwise = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long first = (long long)blockIdx.x * 1024 + threadIdx.x; first < ${COUNT}; first += (long long)gridDim.x * 1024) {
    float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long idx = first + u * 256;
      if (idx < ${COUNT}) {
${OFFSETS}${BODY}        r[u] = t${RESULT};
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long idx = first + u * 256;
      if (idx < ${COUNT}) out0[idx] = r[u];
    }
  }
}
)";

// Indices i < COUNT, four a thread, 256 apart (as kElementwise): LOADS reads index i's values into
// x[0 .. NV), every index's before any index's STORES computes from x and writes (interleave,
// deinterleave, concat, slice, SwiGLU and its gradient over (gate, up) pairs, a library product's
// rope), so that a thread has 4·NV loads in flight.
inline constexpr const char* kPerIndex = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long first = (long long)blockIdx.x * 1024 + threadIdx.x; first < ${COUNT}; first += (long long)gridDim.x * 1024) {
    float v[4][${NV}] = {};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const long long i = first + q * 256;
      float (&x)[${NV}] = v[q];
      if (i < ${COUNT}) {
${LOADS}      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const long long i = first + q * 256;
      const float (&x)[${NV}] = v[q];
      if (i < ${COUNT}) {
${STORES}      }
    }
  }
}
)";

// SwiGLU's gradient with bf16 tensors (precision: bf16): dy = in0 [COUNT], the (gate, up) pairs
// in1 [COUNT, 2], out0 [COUNT, 2]. Four consecutive indices a step: their (gate, up) pairs in one
// 16-byte load, dy in one 8-byte load, the eight gradients in one 16-byte store; two steps a
// thread, every load first (48 bytes in flight; kPerIndex's 2-byte accesses moved 24 and issued
// five memory instructions an index). FORMULA is the one emitSwigluGrad gives kPerIndex too.
// Where a tensor does not start 16-byte aligned, or past the last whole four, one index at a time.
inline constexpr const char* kSwigluGradBf16 = R"(
__device__ __forceinline__ void ${NAME}_one(float g, float up, float d, float& dg, float& du) {
${FORMULA}}
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  constexpr long long kCount = ${COUNT}, kFours = kCount / 4;
  const long long threads = (long long)gridDim.x * 256, t = (long long)blockIdx.x * 256 + threadIdx.x;
  const bool vec = ((((unsigned long long)in0.p) | ((unsigned long long)in1.p) | ((unsigned long long)out0.p)) & 15ull) == 0;
  if (vec) {
    for (long long f = t; f < kFours; f += 2 * threads) {
      uint4 gu[2];
      uint2 dy[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const long long q = f + u * threads;
        if (q < kFours) {
          gu[u] = *reinterpret_cast<const uint4*>(in1.p + 8 * q);
          dy[u] = *reinterpret_cast<const uint2*>(in0.p + 4 * q);
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const long long q = f + u * threads;
        if (q >= kFours) break;
        const unsigned w[4] = {gu[u].x, gu[u].y, gu[u].z, gu[u].w}, dw[2] = {dy[u].x, dy[u].y};
        unsigned o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // index 4q + e: gate and up in word e, dy in half e % 2 of word e / 2
          const unsigned dh = e % 2 ? dw[e / 2] & 0xffff0000u : dw[e / 2] << 16;
          float dg, du;
          ${NAME}_one(__uint_as_float(w[e] << 16), __uint_as_float(w[e] & 0xffff0000u), __uint_as_float(dh), dg, du);
          o[e] = pa::storage::packBf16x2(dg, du);
        }
        *reinterpret_cast<uint4*>(out0.p + 8 * q) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
  for (long long i = (vec ? 4 * kFours : 0) + t; i < kCount; i += threads) {
    float dg, du;
    ${NAME}_one(in1[2 * i], in1[2 * i + 1], in0[i], dg, du);
    out0[2 * i] = dg;
    out0[2 * i + 1] = du;
  }
}
)";

// out[idx] = in0[src], src from the output index term by term (Permute, Reshape, RepeatHeads);
// four elements a thread, loads first, as kElementwise.
inline constexpr const char* kGather = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long first = (long long)blockIdx.x * 1024 + threadIdx.x; first < ${COUNT}; first += (long long)gridDim.x * 1024) {
    float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long idx = first + u * 256;
      if (idx < ${COUNT}) {
        long long rem = idx, src = 0;
${TERMS}        r[u] = in0[src];
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long idx = first + u * 256;
      if (idx < ${COUNT}) out0[idx] = r[u];
    }
  }
}
)";

// A thread per output element, double accumulation over the reduced axes (Sum, Mean, SumTo).
inline constexpr const char* kReduce = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${OUTCOUNT}; idx += (long long)gridDim.x * 256) {
    long long rem = idx, base = 0;
${KEPT}    double acc = 0.0;
    for (long long r = 0; r < ${REDCOUNT}; ++r) {
      long long rr = r, off = base;
${REDUCED}      acc += (double)${IN}[off];
    }
    ${OUT}[idx] = (float)(acc * ${FACTOR});
  }
}
)";

// The split reduction's first kernel (see "Note on the split reduction" in emit_pointwise.cpp):
// a block of 32 outputs × 8 threads sums one part of the reduced range into scratch, in double.
inline constexpr const char* kReducePartial = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double red[8][32];
  const int lane = threadIdx.x % 32, ty = threadIdx.x / 32;
  const long long idx = (long long)blockIdx.x * 32 + lane, part = blockIdx.y;
  double acc = 0.0;
  if (idx < ${OUTCOUNT}) {
    long long rem = idx, base = 0;
${KEPT}    const long long r0 = part * ${CHUNK}, r1 = min(r0 + ${CHUNK}, ${REDCOUNT});
    for (long long r = r0 + ty; r < r1; r += 8) {
      long long rr = r, off = base;
${REDUCED}      acc += (double)${IN}[off];
    }
  }
  red[ty][lane] = acc;
  __syncthreads();
  if (ty == 0 && idx < ${OUTCOUNT}) {
    double s = 0.0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s += red[t][lane];
    ((double*)scratch)[part * ${OUTCOUNT} + idx] = s;
  }
}
)";

// The split reduction's second kernel: each output adds its parts in order.
inline constexpr const char* kReduceFinal = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
  if (idx >= ${OUTCOUNT}) return;
  double s = 0.0;
  for (long long p = 0; p < ${PARTS}; ++p) s += ((const double*)scratch)[p * ${OUTCOUNT} + idx];
  ${OUT}[idx] = (float)(s * ${FACTOR});
}
)";

// Softmax: a thread per row (optional sink logit joins the normaliser, never the output).
inline constexpr const char* kSoftmax = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  const long long row = (long long)blockIdx.x * 256 + threadIdx.x;
  if (row >= ${ROWS}) return;
  const long long o = row / ${INNER}, i = row % ${INNER};
  const auto x = in0 + o * ${LEN} * ${INNER} + i;
  const auto y = out0 + o * ${LEN} * ${INNER} + i;
  const float ninf = -__int_as_float(0x7f800000);
  const float s = ${SINK};
  float m = s;
  for (long long j = 0; j < ${LEN}; ++j) m = fmaxf(m, x[j * ${INNER}]);
  if (m == ninf) {  // every logit masked and no sink: zeros, never NaN
    for (long long j = 0; j < ${LEN}; ++j) y[j * ${INNER}] = 0.0f;
    return;
  }
  double sum = s == ninf ? 0.0 : (double)expf(s - m);
  for (long long j = 0; j < ${LEN}; ++j) {
    const float v = x[j * ${INNER}];
    sum += v == ninf ? 0.0f : expf(v - m);
  }
  // The exponentials again rather than stored and rescaled: one rounding of each result.
  const float inv = (float)(1.0 / sum);
  for (long long j = 0; j < ${LEN}; ++j) {
    const float v = x[j * ${INNER}];
    y[j * ${INNER}] = v == ninf ? 0.0f : expf(v - m) * inv;
  }
}
)";

// Softmax gradients: a thread per row; ${FINISH} writes dx (SoftmaxGrad) or the sink's gradient.
inline constexpr const char* kSoftmaxGrad = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  const long long row = (long long)blockIdx.x * 256 + threadIdx.x;
  if (row >= ${ROWS}) return;
  const long long base = (row / ${INNER}) * ${LEN} * ${INNER} + row % ${INNER};
  double dot = 0.0, mass = 0.0;
  for (long long j = 0; j < ${LEN}; ++j) {
    dot += (double)in0[base + j * ${INNER}] * in1[base + j * ${INNER}];
    mass += in1[base + j * ${INNER}];
  }
${FINISH}}
)";

// AttentionMask: the shared predicate of common/attention_mask.h over the last two axes.
inline constexpr const char* kMask = R"(
#include "common/attention_mask.h"

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  pa::AttentionMaskSpec m;
  m.causal = ${CAUSAL};
  m.alignBottomRight = ${BR};
  m.windowLeft = ${LEFT};
  m.windowRight = ${RIGHT};
  m.sinks = ${SINKS};
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256) {
    const long long k = idx % ${KLEN}, q = (idx / ${KLEN}) % ${QLEN};
    out0[idx] = pa::keyVisible(m, q, k, ${QLEN}, ${KLEN}) ? in0[idx] : ${FILL};
  }
}
)";

// MseLoss in one block: a fixed-order tree, so the same sum every run.
inline constexpr const char* kMse = R"(
extern "C" __global__ void __launch_bounds__(1024) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double part[1024];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < ${COUNT}; i += 1024) {
    const double d = (double)in0[i] - (double)in1[i];
    acc += d * d;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 512; s > 0; s >>= 1) {  // a fixed tree: the same sum every run
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out0[0] = (float)(part[0] / ${DENOM});
}
)";

// A large MSE's chunk: `acc` += the chunk's squared differences, this thread's share, and, with
// ${GRADSTORE}, each term's gradient stored as it is added. The MSE kernels below take it as
// ${ROUND} (codegen/emit_pointwise.cpp), so the loss's sums are the same in both.
inline constexpr const char* kMseRound = R"(  // ${TERMS} terms 256 apart a round (a chunk is one round), every load before the first add or
  // store (the adds in the order of i).
  for (long long i = begin + threadIdx.x; i < end; i += 256 * ${TERMS}) {
    float p[${TERMS}] = {}, t[${TERMS}] = {};
#pragma unroll
    for (int u = 0; u < ${TERMS}; ++u)
      if (i + 256 * u < end) p[u] = in0[i + 256 * u], t[u] = in1[i + 256 * u];
#pragma unroll
    for (int u = 0; u < ${TERMS}; ++u)
      if (i + 256 * u < end) {
        const double d = (double)p[u] - (double)t[u];
        acc += d * d;
${GRADSTORE}      }
  }
)";

// Large MSE sums (mlp_wide: 2M terms) take two kernels: one block per contiguous chunk writes
// the chunk's fixed-tree sum to scratch, then one block adds the chunks' sums in a fixed tree,
// so the result is still the same every run.
inline constexpr const char* kMsePartial = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double part[256];
  const long long begin = (long long)blockIdx.x * ${CHUNK}, end = min(begin + ${CHUNK}, ${COUNT});
  double acc = 0.0;
${ROUND}  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) ((double*)scratch)[blockIdx.x] = part[0];
}
)";

// The large MseLoss's second kernel: the chunks' sums added in a fixed tree.
inline constexpr const char* kMseFinal = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double part[256];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < ${PARTS}; i += 256) acc += ((const double*)scratch)[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out0[0] = (float)(part[0] / ${DENOM});
}
)";

// MseLossGrad, small: MseLoss's one-block tree (the same loss, bit for bit) with each thread
// also writing its elements' gradient, ((p - t) · 2/N) · dy in float as the unfused Sub, Scale,
// Mul compute it.
inline constexpr const char* kMseGrad = R"(
extern "C" __global__ void __launch_bounds__(1024) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double part[1024];
  const float dy = in2[0];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < ${COUNT}; i += 1024) {
    const float p = in0[i], t = in1[i];
    const double d = (double)p - (double)t;
    acc += d * d;
    out1[i] = ((p - t) * ${SCALE}) * dy;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 512; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out0[0] = (float)(part[0] / ${DENOM});
}
)";

// MseLossGrad, large, in one launch: each block takes a chunk, writes its gradient and its
// fixed-tree sum of squares to scratch (as MseLoss's partial kernel); the block that finishes
// last (a ticket counter after a fence) adds the chunks' sums in MseLoss's final tree, so the
// loss is the unfused one's whatever order the blocks ran in, and resets the counter for the
// next launch (a replayed CUDA graph). The counter lives after the sums; the runner zeroes the
// scratch once (NodeKernels::zeroScratch). Only the ticket is atomic: no value is.
inline constexpr const char* kMseGradChunks = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ double part[256];
  __shared__ bool last;
  const float dy = in2[0];
  const long long begin = (long long)blockIdx.x * ${CHUNK}, end = min(begin + ${CHUNK}, ${COUNT});
  double acc = 0.0;
${ROUND}  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  double* sums = (double*)scratch;
  unsigned* done = (unsigned*)(sums + ${PARTS});
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = part[0];
    __threadfence();
    last = atomicAdd(done, 1u) == ${PARTS} - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  acc = 0.0;
  for (long long i = threadIdx.x; i < ${PARTS}; i += 256) acc += __ldcg(sums + i);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out0[0] = (float)(part[0] / ${DENOM});
    *done = 0u;
  }
}
)";

// A product whose B is one column, A stored [K, M] (MatMul, MatMulBiasGrad: a layer to one
// output's weight gradient): out0[m] = Σ_k A[k, m]·B[k] in double and, with BIAS, out1[0] = Σ_k
// B[k], in one launch (codegen/emit_pointwise.cpp, "Note on the column product").
inline constexpr const char* kColumnProduct = R"(
#include "kernels/column_reduce.cuh"

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  constexpr int LANES = ${LANES}, VEC = ${VEC}, RT = 256 / LANES, CB = LANES * VEC;
  constexpr long long M = ${M}, K = ${K}, PARTS = ${PARTS};
  __shared__ double red[RT * CB];
  __shared__ double bred[256];
  const int lane = threadIdx.x % LANES, rt = threadIdx.x / LANES;
  const long long col = (long long)blockIdx.x * CB + lane * VEC;
  const long long r0 = (long long)blockIdx.y * ${CHUNK}, r1 = min(r0 + ${CHUNK}, K);
  const bool vector = ${ALIGNED};
  double acc[VEC], bacc = 0.0;
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.0;
  if (col < M) {
#pragma unroll 4
    for (long long r = r0 + rt; r < r1; r += RT) {
      const double b = (double)in1[r];
      bacc += b;
      float a[VEC];
      if (vector) {
${LOADVEC}      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] = in0[r * M + col + j];
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += (double)a[j] * b;
    }
  }
  // The block's rows, in a fixed tree over the row threads.
#pragma unroll
  for (int j = 0; j < VEC; ++j) red[rt * CB + lane * VEC + j] = acc[j];
  bred[threadIdx.x] = bacc;
  for (int s = RT / 2; s > 0; s >>= 1) {
    __syncthreads();
    if (rt < s) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) red[rt * CB + lane * VEC + j] += red[(rt + s) * CB + lane * VEC + j];
      bred[threadIdx.x] += bred[threadIdx.x + s * LANES];
    }
  }
  __syncthreads();
  double* sums = (double*)scratch;  // [PARTS][M], then the bias's [PARTS], then a ticket per column block
  double* bsums = sums + PARTS * M;
  unsigned* tickets = (unsigned*)(bsums + PARTS);
  const long long mine = (long long)blockIdx.x * CB + threadIdx.x;
  if (threadIdx.x < CB && mine < M) sums[blockIdx.y * M + mine] = red[threadIdx.x];
  if (${BIAS} && blockIdx.x == 0 && threadIdx.x == 0) bsums[blockIdx.y] = bred[0];
  if (!pa::colreduce::lastOfParts(tickets + blockIdx.x, PARTS)) return;
  {  // the last block of the column block: its columns' parts in a fixed order
    const long long m = (long long)blockIdx.x * CB + threadIdx.x % CB;
    const double s = pa::colreduce::sumParts<CB>(sums, PARTS, M, m, m < M, red);
    if (threadIdx.x < CB && m < M) out0[m] = (float)s;
  }
  if (${BIAS} && blockIdx.x == 0) {
    double s = 0.0;
    for (long long p = threadIdx.x; p < PARTS; p += 256) s += __ldcg(bsums + p);
    bred[threadIdx.x] = s;
    for (int t = 128; t > 0; t >>= 1) {
      __syncthreads();
      if (threadIdx.x < t) bred[threadIdx.x] += bred[threadIdx.x + t];
    }
    ${BIASSTORE}
  }
  if (threadIdx.x == 0) tickets[blockIdx.x] = 0u;
}
)";

// Column sums of an input read as [R, N] (SumTo over leading axes: a bias gradient):
// out0[n] = Σ_r in0[r, n], one launch (codegen/emit_pointwise.cpp, "Note on the column sums"):
// a grid of (strips of CW = 32·VEC columns) × (PARTS row chunks); a warp owns a strip's row and
// walks every eighth row of the chunk, its lanes VEC consecutive columns each.
inline constexpr const char* kColumnSums = R"(
#include "kernels/column_reduce.cuh"

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  constexpr int VEC = ${VEC}, CW = 32 * VEC;
  constexpr long long N = ${N}, R = ${R}, PARTS = ${PARTS}, CHUNK = ${CHUNK};
  __shared__ __align__(16) float warpSums[8][CW];
  __shared__ double red[256];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long col = (long long)blockIdx.x * CW + lane * VEC;
  const long long r0 = (long long)blockIdx.y * CHUNK, r1 = min(r0 + CHUNK, R);
  const bool vector = ${ALIGNED};
  // Row r's VEC values into a (0 past N).
  auto load = [&](long long r, float (&a)[VEC]) {
    if (vector) {
${LOADVEC}    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) a[j] = col + j < N ? (float)in0[r * N + col + j] : 0.0f;
    }
  };
  float acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
  if (col < N) {
    long long r = r0 + warp;
    for (; r + 7 * 8 < r1; r += 8 * 8) {  // eight rows' loads in flight, then their adds in row order
      float a[8][VEC];
#pragma unroll
      for (int u = 0; u < 8; ++u) load(r + 8 * u, a[u]);
#pragma unroll
      for (int u = 0; u < 8; ++u)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += a[u][j];
    }
    for (; r < r1; r += 8) {
      float a[VEC];
      load(r, a);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += a[j];
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) warpSums[warp][lane * VEC + j] = acc[j];
  __syncthreads();
  // The chunk's sum of each column: its eight warps' in order, in double.
  double* sums = (double*)scratch;  // [PARTS][N], then a ticket per strip
  unsigned* tickets = (unsigned*)(sums + PARTS * N);
  for (int c = threadIdx.x; c < CW; c += 256) {
    const long long n = (long long)blockIdx.x * CW + c;
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < 8; ++w) s += (double)warpSums[w][c];
    if (n < N) sums[blockIdx.y * N + n] = s;
  }
  if (!pa::colreduce::lastOfParts(tickets + blockIdx.x, PARTS)) return;
  {  // the last block of the strip: its columns' parts in a fixed order
    const long long n = (long long)blockIdx.x * CW + threadIdx.x % CW;
    const double s = pa::colreduce::sumParts<CW>(sums, PARTS, N, n, n < N, red);
    if (threadIdx.x < CW && n < N) out0[n] = (float)s;
  }
  if (threadIdx.x == 0) tickets[blockIdx.x] = 0u;
}
)";

// A product over one shared index (K = 1: a layer from one output's input gradient):
// out0[r, j] = in0[r]·in1[j] over M rows of N, VEC outputs a thread (4: one 16-byte store where
// N allows), four groups a thread in flight as kElementwise.
inline constexpr const char* kOuterProduct = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  constexpr int VEC = ${VEC};
  constexpr long long N = ${N}, GROUPS = ${GROUPS};
  const bool vector = ${ALIGNED};
  for (long long first = (long long)blockIdx.x * 1024 + threadIdx.x; first < GROUPS; first += (long long)gridDim.x * 1024) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long g = first + u * 256;
      if (g >= GROUPS) break;
      const long long i = g * VEC, r = i / N, j = i % N;
      const float a = in0[r];
      float v[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = a * (float)in1[j + e];
      if (vector) {
${STOREVEC}      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) out0[i + e] = v[e];
      }
    }
  }
}
)";

// A product to one column (N = 1: FusedLinear to one output, activation none or relu): a warp
// per row adds x[row, :]·w in double (lanes over K, VEC values a load, the same order whether the
// load is one vector or VEC scalars; a fixed butterfly across the lanes), rounds once, then adds
// the bias and applies the activation in float as the GEMM epilogues do.
inline constexpr const char* kRowDot = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  constexpr int VEC = ${VEC};
  constexpr long long ROWS = ${ROWS}, K = ${K};
  const int lane = threadIdx.x % 32;
  const bool vector = ${ALIGNED};
  for (long long row = ((long long)blockIdx.x * 256 + threadIdx.x) / 32; row < ROWS; row += (long long)gridDim.x * 8) {
    double s = 0.0;
#pragma unroll 4
    for (long long q = lane; q < K / VEC; q += 32) {
      float x[VEC];
      if (vector) {
${LOADVEC}      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) x[e] = in0[row * K + q * VEC + e];
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += (double)x[e] * (double)in1[q * VEC + e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      float v = (float)s;
${EPILOGUE}      out0[row] = v;
    }
  }
}
)";

}  // namespace pa::codegen::templates
