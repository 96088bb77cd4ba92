// bf16 GEMM on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), behind the generated
// MatMul and FusedLinear kernels when both operands are stored in bf16 (precision: bf16).
/*
 * Note on the kernel.
 *
 * Same problem struct P, epilogue functor, raster (tileOf) and split-K contract as the kernels of
 * kernels/gemm.cuh; A and B are raw bf16 patterns (the `.p` of a pa_bf16_in view), products are
 * summed in fp32 by the tensor cores, the epilogue gets fp32.
 *
 * Warp specialisation. A block is 1 + CONSUMERS warpgroups (128 threads each). Warpgroup 0 is the
 * producer: it copies the K slices (BK = 64) of the A tile (BM = 64·CONSUMERS rows) and the B tile
 * (BN columns) into a STAGES-deep ring of shared-memory stages with 16-byte cp.async. Consumer
 * warpgroup w multiplies rows 64w .. 64w+63 of the tile by the whole B tile with
 * wgmma.m64nBNk16 (four per slice), reading both operands straight from shared memory through
 * matrix descriptors; its BN/2 fp32 accumulators per thread stay in registers for the whole K.
 *
 * Hand-offs are mbarriers, two per stage. full[s]: each of the producer's 128 threads arrives
 * once its copies of stage s have landed (cp.async.mbarrier.arrive.noinc: the hardware arrives for
 * it, the producer never waits on its own copies); a consumer that has waited on full[s] executes
 * fence.proxy.async before its wgmmas, because the copies are generic-proxy writes and wgmma reads
 * through the async proxy. empty[s]: every consumer thread arrives once the wgmmas that read
 * stage s have completed (wgmma.wait_group 1 after committing the next slice's, so one slice's
 * products are always queued behind the running ones). Phase parities: the i-th use of a stage
 * (i = slice / STAGES) waits for parity i & 1 on full and (i & 1) ^ 1 on empty; a fresh barrier
 * reports its "previous" phase (parity 1) complete, so the producer's first pass does not wait.
 * Measured on the H100 (8192×4096×4096): 0.425 ms, against 0.435 ms with the producer waiting for
 * each slice's copies (cp.async.wait_group) and arriving one slice late.
 *
 * Epilogue: the functor runs on the accumulators in registers; the results (bf16 pairs or
 * float2) are staged through the ring, rows padded by 16 bytes, and leave as 16-byte row
 * segments. Storing the pairs straight from registers (8 rows × 4 bytes a warp instruction)
 * took the same product from 0.425 to 0.453 ms.
 *
 * Shared layout: 128-byte swizzle, the only pattern with conflict-free wgmma reads of 64-wide
 * bf16 rows. Every operand tile is made of 1024-byte atoms of 8 rows × 128 bytes, 16-byte chunk c of
 * row r stored at chunk c ^ (r mod 8); tiles start 1024-byte aligned.
 *   k-contiguous operand (A plain, B transposed; "K-major"): row r of the tile (an M or N index)
 *     is the 64 k of the slice, at byte r·128. Descriptor: stride byte offset (between 8-row
 *     groups) 1024; the k16 step j advances the start address by 32·j bytes inside the swizzled
 *     row (the hardware applies the XOR to the final address, so this lands on the chunks the
 *     copy wrote).
 *   row-contiguous operand (A transposed, B plain; "MN-major", wgmma's transpose flag): blocks of
 *     64 M/N indices, each 64 k-rows × 128 bytes (8 KB); row k of block q holds M/N 64q .. 64q+63.
 *     Descriptor: leading byte offset (between 64-wide blocks) 8192, stride byte offset (between
 *     8-k groups) 1024; the k16 step j advances the start by 2048·j.
 * Requirements, checked by the emitter: each operand's contiguous extent and batch stride are
 * multiples of 8 (16-byte chunks lie wholly inside or outside the matrix; out-of-range chunks are
 * zero-filled), pointers 16-byte aligned (the runner's arena aligns every value to 256 bytes).
 *
 * Accumulator layout (wgmma m64nN, f32): thread (warp q of the warpgroup, lane = 4g + t) holds,
 * for each 8-column group j, rows 16q + g and 16q + g + 8, columns 8j + 2t and 8j + 2t + 1, in
 * acc[4j .. 4j+3] = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1): mma.sync's m16n8 layout, repeated.
 *
 * Registers: the large tile (BN = 256, two consumers, 384 threads) has 168 a thread; ptxas
 * fits the consumers' 128 accumulators in 154 without spills. Moving registers from producer to
 * consumers with setmaxnreg (40 / 232) made ptxas spill the producer's hoisted row addresses.
 */
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kernels/gemm_wgmma.cuh needs the sm_90a target (wgmma)"
#endif

