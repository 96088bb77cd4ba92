// bf16 GEMM on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), behind the generated
// MatMul and FusedLinear kernels when both operands are stored in bf16 (precision: bf16).
/*
 * Note on the kernel.
 *
 * Same problem struct P, epilogue functor, raster (tileOf) and split-K contract as the other GEMM
 * kernels (kernels/gemm_common.cuh); A and B are bf16 matrices read through TMA tensor maps,
 * products are summed in fp32 by the tensor cores, the epilogue gets fp32.
 *
 * Persistent blocks. The launcher starts at most one block per SM (two for the small tile); block
 * b takes work items b, b + gridDim.x, ... where an item is one output tile of one batch entry or
 * K split. Every warpgroup walks the same item sequence, and the ring's slice counter runs on
 * across items, so the producer fills the next item's first slices while the consumers are still
 * in the current one's epilogue: no block launch or pipeline fill between tiles.
 *
 * Warp specialisation. A block is 1 + CONSUMERS warpgroups (128 threads each). One thread of
 * warpgroup 0 is the producer: for every K slice (BK = 64; 32 for TF32) it waits until the ring stage is free,
 * announces the stage's byte count on the stage's full barrier and issues the TMA copies of the A
 * tile (BM = 64·CONSUMERS rows) and the B tile (BN columns); the hardware counts the bytes on the
 * barrier as they land (out-of-range elements arrive as zeros, so ragged M, N and K need no code).
 * Consumer warpgroup w multiplies rows 64w .. 64w+63 of the tile by the whole B tile with
 * wgmma.m64nBNk16 (four per slice), operands straight from shared memory through matrix
 * descriptors; its BN/2 fp32 accumulators per thread stay in registers for the whole K.
 * TMA writes and wgmma reads both go through the async proxy: no proxy fence between them.
 *
 * Ping-pong consumers (Cfg::PINGPONG, bf16, 128 × 128 tiles): each consumer warpgroup multiplies
 * whole tiles, both 64-row blocks (two wgmma.m64n128k16 a k step, 128 accumulators a thread),
 * and the two take turns: consumer c owns the block's items c, c + 2, ... while the producer fills
 * the ring in item order as before. So one consumer's epilogue runs while the other's products
 * do, where the cooperative tiles leave the tensor cores idle through every epilogue (bench/
 * RESULTS.md, twenty-seventh session). A consumer skips the other's slices in its ring position,
 * and starts an item's products only once the other has taken its previous item's last slice
 * (named barriers 4 and 5: one consumer arrives, the other syncs; an arrival only where the other
 * has a next item): a parity wait tells apart only two phases of a stage's barrier, so no wait
 * may run more than one phase ahead of the slices already taken. A stage's empty barrier then
 * counts the 128 threads of the one consumer that read it, and an item's operand sums are its
 * consumer's threads' alone (8 to a chunk column).
 *
 * Hand-offs are mbarriers, two per stage. full[s]: one arrival (the producer's expect) plus the
 * stage's bytes. empty[s]: every consumer thread arrives once the wgmmas that read stage s have
 * completed (wgmma.wait_group 1 after committing the next slice's, so one slice's products are
 * always queued behind the running ones; the last slice of an item is released after
 * wait_group 0). Phase parities: the i-th use of a stage (i = slice / STAGES) waits for parity
 * i & 1 on full and (i & 1) ^ 1 on empty; a fresh barrier reports its "previous" phase (parity 1)
 * complete, so the producer's first pass does not wait.
 *
 * Epilogue: the functor runs on the accumulators in registers; the results (bf16 pairs or
 * float2) go to the consumer's own 16 KB staging area beside the ring (64 rows × 256 bytes, the
 * 16-byte chunks of row r XOR-ed with r mod 8, so the pair writes of 8 rows hit distinct banks),
 * 256 bytes of each row at a time (128 bf16 or 64 fp32 columns a pass), and leave as 16-byte row
 * segments. The ring stays the producer's, so the epilogue overlaps the next item's loads.
 * Given a TMA map of C (the optional argument after the sums; codegen passes one where C's rows are whole
 * 16-byte chunks), the pass leaves by TMA stores instead: the staging is then two boxes of 64
 * rows × 128 bytes in TMA's 128-byte swizzle (chunk c of row r at c ^ (r mod 8), as before but
 * in 128-byte rows), and one thread of the consumer issues the two box stores and goes on. Before
 * writing the staging again it waits only until the stores have read it
 * (cp.async.bulk.wait_group.read), not for their writes, so the last pass's writes to global
 * memory run under the next item's products; the map clips rows and columns outside C.
 *
 * Operand sums (Sums, kernels/gemm_common.cuh: MatMulBiasGrad's bias gradient). The operand to
 * sum over K must be MN-major (A transposed, or B as stored: a weight gradient's dY). After
 * issuing a slice's products each consumer thread of a summing item reads its share of the
 * operand's slice from the ring (16-byte chunks of 8 M/N indices, a few k rows) and adds it in
 * fp32; after the item the threads sharing a chunk column (lanes of one warp) add their sums by
 * a butterfly of shuffles, and one of them writes the column's 8. One product: the
 * items of the first tile column (A) or row (B) sum every slice and write the sums. Split: the
 * tiles sharing the operand's tile (the other tile rows or columns) share its slices round
 * robin, so that every item does a share of the summing and none the whole (bench/RESULTS.md,
 * twenty-fourth session); each writes fp64 partial sums, which the reduce kernel adds in (split,
 * tile) order. Elements outside the operand arrive as zeros.
 * An epilogue functor with kStageRaw (kernels/gemm_common.cuh) runs after the staging instead: the
 * raw fp32 sums are staged, 64 columns (256 bytes of each row) a pass, and each thread takes
 * 16-byte chunks of 4 columns of one row (rows rt + 8u, rt = tid / 16), applies the functor and
 * stores 4 results; a kAux functor's input is prefetched into L2 when the item starts and loaded
 * 4 values at a time, a group of 4 chunks ahead of its use (bf16; fp32 at the group's start).
 *
 * Shared layout of the ring: 128-byte swizzle, the only pattern with conflict-free wgmma reads of
 * 64-wide bf16 rows, which is also TMA's CU_TENSOR_MAP_SWIZZLE_128B. Every operand tile is made
 * of 1024-byte atoms of 8 rows × 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r mod 8);
 * tiles start 1024-byte aligned.
 *   k-contiguous operand (A plain, B transposed; "K-major"): row r of the tile (an M or N index)
 *     is the 64 k of the slice, at byte r·128: one TMA box of 64 (k) × R rows. Descriptor: stride
 *     byte offset (between 8-row groups) 1024; the k16 step j advances the start address by 32·j
 *     bytes inside the swizzled row (the hardware applies the XOR to the final address, so this
 *     lands on the chunks the copy wrote).
 *   row-contiguous operand (A transposed, B plain; "MN-major", wgmma's transpose flag): blocks of
 *     64 M/N indices, each 64 k-rows × 128 bytes (8 KB), one TMA box of 64 (M/N) × 64 (k) each;
 *     row k of block q holds M/N 64q .. 64q+63. Descriptor: leading byte offset (between 64-wide
 *     blocks) 8192, stride byte offset (between 8-k groups) 1024; the k16 step j advances the
 *     start by 2048·j.
 * Tensor maps (codegen's gemmTensorMap): dimension 0 the operand's contiguous extent, 1 the other
 * matrix extent, 2 the batch (size 1 for a shared operand); the emitter checks that contiguous
 * extents and batch strides are multiples of 8 (TMA's 16-byte strides), the runner's arena aligns
 * every value to 256 bytes (TMA's 16-byte base).
 *
 * TF32 (Cfg::TF32, precision: tf32 with fp32 operands): the same kernel with fp32 elements, 32 of
 * them in a 128-byte slice row, and wgmma.m64nNk8.tf32 (the hardware reads the top 19 bits of
 * each fp32 operand). TF32 wgmma reads shared-memory operands K-major only (the transpose
 * immediates exist for 16-bit types alone), so B must be K-major: the emitter first copies a B
 * stored N-major transposed into the node's scratch, or the kernel transposes it as it loads it
 * (codegen's tf32Plan): then the whole producer warpgroup copies B's slices with 4-byte cp.async
 * into the K-major swizzled rows (zero-filling out-of-range elements) and arrives on the stage's
 * full barrier when they land, beside thread 0's TMA copy of A; the consumers fence the async
 * proxy after the wait, as the stores came through the generic one. An A stored M-major
 * (P::transA) is read from registers instead, wgmma's RS form: TMA brings its slice in blocks
 * of 32 M indices × 32 k rows (4 KB, 16-byte chunk c of k row r at c ^ (r mod 8)), and each
 * consumer thread loads its four fragments of a k8 step (mma.sync's m16n8k8 TF32 A layout) with
 * 32-bit shared loads, two-way bank conflicts. ptxas serializes every wgmma (C7513) whose A
 * registers are written while any wgmma is in flight, so this path waits for a slice's products
 * before loading the next slice's fragments; the other consumer warpgroup fills the gap. Its large
 * tile needs more than the 168 registers 384 threads get: setmaxnreg moves them from the
 * producer warpgroup (40) to the consumers (232).
 *
 * Transposed output (P::transC): the kernel computes Cᵀ = Bᵀ·Aᵀ (the emitter's choice for a
 * TF32 weight gradient Aᵀ·B with M < N: the narrower A is then the copied operand) and the
 * epilogue writes it back as C, the functor getting C's coordinates: 64 kernel columns a pass,
 * staged as 64 rows of C (the 16-byte chunks of staged row i XOR-ed with i mod 16, so the scalar
 * writes of a warp hit distinct banks), out as 16-byte segments of C's rows. Split products write
 * their partial sums the same way, laid out as C.
 *
 * Accumulator layout (wgmma m64nN, f32): thread (warp q of the warpgroup, lane = 4g + t) holds,
 * for each 8-column group j, rows 16q + g and 16q + g + 8, columns 8j + 2t and 8j + 2t + 1, in
 * acc[4j .. 4j+3] = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1): mma.sync's m16n8 layout, repeated.
 *
 * Registers: the large tile (BN = 256, two consumers, 384 threads) has 168 a thread; ptxas fits
 * the consumers' 128 accumulators without spills.
 */
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kernels/gemm_wgmma.cuh needs the sm_90a target (wgmma)"
#endif

