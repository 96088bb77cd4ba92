// Flash attention forward on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a), for
// bf16 and fp16 at padded head dims 64, 128, 192 and 256 (64-key tiles and two warpgroups above
// 128). Same semantics and row statistics as flashForwardMma (flash_attention_fwd.cuh); the
// launcher picks it on sm_90a devices.
/*
 * Note on the kernel.
 *
 * Block: CONSUMERS warpgroups (128 threads each) own 64 query rows each (BM = 64·CONSUMERS), and
 * a producer warpgroup, which hands most of its registers to the consumers (setmaxnreg), streams the key/value tiles of BN rows that the mask leaves (partly) visible (BlockTiles, as in
 * the mma.sync kernel) into a STAGES-deep ring with 16-byte cp.async. Q is copied once by the
 * producer too. Every tile in shared memory uses the 128-byte swizzle of the wgmma GEMM
 * (kernels/gemm_wgmma.cuh): column blocks of 64 head-dim elements, each row 128 bytes, 16-byte
 * chunk c of row r at chunk c ^ (r mod 8), blocks 1024-byte aligned. The one layout serves all three
 * operands: Q and K are read k-major (k = head dim) by S = Q·Kᵀ, and V, whose rows are keys, is
 * read MN-major (its n = head dim is contiguous) by O += P·V.
 *
 * Consumer warpgroup, per tile: S = Q·Kᵀ with wgmma.m64nBNk16 from shared memory (DPAD/16 steps,
 * the first overwriting S); wait; release K's stage and the previous tile's V stage (their wgmmas
 * are complete); mask, online softmax and O rescale in registers exactly as the mma.sync kernel
 * does (the wgmma accumulator layout is mma.sync's m16n8 layout per warp); P is packed to 16 bits
 * in registers, already in the A-fragment layout, and O += P·V runs as wgmma.m64nDPADk16 with A
 * from registers, left in flight while the next tile's S is issued. The warpgroups never wait
 * for one another: each has its own arrivals on the "empty" barriers, so one warpgroup's softmax
 * overlaps the other's products.
 *
 * Hand-offs are mbarriers per stage: kFull / vFull (one arrival per producer thread, made by the hardware as
 * each producer thread's copies land: cp.async.mbarrier.arrive.noinc) and kEmpty / vEmpty (128·CONSUMERS
 * consumer arrivals). Consumers execute fence.proxy.async after waiting on a full barrier, since
 * cp.async writes through the generic proxy and wgmma reads through the async proxy. The i-th use
 * of a stage waits for parity (i / STAGES) & 1 on full and the opposite on empty (a fresh barrier
 * reports its previous phase complete).
 *
 * TMA (FlashKernelSpec::tma, the launcher's default): the copies are TMA copies instead, one per
 * 64 columns of a tile (tmaSwizzled), issued by one producer thread from tensor maps the launcher
 * passes as a second, __grid_constant__ argument; the map's 128-byte swizzle is the layout above
 * and rows or columns out of range arrive as zeros. The full barriers then expect that thread's
 * one arrival, with the tile's bytes (mbarrier.arrive.expect_tx), the rest of the producer
 * warpgroup exits, and the consumers skip the proxy fence (TMA writes through the async proxy).
 * At head dim 128 with up to two consumer warpgroups O leaves by TMA as well (STORE_TMA): a
 * warpgroup writes its 64 rows, scaled and rounded, into its rows of the Q buffer (stmatrix, the
 * same swizzle), fences them for the async proxy, and after a barrier of its 128 threads its
 * thread 0 stores them with cp.async.bulk.tensor from a map of O (rows and columns out of range
 * are not written). That thread's arrival on the buffer's qEmpty waits until the store has read
 * the buffer, and it comes under the next item's first product, so no warp waits for the store.
 *
 * PINGPONG (FlashAttention-3's inter-warpgroup schedule; the rule turns it on at head dim 128 with
 * two consumer warpgroups): named barrier 1 + w gates warpgroup w's issue of S, which then opens
 * w + 1's, so the warpgroups issue in turn and one's softmax runs under another's products.
 * FlashAttention-3's intra-warpgroup pipelining (a tile's S issued with the previous tile's P·V,
 * the softmax under the latter) was measured slower here and is not in the kernel:
 * bench/RESULTS_flash.md, "Forward schedules".
 *
 * SINK_TILE (the rule where the mask has 1 to kSinkKeys sinks beside a left window): far from the
 * start a block's first visible key tile holds only the sinks (BlockTiles::sinkNarrow); it runs
 * as kSinkKeys-key products (S in m64n16k16 steps, one k16 step of P·V), whose sums are the whole
 * tile's: its other keys' P is exactly 0.
 *
 * PERSISTENT (the rule where the launcher knows the SM count): one block an SM, each taking
 * (slice, query tile) items from a work list through an atomic counter until it runs out
 * (WorkList: heaviest tiles first, so the light ones fill in at the end). The producer loads
 * the next item's Q into the second Q buffer and its first K/V tiles while the consumers finish
 * the current one (the ring runs on across items); qFull / qEmpty hand the Q buffers over, and
 * qFull's second set of arrivals publishes the buffer's item. An item is computed with the same
 * operations as in a block of its own (same bits; bench/RESULTS_flash.md, "Persistent forward").
 *
 * Why a producer warpgroup: a single producer warp starves the consumers; a whole warpgroup that
 * hands its registers to them (setmaxnreg) keeps them fed (the sweep: bench/RESULTS_flash.md).
 *
 * The RS product reads P's registers asynchronously; they are pinned (fenceRegisters) after the
 * next wait, so the compiler cannot reuse them before the hardware has read them.
 */