#include "kernels/gemm.cuh"
#include "kernels/wgmma.cuh"

namespace pa {
namespace gemm {

typedef sm90::u64 u64;
using sm90::cpAsync16To;
using sm90::cpAsyncArriveOnLanding;
using sm90::fenceProxyAsync;
using sm90::fenceRegisters;
using sm90::mbarArrive;
using sm90::mbarInitRange;
using sm90::mbarWait;
using sm90::smemDescriptor;
using sm90::wgmmaCommit;
using sm90::wgmmaFence;
using sm90::wgmmaWait;

// ---- C's element type, for the staged epilogue -----------------------------------------------
template <class CPtr>
struct CElement;
template <>
struct CElement<float*> {
  static constexpr int kBytes = 4;
  static __device__ __forceinline__ void storePair(unsigned char* p, float2 o) { *reinterpret_cast<float2*>(p) = o; }
  static __device__ __forceinline__ unsigned char* bytes(float* C) { return reinterpret_cast<unsigned char*>(C); }
  static __device__ __forceinline__ void copy(unsigned char* d, const unsigned char* s) {
    *reinterpret_cast<float*>(d) = *reinterpret_cast<const float*>(s);
  }
};
template <>
struct CElement<pa_bf16_out> {
  static constexpr int kBytes = 2;
  static __device__ __forceinline__ void storePair(unsigned char* p, float2 o) {
    *reinterpret_cast<unsigned*>(p) = storage::packBf16x2(o.x, o.y);
  }
  static __device__ __forceinline__ unsigned char* bytes(pa_bf16_out C) { return reinterpret_cast<unsigned char*>(C.p); }
  static __device__ __forceinline__ void copy(unsigned char* d, const unsigned char* s) {
    *reinterpret_cast<unsigned short*>(d) = *reinterpret_cast<const unsigned short*>(s);
  }
};

// ---- one operand's R×64 slice in shared memory (see the note) --------------------------------
template <int R, bool KCONTIG, long long EXT, long long K, long long LD>
struct WgmmaOperand {
  static constexpr int kBytes = R * 128;
  static constexpr int kPerThread = R * 8 / 128;  // 16-byte chunks per producer thread
  static_assert(R % 64 == 0, "operand tiles are whole 64-row swizzle blocks");