#include "kernels/gemm_common.cuh"
#include "kernels/gemm_ptx.cuh"
#include "kernels/wgmma.cuh"

namespace pa {
namespace gemm {

typedef sm90::u64 u64;
using sm90::mbarArrive;
using sm90::mbarArriveExpectBytes;
using sm90::mbarInitRange;
using sm90::mbarWait;
using sm90::smemDescriptor;
using sm90::TensorMap;
using sm90::tmaLoad3d;
using sm90::wgmmaCommit;
using sm90::wgmmaFence;
using sm90::wgmmaWait;
using sm90::fenceRegisters;

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
  // The staged-raw epilogue's stores (see the note): four results at once (16-byte aligned), or one.
  static __device__ __forceinline__ void store4(unsigned char* p, const float (&v)[4]) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]));
  }
  static __device__ __forceinline__ void store1(unsigned char* p, float v) { asm volatile("st.global.f32 [%0], %1;" ::"l"(p), "f"(v)); }
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
  // (8-byte aligned)
  static __device__ __forceinline__ void store4(unsigned char* p, const float (&v)[4]) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(storage::packBf16x2(v[0], v[1])), "r"(storage::packBf16x2(v[2], v[3])));
  }
  static __device__ __forceinline__ void store1(unsigned char* p, float v) {
    asm volatile("st.global.b16 [%0], %1;" ::"l"(p), "h"(storage::floatToBf16(v)));
  }
};