#pragma once

#include "kernels/flash_attention_fwd.cuh"
#include "kernels/wgmma.cuh"

namespace pa {
namespace flash {

template <int DPAD, int BN, int CONSUMERS, int STAGES_, bool PERSISTENT = false>
struct WgmmaForwardConfig {
  static_assert(DPAD == 64 || DPAD == 128 || DPAD == 192 || DPAD == 256, "wgmma forward: padded head dim 64, 128, 192 or 256");
  static_assert(BN == 64 || BN == 128 || BN == 160 || BN == 176 || BN == 192, "wgmma forward: 64, 128, 160, 176 or 192 keys per tile");
  static_assert(DPAD <= 128 || (BN == 64 && CONSUMERS <= 2), "head dims 192 and 256: 64-key tiles, at most two consumer warpgroups");
  static_assert(CONSUMERS >= 1 && CONSUMERS <= 3, "wgmma forward: 1 to 3 consumer warpgroups");
  static_assert(STAGES_ >= 2, "the ring needs a stage to fill while another is read");
  static constexpr int BM = 64 * CONSUMERS;
  static constexpr int kThreads = 128 * (CONSUMERS + 1);  // + the producer warpgroup
  typedef sm90::RegisterSplit<CONSUMERS, CONSUMERS <= 2 ? 40 : 24> Registers;
  static constexpr int kQBytes = BM * DPAD * 2;
  static constexpr int kTileBytes = BN * DPAD * 2;  // one K or V tile
  static constexpr int kStages = STAGES_;
  // Q (two buffers when persistent: the next item's loads under this one's work), then K stages,
  // then V stages; + the slack that aligns the start to 1024 bytes.
  static constexpr int kQBuffers = PERSISTENT ? 2 : 1;
  static constexpr int kSharedBytes = kQBuffers * kQBytes + 2 * kStages * kTileBytes + 1024;
};

template <typename Tag>
struct WgmmaInputOf;
template <>
struct WgmmaInputOf<BF16Tag> {
  static constexpr int kValue = sm90::kInBf16;
};
template <>
struct WgmmaInputOf<F16Tag> {
  static constexpr int kValue = sm90::kInF16;
};

// Rows [row0, row0 + ROWS) of a [seq, head dim] slice into the swizzled layout of the note at
// `dst`, by the LANES threads of the producer; rows past `rows` and columns past `headDim` become zeros.
template <int ROWS, int DPAD, int LANES>
__device__ __forceinline__ void loadSwizzled(u32 dst, const u16* gbase, long long seqStride, int row0, int rows,
                                             int headDim, int lane) {
  constexpr int kChunksPerRow = DPAD / 8;  // 16-byte chunks
  if constexpr (LANES % kChunksPerRow == 0) {  // a lane keeps its column
    constexpr int kRowStep = LANES / kChunksPerRow;
    static_assert(ROWS % kRowStep == 0, "whole row steps");
    constexpr int kIters = ROWS / kRowStep;
    const int c = lane % kChunksPerRow, r0 = lane / kChunksPerRow;
    const bool colOk = 8 * c < headDim;
    const u16* src = gbase + (long long)(row0 + r0) * seqStride + 8 * c;
    const u32 base = dst + (c >> 3) * (ROWS * 128) + r0 * 128;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int r = r0 + i * kRowStep;
      const bool valid = colOk && row0 + r < rows;
      sm90::cpAsync16To(base + i * kRowStep * 128 + (((c & 7) ^ (r & 7)) << 4),
                        valid ? src + (long long)i * kRowStep * seqStride : gbase, valid);
    }
  } else {  // head dim 192 (24 chunks a row, which LANES does not divide): 64 columns at a time
    constexpr int kRowStep = LANES / 8;
    static_assert(ROWS % kRowStep == 0, "whole row steps");
    const int c8 = lane % 8, r0 = lane / 8;
#pragma unroll
    for (int block = 0; block < DPAD / 64; ++block) {
      const bool colOk = 8 * (8 * block + c8) < headDim;
      const u16* src = gbase + (long long)(row0 + r0) * seqStride + 8 * (8 * block + c8);
      const u32 base = dst + block * (ROWS * 128) + r0 * 128 + ((c8 ^ (r0 & 7)) << 4);  // r0 + kRowStep·i ≡ r0 mod 8
#pragma unroll
      for (int i = 0; i < ROWS / kRowStep; ++i) {
        const bool valid = colOk && row0 + r0 + i * kRowStep < rows;
        sm90::cpAsync16To(base + i * kRowStep * 128, valid ? src + (long long)i * kRowStep * seqStride : gbase, valid);
      }
    }
  }
}

// The same rows by TMA (FlashKernelSpec::tma): one copy per 64 columns from `map` (a 4-d map of
// [batch, heads, seq, head dim], boxes of 64 columns by ROWS rows, 128-byte swizzle: the layout
// above, rows and columns out of range as zeros); the bytes land on `bar`, whose expected bytes
// the caller set. One thread issues it.
template <int ROWS, int DPAD>
__device__ __forceinline__ void tmaSwizzled(u32 dst, const FlashTensorMap& map, int row0, int head, int batch, u32 bar) {
#pragma unroll
  for (int c = 0; c < DPAD / 64; ++c) sm90::tmaLoad4d(dst + c * (ROWS * 128), &map, 64 * c, row0, head, batch, bar);
}

// acc = A·Bᵀ summed over the head dim, both read k-major from the swizzled layout: A is the 64-row
// block at `aRows` inside a tile of A_ROWS rows, B the first N rows of the B_ROWS-row tile at
// `bTile`. The descriptors of one product's k16 steps are the first step's plus a constant each
// (sm90::smemDescriptorStep), so a step costs an add, not a descriptor built from its address.
template <int N, int IN, int DPAD, int A_ROWS, int B_ROWS = N>
__device__ __forceinline__ void headDimProduct(float (&acc)[N / 2], u32 aRows, u32 bTile) {
  const sm90::u64 da = sm90::smemDescriptor(aRows, 16, 1024), db = sm90::smemDescriptor(bTile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < DPAD / 16; ++kk)
    sm90::WgmmaSS<N, IN, 0, 0>::run(acc, sm90::smemDescriptorStep(da, (kk / 4) * (A_ROWS * 128) + 32 * (kk % 4)),
                                    sm90::smemDescriptorStep(db, (kk / 4) * (B_ROWS * 128) + 32 * (kk % 4)), kk > 0);
}

// acc += F·T over the first ROWS rows of the swizzled tile at `tile` (`tileRows` rows: its column
// blocks lie tileRows · 128 bytes apart), read MN-major (its columns are the head dim), F register
// fragments, four registers per k16 step.
template <int DPAD, int IN, int ROWS>
__device__ __forceinline__ void tileProduct(float (&acc)[DPAD / 2], const u32 (&f)[ROWS / 16][4], u32 tile,
                                            int tileRowBytes = ROWS * 128) {
  const sm90::u64 d = sm90::smemDescriptor(tile, tileRowBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < ROWS / 16; ++kk) sm90::WgmmaRS<DPAD, IN, 1>::run(acc, f[kk], sm90::smemDescriptorStep(d, 2048 * kk), 1);
}

// Keys of the narrow products that stand for a tile holding only sink keys (BlockTiles::sinkNarrow).
constexpr int kSinkKeys = kFlashSinkTileKeys;

// The A fragment of k16 step kk from a wgmma m64nN accumulator (acc[4j + e]: rows g, g + 8 of the
// warp's 16, columns 8j + 2t, 8j + 2t + 1), the packing mma.sync's A layout needs.
template <typename Tag, int R>
__device__ __forceinline__ void packFragment(u32 (&a)[4], const float (&acc)[R], int kk) {
  a[0] = Elem<Tag>::pack(acc[8 * kk + 0], acc[8 * kk + 1]);
  a[1] = Elem<Tag>::pack(acc[8 * kk + 2], acc[8 * kk + 3]);
  a[2] = Elem<Tag>::pack(acc[8 * kk + 4], acc[8 * kk + 5]);
  a[3] = Elem<Tag>::pack(acc[8 * kk + 6], acc[8 * kk + 7]);
}

// Row g + 8r of the thread's warp rows from an m64nDPAD accumulator, times `scale`, as 16-bit pairs
// into `dst` (the row's first element), columns below headDim.
template <typename Tag, int DPAD>
__device__ __forceinline__ void storeAccRow(u16* dst, const float (&acc)[DPAD / 2], int r, float scale, int t, int headDim) {
#pragma unroll
  for (int dt = 0; dt < DPAD / 8; ++dt) {
    const int col = dt * 8 + 2 * t;
    if (col < headDim) *(u32*)(dst + col) = Elem<Tag>::pack(acc[4 * dt + 2 * r] * scale, acc[4 * dt + 2 * r + 1] * scale);
  }
}

// The warp's 16 rows (warp q of its warpgroup) of an m64nDPAD accumulator, row g + 8r times
// scale[r], as 16-bit values into the swizzled layout of the note at `rows` (the warpgroup's
// 64-row block of a BM-row tile: column blocks BM · 128 bytes apart), two 8-column groups of both
// row halves per stmatrix.
template <typename Tag, int DPAD, int BM>
__device__ __forceinline__ void stageAccRows(u32 rows, const float (&acc)[DPAD / 2], const float (&scale)[2], int q, int lane) {
  const int m = lane >> 3, row = 16 * q + (lane & 7) + 8 * (m & 1);
#pragma unroll
  for (int dt0 = 0; dt0 < DPAD / 8; dt0 += 2) {
    const int dt = dt0 + (m >> 1);  // this lane's address: matrix m's row
    u32 v[4];                        // matrix k: column group dt0 + k / 2, row half k % 2
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int d = dt0 + (k >> 1), h = k & 1;
      v[k] = Elem<Tag>::pack(acc[4 * d + 2 * h] * scale[h], acc[4 * d + 2 * h + 1] * scale[h]);
    }
    sm90::stMatrix4(rows + (dt >> 3) * (BM * 128) + row * 128 + (((dt & 7) ^ (lane & 7)) << 4), v[0], v[1], v[2], v[3]);
  }
}