  // The producer's copies of slice k0 of the tile whose first row (M or N index) is r0.
  static __device__ __forceinline__ void load(u32 dst, const unsigned short* __restrict__ base, long long r0, long long k0,
                                              int tid) {
#pragma unroll
    for (int v = 0; v < kPerThread; ++v) {
      const int f = tid + 128 * v;
      if (KCONTIG) {
        const int r = f >> 3, c = f & 7;
        const long long gr = r0 + r, gk = k0 + 8 * c;
        const bool in = gr < EXT && gk < K;
        cpAsync16To(dst + r * 128 + ((c ^ (r & 7)) << 4), in ? base + gr * LD + gk : base, in);
      } else {
        const int k = f / (R / 8), cm = f % (R / 8);
        const long long gk = k0 + k, gr = r0 + 8 * cm;
        const bool in = gk < K && gr < EXT;
        cpAsync16To(dst + (cm >> 3) * 8192 + k * 128 + (((cm & 7) ^ (k & 7)) << 4), in ? base + gk * LD + gr : base, in);
      }
    }
  }
  // Descriptor of the 64-row block `block` of the tile at `tile`, k16 step j.
  static __device__ __forceinline__ u64 descriptor(u32 tile, int block, int j) {
    return KCONTIG ? smemDescriptor(tile + block * 8192 + 32 * j, 16, 1024) : smemDescriptor(tile + block * 8192 + 2048 * j, 8192, 1024);
  }
};

// BN ∈ {128, 256}; CONSUMERS ∈ {1, 2} (BM = 64·CONSUMERS). Launch: grid (TilesM·TilesN, 1,
// batch or splits), block kThreads, dynamic shared memory kSharedBytes (opt-in above 48 KB).
template <int BN_, int CONSUMERS_, int STAGES_>
struct WgmmaConfig {
  static constexpr int BN = BN_, CONSUMERS = CONSUMERS_, STAGES = STAGES_;
  static constexpr int BM = 64 * CONSUMERS, BK = 64;
  static constexpr int kThreads = 128 * (1 + CONSUMERS);
  static constexpr int kStageBytes = (BM + BN) * 128;
  static constexpr int kSharedBytes = STAGES * kStageBytes + 1024;  // + the slack to align the ring to 1024
  static_assert(BN == 128 || BN == 256, "wgmma tiles are 128 or 256 wide here");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
  static_assert(STAGES >= 2, "the ring needs a stage to fill while another is read");
};

template <class P, class Cfg, class Epi, class CPtr>
__device__ __forceinline__ void wgmmaGemm(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B, CPtr C,
                                          const Epi& epi) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr long long M = P::M, N = P::N, K = P::K;
  constexpr long long TilesM = (M + BM - 1) / BM, TilesN = (N + BN - 1) / BN;
  constexpr long long kSlices = (K + BK - 1) / BK;
  constexpr long long kPerSplit = (kSlices + P::splits - 1) / P::splits;
  typedef WgmmaOperand<BM, !P::transA, M, K, (P::transA ? M : K)> OpA;
  typedef WgmmaOperand<BN, P::transB, N, K, (P::transB ? K : N)> OpB;
  static_assert((P::transA ? M : K) % 8 == 0 && (P::transB ? K : N) % 8 == 0 && P::strideA % 8 == 0 && P::strideB % 8 == 0,
                "wgmma operands need contiguous extents and batch strides that are multiples of 8");

  extern __shared__ unsigned char sharedRaw[];
  __shared__ __align__(8) u64 barriers[2 * STAGES];  // full[0..STAGES), empty[STAGES..2·STAGES)
  sm90::trapIfSharedBelow(Cfg::kSharedBytes);  // the launcher sizes the ring on the host (codegen's wgmmaVariant)
  const u32 ring = (smemAddress(sharedRaw) + 1023u) & ~1023u;
  const u32 full = smemAddress(barriers), empty = full + 8 * STAGES;

  long long tm, tn;
  tileOf<TilesM, TilesN>(blockIdx.x, tm, tn);
  const long long m0 = tm * BM, n0 = tn * BN;
  const long long b = P::splits > 1 ? 0 : blockIdx.z, split = P::splits > 1 ? blockIdx.z : 0;
  const long long sBegin = split * kPerSplit, sEnd = sBegin + kPerSplit < kSlices ? sBegin + kPerSplit : kSlices;
  const int count = sEnd > sBegin ? (int)(sEnd - sBegin) : 0;
  A += b * P::strideA;
  B += b * P::strideB;
  C += (b + split) * M * N;

  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbarInitRange(full, STAGES, 128);
    mbarInitRange(empty, STAGES, 128 * Cfg::CONSUMERS);
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer
    for (int s = 0; s < count; ++s) {
      const int st = s % STAGES;
      mbarWait(empty + 8 * st, ((s / STAGES) & 1) ^ 1);
      const u32 a = ring + st * Cfg::kStageBytes;
      OpA::load(a, A, m0, (sBegin + s) * BK, tid);
      OpB::load(a + OpA::kBytes, B, n0, (sBegin + s) * BK, tid);
      cpAsyncArriveOnLanding(full + 8 * st);
    }
    cpAsyncCommit();
    cpAsyncWait<0>();  // nothing in flight when the producer's threads exit
    return;
  }

