// The fully fused MLP (fused-mlp and fused-mlp-grad; codegen/emit_mlp.cpp generates the kernels
// from codegen/templates/mlp.h, one call of the functions below per layer, every width a
// compile-time constant).
/*
 * Note on the algorithm. The layers are narrow (widths <= 128, common/mlp_limits.h) and the
 * batches small, so a step is latency-bound: each block takes whole tiles of R rows and runs every
 * layer on chip. The forward keeps the tile's activations in shared memory (two buffers, ping and
 * pong, R × the widest width), loads one layer's weights at a time into shared memory, and writes
 * the saved hidden outputs and y as it goes. The backward walks the layers down with three row
 * buffers (the layer's input h, its dz, and the next dz) and, per layer, adds the tile's
 * dW = hᵀ·dz and db = Σ dz into the block's own slot of a partial-sum workspace; dh = dz·Wᵀ times
 * the lower activation's derivative (a function of its saved output) becomes the next dz, or dx
 * at the first layer.
 *
 * Note on determinism. Every sum runs in a fixed order: a thread owns its outputs (their k loop
 * runs 0 .. K-1), a block's tiles are always the same and run in order, and the partial slots of
 * the C blocks are added in block order 0 .. C-1 by the last block to finish (a counter in the
 * workspace, incremented after a __threadfence; the last block resets it to 0, so a CUDA graph
 * replays the kernel, and the runner zeroes it at allocation). No float atomics: the gradients
 * are bit-identical run to run for a given grid.
 *
 * Traps. Shared weight rows are padded to an odd stride S (N, or N + 1 when N is even), so that
 * dz·Wᵀ's threads, which walk k, read distinct banks. A tile's last rows may be past the batch:
 * threads compute them from whatever the buffers hold but never store them, and the row sums of
 * dW and db stop at the tile's real rows. Rows of a thread's TM-row group past the tile are read
 * from the buffers' allocated space (R rows), never past it.
 */
#pragma once