// The online softmax of one S tile in place (the mma.sync kernel's, flashForwardMma: mask, raw-score
// maximum, FFMA-folded exp2): s becomes P in fp32, rowMax and rowSum move on, and corr holds what
// the output accumulated so far must be scaled by; returns whether any row of the warp moved its
// maximum (else the scaling can be skipped).
template <int BN>
__device__ __forceinline__ bool softmaxTile(float (&s)[BN / 2], float (&rowMax)[2], float (&rowSum)[2], float (&corr)[2],
                                            bool full, int n0, const int (&bandLo)[2], const int (&bandHi)[2],
                                            const int (&bandSink)[2], float scaleLog2, int t) {
  if (!full) {
    // bandVisible with the bounds taken relative to the thread's first key n0 + 2t, so that each
    // key tests a constant. Where no thread of the warp has its band's start or a sink at or past
    // its first key (a causal diagonal, a window's right edge: most masked tiles) the upper bound
    // alone decides.
    const int first = n0 + 2 * t;
    const int lo[2] = {bandLo[0] - first, bandLo[1] - first}, hi[2] = {bandHi[0] - first, bandHi[1] - first};
    const int sink[2] = {bandSink[0] - first, bandSink[1] - first};
    if (__all_sync(0xffffffffu, max(lo[0], lo[1]) <= 0 && max(sink[0], sink[1]) < 0)) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (nt * 8 + (e & 1) > hi[e >> 1]) s[4 * nt + e] = negInf();
    } else {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!bandVisible(nt * 8 + (e & 1), lo[e >> 1], hi[e >> 1], sink[e >> 1])) s[4 * nt + e] = negInf();
    }
  }
  bool rescale = false;
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tileMax = negInf();
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) tileMax = fmaxf(tileMax, fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
    tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
    tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 2));
    const float newMax = fmaxf(rowMax[r], tileMax * scaleLog2);
    base[r] = softmaxBase(newMax);
    corr[r] = rowMax[r] == negInf() ? 0.f : fastExp2(rowMax[r] - base[r]);
    rescale |= newMax != rowMax[r];
    rowMax[r] = newMax;
    rowSum[r] *= corr[r];
  }
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = fastExp2(fmaf(s[4 * nt + e], scaleLog2, -base[e >> 1]));
      s[4 * nt + e] = pe;
      rowSum[e >> 1] += pe;
    }
  return __any_sync(0xffffffffu, rescale);
}

