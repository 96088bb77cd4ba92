// The fully fused MLP (fused-mlp, fused-mlp-grad, fused-mlp-train; codegen/emit_mlp.cpp generates the kernels
// from codegen/templates/mlp.h, one call of the functions below per layer, every width and every
// tiling choice a compile-time constant).
/*
 * Note on the algorithm. The layers are narrow (widths <= 128, common/mlp_limits.h) and the
 * batches small, so a step is latency-bound: the serial chain a thread runs, and the round trips
 * to global memory, set the time, not the FLOPs. So:
 *
 *  - One trip for the weights. A block copies every layer's weights (and biases) into shared
 *    memory at its start with cp.async, one commit group per layer, plus its first tile's rows
 *    with the first group: layer i waits only for groups 0..i, so the later layers' copies fly
 *    while the first layers compute, and a block that takes several tiles copies the weights once.
 *    Where they do not all fit, one layer's weights at a time ("streamed": copy, wait, compute).
 *  - Small tiles, many blocks. A tile is R rows (a power of two, 1 to 32) that the emitter picks
 *    so that the batch makes about as many tiles as the grid it wants (codegen/emit_mlp.cpp), so
 *    each block's work per layer is small.
 *  - Short per-thread chains. A layer is a set of dot products (R x N of length K forward; R x K
 *    of length N for dz·Wᵀ). A thread computes a micro-tile of TM rows x V columns (V-wide vector
 *    reads of shared memory; dz·Wᵀ: TM rows of one column) over one of KS interleaved slices of
 *    the dot product (k = ks, ks + KS, ...; dz·Wᵀ: V-wide chunks of n, NS slices); the KS lanes
 *    of one micro-tile, lane = ks·(32/KS) + item, are then summed by a
 *    reduce-scatter over shuffles: at each of log2(KS) levels a lane keeps half its values and
 *    adds its partner's half, so every value is added exactly once per level, in a fixed tree,
 *    and ends in one lane (values fewer than lanes: the last levels are plain butterflies, whose
 *    a + b = b + a give every lane the same bits). The emitter picks TM and KS per layer.
 *  - The forward writes each layer's output to shared memory for the next layer and to global
 *    memory (the saved hidden outputs, y) from registers.
 *  - The backward walks the layers down per tile: dz of the last layer from dy and y, then per
 *    layer the tile's dW = hᵀ·dz and db = Σ dz are added into the block's partial sums (a thread
 *    owns the same dW elements on every tile), and dh = dz·Wᵀ times the lower activation's
 *    derivative (a function of its saved output h) becomes the next dz, or dx at the first layer.
 *  - The partial sums (P floats per block, every layer's dW then db, each segment padded to four
 *    floats) live in shared memory where they fit, else in the block's slot of the scratch.
 *    Their reduction over the C blocks is spread: on sm_90 the grid is clusters of G = 8 blocks
 *    (__cluster_dims__); after a cluster barrier, rank j of a cluster sums the j-th share of every
 *    segment over the cluster's G partials in rank order (through distributed shared memory, or
 *    L2), writing the gradients directly when there is one cluster, else its cluster's slot; then
 *    per share j a counter finds the last cluster to finish, whose rank j adds the NC = C / G
 *    cluster slots in order. Without clusters (sm_80, or the emitter's G = 1) the block is its
 *    own cluster: the last block adds the C slots.
 *  - fused-mlp-train runs the backward's tiles and reduction with each tile's forward in front of
 *    its backward in the same block: the layers' outputs go to the shared buffers the backward
 *    reads as its layer inputs (y is also stored), the targets take dy's buffer and
 *    mseOutputGrad makes the last dz from y and them, adding each thread's squared errors in
 *    double. The blocks' loss sums (blockSum) are added in block order: by rank 0 from the
 *    members' shared memory when the grid is one cluster (whose blocks then also need no second
 *    level for the gradients), else through the scratch by the last block to arrive. With the
 *    session's Adam in the kernel (AdamOut), the thread that writes a gradient element's final
 *    value updates that weight and its moments right after: every block has copied the weights
 *    in and finished its tiles before any final value exists (a cluster barrier, or every
 *    cluster's arrival at the counter), so no block reads a weight another has stepped.
 *
 * Note on determinism. Every sum runs in a fixed order: a dot product's slices in k order inside
 * a thread, then the reduce-scatter's fixed tree; dW over a tile's rows in order, over a block's
 * tiles (always the same ones) in order, over a cluster's members in rank order, over clusters
 * in order. No float atomics: the gradients are bit-identical run to run for a given grid and
 * target. The counters sit after the slots in the node's scratch (the runner zeroes it at
 * allocation); the last arrival resets its counter to 0, so a CUDA graph replays the kernel.
 *
 * Traps. A tile's last rows may be past the batch: their rows in shared memory hold stale data,
 * threads compute them all the same but never store them, and the row sums of dW and db stop at
 * the tile's real rows. Every lane of a warp takes part in the shuffles: a lane past the layer's
 * micro-tiles computes the first one again and stores nothing. cp.async.wait_group counts the
 * calling thread's own groups, so every thread commits the same groups in the same order (empty
 * ones included) and a barrier follows each wait. A block reading another block's shared memory
 * (sm_90) must finish before that block exits: every block arrives at a second cluster barrier
 * after its reads and waits on it before it leaves. Shared weight rows are padded to a stride the
 * emitter checks against the banks a warp's vector reads hit.
 */