  const int consumer = warpgroup - 1;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  for (int s = 0; s < count; ++s) {
    const int st = s % STAGES;
    mbarWait(full + 8 * st, (s / STAGES) & 1);
    fenceProxyAsync();  // the copies were generic-proxy writes; wgmma reads through the async proxy
    const u32 a = ring + st * Cfg::kStageBytes, bt = a + OpA::kBytes;
    fenceRegisters(acc);
    wgmmaFence();
#pragma unroll
    for (int j = 0; j < BK / 16; ++j)
      sm90::WgmmaSS<BN, sm90::kInBf16, P::transA ? 1 : 0, P::transB ? 0 : 1>::run(acc, OpA::descriptor(a, consumer, j),
                                                                         OpB::descriptor(bt, 0, j), 1);
    wgmmaCommit();
    wgmmaWait<1>();  // the previous slice's products are done: its stage can be refilled
    fenceRegisters(acc);
    if (s > 0) mbarArrive(empty + 8 * ((s - 1) % STAGES));
  }
  wgmmaWait<0>();
  fenceRegisters(acc);

  // Epilogue: the functor runs on the accumulators in registers (see the note for their layout);
  // its results are staged through shared memory, which is free once every consumer's products
  // are done, and leave as 16-byte row segments instead of 4- or 8-byte pieces of 8 rows.
  typedef CElement<CPtr> E;
  constexpr int kPitch = BN * E::kBytes + 16;  // +16: the pair writes of 8 rows hit distinct banks
  static_assert(Cfg::CONSUMERS * 64 * kPitch <= STAGES * Cfg::kStageBytes, "the staged tile must fit in the ring");
  asm volatile("bar.sync 1, %0;" ::"n"(128 * Cfg::CONSUMERS) : "memory");  // nobody reads the ring any more
  unsigned char* const staged = sharedRaw + (ring - smemAddress(sharedRaw)) + consumer * 64 * kPitch;
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  const long long tileRow = m0 + consumer * 64;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (tid / 32) * 16 + g + 8 * h;
    const long long m = tileRow + r;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = 8 * j + 2 * t;
      const long long n = n0 + col, at = m * N + n;
      float2 o = make_float2(0.0f, 0.0f);  // the functor runs exactly once for every element of C
      if (m < M && n < N) o.x = epi(acc[4 * j + 2 * h], m, n, b * M * N + at);
      if (m < M && n + 1 < N) o.y = epi(acc[4 * j + 2 * h + 1], m, n + 1, b * M * N + at + 1);
      E::storePair(staged + r * kPitch + col * E::kBytes, o);
    }
  }
  asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
  constexpr int kPerChunk = 16 / E::kBytes, kRowChunks = BN / kPerChunk;
  unsigned char* const out = E::bytes(C);
  const bool vec = N % kPerChunk == 0 && aligned16(out);
#pragma unroll 4
  for (int f = tid; f < 64 * kRowChunks; f += 128) {
    const int r = f / kRowChunks, c = f % kRowChunks;
    const long long m = tileRow + r, n = n0 + c * kPerChunk;
    if (m >= M || n >= N) continue;
    const unsigned char* src = staged + r * kPitch + c * 16;
    unsigned char* dst = out + (m * N + n) * E::kBytes;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < kPerChunk && n + e < N; ++e) E::copy(dst + e * E::kBytes, src + e * E::kBytes);
    }
  }
}

}  // namespace gemm
}  // namespace pa