// The auxiliary input of an epilogue functor with kAux (see the note): its bytes, four consecutive
// values from element i (4·kBytes aligned), or the first `count` of them.
struct AuxF32 {
  static constexpr int kBytes = 4;
  typedef float4 Raw;  // four values
  static __device__ __forceinline__ const unsigned char* bytes(const float* a) { return reinterpret_cast<const unsigned char*>(a); }
  static __device__ __forceinline__ Raw load4(const float* a, long long i) { return *reinterpret_cast<const float4*>(a + i); }
  static __device__ __forceinline__ Raw loadSome(const float* a, long long i, int count) {  // the first `count`, zeros after
    Raw r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (count > 0) r.x = a[i];
    if (count > 1) r.y = a[i + 1];
    if (count > 2) r.z = a[i + 2];
    if (count > 3) r.w = a[i + 3];
    return r;
  }
  static __device__ __forceinline__ void unpack(const Raw& r, float (&s)[4]) { s[0] = r.x, s[1] = r.y, s[2] = r.z, s[3] = r.w; }
};
struct AuxBf16 {
  static constexpr int kBytes = 2;
  typedef uint2 Raw;  // four bf16 values
  static __device__ __forceinline__ const unsigned char* bytes(pa_bf16_in a) { return reinterpret_cast<const unsigned char*>(a.p); }
  static __device__ __forceinline__ Raw load4(pa_bf16_in a, long long i) { return *reinterpret_cast<const uint2*>(a.p + i); }
  static __device__ __forceinline__ Raw loadSome(pa_bf16_in a, long long i, int count) {
    unsigned h[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < count) h[e] = a.p[i + e];
    return make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
  }
  static __device__ __forceinline__ void unpack(const Raw& r, float (&s)[4]) {
    s[0] = __uint_as_float(r.x << 16), s[1] = __uint_as_float(r.x & 0xffff0000u);
    s[2] = __uint_as_float(r.y << 16), s[3] = __uint_as_float(r.y & 0xffff0000u);
  }
};
struct AuxNone {  // (a functor without kAux)
  static constexpr int kBytes = 0;
  typedef int Raw;
};
// (declared only: decltype(auxElementOf(aux)) names the element's traits, whatever qualifies the pointer)
__device__ AuxF32 auxElementOf(const float*);
__device__ AuxBf16 auxElementOf(pa_bf16_in);
template <class Epi, bool = Epi::kAux>
struct AuxOf {
  typedef AuxNone type;
};
template <class Epi>
struct AuxOf<Epi, true> {
  typedef decltype(auxElementOf(static_cast<const Epi*>(nullptr)->aux)) type;
};

// ---- one operand's R-row slice in shared memory (see the note) -------------------------------
// BYTES: the element size (2: bf16, 4: fp32 for TF32); a slice is 128 bytes of K either way.
template <int R, bool KCONTIG, int BYTES = 2>
struct WgmmaOperand {
  static constexpr int kBytes = R * 128;
  static constexpr int kBlock = 128 / BYTES;        // MN-major: M/N indices in one 128-byte row
  static constexpr int kBlockBytes = kBlock * 128;  // MN-major: one block, the slice's K rows of 128 bytes
  static_assert(R % 64 == 0 && R <= 256, "operand tiles are whole 64-row swizzle blocks, one TMA box high at most");

  // The TMA copies of slice k0 of the tile whose first row (M or N index) is r0, batch entry b.
  static __device__ __forceinline__ void load(u32 dst, const TensorMap& map, int r0, int k0, int b, u32 bar) {
    if (KCONTIG) {
      tmaLoad3d(dst, map, k0, r0, b, bar);
    } else {
#pragma unroll
      for (int q = 0; q < R / kBlock; ++q) tmaLoad3d(dst + q * kBlockBytes, map, r0 + kBlock * q, k0, b, bar);
    }
  }
  // Descriptor of the 64-row block `block` of the tile at `tile`, k16 step j.
  static __device__ __forceinline__ u64 descriptor(u32 tile, int block, int j) {
    return KCONTIG ? smemDescriptor(tile + block * 8192 + 32 * j, 16, 1024) : smemDescriptor(tile + block * 8192 + 2048 * j, 8192, 1024);
  }
};

// BN ∈ {128, 256}; CONSUMERS ∈ {1, 2} (BM = 64·CONSUMERS). TF32: fp32 operands, products on
// TF32 (see the note). PINGPONG: two consumers, each multiplying whole 128 × 128 tiles of its own
// (BM = 128; see the note). Launch: grid (min(work items, SMs × blocks an SM)), block kThreads,
// dynamic shared memory kSharedBytes (opt-in above 48 KB).
template <int BN_, int CONSUMERS_, int STAGES_, bool TF32_ = false, bool PINGPONG_ = false>
struct WgmmaConfig {
  static constexpr int BN = BN_, CONSUMERS = CONSUMERS_, STAGES = STAGES_;
  static constexpr bool TF32 = TF32_, PINGPONG = PINGPONG_;
  static constexpr int kElemBytes = TF32 ? 4 : 2;
  // The 64-row blocks of a tile that one consumer multiplies (two with PINGPONG, else its own one).
  static constexpr int kRowBlocks = PINGPONG ? 2 : 1;
  static constexpr int BM = 64 * (PINGPONG ? kRowBlocks : CONSUMERS), BK = 128 / kElemBytes;  // a slice row is 128 bytes either way
  static constexpr int kThreads = 128 * (1 + CONSUMERS);
  static constexpr int kStageBytes = (BM + BN) * 128;
  static constexpr int kStagingBytes = 64 * 256;  // a consumer's epilogue staging (see the note)
  // The ring, the staging areas and the slack to align the ring to 1024 bytes.
  static constexpr int kSharedBytes = STAGES * kStageBytes + CONSUMERS * kStagingBytes + 1024;
  static_assert(BN == 128 || BN == 256, "wgmma tiles are 128 or 256 wide here");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
  static_assert(STAGES >= 2, "the ring needs a stage to fill while another is read");
  static_assert(!PINGPONG || (CONSUMERS == 2 && BN == 128 && !TF32), "ping-pong: two bf16 consumers of 128 × 128 tiles");
};

// The wgmma kernel's optional argument after the operand sums: a TMA map of C (the epilogue then
// stores by TMA; see the note), or none.
struct NoOutputMap {};
template <class CMap>
struct StoresByTma {
  static constexpr bool value = false;
};
template <>
struct StoresByTma<TensorMap> {
  static constexpr bool value = true;
};

// B as the kernel reads it: a TMA map (stored K-major, or MN-major for bf16), or, TF32 only, the
// fp32 matrix stored N-major, which the producer warpgroup transposes into the ring (see the note).
template <class BOperand>
struct TransposesB {
  static constexpr bool value = false;
};
template <>
struct TransposesB<const float*> {
  static constexpr bool value = true;
};