#pragma once

#include "kernels/adam.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PA_MLP_CLUSTERS 1
#define PA_MLP_CLUSTER_DIMS(g) __cluster_dims__(g, 1, 1)
#else
#define PA_MLP_CLUSTERS 0
#define PA_MLP_CLUSTER_DIMS(g)
#endif

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

// ---- global -> shared copies ----------------------------------------------------------------

__device__ __forceinline__ unsigned sharedAddress(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void copy4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sharedAddress(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void copy16(float* dst, const float* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sharedAddress(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's newest groups are in flight.
template <int N>
__device__ __forceinline__ void waitGroups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15) == 0; }

// dst[e] = src[e] for e < count: 16-byte copies where both ends are aligned (dst always is).
template <int T>
__device__ __forceinline__ void copyAsync(float* dst, const float* src, int count) {
  int e = 0;
  if (aligned16(src)) {
    for (int q = threadIdx.x; q < count / 4; q += T) copy16(dst + 4 * q, src + 4 * q);
    e = count / 4 * 4;
  }
  for (int i = e + threadIdx.x; i < count; i += T) copy4(dst + i, src + i);
}
// A bf16 view (a hand-written node under precision bf16): a plain load and store, ordered by the
// same wait and barrier.
template <int T, class In>
__device__ __forceinline__ void copyAsync(float* dst, In src, int count) {
  for (int i = threadIdx.x; i < count; i += T) dst[i] = src[i];
}

// w [K, N] into shared rows of stride S (a multiple of 4 where N is).
template <int K, int N, int S, int T>
__device__ __forceinline__ void copyWeights(float* dst, const float* w) {
  if constexpr (S == N) {
    copyAsync<T>(dst, w, K * N);
  } else if constexpr (N % 4 == 0) {
    if (aligned16(w)) {
      for (int q = threadIdx.x; q < K * N / 4; q += T) copy16(dst + q / (N / 4) * S + q % (N / 4) * 4, w + 4 * q);
      return;
    }
    for (int e = threadIdx.x; e < K * N; e += T) copy4(dst + e / N * S + e % N, w + e);
  } else {
    for (int e = threadIdx.x; e < K * N; e += T) copy4(dst + e / N * S + e % N, w + e);
  }
}
template <int K, int N, int S, int T, class W>
__device__ __forceinline__ void copyWeights(float* dst, W w) {
  for (int e = threadIdx.x; e < K * N; e += T) dst[e / N * S + e % N] = w[e];
}

// ---- vectors and the reduce-scatter --------------------------------------------------------

// v[0 .. V) = p[0 .. V) (p aligned to V floats); V is 1, 2 or 4.
template <int V>
__device__ __forceinline__ void loadVec(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else if constexpr (V == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x, v[1] = t.y;
  } else {
    v[0] = *p;
  }
}

// One level of the reduce-scatter over the lanes whose bit M·W differs (M: a bit of the slice
// index s, W: lanes per slice), for C values still held; then the levels below. A lane with the
// bit set keeps the upper half of its values (moved down to v[0 .. C/2)) and `first` grows by
// C/2; each kept value gets the partner's copy added. With one value left, a plain butterfly.
template <int C, int M, int W, int NV>
__device__ __forceinline__ void reduceLevels(float (&v)[NV], int s, int& first) {
  if constexpr (M >= 1) {
    if constexpr (C > 1) {
      constexpr int H = C / 2;
      const bool upper = (s & M) != 0;
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const float send = upper ? v[j] : v[j + H];
        const float keep = upper ? v[j + H] : v[j];
        v[j] = keep + __shfl_xor_sync(0xffffffffu, send, M * W);
      }
      if (upper) first += H;
      reduceLevels<H, M / 2, W>(v, s, first);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], M * W);
      reduceLevels<1, M / 2, W>(v, s, first);
    }
  }
}