namespace pa {
namespace mlp {

enum : int { kNone = 0, kRelu = 1, kTanh = 2, kSigmoid = 3 };

template <int A>
__device__ __forceinline__ float activate(float z) {
  if constexpr (A == kRelu) return z > 0.0f ? z : 0.0f;
  else if constexpr (A == kTanh) return tanhf(z);
  else if constexpr (A == kSigmoid) return 1.0f / (1.0f + expf(-z));
  else return z;
}

// dh · act'(z), from the activation's output y = act(z).
template <int A>
__device__ __forceinline__ float activationGrad(float dh, float y) {
  if constexpr (A == kRelu) return y > 0.0f ? dh : 0.0f;
  else if constexpr (A == kTanh) return dh * (1.0f - y * y);
  else if constexpr (A == kSigmoid) return dh * y * (1.0f - y);
  else return dh;
}

// dst[e] = src[base + e] for e < count (a tile of rows is contiguous in a row-major tensor).
template <int T, class In>
__device__ __forceinline__ void loadTile(In src, long long base, int count, float* dst) {
  for (int e = threadIdx.x; e < count; e += T) dst[e] = src[base + e];
}
template <int T, class Out>
__device__ __forceinline__ void storeTile(Out dst, long long base, int count, const float* src) {
  for (int e = threadIdx.x; e < count; e += T) dst[base + e] = src[e];
}

// w [K, N] into shared rows of stride S.
template <int K, int N, int S, int T, class W>
__device__ __forceinline__ void loadWeights(W w, float* ws) {
  for (int e = threadIdx.x; e < K * N; e += T) ws[(e / N) * S + e % N] = w[e];
}

// out[r][n] = act(Σ_k in[r][k]·w[k][n] + b[n]) for the tile's `rows` rows; a thread computes TM
// rows of one column.
template <int K, int N, int S, int R, int TM, int T, int A, bool HasBias, class B>
__device__ __forceinline__ void layerForward(const float* in, const float* ws, B bias, float* out, int rows) {
  constexpr int G = (R + TM - 1) / TM;
  for (int item = threadIdx.x; item < G * N; item += T) {
    const int n = item % N, r0 = (item / N) * TM;
    if (r0 >= rows) continue;
    float acc[TM];
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[j] = 0.0f;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      const float w = ws[k * S + n];
#pragma unroll
      for (int j = 0; j < TM; ++j) acc[j] = fmaf(in[(r0 + j) * K + k], w, acc[j]);
    }
    float b = 0.0f;
    if constexpr (HasBias) b = bias[n];
#pragma unroll
    for (int j = 0; j < TM; ++j)
      if (r0 + j < rows) out[(r0 + j) * N + n] = activate<A>(acc[j] + b);
  }
}

// dz[e] = dy[base + e] · act'(y[base + e]): the last layer's dz, from the outputs.
template <int T, int A, class Dy, class Y>
__device__ __forceinline__ void outputGrad(Dy dy, Y y, long long base, int count, float* dz) {
  for (int e = threadIdx.x; e < count; e += T) dz[e] = activationGrad<A>(dy[base + e], y[base + e]);
}

// The tile's share of dW = hᵀ·dz (part, [K][N]) and, with HasBias, db = Σ_r dz (partB, [N]):
// stored where `first` (the block's first tile), added otherwise; a thread owns TK rows of dW.
template <int K, int N, int TK, int T, bool HasBias>
__device__ __forceinline__ void weightGrad(const float* h, const float* dz, int rows, float* part, float* partB, bool first) {
  constexpr int G = (K + TK - 1) / TK;
  for (int item = threadIdx.x; item < G * N; item += T) {
    const int n = item % N, k0 = (item / N) * TK;
    float acc[TK];
#pragma unroll
    for (int j = 0; j < TK; ++j) acc[j] = 0.0f;
    for (int r = 0; r < rows; ++r) {
      const float d = dz[r * N + n];
#pragma unroll
      for (int j = 0; j < TK; ++j)
        if (k0 + j < K) acc[j] = fmaf(h[r * K + k0 + j], d, acc[j]);
    }
#pragma unroll
    for (int j = 0; j < TK; ++j)
      if (k0 + j < K) part[(k0 + j) * N + n] = first ? acc[j] : part[(k0 + j) * N + n] + acc[j];
  }
  if constexpr (HasBias) {
    for (int n = threadIdx.x; n < N; n += T) {
      float s = 0.0f;
      for (int r = 0; r < rows; ++r) s += dz[r * N + n];
      partB[n] = first ? s : partB[n] + s;
    }
  }
}

// dh[r][k] = Σ_n dz[r][n]·w[k][n] for the tile's rows; Lower >= 0: stored as the next dz,
// dh · act_Lower'(h[r][k]) (h: the layer's input, the lower layer's output) into `next`; Lower < 0:
// stored as dx into `dx` from row offset `base`.
template <int K, int N, int S, int R, int TM, int T, int Lower, class Dx>
__device__ __forceinline__ void inputGrad(const float* dz, const float* ws, const float* h, float* next, Dx dx, long long base,
                                          int rows) {
  constexpr int G = (R + TM - 1) / TM;
  for (int item = threadIdx.x; item < G * K; item += T) {
    const int k = item % K, r0 = (item / K) * TM;
    if (r0 >= rows) continue;
    float acc[TM];
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[j] = 0.0f;
#pragma unroll 4
    for (int n = 0; n < N; ++n) {
      const float w = ws[k * S + n];
#pragma unroll
      for (int j = 0; j < TM; ++j) acc[j] = fmaf(dz[(r0 + j) * N + n], w, acc[j]);
    }
#pragma unroll
    for (int j = 0; j < TM; ++j) {
      if (r0 + j >= rows) continue;
      const int e = (r0 + j) * K + k;
      if constexpr (Lower >= 0) next[e] = activationGrad<Lower>(acc[j], h[e]);
      else dx[base + e] = acc[j];
    }
  }
}

// Element e of the sum of the C partial slots (each P floats), added in slot order. Read through
// L2 (ld.global.cg): the other blocks wrote them during this kernel.
__device__ __forceinline__ float sumSlots(const float* part, int c, long long p, long long e) {
  float s = 0.0f;
  for (int i = 0; i < c; ++i) s += __ldcg(part + i * p + e);
  return s;
}

// Whether this block is the last of the grid to get here: every thread's partial sums are made
// visible device-wide first. The counter returns to 0 for the next launch.
__device__ __forceinline__ bool lastBlockDone(unsigned* counter) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned done = atomicAdd(counter, 1u);
    last = done == gridDim.x - 1;
    if (last) *counter = 0u;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

}  // namespace mlp
}  // namespace pa