template <class P, class Cfg, class Epi, class CPtr, class BOperand, class Sums = NoSums, class CMap = NoOutputMap>
__device__ __forceinline__ void wgmmaGemm(const TensorMap& mapA, const BOperand& opB, CPtr C, const Epi& epi, const Sums& sums = Sums(),
                                          const CMap& mapC = CMap()) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr long long M = P::M, N = P::N, K = P::K;
  constexpr long long TilesM = (M + BM - 1) / BM, TilesN = (N + BN - 1) / BN, kTiles = TilesM * TilesN;
  constexpr long long kSlices = (K + BK - 1) / BK;
  constexpr long long kPerSplit = (kSlices + P::splits - 1) / P::splits;
  constexpr long long kItems = kTiles * (P::splits > 1 ? P::splits : P::batch);
  // B transposed by the producer warpgroup as it loads (TF32, B stored N-major): K-major in the ring.
  constexpr bool kLoadBT = TransposesB<BOperand>::value;
  constexpr bool kBKmajor = P::transB || kLoadBT;
  typedef WgmmaOperand<BM, !P::transA, Cfg::kElemBytes> OpA;
  typedef WgmmaOperand<BN, kBKmajor, Cfg::kElemBytes> OpB;
  constexpr long long kAlign = 16 / Cfg::kElemBytes;
  static_assert((P::transA ? M : K) % kAlign == 0 && (kLoadBT || (P::transB ? K : N) % kAlign == 0) && P::strideA % kAlign == 0 &&
                    (kLoadBT || P::strideB % kAlign == 0),
                "TMA needs contiguous extents and batch strides of whole 16-byte chunks");
  static_assert(!Cfg::TF32 || P::transB || kLoadBT, "TF32 wgmma reads B K-major");
  static_assert(!kLoadBT || (Cfg::TF32 && !P::transB), "the producer transposes an N-major fp32 B, for TF32");
  // TF32 with A stored M-major: A from registers (see the note); the large tile's consumers then
  // need more registers than 384 threads get, and take them from the producer warpgroup.
  constexpr bool kRsA = Cfg::TF32 && P::transA;
  constexpr bool kSplitRegs = (kRsA && Cfg::CONSUMERS == 2) || Cfg::PINGPONG;  // (ping-pong: 128 accumulators and the epilogue)
  // Ping-pong (see the note): each consumer multiplies whole tiles, every other item of the block's.
  constexpr bool kPingPong = Cfg::PINGPONG;
  constexpr int kRowBlocks = Cfg::kRowBlocks;
  static_assert(!kPingPong || (!kRsA && !kLoadBT), "ping-pong: both operands by TMA");
  typedef sm90::RegisterSplit<Cfg::CONSUMERS, 40> Registers;
  constexpr int IN = Cfg::TF32 ? sm90::kInTf32 : sm90::kInBf16;
  static_assert(M < (1ll << 31) && N < (1ll << 31) && K < (1ll << 31), "TMA coordinates are 32-bit");

  extern __shared__ unsigned char sharedRaw[];
  __shared__ __align__(8) u64 barriers[2 * STAGES];  // full[0..STAGES), empty[STAGES..2·STAGES)
  sm90::trapIfSharedBelow(Cfg::kSharedBytes);  // the launcher sizes the ring on the host (codegen's wgmmaVariant)
  const u32 ring = (smemAddress(sharedRaw) + 1023u) & ~1023u;
  const u32 full = smemAddress(barriers), empty = full + 8 * STAGES;

  // Work item w: tile w % kTiles of batch entry (or K split) w / kTiles.
  struct Item {
    long long m0, n0, b, split, sBegin;
    int count;
    __device__ __forceinline__ Item(long long w) {
      long long tm, tn;
      tileOf<TilesM, TilesN>(w % kTiles, tm, tn);
      m0 = tm * BM, n0 = tn * BN;
      const long long z = w / kTiles;
      b = P::splits > 1 ? 0 : z, split = P::splits > 1 ? z : 0;
      sBegin = split * kPerSplit;
      const long long sEnd = sBegin + kPerSplit < kSlices ? sBegin + kPerSplit : kSlices;
      count = sEnd > sBegin ? (int)(sEnd - sBegin) : 0;
    }
  };

  // B's slice at k0 of the tile from n0 (batch entry's matrix Bb), transposed by the producer
  // warpgroup (kLoadBT) into the stage's B tile at dst: each thread copies its share 4 bytes at a
  // time (cp.async) from N-major global memory into the K-major swizzled rows wgmma reads. A warp
  // copies 8 consecutive n of 4 consecutive k at a time: four 32-byte global segments, and
  // (k-chunk XOR n mod 8) puts its 32 stores in 32 banks. Warp w takes k rows 8w .. 8w+7 of the
  // slice, every n. Out-of-range elements are zero-filled.
  auto copyTransposedB = [&](u32 dst, const float* Bb, long long n0, long long k0, int tid) {
    if constexpr (kLoadBT) {
      const int lane = tid % 32, warp = tid / 32, nl = lane % 8, kl = lane / 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kk = 8 * warp + 4 * h + kl;  // the slice's k row; 16-byte chunk kk / 4 of each n row
        const long long k = k0 + kk, n = n0 + nl;
        const float* src = Bb + k * N + n;
        const u32 at = dst + nl * 128 + (((kk / 4) ^ nl) << 4) + (kk % 4) * 4;
#pragma unroll 8
        for (int q = 0; q < BN / 8; ++q) {
          const bool valid = k < K && n + 8 * q < N;
          sm90::cpAsync4To(at + q * 1024, valid ? src + 8 * q : Bb, valid);
        }
      }
    }
  };

  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbarInitRange(full, STAGES, kLoadBT ? 1 + 128 : 1);  // B transposed: every producer thread's copies too
    mbarInitRange(empty, STAGES, 128 * (kPingPong ? 1 : Cfg::CONSUMERS));  // (ping-pong: the one consumer that read it)
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();

  // The producer: thread 0 issues the TMA copies; when it transposes B (kLoadBT) the whole
  // warpgroup also copies B's slice and arrives on the stage's full barrier once it lands.
  if (warpgroup == 0) {
    if (kSplitRegs) Registers::enterProducer();
    if (!kLoadBT && tid != 0) return;
    int it = 0;  // slices issued so far, over every item: the ring position
    for (long long w = blockIdx.x; w < kItems; w += gridDim.x) {
      const Item item(w);
      const int ba = P::strideA ? (int)item.b : 0, bb = P::strideB ? (int)item.b : 0;
      for (int s = 0; s < item.count; ++s, ++it) {
        const int st = it % STAGES;
        mbarWait(empty + 8 * st, ((it / STAGES) & 1) ^ 1);
        const u32 a = ring + st * Cfg::kStageBytes, bar = full + 8 * st;
        const int k0 = (int)((item.sBegin + s) * BK);
        if (tid == 0) {
          mbarArriveExpectBytes(bar, kLoadBT ? OpA::kBytes : Cfg::kStageBytes);
          OpA::load(a, mapA, (int)item.m0, k0, ba, bar);
          if constexpr (!kLoadBT) OpB::load(a + OpA::kBytes, opB, (int)item.n0, k0, bb, bar);
        }
        if constexpr (kLoadBT) {
          copyTransposedB(a + OpA::kBytes, opB + (long long)bb * P::strideB, item.n0, k0, tid);
          sm90::cpAsyncArriveOnLanding(bar);
        }
      }
    }
    return;
  }

  if (kSplitRegs) Registers::enterConsumer();
  const int consumer = warpgroup - 1;
  typedef CElement<CPtr> E;
  static_assert(!P::transC || E::kBytes == 4, "a transposed output is fp32");
  constexpr bool kTmaC = StoresByTma<CMap>::value;
  static_assert(!kTmaC || (!P::transC && !Epi::kStageRaw), "TMA stores leave the fragments' staging of C's own rows");
  constexpr int kChunkCols = 256 / E::kBytes, kPasses = (BN + kChunkCols - 1) / kChunkCols;
  constexpr int kPerChunk = 16 / E::kBytes;
  // Every tile wholly inside C: the epilogue's bounds tests compile away. A row's 64 × N
  // elements within 32-bit offsets: the per-element offsets from a row base are ints.
  constexpr bool kFullTiles = M % BM == 0 && N % BN == 0;
  constexpr bool kOffsets32 = 64 * N < (1ll << 31);
  const u32 stagedAt = ring + STAGES * Cfg::kStageBytes + consumer * Cfg::kStagingBytes;
  unsigned char* const staged = sharedRaw + (stagedAt - smemAddress(sharedRaw));
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  // Operand sums (MatMulBiasGrad's bias gradient; see the note): the consumers sum an MN-major
  // operand's slices as they sit in the ring. The P = kThreadsPerColumn consecutive consumer
  // threads T of a group (lanes of one warp) take chunk column T div P (8 consecutive M or N
  // indices, one 16-byte chunk of each k row) in k rows T mod P + P·i: the 8 lanes of a 16-byte
  // load's phase read rows of distinct k mod 8, so distinct chunks of the swizzle (no conflict).
  constexpr int kSum = Sums::kOperand;
  constexpr int kSumRows = kSum == 1 ? BM : BN, kSumThreads = 128 * (kPingPong ? 1 : Cfg::CONSUMERS);  // (ping-pong: the item's consumer)
  constexpr int kSumColumns = kSumRows / 8, kThreadsPerColumn = kSumThreads / kSumColumns, kRowsPerThread = 64 / kThreadsPerColumn;
  static_assert(kSum == 0 || (!Cfg::TF32 && P::batch == 1 && (kSum == 1 ? P::transA : !P::transB)),
                "operand sums: bf16, one product, the summed operand MN-major");
  static_assert(kSum == 0 || (sizeof(typename Sums::T) == 8) == (P::splits > 1), "split products write fp64 partial sums");
  static_assert(kSumThreads % kSumColumns == 0 && 64 % kThreadsPerColumn == 0 && kThreadsPerColumn >= 8 && kThreadsPerColumn <= 32 &&
                    (kThreadsPerColumn & (kThreadsPerColumn - 1)) == 0,
                "a chunk column's threads: 8 to 32 lanes of one warp, a power of two");
  const int sumThread = (kPingPong ? 0 : consumer) * 128 + tid, sumColumn = sumThread / kThreadsPerColumn, sumRow0 = sumThread % kThreadsPerColumn;
  constexpr long long kSumShares = kSum == 1 ? TilesN : TilesM;  // (split products: the items that share a tile's slices)
  float operandSum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  // A from registers: where this thread's fragments of k8 step 0 lie in a stage's A tile (step j
  // is 8 rows, 1024 bytes, further). Fragment h + 2e is row m = 64·consumer + 16·warp + g + 8h,
  // k = t + 4e: block m / 32, row k, 16-byte chunk (m mod 32) / 4 XOR-ed with k mod 8.
  u32 aAt[4] = {0, 0, 0, 0};
  if (kRsA) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const u32 m = 64 * consumer + 16 * (tid / 32) + g + 8 * h, k = t + 4 * e;
        aAt[h + 2 * e] = (m / OpA::kBlock) * OpA::kBlockBytes + k * 128 + ((((m % OpA::kBlock) / 4) ^ k) << 4) + (m % 4) * 4;
      }
  }
  // A from registers: ptxas serializes every wgmma (C7513) when registers a wgmma reads are written
  // while any wgmma is in flight, so each slice's products complete before the next slice's
  // fragments load (the other consumer warpgroup keeps the tensor cores busy meanwhile).
  u32 frag[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) frag[j][r] = 0u;
  int it = 0;
  float accs[kRowBlocks][BN / 2];  // the consumer's 64-row blocks of the tile
  auto fenceAccs = [&]() {
#pragma unroll
    for (int h = 0; h < kRowBlocks; ++h) fenceRegisters(accs[h]);
  };
  auto slice = [&](int s, bool summing) {
    const int st = it % STAGES;
    mbarWait(full + 8 * st, (it / STAGES) & 1);
    if constexpr (kLoadBT) sm90::fenceProxyAsync();  // B's stores came through the generic proxy
    const u32 a = ring + st * Cfg::kStageBytes, bt = a + OpA::kBytes;
    if constexpr (kRsA) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) frag[j][r] = sm90::ldShared32(a + aAt[r] + 1024 * j);
    }
    fenceAccs();
    wgmmaFence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // k16 (bf16) or k8 (TF32) steps: 32 bytes of each 128-byte row
      if constexpr (kRsA) {
        sm90::WgmmaRS<BN, sm90::kInTf32, 0>::run(accs[0], frag[j], OpB::descriptor(bt, 0, j), 1);
      } else {
#pragma unroll
        for (int h = 0; h < kRowBlocks; ++h)
          sm90::WgmmaSS<BN, IN, P::transA ? 1 : 0, kBKmajor ? 0 : 1>::run(accs[h], OpA::descriptor(a, kPingPong ? h : consumer, j),
                                                                             OpB::descriptor(bt, 0, j), 1);
      }
    }
    wgmmaCommit();
    if constexpr (kSum != 0) {  // while the products run (the stage is released after them)
      if (summing) {
        const u32 tile = kSum == 1 ? a : bt;
        const int block = sumColumn / 8, chunk = sumColumn % 8;
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int k = sumRow0 + kThreadsPerColumn * i;
          u32 v[4];
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                       : "r"(tile + block * 8192 + k * 128 + ((chunk ^ (k & 7)) << 4)));
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            operandSum[2 * e] += __uint_as_float(v[e] << 16);
            operandSum[2 * e + 1] += __uint_as_float(v[e] & 0xffff0000u);
          }
        }
      }
    }
    if constexpr (kRsA) {
      wgmmaWait<0>();  // this slice's products are done: its stage and the fragments are free
      fenceAccs();
#pragma unroll
      for (int j = 0; j < 4; ++j) fenceRegisters(frag[j]);
      mbarArrive(empty + 8 * st);
    } else {
      wgmmaWait<1>();  // the previous slice's products are done: its stage can be refilled
      fenceAccs();
      if (s > 0) mbarArrive(empty + 8 * ((it - 1) % STAGES));
    }
    ++it;
  };
  // The transposed output (P::transC, see the note): the kernel's row index is C's column and its
  // column C's row (C is N × M). 64 kernel columns a pass, staged as rows of C (64 kernel rows,
  // 256 bytes, chunk c of staged row i at c ^ (i mod 16)), out as 16-byte segments of C's rows.
  auto transposedEpilogue = [&](const float (&acc)[BN / 2], long long tileRow, long long n0, long long b, unsigned char* out,
                                unsigned char* staged) {
    const bool vec = M % 4 == 0 && aligned16(out);
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (tid / 32) * 16 + g + 8 * h;
        const long long km = tileRow + r;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = p * 8 + jj;
          if (j >= BN / 8) break;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = 8 * jj + 2 * t + e;
            const long long kn = n0 + p * 64 + col;
            float o = 0.0f;  // the functor runs exactly once for every element of C
            if (km < M && kn < N) o = epi(acc[4 * j + 2 * h + e], kn, km, b * M * N + kn * M + km);
            *reinterpret_cast<float*>(staged + col * 256 + ((((r >> 2) ^ col) & 15) << 4) + (r & 3) * 4) = o;
          }
        }
      }
      asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