template <int DPAD>
__device__ __forceinline__ void scaleRows(float (&o)[DPAD / 2], const float (&corr)[2]) {
#pragma unroll
  for (int dt = 0; dt < DPAD / 8; ++dt) {
    o[4 * dt + 0] *= corr[0];
    o[4 * dt + 1] *= corr[0];
    o[4 * dt + 2] *= corr[1];
    o[4 * dt + 3] *= corr[1];
  }
}

// The producer's next (slice, query tile) item in a kernel over query blocks (the forward, dQ):
// PERSISTENT, the work list's next once the consumers released buffer `done % BUFFERS` (`empty`),
// written to `itemOfBuffer` for them (the caller's arrival on the buffer's full barrier publishes
// it); else the block's own item, once. False when none is left (with PERSISTENT the consumers
// were told on `full` and the counter handed back). THREADS: the TMA producer's one thread, or the
// cp.async producer's 128 (`pid` 0-127: thread 0 takes the item, named barrier 5 lets the others
// read it, and the list's end is two arrivals, as `full` expects the copies' and the publishing one).
template <bool PERSISTENT, int BUFFERS, int THREADS>
__device__ __forceinline__ bool nextQueryItem(const FlashKernelParams& p, WorkList& work, int done, u32 empty, u32 full,
                                              int* itemOfBuffer, int pid, int& slice, int& qt) {
  static_assert(THREADS == 1 || THREADS == 128, "the TMA producer's thread or the cp.async producer warpgroup");
  int n = 0;
  if (PERSISTENT) {
    sm90::mbarWait(empty, ((done / BUFFERS) & 1) ^ 1);
    if (THREADS == 1) {
      n = itemOfBuffer[done % BUFFERS] = work.take(p);
    } else {
      if (pid == 0) itemOfBuffer[done % BUFFERS] = work.take(p);
      asm volatile("bar.sync 5, 128;" ::: "memory");  // the producer's threads read the item
      n = itemOfBuffer[done % BUFFERS];
    }
    if (n >= work.count) {  // the list is done: tell the consumers, hand the counter back
      sm90::mbarArrive(full);
      if (THREADS == 128) sm90::mbarArrive(full);
      if (pid == 0) work.finish(p);
      return false;
    }
  } else if (done > 0) {
    return false;
  }
  if (PERSISTENT) work.item(p, n, slice, qt);
  else gridItem(p, true, slice, qt);
  return true;
}