// Sums each of the NV values over the S slices (lanes s·W + item, s < S) of a micro-tile. On
// return v[0 .. NV / S) (one value where NV <= S) hold the sums of values first, first + 1, ...,
// and the lane is the one to store them where `s` is a multiple of S / NV (when S > NV, the lanes
// of a butterfly hold equal sums).
template <int NV, int S, int W>
__device__ __forceinline__ int reduceScatter(float (&v)[NV], int s) {
  int first = 0;
  reduceLevels<NV, S / 2, W>(v, s, first);
  return first;
}
template <int NV, int S>
__device__ __forceinline__ bool storesReduced(int s) {
  return NV >= S || s % (S / NV) == 0;
}

// ---- the layers ----------------------------------------------------------------------------

// out[r][n] = act(Σ_k in[r][k]·w[k][n] + b[n]) for the tile's rows r < rows: into shared `keep`
// (the next layer's input, when Keep) and into global `out` from `outBase`. `in` holds R rows of
// K, w K rows of stride S, bias N floats (shared). A lane computes TM rows × V columns over
// k = s, s + KS, ... (s its slice), the KS slices of one micro-tile in one warp.
template <int K, int N, int S, int R, int T, int TM, int V, int KS, int A, bool HasBias, bool Keep, class Out>
__device__ __forceinline__ void layerForward(const float* in, const float* w, const float* bias, float* keep, Out out,
                                             long long outBase, int rows) {
  constexpr int W = 32 / KS, NG = N / V, ITEMS = R / TM * NG, GROUPS = (ITEMS + W - 1) / W, NV = TM * V;
  constexpr int STEPS = (K + KS - 1) / KS, OWN = NV > KS ? NV / KS : 1;
  const int lane = threadIdx.x % 32, s = lane / W;
  for (int g = threadIdx.x / 32; g < GROUPS; g += T / 32) {
    const int item = g * W + lane % W, it = item < ITEMS ? item : 0;
    const int r0 = it / NG * TM, n0 = it % NG * V;
    float acc[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) acc[j] = 0.0f;
#pragma unroll 8
    for (int i = 0; i < STEPS; ++i) {
      const int k = s + i * KS;
      if (K % KS != 0 && k >= K) break;
      float wv[V];
      loadVec<V>(w + k * S + n0, wv);
#pragma unroll
      for (int j = 0; j < TM; ++j) {
        const float a = in[(r0 + j) * K + k];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[j * V + v] = fmaf(a, wv[v], acc[j * V + v]);
      }
    }
    const int first = reduceScatter<NV, KS, W>(acc, s);
    if (item >= ITEMS || !storesReduced<NV, KS>(s)) continue;
#pragma unroll
    for (int u = 0; u < OWN; ++u) {
      const int r = r0 + (first + u) / V, n = n0 + (first + u) % V;
      if (r >= rows) continue;
      float z = acc[u];
      if constexpr (HasBias) z += bias[n];
      const float y = activate<A>(z);
      if constexpr (Keep) keep[r * N + n] = y;
      out[outBase + (long long)r * N + n] = y;
    }
  }
}

// dz[e] = dy[e] · act'(y[e]) for e < count: the last layer's dz, from the tile's dy and y (shared).
template <int T, int A>
__device__ __forceinline__ void outputGrad(const float* dy, const float* y, float* dz, int count) {
  for (int e = threadIdx.x; e < count; e += T) dz[e] = activationGrad<A>(dy[e], y[e]);
}

// fused-mlp-train's last dz from the tile's y and targets t (shared): dy = ((y - t)·scale)·seed as
// mse-loss-grad computes it, times act'(y); `loss` gathers the thread's (y - t)² in double.
template <int T, int A>
__device__ __forceinline__ void mseOutputGrad(const float* y, const float* t, float* dz, int count, float scale, float seed,
                                              double& loss) {
  for (int e = threadIdx.x; e < count; e += T) {
    const float p = y[e], q = t[e];
    const double d = (double)p - (double)q;
    loss += d * d;
    dz[e] = activationGrad<A>(((p - q) * scale) * seed, p);
  }
}