#pragma unroll 4
      for (int f = tid; f < 64 * 16; f += 128) {
        const int col = f / 16, c = f % 16;
        const long long kn = n0 + p * 64 + col, km = tileRow + 4 * c;
        if (kn >= N || km >= M || p * 64 + col >= BN) continue;
        const float* src = reinterpret_cast<const float*>(staged + col * 256 + ((c ^ (col & 15)) << 4));
        float* dst = reinterpret_cast<float*>(out) + kn * M + km;
        if (vec) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < 4 && km + e < M; ++e) dst[e] = src[e];
        }
      }
      asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");  // the staging is free again
    }
  };
  // The staged-raw epilogue (Epi::kStageRaw, see the note): 64 columns a pass, the raw fp32
  // sums staged (the 16-byte chunks of row r XOR-ed with 2·(r mod 8), so the 8-byte writes of a
  // half-warp and the 16-byte reads of a quarter-warp hit distinct banks), then each thread takes
  // 16-byte chunks of 4 columns: the functor (its auxiliary input four at a time), C four at a time.
  auto stagedRawEpilogue = [&](const float (&acc)[BN / 2], long long tileRow, long long n0, long long b, unsigned char* out,
                               unsigned char* staged, int r0) {
    constexpr int kRawPasses = BN / 64, kChunks = 64 * 16 / 128, kGroup = 4;  // chunks a thread takes per pass, a group's
    typedef typename AuxOf<Epi>::type A;
    const bool vec = N % 4 == 0 && ((unsigned long long)out & (4 * E::kBytes - 1)) == 0;
    bool auxVec = false;
    if constexpr (Epi::kAux) auxVec = N % 4 == 0 && ((unsigned long long)A::bytes(epi.aux) & (4 * A::kBytes - 1)) == 0;
    // Chunk u of pass p: row rt + 8u of the 64, columns 64p + 4c .. 64p + 4c + 3 (the same swizzled
    // chunk in every row a thread takes, as 8u keeps r mod 8).
    const int rt = tid / 16, c = tid % 16;
    const long long m0 = tileRow + rt, nc = n0 + 4 * c, at0 = b * M * N + m0 * N + nc;
    const unsigned char* src = staged + rt * 256 + (((c ^ ((rt & 7) << 1)) & 15) << 4);
    unsigned char* dst = out + (m0 * N + nc) * E::kBytes;
    // The auxiliary values of group (p, q) as loaded: each group's are requested one group ahead of
    // their use (the first before the staging), so their latency overlaps the previous group's work;
    // fp32 ones (16 registers a group) at the group's start (the consumers have no registers for two).
    constexpr bool kAhead = A::kBytes == 2;
    typename A::Raw cur[kGroup] = {}, next[kGroup] = {};
    auto loadGroup = [&](typename A::Raw(&to)[kGroup], int p, int q) {
      if constexpr (Epi::kAux) {
#pragma unroll
        for (int uu = 0; uu < kGroup; ++uu) {
          const long long m = m0 + 8 * (q + uu), n = nc + 64 * p, at = at0 + 8 * (q + uu) * N + 64 * p;
          const bool whole = kFullTiles || (m < M && n + 3 < N), any = kFullTiles || (m < M && n < N);
          to[uu] = whole && auxVec ? A::load4(epi.aux, at) : A::loadSome(epi.aux, at, any ? (int)(N - n < 4 ? N - n : 4) : 0);
        }
      }
    };
    if (kAhead) loadGroup(cur, 0, 0);
#pragma unroll
    for (int p = 0; p < kRawPasses; ++p) {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int j = p * 8 + jj, byte = 32 * jj + 8 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = r0 + 8 * h;
          *reinterpret_cast<float2*>(staged + r * 256 + ((((byte >> 4) ^ ((r & 7) << 1)) & 15) << 4) + (byte & 15)) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
      }
      asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
      const long long n = nc + 64 * p;
      // The groups one after another (not unrolled: an inlined functor such as GELU's derivative
      // would otherwise be copied 32 times a pass).
#pragma unroll 1
      for (int q = 0; q < kChunks; q += kGroup) {  // a group's functors, then its stores
        if (!kAhead) {
          loadGroup(cur, p, q);
        } else if (q + kGroup < kChunks) {
          loadGroup(next, p, q + kGroup);
        } else if (p + 1 < kRawPasses) {
          loadGroup(next, p + 1, 0);
        }
        // Chunk u's four results out (row m0 + 8u, columns n .. n + 3).
        auto storeChunk = [&](int u, const float (&vals)[4]) {
          const long long m = m0 + 8 * u;
          unsigned char* d = dst + (8 * u * N + 64 * p) * E::kBytes;
          if ((kFullTiles || (m < M && n + 3 < N)) && vec) {
            E::store4(d, vals);
          } else if (kFullTiles || m < M) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (n + e < N) E::store1(d + e * E::kBytes, vals[e]);
          }
        };
        if constexpr (Epi::kAux) {  // the auxiliary values are in registers: each chunk out as it is done
#pragma unroll
          for (int uu = 0; uu < kGroup; ++uu) {
            const float4 raw = *reinterpret_cast<const float4*>(src + (q + uu) * 8 * 256);
            float a[4], x[4] = {raw.x, raw.y, raw.z, raw.w};
            A::unpack(cur[uu], a);
#pragma unroll
            for (int e = 0; e < 4; ++e) x[e] = epi.withAux(x[e], a[e]);  // (one formula for whole and partial chunks: pure,
                                                                       // and what lies outside C is not stored)
            storeChunk(q + uu, x);
            if (kAhead) cur[uu] = next[uu];
          }
        } else {
          // The group's staged sums first (the four loads in flight at once), then the functors
          // (which may load: a bias), then the stores: a consumer's epilogue runs on one warp a
          // scheduler, so its chunks' latencies must overlap. (The aux path above keeps its loads
          // in the loop, which measured faster there: bench/RESULTS.md, twenty-seventh session.)
          float v[kGroup][4];
#pragma unroll
          for (int uu = 0; uu < kGroup; ++uu) {
            const float4 raw = *reinterpret_cast<const float4*>(src + (q + uu) * 8 * 256);
            v[uu][0] = raw.x, v[uu][1] = raw.y, v[uu][2] = raw.z, v[uu][3] = raw.w;
          }
#pragma unroll
          for (int uu = 0; uu < kGroup; ++uu) {
            const int u = q + uu;
            float* x = v[uu];
            const long long m = m0 + 8 * u, at = at0 + 8 * u * N + 64 * p;
            const bool whole = kFullTiles || (m < M && n + 3 < N), any = kFullTiles || (m < M && n < N);
            if (whole) {
              epiPair(epi, x[0], x[1], m, n, at);
              epiPair(epi, x[2], x[3], m, n + 2, at + 2);
            } else if (any) {
#pragma unroll
              for (int e = 0; e < 4; e += 2) {  // (a pair epilogue has N even: a pair inside C starts inside it)
                if (n + e + 1 < N) {
                  epiPair(epi, x[e], x[e + 1], m, n + e, at + e);
                } else if (n + e < N) {
                  x[e] = epi(x[e], m, n + e, at + e);
                }
              }
            }
          }
#pragma unroll
          for (int uu = 0; uu < kGroup; ++uu) storeChunk(q + uu, v[uu]);
        }
      }
      asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");  // the staging is free again
    }
  };
  long long local = 0;  // the item's place in the block's sequence
  for (long long w = blockIdx.x; w < kItems; w += gridDim.x, ++local) {
    const Item item(w);
    if constexpr (kPingPong) {
      // Every other item is this consumer's: the other's slices pass by in the ring. The products
      // start once the other consumer has taken its previous item's last slice, so that no wait
      // on a stage's full barrier runs more than one phase ahead (see the note).
      if (local % 2 != consumer) {
        it += item.count;
        continue;
      }
      if (local > 0) asm volatile("bar.sync %0, 256;" ::"r"(4 + consumer) : "memory");
    }
#pragma unroll
    for (int h = 0; h < kRowBlocks; ++h)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) accs[h][i] = 0.0f;
    if constexpr (Epi::kStageRaw && Epi::kAux && !P::transC) {
      // The epilogue's auxiliary input for this consumer's rows of the tile, into L2 while the
      // products run: its reads then wait on L2, not DRAM (one 128-byte line a prefetch).
      typedef typename AuxOf<Epi>::type A;
      constexpr int kLines = (BN * A::kBytes + 127) / 128;
      const long long rows = item.m0 + (kPingPong ? 0 : consumer * 64), base = item.b * M * N;
      for (int l = tid; l < 64 * kRowBlocks * kLines; l += 128) {
        const long long m = rows + l / kLines, n = item.n0 + (l % kLines) * (128 / A::kBytes);
        if (m < M && n < N) asm volatile("prefetch.global.L2 [%0];" ::"l"(A::bytes(epi.aux) + (base + m * N + n) * A::kBytes));
      }
    }
    // Which items sum (see the note): one product, those of the first tile column (A) or row (B);
    // split, every item, slice g of the split's share where g mod (tile columns or rows) is the item's.
    const long long other = kSum == 1 ? item.n0 / BN : item.m0 / BM;
    const bool summing = kSum != 0 && (P::splits > 1 || other == 0);
    for (int s = 0; s < item.count; ++s) slice(s, summing && (P::splits == 1 || (item.sBegin + s) % kSumShares == other));
    if constexpr (kPingPong) {  // the other consumer's next item may start (where it has one)
      if (w + gridDim.x < kItems) asm volatile("bar.arrive %0, 256;" ::"r"(5 - consumer) : "memory");
    }
    if constexpr (!kRsA) {
      wgmmaWait<0>();
      fenceAccs();
      if (item.count > 0) mbarArrive(empty + 8 * ((it - 1) % STAGES));
    }
    if constexpr (kSum != 0) {
      // The tile's operand sums: each chunk column's P threads add theirs by a butterfly of
      // shuffles (a fixed tree), and the group's first thread writes its 8 sums (or the fp64
      // partials of split z and tile row (B) or column (A) j at out[(z·shares + j)·extent + r],
      // which the reduce kernel adds in that order).
      if (summing) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
#pragma unroll
          for (int d = 1; d < kThreadsPerColumn; d *= 2) operandSum[e] += __shfl_xor_sync(0xffffffffu, operandSum[e], d);
        constexpr long long kExtent = kSum == 1 ? M : N;
        const long long r0 = (kSum == 1 ? item.m0 : item.n0) + sumColumn * 8;
        typename Sums::T* const to = sums.out + (P::splits > 1 ? item.split * kSumShares + other : 0) * kExtent;
        if (sumRow0 == 0) {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (r0 + e < kExtent) to[r0 + e] = static_cast<typename Sums::T>(operandSum[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) operandSum[e] = 0.0f;
      }
    }

    // Epilogue (see the note): the functor on the accumulators, staged 256 bytes of each row at
    // a time, out as 16-byte row segments. C's batch entry: the batch entry's, or a split's partial sums.
    const long long n0 = item.n0, b = item.b;
    const long long cEntry = item.b + item.split;
    unsigned char* const out = E::bytes(C) + cEntry * M * N * E::kBytes;
#pragma unroll
    for (int h = 0; h < kRowBlocks; ++h) {  // the consumer's 64-row blocks of the tile, one after the other
      const float(&acc)[BN / 2] = accs[h];
      const long long tileRow = item.m0 + 64 * (kPingPong ? h : consumer);
      if constexpr (P::transC) {
        static_assert(!Epi::kPairs, "a pair epilogue runs on C's own rows (codegen never swaps its product)");
        transposedEpilogue(acc, tileRow, n0, b, out, staged);
        continue;
      }
      const int r0 = (tid / 32) * 16 + g;  // this thread's rows r0 and r0 + 8 of the warpgroup's 64
      if constexpr (Epi::kStageRaw) {
        stagedRawEpilogue(acc, tileRow, n0, b, out, staged, r0);
        continue;
      }
      const bool vec = N % kPerChunk == 0 && aligned16(out);
      const long long m0 = tileRow + r0, rowAt = b * M * N + m0 * N + n0;
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        if constexpr (kTmaC) {  // the staging's previous stores have read it
          if (tid == 0) sm90::bulkWaitRead<0>();
          asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
        }
        // Column pair by column pair, both rows' results before either is stored: the functor's
        // per-column reads (the bias) then serve both rows (no store between them to alias them).
#pragma unroll
        for (int jj = 0; jj < kChunkCols / 8; ++jj) {
          const int j = p * (kChunkCols / 8) + jj;
          if (j >= BN / 8) break;
          const int col = 8 * j + 2 * t, byte = (8 * jj + 2 * t) * E::kBytes;
          const long long n = n0 + col;
          float2 o[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const long long m = m0 + 8 * h, at = rowAt + (kOffsets32 ? (long long)(int)(8 * h * (int)N + col) : 8 * h * N + col);
            o[h] = make_float2(0.0f, 0.0f);  // the functor runs exactly once for every element of C
            if (kFullTiles || (m < M && n + 1 < N)) {
              o[h] = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
              epiPair(epi, o[h].x, o[h].y, m, n, at);
            } else {
              if (m < M && n < N) o[h].x = epi(acc[4 * j + 2 * h], m, n, at);
              if (m < M && n + 1 < N) o[h].y = epi(acc[4 * j + 2 * h + 1], m, n + 1, at + 1);
            }
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
            if constexpr (kTmaC) {  // box byte / 128, its row r, chunk (byte / 16 mod 8) ^ (r mod 8)
              E::storePair(staged + (byte >> 7) * 8192 + r * 128 + ((((byte >> 4) & 7) ^ (r & 7)) << 4) + (byte & 15), o[h]);
            } else {
              E::storePair(staged + r * 256 + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15), o[h]);
            }
          }
        }
        if constexpr (kTmaC) {
          sm90::fenceProxyAsync();  // the stores read the staging through the async proxy
          asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
          if (tid == 0) {
#pragma unroll
            for (int q = 0; q < 2; ++q)
              sm90::tmaStore3d(mapC, stagedAt + q * 8192, (int)(n0 + p * kChunkCols + q * (kChunkCols / 2)), (int)tileRow, (int)cEntry);
            sm90::bulkCommit();
          }
          continue;
        }
        asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
#pragma unroll 4
        for (int f = tid; f < 64 * 16; f += 128) {
          const int r = f / 16, c = f % 16;
          const long long m = tileRow + r, n = n0 + p * kChunkCols + c * kPerChunk;
          if (p * kChunkCols + c * kPerChunk >= BN || (!kFullTiles && (m >= M || n >= N))) continue;
          const unsigned char* src = staged + r * 256 + ((c ^ (r & 7)) << 4);
          unsigned char* dst = out + (m * N + n) * E::kBytes;
          if (vec) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
          } else {
            for (int e = 0; e < kPerChunk && n + e < N; ++e) E::copy(dst + e * E::kBytes, src + e * E::kBytes);
          }
        }
        asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");  // the staging is free again
      }
    }
  }
  if constexpr (kTmaC) {
    if (tid == 0) sm90::bulkWait<0>();  // the last stores are done before the block's shared memory goes
  }
}

}  // namespace gemm
}  // namespace pa