// Named barriers 1..CONSUMERS order the consumer warpgroups' tensor-core work (PINGPONG): warpgroup
// w issues its products after w - 1 has issued its own, so one warpgroup's softmax runs under
// another's products (kept apart from barrier 0, __syncthreads).
__device__ __forceinline__ void namedBarrierSync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void namedBarrierArrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }
// Named barriers 8 + w: consumer warpgroup w's 128 threads, before its O store (TMA). Immediate
// ids, so that a kernel without ping-pong reserves only the barriers it uses.
__device__ __forceinline__ void warpgroupBarrierSync(int wg) {
  if (wg == 0) asm volatile("bar.sync 8, 128;" ::: "memory");
  else if (wg == 1) asm volatile("bar.sync 9, 128;" ::: "memory");
  else asm volatile("bar.sync 10, 128;" ::: "memory");
}

// A consumer's part in the TMA stores of its warpgroup's 64 staged output rows, in boxes of ROWS
// rows (flashForwardStoreRows and its kin in flash_attention_params.h): at 64 thread 0 of the
// warpgroup stores them after the warpgroup's named barrier, at 16 lane 0 of each warp stores the
// warp's rows after __syncwarp; at 0 nothing is stored this way.
template <int ROWS>
struct StoreBoxes {
  static_assert(ROWS == 0 || ROWS == 16 || ROWS == 64, "a warp's or a warpgroup's rows");
  // Threads whose rows one box holds; its storer is the first (threadIdx.x % kThreadsPerBox == 0).
  static constexpr int kThreadsPerBox = ROWS > 0 ? 2 * ROWS : 1;
  // The box's first row within the warpgroup's 64 (q: the warp within its warpgroup).
  static __device__ __forceinline__ int firstRow(int q) { return ROWS == 64 ? 0 : 16 * q; }
  // The box's rows are staged and fenced for the async proxy: its storer may issue.
  static __device__ __forceinline__ void sync(int wg) {
    if (ROWS == 64) warpgroupBarrierSync(wg);
    else __syncwarp();
  }
  // The storer's stores of its box (not committed): from `rows`, the warpgroup's 64-row block of a
  // TILE-row buffer in the swizzled layout (column blocks TILE · 128 bytes apart), to rows row0 +
  // firstRow(q) on of `map` at (head, batch), one store per 64 columns. (The dK/dV kernel
  // interleaves its two outputs' stores column block by column block, written out there.)
  template <int DPAD, int TILE>
  static __device__ __forceinline__ void issue(const FlashTensorMap& map, u32 rows, int row0, int q, int head, int batch) {
    const int r0 = firstRow(q);
#pragma unroll
    for (int c = 0; c < DPAD / 64; ++c) sm90::tmaStore4d(&map, rows + c * (TILE * 128) + r0 * 128, 64 * c, row0 + r0, head, batch);
  }
};

// TMA: the producer's copies are TMA copies from `maps`, issued by one thread (FlashKernelSpec::tma).
template <typename Tag, int DPAD, int BN, int CONSUMERS, int STAGES_, bool PINGPONG = false, bool PERSISTENT = false,
          bool SINK_TILE = false, bool TMA = false>