// A global output nobody reads (fused-mlp-train's hidden layers keep their outputs on chip only).
struct Discard {
  mutable float sink;
  __device__ __forceinline__ float& operator[](long long) const { return sink; }
};

// The block's sum of the threads' `v` (T a multiple of 32), in thread 0: a fixed butterfly in
// each warp, then the warps' sums in order.
template <int T>
__device__ __forceinline__ double blockSum(double v) {
  __shared__ double warps[T / 32];
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < T / 32; ++w) s += warps[w];
  return s;
}

// The tile's share of dW = hᵀ·dz (part: [K][N]) and, with HasBias, db = Σ_r dz (partB: [N]),
// rows in order: stored where `first` (the block's first tile), added otherwise. A thread owns
// TK rows × V columns of dW, the same ones on every tile. part and partB are aligned to V floats.
template <int K, int N, int T, int TK, int V, bool HasBias>
__device__ __forceinline__ void weightGrad(const float* h, const float* dz, int rows, float* part, float* partB, bool first) {
  constexpr int NG = N / V, ITEMS = (K + TK - 1) / TK * NG;
  for (int item = threadIdx.x; item < ITEMS; item += T) {
    const int k0 = item / NG * TK, n0 = item % NG * V;
    float acc[TK][V];
#pragma unroll
    for (int j = 0; j < TK; ++j)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[j][v] = 0.0f;
#pragma unroll 4
    for (int r = 0; r < rows; ++r) {
      float d[V];
      loadVec<V>(dz + r * N + n0, d);
#pragma unroll
      for (int j = 0; j < TK; ++j) {
        if (K % TK != 0 && k0 + j >= K) break;
        const float a = h[r * K + k0 + j];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[j][v] = fmaf(a, d[v], acc[j][v]);
      }
    }
#pragma unroll
    for (int j = 0; j < TK; ++j) {
      if (K % TK != 0 && k0 + j >= K) break;
      float* const p = part + (k0 + j) * N + n0;
#pragma unroll
      for (int v = 0; v < V; ++v) p[v] = first ? acc[j][v] : p[v] + acc[j][v];
    }
  }
  if constexpr (HasBias) {
    for (int n = threadIdx.x; n < N; n += T) {
      float sum = 0.0f;
      for (int r = 0; r < rows; ++r) sum += dz[r * N + n];
      partB[n] = first ? sum : partB[n] + sum;
    }
  }
}

// dh[r][k] = Σ_n dz[r][n]·w[k][n] for the tile's rows r < rows; Lower >= 0: stored as the next dz,
// dh · act_Lower'(h[r][k]) (h: the layer's input, the lower layer's output) into shared `next`;
// Lower < 0: stored as dx into global `dx` from `dxBase`. A lane computes TM rows of one k over
// the V-wide chunks of n numbered s, s + NS, ... (s its slice).
template <int K, int N, int S, int R, int T, int TM, int V, int NS, int Lower, class Dx>
__device__ __forceinline__ void inputGrad(const float* dz, const float* w, const float* h, float* next, Dx dx, long long dxBase,
                                          int rows) {
  constexpr int W = 32 / NS, ITEMS = R / TM * K, GROUPS = (ITEMS + W - 1) / W, CHUNKS = N / V;
  constexpr int STEPS = (CHUNKS + NS - 1) / NS, OWN = TM > NS ? TM / NS : 1;
  const int lane = threadIdx.x % 32, s = lane / W;
  for (int g = threadIdx.x / 32; g < GROUPS; g += T / 32) {
    const int item = g * W + lane % W, it = item < ITEMS ? item : 0;
    const int r0 = it / K * TM, k = it % K;
    float acc[TM];
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[j] = 0.0f;
#pragma unroll 8
    for (int i = 0; i < STEPS; ++i) {
      const int c = s + i * NS;
      if (CHUNKS % NS != 0 && c >= CHUNKS) break;
      float wv[V];
      loadVec<V>(w + k * S + c * V, wv);
#pragma unroll
      for (int j = 0; j < TM; ++j) {
        float d[V];
        loadVec<V>(dz + (r0 + j) * N + c * V, d);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[j] = fmaf(d[v], wv[v], acc[j]);
      }
    }
    const int first = reduceScatter<TM, NS, W>(acc, s);
    if (item >= ITEMS || !storesReduced<TM, NS>(s)) continue;
#pragma unroll
    for (int u = 0; u < OWN; ++u) {
      const int r = r0 + first + u;
      if (r >= rows) continue;
      const int e = r * K + k;
      if constexpr (Lower >= 0) next[e] = activationGrad<Lower>(acc[u], h[e]);
      else dx[dxBase + e] = acc[u];
    }
  }
}