__device__ __forceinline__ void flashForwardWgmma(const FlashKernelParams& p, const FlashTensorMaps* maps = nullptr) {
  typedef WgmmaForwardConfig<DPAD, BN, CONSUMERS, STAGES_, PERSISTENT> Cfg;
  static_assert(!PINGPONG || CONSUMERS >= 2, "ping-pong needs two consumer warpgroups");
  constexpr int LANES = 128;
  constexpr int BM = Cfg::BM, STAGES = STAGES_, QB = Cfg::kQBuffers;
  constexpr int IN = WgmmaInputOf<Tag>::kValue;
  // O stored by TMA (the note) at head dim 128 with up to two consumer warpgroups; the others keep
  // the register stores (measured 1-2 % slower at 64; at three warpgroups the staging spills).
  constexpr int STORE_ROWS = TMA ? flashForwardStoreRows(DPAD, CONSUMERS) : 0;
  constexpr bool STORE_TMA = STORE_ROWS > 0;
  typedef StoreBoxes<STORE_ROWS> Boxes;
  extern __shared__ unsigned char smemRaw[];
  // kFull, vFull, kEmpty, vEmpty per stage; qFull, qEmpty per Q buffer
  __shared__ __align__(8) sm90::u64 barriers[4 * STAGES + 2 * QB];
  __shared__ int itemOfBuffer[QB];  // PERSISTENT: the work-list item whose Q a buffer holds
  sm90::trapIfSharedBelow(Cfg::kSharedBytes);
  const u32 sQ0 = (smemAddr(smemRaw) + 1023u) & ~1023u;
  const u32 sK = sQ0 + QB * Cfg::kQBytes, sV = sK + STAGES * Cfg::kTileBytes;
  const u32 bar = smemAddr(barriers);
  auto kFull = [&](int s) { return bar + 8 * s; };
  auto vFull = [&](int s) { return bar + 8 * (STAGES + s); };
  auto kEmpty = [&](int s) { return bar + 8 * (2 * STAGES + s); };
  auto vEmpty = [&](int s) { return bar + 8 * (3 * STAGES + s); };
  auto qFull = [&](int s) { return bar + 8 * (4 * STAGES + s); };
  auto qEmpty = [&](int s) { return bar + 8 * (4 * STAGES + QB + s); };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  WorkList work;  // PERSISTENT: (slice, query tile) items, the last tiles (the heaviest when causal) first
  work.init(p, PERSISTENT ? ceilDiv(p.qLen, BM) : 1, PERSISTENT ? p.batch * p.heads : 1, true);

  if (threadIdx.x == 0) {
    // The copies' arrivals: one a producer thread (cp.async), or the one thread's expected bytes (TMA).
    const u32 copiers = TMA ? 1 : LANES;
    sm90::mbarInitRange(kFull(0), 2 * STAGES, copiers);              // kFull, vFull
    sm90::mbarInitRange(kEmpty(0), 2 * STAGES, 128 * CONSUMERS);     // kEmpty, vEmpty
    // PERSISTENT with cp.async: Q's copies, and a plain arrival that publishes the buffer's item
    // (release); with TMA the one arrival does both.
    sm90::mbarInitRange(qFull(0), QB, PERSISTENT && !TMA ? 2 * LANES : copiers);
    sm90::mbarInitRange(qEmpty(0), QB, 128 * CONSUMERS);
  }
  __syncthreads();

  if (warp >= 4 * CONSUMERS && TMA) {  // the producer: one thread's TMA copies
    Cfg::Registers::enterProducer();
    if (threadIdx.x != 128 * CONSUMERS) return;
    int i = 0;  // the K/V ring's position
    for (int done = 0;; ++done) {
      const int qb = done % QB;
      int slice, qt;
      if (!nextQueryItem<PERSISTENT, QB, 1>(p, work, done, qEmpty(qb), qFull(qb), itemOfBuffer, 0, slice, qt)) break;
      QueryBlock blk;
      blk.initAt(p, BM, BN, slice, qt);
      const BlockTiles& tiles = blk.tiles;
      sm90::mbarArriveExpectBytes(qFull(qb), Cfg::kQBytes);  // also publishes itemOfBuffer (release)
      tmaSwizzled<BM, DPAD>(sQ0 + qb * Cfg::kQBytes, maps->q, blk.m0, blk.h, blk.b, qFull(qb));
      for (int j = tiles.next(0); j < tiles.nTiles; j = tiles.next(j + 1), ++i) {
        const int st = i % STAGES;
        const u32 parity = ((i / STAGES) & 1) ^ 1;
        sm90::mbarWait(kEmpty(st), parity);
        sm90::mbarArriveExpectBytes(kFull(st), Cfg::kTileBytes);
        tmaSwizzled<BN, DPAD>(sK + st * Cfg::kTileBytes, maps->k, j * BN, blk.hk, blk.b, kFull(st));
        sm90::mbarWait(vEmpty(st), parity);
        sm90::mbarArriveExpectBytes(vFull(st), Cfg::kTileBytes);
        tmaSwizzled<BN, DPAD>(sV + st * Cfg::kTileBytes, maps->v, j * BN, blk.hk, blk.b, vFull(st));
      }
    }
    return;
  }
  if (warp >= 4 * CONSUMERS) {  // the producer
    Cfg::Registers::enterProducer();
    const int pid = threadIdx.x - 128 * CONSUMERS;
    int i = 0;  // the K/V ring's position
    for (int done = 0;; ++done) {
      const int qb = done % QB;
      int slice, qt;
      if (!nextQueryItem<PERSISTENT, QB, 128>(p, work, done, qEmpty(qb), qFull(qb), itemOfBuffer, pid, slice, qt)) break;
      QueryBlock blk;
      blk.initAt(p, BM, BN, slice, qt);
      const BlockTiles& tiles = blk.tiles;
      loadSwizzled<BM, DPAD, LANES>(sQ0 + qb * Cfg::kQBytes, slicePtr<u16>(p.q, blk.b, blk.h), p.q.seqStride, blk.m0, p.qLen,
                                    p.headDim, pid);
      sm90::cpAsyncArriveOnLanding(qFull(qb));
      if (PERSISTENT) sm90::mbarArrive(qFull(qb));  // publishes itemOfBuffer (release)
      const u16* gK = slicePtr<u16>(p.k, blk.b, blk.hk);
      const u16* gV = slicePtr<u16>(p.v, blk.b, blk.hk);
      for (int j = tiles.next(0); j < tiles.nTiles; j = tiles.next(j + 1), ++i) {
        const int st = i % STAGES;
        const u32 parity = ((i / STAGES) & 1) ^ 1;
        sm90::mbarWait(kEmpty(st), parity);
        loadSwizzled<BN, DPAD, LANES>(sK + st * Cfg::kTileBytes, gK, p.k.seqStride, j * BN, p.kLen, p.headDim, pid);
        sm90::cpAsyncArriveOnLanding(kFull(st));
        sm90::mbarWait(vEmpty(st), parity);
        loadSwizzled<BN, DPAD, LANES>(sV + st * Cfg::kTileBytes, gV, p.v.seqStride, j * BN, p.kLen, p.headDim, pid);
        sm90::cpAsyncArriveOnLanding(vFull(st));
      }
    }
    cpAsyncCommit();
    cpAsyncWait<0>();  // nothing in flight when the producer exits
    return;
  }

  // Consumer warpgroup `wg`: rows m0 + 64·wg .. +63 of an item; warp q of it rows 16q .. 16q + 15.
  Cfg::Registers::enterConsumer();
  const int wg = warp / 4, q = warp % 4, g = lane >> 2, t = lane & 3;
  // Ping-pong: warpgroup wg waits on barrier 1 + wg before issuing S and then lets the next one
  // go; the last warpgroup lets the first go once at the start, and the first takes that extra
  // arrival back at the end, so no barrier is left with arrivals. The turns run on across items.
  const int myTurn = 1 + wg, nextTurn = 1 + (wg + 1) % CONSUMERS;
  if (PINGPONG && wg == CONSUMERS - 1) namedBarrierArrive(nextTurn);
  // TMA: thread 0 of each consumer warpgroup stores its O rows from the Q buffer; its arrival on
  // that buffer's qEmpty waits until the store has read them, under the next item's first product
  // (or at its end, if it has no visible tile).
  const bool storer = STORE_TMA && threadIdx.x % Boxes::kThreadsPerBox == 0;
  auto releaseStoredQ = [&](int done) {
    if (PERSISTENT && storer && done > 0) {
      sm90::bulkWaitRead<0>();
      sm90::mbarArrive(qEmpty((done - 1) % QB));
    }
  };
  int i = 0;  // the K/V ring's position
  for (int done = 0;; ++done) {
    const int qb = done % QB;
    if (!PERSISTENT && done > 0) break;
    sm90::mbarWait(qFull(qb), (done / QB) & 1);
    const int n = PERSISTENT ? itemOfBuffer[qb] : 0;
    if (n >= work.count) break;
    int slice, qt;
    if (PERSISTENT) work.item(p, n, slice, qt);
    else gridItem(p, true, slice, qt);
    QueryBlock blk;
    blk.initAt(p, BM, BN, slice, qt);
    const int bh = blk.bh, b = blk.b, h = blk.h, m0 = blk.m0;
    const TileMask& tm = blk.tm;
    const BlockTiles& tiles = blk.tiles;
    const int nTiles = tiles.nTiles;
    const int rowA = m0 + 64 * wg + 16 * q + g;  // this thread's rows: rowA and rowA + 8
    int bandLo[2], bandHi[2], bandSink[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tm.rowBand(rowA + 8 * r, bandLo[r], bandHi[r], bandSink[r]);
      // Computed here, once an item: left to itself the compiler recomputes them (64-bit) in
      // every masked tile, their only reader.
      asm volatile("" : "+r"(bandLo[r]), "+r"(bandHi[r]), "+r"(bandSink[r]));
    }

    float o[DPAD / 2], s[BN / 2];
#pragma unroll
    for (int k = 0; k < DPAD / 2; ++k) o[k] = 0.f;
#pragma unroll
    for (int k = 0; k < BN / 2; ++k) s[k] = 0.f;
    u32 pv[BN / 16][4];  // P in A-fragment layout, one group of four per k16 step of P·V
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) pv[kk][0] = pv[kk][1] = pv[kk][2] = pv[kk][3] = 0u;
    float rowMax[2] = {negInf(), negInf()}, rowSum[2] = {0.f, 0.f};

    const u32 qRows = sQ0 + qb * Cfg::kQBytes + wg * 64 * 128;
    // Each tile: S = Q·Kᵀ, wait (also for the previous P·V), softmax, then O += P·V left in
    // flight under the next tile's S. A first tile whose only visible keys are sinks below
    // kSinkKeys (tiles.sinkNarrow) runs kSinkKeys-key products: its other keys' P is exactly 0.
    int local = 0;  // tiles of this item so far
    int j = tiles.next(0);
    if (SINK_TILE && j == 0 && tiles.sinkNarrow) {
      const int st = i % STAGES;
      const u32 parity = (i / STAGES) & 1;
      sm90::mbarWait(kFull(st), parity);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      if (PINGPONG) namedBarrierSync(myTurn);
      float sSink[kSinkKeys / 2] = {};
      sm90::wgmmaFence();
      headDimProduct<kSinkKeys, IN, DPAD, BM, BN>(sSink, qRows, sK + st * Cfg::kTileBytes);
      sm90::wgmmaCommit();
      if (PINGPONG) namedBarrierArrive(nextTurn);
      releaseStoredQ(done);  // the last item's O store, under this product
      sm90::wgmmaWait<0>();
      sm90::fenceRegisters(sSink);
      sm90::fenceRegisters(o);
      sm90::mbarArrive(kEmpty(st));
      float corr[2];
      softmaxTile<kSinkKeys>(sSink, rowMax, rowSum, corr, false, 0, bandLo, bandHi, bandSink, p.scaleLog2, t);
      packFragment<Tag>(pv[0], sSink, 0);
      sm90::mbarWait(vFull(st), parity);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      sm90::wgmmaFence();
      tileProduct<DPAD, IN, kSinkKeys>(o, reinterpret_cast<const u32(&)[1][4]>(pv[0]), sV + st * Cfg::kTileBytes, BN * 128);
      sm90::wgmmaCommit();
      j = tiles.next(1), ++i, ++local;
    }
    for (; j < nTiles; j = tiles.next(j + 1), ++i, ++local) {
      const int st = i % STAGES;
      const u32 parity = (i / STAGES) & 1;
      const int n0 = j * BN, n1 = min(n0 + BN, p.kLen);
      sm90::mbarWait(kFull(st), parity);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      const u32 kTile = sK + st * Cfg::kTileBytes;
      if (PINGPONG) namedBarrierSync(myTurn);
      sm90::wgmmaFence();
      headDimProduct<BN, IN, DPAD, BM>(s, qRows, kTile);
      sm90::wgmmaCommit();
      if (PINGPONG) namedBarrierArrive(nextTurn);
      if (local == 0) releaseStoredQ(done);  // the last item's O store, under this product
      sm90::wgmmaWait<0>();  // S is ready, and the previous tile's P·V is complete
      sm90::fenceRegisters(s);
      sm90::fenceRegisters(o);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) sm90::fenceRegisters(pv[kk]);
      sm90::mbarArrive(kEmpty(st));
      if (local > 0) sm90::mbarArrive(vEmpty((i - 1) % STAGES));

      float corr[2];
      const bool full = tiles.full(n0, n1) && n1 - n0 == BN;
      if (softmaxTile<BN>(s, rowMax, rowSum, corr, full, n0, bandLo, bandHi, bandSink, p.scaleLog2, t)) scaleRows<DPAD>(o, corr);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) packFragment<Tag>(pv[kk], s, kk);

      sm90::mbarWait(vFull(st), parity);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      const u32 vTile = sV + st * Cfg::kTileBytes;
      sm90::wgmmaFence();
      tileProduct<DPAD, IN, BN>(o, pv, vTile);
      sm90::wgmmaCommit();
    }
    sm90::wgmmaWait<0>();
    sm90::fenceRegisters(o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) sm90::fenceRegisters(pv[kk]);
    if (PERSISTENT) {  // the item's last V tile is read, and (cp.async) its Q
      if (local > 0) sm90::mbarArrive(vEmpty((i - 1) % STAGES));
      if (!STORE_TMA) sm90::mbarArrive(qEmpty(qb));
    }

    typedef u16 T;
    const bool hasSink = p.sinkLogits != 0;
    const float sink2 = hasSink ? ((const float*)p.sinkLogits)[h] * 1.4426950408889634f : 0.f;
    T* gO = sliceMutPtr<T>(p.o, b, h);
    float* gLse = (float*)p.lse + (long long)bh * p.qLen;
    float outScale[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = rowSum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const RowFinal fin = finishRow(rowMax[r], l, hasSink, sink2);
      const int row = rowA + 8 * r;
      outScale[r] = fin.outScale;
      if (row < p.qLen) {
        if (!STORE_TMA) storeAccRow<Tag, DPAD>(gO + (long long)row * p.o.seqStride, o, r, fin.outScale, t, p.headDim);
        if (t == 0) gLse[row] = fin.lse;
      }
    }
    if (STORE_TMA) {  // O through the warpgroup's rows of the Q buffer, which its products no longer read
      if (local == 0) releaseStoredQ(done);  // an item without visible tiles had no first product
      stageAccRows<Tag, DPAD, BM>(qRows, o, outScale, q, lane);
      sm90::fenceProxyAsync();  // the TMA store reads through the async proxy
      Boxes::sync(wg);
      if (storer) {
        Boxes::template issue<DPAD, BM>(maps->o, qRows, m0 + 64 * wg, q, h, b);
        sm90::bulkCommit();
      } else if (PERSISTENT) {
        sm90::mbarArrive(qEmpty(qb));
      }
    }
  }
  if (storer) sm90::bulkWait<0>();  // the block's last O stores are done
  if (PINGPONG && wg == 0) namedBarrierSync(myTurn);
}

}  // namespace flash
}  // namespace pa