// ---- the reduction of the partial sums -----------------------------------------------------

// A parameter's final gradient where the kernel also takes the session's Adam step
// (fused-mlp-train with EmitOptions::adamInTrainNode): `out[i] = g` stores g and updates value i
// of the parameter and its moments (pa::adam::update, as pa_adam_multi). The reduction writes
// each final value once, after every block has copied the weights in and finished its tiles.
struct AdamOut {
  float* grad;
  float* param;
  float* m;
  float* v;
  pa::adam::Hyper hyper;
  struct Ref {
    const AdamOut& o;
    long long i;
    __device__ __forceinline__ void operator=(float g) const {
      float mi = o.m[i], vi = o.v[i];
      const float p = o.param[i];
      o.grad[i] = g;
      o.param[i] = pa::adam::update(g, 1.0, mi, vi, p, o.hyper);
      o.m[i] = mi;
      o.v[i] = vi;
    }
  };
  __device__ __forceinline__ Ref operator[](long long i) const { return Ref{*this, i}; }
};
// The AdamOut of the parameter at node input `input`, gradient `grad`.
__device__ __forceinline__ AdamOut adamOut(float* grad, const pa::adam::Binding* b, int input, const pa::adam::Hyper& h) {
  return AdamOut{grad, b->param[input], b->m[input], b->v[input], h};
}

// The cluster barrier, split: arrive (release: this block's shared and global writes before it)
// and wait (acquire: every member's writes before its arrival are seen after it). No-ops without
// clusters.
__device__ __forceinline__ void clusterArrive() {
#if PA_MLP_CLUSTERS
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void clusterWait() {
#if PA_MLP_CLUSTERS
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// Where the same shared location `p` is in the cluster's block `rank` (a generic address; sm_90).
template <class X>
__device__ __forceinline__ const X* memberShared(const X* p, unsigned rank) {
#if PA_MLP_CLUSTERS
  unsigned long long a;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(a) : "l"(p), "r"(rank));
  return reinterpret_cast<const X*>(a);
#else
  (void)rank;
  return p;
#endif
}

// This rank's share [lo, hi) of a segment of `count` floats split among G ranks.
template <int G>
__device__ __forceinline__ int shareBegin(int count, int rank) {
  return (int)((long long)count * rank / G);
}

// dst[e] = Σ_m member[m][off + e] in member order, for e in this rank's share of the segment
// [off, off + count). Members in shared memory (Shared) are read with plain loads through their
// generic addresses, members in global memory through L2 (other blocks wrote them).
template <int T, int G, bool Shared, class Out>
__device__ __forceinline__ void sumMembers(const float* const (&member)[G], long long off, int count, int rank, Out dst,
                                           long long dstOff) {
  const int hi = shareBegin<G>(count, rank + 1);
  for (int e = shareBegin<G>(count, rank) + threadIdx.x; e < hi; e += T) {
    float v[G];
#pragma unroll
    for (int m = 0; m < G; ++m) v[m] = Shared ? member[m][off + e] : __ldcg(member[m] + off + e);
    float sum = v[0];
#pragma unroll
    for (int m = 1; m < G; ++m) sum += v[m];
    dst[dstOff + e] = sum;
  }
}

// out[e] = Σ_c slots[c·P + off + e] for c < NC in order, for e in this rank's share of the
// segment [off, off + count) (the cluster slots, written in this kernel: read through L2).
template <int T, int G, int NC, long long P, class Out>
__device__ __forceinline__ void sumSlots(const float* slots, long long off, int count, int rank, Out out) {
  const int hi = shareBegin<G>(count, rank + 1);
  for (int e = shareBegin<G>(count, rank) + threadIdx.x; e < hi; e += T) {
    float sum = __ldcg(slots + off + e);
#pragma unroll 8
    for (int c = 1; c < NC; ++c) sum += __ldcg(slots + c * P + off + e);
    out[e] = sum;
  }
}

// Whether this block is the last of `arrivals` to get here on `counter`: every thread's writes
// are made visible device-wide first. The counter returns to 0 for the next launch.
__device__ __forceinline__ bool lastToArrive(unsigned* counter, unsigned arrivals) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned done = atomicAdd(counter, 1u);
    last = done == arrivals - 1;
    if (last) *counter = 0u;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

}  // namespace mlp
}  // namespace pa
