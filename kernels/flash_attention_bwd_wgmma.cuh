// Flash attention backward on Hopper's wgmma (sm_90a), bf16 and fp16 at padded head dims 64, 128,
// 192 and 256: the dK/dV kernel and the dQ kernel of the default (no-atomics) scheme, with the semantics
// of flashBackwardDkDvMma / flashBackwardDqMma (flash_attention_bwd_mma.cuh); the launcher picks them
// on sm_90a devices.
/*
 * Note on the kernels.
 *
 * Both follow the wgmma forward (flash_attention_fwd_wgmma.cuh): a producer warpgroup that gives
 * its registers to the consumers (setmaxnreg), a STAGES-deep ring of 128-byte-swizzled tiles
 * filled with TMA copies (TMA; else the producer's cp.async) landing on mbarriers, consumer
 * warpgroups of 64 rows that run every product on wgmma and never wait for one another. One swizzled layout (rows of 64 head-dim
 * elements, 128 bytes) serves every operand: read k-major when the head dim is the reduction
 * (S = Q·Kᵀ, dP = dO·Vᵀ) and MN-major when the head dim is the output's column (dV += Pᵀ·dO,
 * dK += dSᵀ·Q, dQ += dS·K).
 *
 * dK/dV: a block owns BN = 64·CONSUMERS keys (K and V copied once) and streams the query tiles of
 * BQ rows of its head(s) that the mask leaves visible. Consumer warpgroup w holds its 64 keys'
 * dK and dV in registers; per query tile it computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ from shared memory,
 * Pᵀ = exp2(Sᵀ·scale·log2 e − lse2) and dSᵀ = Pᵀ ⊙ (dPᵀ − Δ) in registers with the per-query
 * statistics and mask bands the producer wrote beside the tile, then dV += Pᵀ·dO and dK += dSᵀ·Q
 * with Pᵀ and dSᵀ as register operands. The producer's plain stores of those statistics are
 * published by a plain mbarrier arrival (release) on the same "full" barrier that its copies
 * arrive on: 2 × 128 arrivals with cp.async; with TMA 128, thread 0 having added the tile's
 * bytes (mbarrier.expect_tx) before it issued the copies. With TMA, 16-bit dK and dV leave through
 * the consumers' rows of the K/V buffer by TMA stores, as the forward's O does: a warpgroup's 64
 * rows a store at head dim 64, a warp's 16 at 128 (flashDkDvStoreRows, StoreBoxes).
 *
 * dQ: a block owns BM = 64·CONSUMERS query rows (Q and dO copied once) and streams the visible
 * K/V tiles; per tile S = Q·Kᵀ and dP = dO·Vᵀ from shared memory, dS = P ⊙ (dP − Δ) in registers,
 * dQ += dS·K with dS as the register operand (dqTile). SINK_TILE: a first tile whose only visible
 * keys are sinks below kSinkKeys runs as kSinkKeys-key products, as in the forward. With TMA at
 * head dim 128 dQ leaves through the Q buffer by TMA stores, a warp's 16 rows a store
 * (flashDqStoreRows); at 64 by register stores.
 *
 * PERSISTENT (both kernels; the rule where the launcher knows the SM count): one block an SM takes
 * (slice, key block) or (slice, query tile) items from a work list (WorkList, heaviest first), as
 * the forward does, loading the next item's resident tiles (K and V; Q and dO) into a second
 * buffer under the current item; an item is computed exactly as a block of its own would.
 *
 * Each tile's register-operand products are waited for before the stage is released, which
 * keeps the packed P / dS registers short-lived (the register budget is the limit at head dim
 * 128: dK and dV alone take 128 a thread).
 *
 * Head dims 192 and 256 (kRoles; one item a block): a warpgroup's registers hold one
 * 64 × DPAD fp32 accumulator, not dK and dV both, so the dK/dV kernel's two warpgroups share the
 * block's 64 keys: warpgroup 0 computes Sᵀ, Pᵀ and dV += Pᵀ·dO and hands Pᵀ (fp32) to warpgroup
 * 1 through 16 KB of shared memory, which computes dPᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − Δ) and dK += dSᵀ·Q:
 * two products each a tile pair, and each stores its tensor from registers. The dQ kernel streams
 * 32-key tiles at 256, so that Q and dO of 128 rows and three stages fit (64-key tiles in two at
 * 192, the chooser's rule).
 */
#pragma once

#include "kernels/flash_attention_bwd_common.cuh"
#include "kernels/flash_attention_fwd_wgmma.cuh"

namespace pa {
namespace flash {

// The producer's per-query statistics of one query tile (dK/dV kernel).
template <int BQ>
struct WgmmaRowStats {
  float lse2[BQ];
  float delta[BQ];
  int lo[BQ], hi[BQ], sinkHi[BQ];
};

template <int DPAD, int BQ, int CONSUMERS, int STAGES, bool PERSISTENT = false>
struct WgmmaDkDvConfig {
  static_assert(DPAD == 64 || DPAD == 128 || DPAD == 192 || DPAD == 256, "wgmma backward: padded head dim 64, 128, 192 or 256");
  static_assert(BQ == 64 || BQ == 128, "wgmma backward: 64 or 128 queries per tile");
  // Above 128 the two consumer warpgroups share the block's keys: one holds dV, the other dK.
  static constexpr bool kRoles = flashDkDvRoles(DPAD);
  static_assert(!kRoles || (CONSUMERS == 2 && BQ == 64 && !PERSISTENT), "head dims 192 and 256: two warpgroups, 64-query tiles, one item a block");
  static constexpr int BN = flashDkDvKeys(DPAD, CONSUMERS);
  static constexpr int kThreads = 128 * (CONSUMERS + 1);
  typedef sm90::RegisterSplit<CONSUMERS, 24> Registers;
  static constexpr int kKBytes = BN * DPAD * 2;              // K, and again V
  static constexpr int kTileBytes = BQ * DPAD * 2;           // Q, and again dO, per stage
  static constexpr int kStatsBytes = (int)sizeof(WgmmaRowStats<BQ>);
  static constexpr int kStageBytes = 2 * kTileBytes + ((kStatsBytes + 1023) / 1024) * 1024;
  static constexpr int kKvBuffers = PERSISTENT ? 2 : 1;  // K and V of the next item under this one
  static constexpr int kExchangeBytes = flashDkDvExchangeBytes(DPAD, BQ);  // kRoles: Pᵀ from the dV warpgroup to the dK one
  static constexpr int kSharedBytes = kKvBuffers * 2 * kKBytes + STAGES * kStageBytes + kExchangeBytes + 1024;
};

template <int DPAD, int BN, int CONSUMERS, int STAGES, bool PERSISTENT = false>
struct WgmmaDqConfig {
  static_assert(DPAD == 64 || DPAD == 128 || DPAD == 192 || DPAD == 256, "wgmma backward: padded head dim 64, 128, 192 or 256");
  static_assert(BN == 64 || BN == 128 || (DPAD > 128 && BN == 32), "wgmma backward: 64 or 128 keys per tile (or 32 above 128)");
  static constexpr int BM = 64 * CONSUMERS;
  static constexpr int kThreads = 128 * (CONSUMERS + 1);
  typedef sm90::RegisterSplit<CONSUMERS, 24> Registers;
  static constexpr int kQBytes = BM * DPAD * 2;    // Q, and again dO
  static constexpr int kTileBytes = BN * DPAD * 2;  // K, and again V, per stage
  static constexpr int kQBuffers = PERSISTENT ? 2 : 1;  // Q and dO of the next item under this one
  static constexpr int kSharedBytes = kQBuffers * 2 * kQBytes + STAGES * 2 * kTileBytes + 1024;
};

// =============================================================================================
// TMA: K, V, Q and dO arrive by TMA copies from `maps`, issued by one producer thread; the
// producer warpgroup still writes the statistics (FlashKernelSpec::tma).
template <typename Tag, int DPAD, int BQ, int CONSUMERS, int STAGES, bool PERSISTENT = false, bool TMA = false>
__device__ __forceinline__ void flashBackwardDkDvWgmma(const FlashKernelParams& p, const FlashTensorMaps* maps = nullptr) {
  typedef WgmmaDkDvConfig<DPAD, BQ, CONSUMERS, STAGES, PERSISTENT> Cfg;
  typedef WgmmaRowStats<BQ> Stats;
  constexpr int BN = Cfg::BN, IN = WgmmaInputOf<Tag>::kValue, KB = Cfg::kKvBuffers;
  extern __shared__ unsigned char smemRaw[];
  // full, empty per stage; kvFull, kvEmpty per K/V buffer; kRoles: pFull, pEmpty (the Pᵀ exchange)
  __shared__ __align__(8) sm90::u64 barriers[2 * STAGES + 2 * KB + (Cfg::kRoles ? 2 : 0)];
  __shared__ int itemOfBuffer[KB];  // PERSISTENT: the work-list item whose K and V a buffer holds
  sm90::trapIfSharedBelow(Cfg::kSharedBytes);
  const u32 base = (smemAddr(smemRaw) + 1023u) & ~1023u;
  unsigned char* const baseGeneric = smemRaw + (base - smemAddr(smemRaw));
  const u32 sKV0 = base, sStages = base + KB * 2 * Cfg::kKBytes;  // per K/V buffer: K, V
  auto stage = [&](int s) { return sStages + s * Cfg::kStageBytes; };  // Q, dO, stats
  auto stats = [&](int s) {
    return reinterpret_cast<Stats*>(baseGeneric + KB * 2 * Cfg::kKBytes + s * Cfg::kStageBytes + 2 * Cfg::kTileBytes);
  };
  const u32 bar = smemAddr(barriers);
  auto full = [&](int s) { return bar + 8 * s; };
  auto empty = [&](int s) { return bar + 8 * (STAGES + s); };
  auto kvFull = [&](int s) { return bar + 8 * (2 * STAGES + s); };
  auto kvEmpty = [&](int s) { return bar + 8 * (2 * STAGES + KB + s); };
  const u32 pFull = bar + 8 * (2 * STAGES + 2 * KB), pEmpty = pFull + 8;

  const int warp = threadIdx.x >> 5;
  // PERSISTENT: (slice, key block) items, the first key blocks (the heaviest under a top-left
  // causal mask) first, those with sink keys ahead of all.
  WorkList work;
  work.init(p, PERSISTENT ? ceilDiv(p.kLen, BN) : 1,
            PERSISTENT ? p.batch * (p.dKVPartial != 0 ? p.heads : p.kvHeads) : 1, false, p.workLead);

  if (threadIdx.x == 0) {
    // The producer threads' copies (not with TMA: thread 0's expected bytes) and statistics.
    sm90::mbarInitRange(full(0), STAGES, TMA ? 128 : 2 * 128);
    sm90::mbarInitRange(empty(0), STAGES, 128 * CONSUMERS);
    // PERSISTENT with cp.async: K's and V's copies, and a plain arrival that publishes the
    // buffer's item; with TMA thread 0's one arrival does both.
    sm90::mbarInitRange(kvFull(0), KB, TMA ? 1 : PERSISTENT ? 2 * 128 : 128);
    sm90::mbarInitRange(kvEmpty(0), KB, 128 * CONSUMERS);
    if (Cfg::kRoles) {
      sm90::mbarInit(pFull, 128);
      sm90::mbarInit(pEmpty, 128);
    }
  }
  __syncthreads();

  if (warp >= 4 * CONSUMERS) {  // the producer
    Cfg::Registers::enterProducer();
    const int pid = threadIdx.x - 128 * CONSUMERS;
    int i = 0;  // the stages' position
    for (int done = 0;; ++done) {
      const int kvb = done % KB;
      int n = 0;
      if (PERSISTENT) {
        sm90::mbarWait(kvEmpty(kvb), ((done / KB) & 1) ^ 1);
        if (pid == 0) itemOfBuffer[kvb] = work.take(p);
        asm volatile("bar.sync 5, 128;" ::: "memory");  // the producer's threads read the item
        n = itemOfBuffer[kvb];
        if (n >= work.count) {  // the list is done: tell the consumers, hand the counter back
          if (!TMA) {
            sm90::mbarArrive(kvFull(kvb));
            sm90::mbarArrive(kvFull(kvb));
          } else if (pid == 0) {
            sm90::mbarArrive(kvFull(kvb));
          }
          if (pid == 0) work.finish(p);
          break;
        }
      } else if (done > 0) {
        break;
      }
      int slice, kb;
      if (PERSISTENT) work.item(p, n, slice, kb);
      else gridItem(p, false, slice, kb);
      DkDvBlock blk;
      blk.initAt(p, BN, BQ, slice, kb);
      const u32 sK = sKV0 + kvb * 2 * Cfg::kKBytes, sV = sK + Cfg::kKBytes;
      if (!TMA) {
        loadSwizzled<BN, DPAD, 128>(sK, slicePtr<u16>(p.k, blk.b, blk.hk), p.k.seqStride, blk.n0, p.kLen, p.headDim, pid);
        loadSwizzled<BN, DPAD, 128>(sV, slicePtr<u16>(p.v, blk.b, blk.hk), p.v.seqStride, blk.n0, p.kLen, p.headDim, pid);
        sm90::cpAsyncArriveOnLanding(kvFull(kvb));
        if (PERSISTENT) sm90::mbarArrive(kvFull(kvb));  // publishes itemOfBuffer (release)
      } else if (pid == 0) {
        sm90::mbarArriveExpectBytes(kvFull(kvb), 2 * Cfg::kKBytes);  // also publishes itemOfBuffer (release)
        tmaSwizzled<BN, DPAD>(sK, maps->k, blk.n0, blk.hk, blk.b, kvFull(kvb));
        tmaSwizzled<BN, DPAD>(sV, maps->v, blk.n0, blk.hk, blk.b, kvFull(kvb));
      }
      for (int it = blk.next(0); it < blk.nItems; it = blk.next(it + 1), ++i) {
        const int st = i % STAGES;
        sm90::mbarWait(empty(st), ((i / STAGES) & 1) ^ 1);
        const int h = blk.head(it), q0 = blk.q0(it);
        if (!TMA) {
          loadSwizzled<BQ, DPAD, 128>(stage(st), slicePtr<u16>(p.q, blk.b, h), p.q.seqStride, q0, p.qLen, p.headDim, pid);
          loadSwizzled<BQ, DPAD, 128>(stage(st) + Cfg::kTileBytes, slicePtr<u16>(p.dO, blk.b, h), p.dO.seqStride, q0, p.qLen,
                                      p.headDim, pid);
          sm90::cpAsyncArriveOnLanding(full(st));
        } else if (pid == 0) {
          sm90::mbarExpectBytes(full(st), 2 * Cfg::kTileBytes);  // thread 0 arrives with the statistics below
          tmaSwizzled<BQ, DPAD>(stage(st), maps->q, q0, h, blk.b, full(st));
          tmaSwizzled<BQ, DPAD>(stage(st) + Cfg::kTileBytes, maps->dO, q0, h, blk.b, full(st));
        }
        const long long rowBase = ((long long)blk.b * p.heads + h) * p.qLen;
        Stats* sts = stats(st);
        for (int r = pid; r < BQ; r += 128) {
          const int q = q0 + r;
          sts->lse2[r] = q < p.qLen ? backwardLse2(((const float*)p.lse)[rowBase + q]) : posInf();
          sts->delta[r] = q < p.qLen ? ((const float*)p.delta)[rowBase + q] : 0.f;
          blk.tm.rowBand(q, sts->lo[r], sts->hi[r], sts->sinkHi[r]);
        }
        sm90::mbarArrive(full(st));  // publishes the statistics (release)
      }
    }
    cpAsyncCommit();
    cpAsyncWait<0>();
    return;
  }

  Cfg::Registers::enterConsumer();
  const int wg = warp / 4, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool isDk = Cfg::kRoles && wg == 1;  // kRoles: warpgroup 1 holds the keys' dK, 0 their dV
  // kRoles: the dV warpgroup computes Sᵀ and Pᵀ and hands Pᵀ (fp32, in its accumulator layout,
  // which the dK warpgroup's thread of the same rank shares) over in shared memory: every thread
  // arrives on pFull once it has written its part, on pEmpty once it has read it (mbarriers, not
  // named barriers: racecheck orders accesses by an mbarrier's arrivals, not by bar.arrive).
  float4* const exchange = reinterpret_cast<float4*>(baseGeneric + KB * 2 * Cfg::kKBytes + STAGES * Cfg::kStageBytes);
  const int rank = threadIdx.x % 128;
  int handoffs = 0;  // Pᵀ handed over (dV warpgroup) or taken (dK warpgroup): the barriers' phase
  // TMA, 16-bit dK and dV (not the fp32 partials of split GQA): the consumers stage their keys'
  // dK and dV in the K/V buffer and store them in boxes of flashDkDvStoreRows rows (StoreBoxes: a
  // warpgroup's at head dim 64, a warp's at 128); a storing thread's arrival on the buffer's
  // kvEmpty waits until its stores have read it, under the next item's first products (or at its
  // end, if it has no visible tile).
  constexpr int STORE_ROWS = TMA ? flashDkDvStoreRows(DPAD) : 0;
  typedef StoreBoxes<STORE_ROWS> Boxes;
  const bool storeByTma = STORE_ROWS > 0 && p.dKVPartial == 0, storer = storeByTma && threadIdx.x % Boxes::kThreadsPerBox == 0;
  auto releaseStored = [&](int done) {
    if (PERSISTENT && storer && done > 0) {
      sm90::bulkWaitRead<0>();
      sm90::mbarArrive(kvEmpty((done - 1) % KB));
    }
  };
  int i = 0;  // the stages' position
  for (int done = 0;; ++done) {
    const int kvb = done % KB;
    if (!PERSISTENT && done > 0) break;
    sm90::mbarWait(kvFull(kvb), (done / KB) & 1);
    const int n = PERSISTENT ? itemOfBuffer[kvb] : 0;
    if (n >= work.count) break;
    int slice, kb;
    if (PERSISTENT) work.item(p, n, slice, kb);
    else gridItem(p, false, slice, kb);
    DkDvBlock blk;
    blk.initAt(p, BN, BQ, slice, kb);
    const int n0 = blk.n0, n1 = blk.n1;
    const TileMask& tm = blk.tm;
    // kRoles (head dims 192 and 256): the warpgroups share the block's keys; dV holds the dK warpgroup's dK.
    const int keyRow = Cfg::kRoles ? 0 : 64 * wg;        // the warpgroup's first key in the block
    const int keyA = n0 + keyRow + 16 * (warp % 4) + g;  // this thread's keys: keyA, keyA + 8
    float dK[Cfg::kRoles ? 1 : DPAD / 2], dV[DPAD / 2], sT[BQ / 2], dpT[BQ / 2];
#pragma unroll
    for (int k = 0; k < DPAD / 2; ++k) {
      if constexpr (Cfg::kRoles)
        dV[k] = 0.f;
      else
        dK[k] = dV[k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < BQ / 2; ++k) sT[k] = dpT[k] = 0.f;

    const u32 kRows = sKV0 + kvb * 2 * Cfg::kKBytes + keyRow * 128, vRows = kRows + Cfg::kKBytes;
    const int firstIt = blk.next(0);
    for (int it = firstIt; it < blk.nItems; it = blk.next(it + 1), ++i) {
      const int st = i % STAGES;
      sm90::mbarWait(full(st), (i / STAGES) & 1);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      const u32 qTile = stage(st), oTile = qTile + Cfg::kTileBytes;
      const Stats* sts = stats(st);
      const int q0 = blk.q0(it), q1 = min(q0 + BQ, p.qLen);
      sm90::wgmmaFence();
      if constexpr (Cfg::kRoles) {
        // One product a warpgroup into sT, Sᵀ in the dV warpgroup and dPᵀ in the dK one: the same
        // instructions on other tiles, as ptxas serialises wgmma in a path that diverges.
        headDimProduct<BQ, IN, DPAD, BN>(sT, isDk ? vRows : kRows, isDk ? oTile : qTile);
      } else {
        headDimProduct<BQ, IN, DPAD, BN>(sT, kRows, qTile);
        headDimProduct<BQ, IN, DPAD, BN>(dpT, vRows, oTile);
      }
      sm90::wgmmaCommit();
      if (it == firstIt) releaseStored(done);  // the last item's stores, under these products
      sm90::wgmmaWait<0>();
      sm90::fenceRegisters(sT);
      if constexpr (!Cfg::kRoles) sm90::fenceRegisters(dpT);
      if constexpr (!Cfg::kRoles) sm90::fenceRegisters(dK);
      sm90::fenceRegisters(dV);

      // Pᵀ and dSᵀ: element e of n-tile nt is key keyA + 8·(e >> 1), query q0 + 8·nt + 2t + (e & 1).
      // The mask is a pass of its own that full tiles skip; the queries' statistics are read two
      // at a time (the thread's two adjacent queries).
      if (Cfg::kRoles && isDk) {  // sT holds dPᵀ; Pᵀ from the dV warpgroup into dpT
        sm90::mbarWait(pFull, handoffs++ & 1);
#pragma unroll
        for (int v = 0; v < BQ / 8; ++v) {
          const float4 x = exchange[v * 128 + rank];
          dpT[4 * v] = x.x, dpT[4 * v + 1] = x.y, dpT[4 * v + 2] = x.z, dpT[4 * v + 3] = x.w;
        }
        sm90::mbarArrive(pEmpty);
#pragma unroll
        for (int nt = 0; nt < BQ / 8; ++nt) {
          const float2 delta = *reinterpret_cast<const float2*>(&sts->delta[nt * 8 + 2 * t]);
#pragma unroll
          for (int e = 0; e < 4; ++e) sT[4 * nt + e] = dpT[4 * nt + e] * (sT[4 * nt + e] - ((e & 1) ? delta.y : delta.x));
        }
      } else {
        if (!(tm.allVisible(q0, q1, n0, n1) && q1 - q0 == BQ)) {
#pragma unroll
          for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int ql = nt * 8 + 2 * t + (e & 1);
              if (!bandVisible(keyA + 8 * (e >> 1), sts->lo[ql], sts->hi[ql], sts->sinkHi[ql])) sT[4 * nt + e] = negInf();
            }
        }
#pragma unroll
        for (int nt = 0; nt < BQ / 8; ++nt) {
          const float2 lse2 = *reinterpret_cast<const float2*>(&sts->lse2[nt * 8 + 2 * t]);
          const float2 delta = *reinterpret_cast<const float2*>(&sts->delta[nt * 8 + 2 * t]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float pe = fastExp2(fmaf(sT[4 * nt + e], p.scaleLog2, -((e & 1) ? lse2.y : lse2.x)));
            sT[4 * nt + e] = pe;
            if constexpr (!Cfg::kRoles) dpT[4 * nt + e] = pe * (dpT[4 * nt + e] - ((e & 1) ? delta.y : delta.x));
          }
        }
        if constexpr (Cfg::kRoles) {  // hand Pᵀ over once the last one has been read
          if (handoffs > 0) sm90::mbarWait(pEmpty, (handoffs - 1) & 1);
#pragma unroll
          for (int v = 0; v < BQ / 8; ++v) exchange[v * 128 + rank] = make_float4(sT[4 * v], sT[4 * v + 1], sT[4 * v + 2], sT[4 * v + 3]);
          sm90::mbarArrive(pFull);
          ++handoffs;
        }
      }
      if constexpr (Cfg::kRoles) {  // dK += dSᵀ·Q or dV += Pᵀ·dO
        u32 a[BQ / 16][4];
#pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) packFragment<Tag>(a[kk], sT, kk);
        sm90::wgmmaFence();
        tileProduct<DPAD, IN, BQ>(dV, a, isDk ? qTile : oTile);
        sm90::wgmmaCommit();
        sm90::wgmmaWait<0>();
        sm90::fenceRegisters(dV);
#pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) sm90::fenceRegisters(a[kk]);
      } else {
        u32 aP[BQ / 16][4], aS[BQ / 16][4];
#pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) {
          packFragment<Tag>(aP[kk], sT, kk);
          packFragment<Tag>(aS[kk], dpT, kk);
        }
        sm90::wgmmaFence();
        tileProduct<DPAD, IN, BQ>(dV, aP, oTile);
        tileProduct<DPAD, IN, BQ>(dK, aS, qTile);
        sm90::wgmmaCommit();
        sm90::wgmmaWait<0>();
        sm90::fenceRegisters(dK);
        sm90::fenceRegisters(dV);
#pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) {
          sm90::fenceRegisters(aP[kk]);
          sm90::fenceRegisters(aS[kk]);
        }
      }
      sm90::mbarArrive(empty(st));
    }
    // Every product reading the item's K and V is complete.
    if constexpr (Cfg::kRoles) {  // register stores of the warpgroup's dK or dV
      blk.storeKeysOf<Tag, DPAD / 8>(p, isDk, keyA, t, [&](int dt, int r) {
        return make_float2(dV[4 * dt + 2 * r], dV[4 * dt + 2 * r + 1]);
      });
    } else if (storeByTma) {  // dK and dV through the consumers' rows of the K/V buffer
      if (firstIt >= blk.nItems) releaseStored(done);  // an item without visible tiles had no products
      const float scaleK[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
      stageAccRows<Tag, DPAD, BN>(kRows, dK, scaleK, warp % 4, lane);
      stageAccRows<Tag, DPAD, BN>(vRows, dV, one, warp % 4, lane);
      sm90::fenceProxyAsync();  // the TMA stores read through the async proxy
      Boxes::sync(wg);
      if (storer) {
        const int r0 = Boxes::firstRow(warp % 4);
#pragma unroll
        for (int c = 0; c < DPAD / 64; ++c) {
          sm90::tmaStore4d(&maps->dK, kRows + c * (BN * 128) + r0 * 128, 64 * c, n0 + 64 * wg + r0, blk.hk, blk.b);
          sm90::tmaStore4d(&maps->dV, vRows + c * (BN * 128) + r0 * 128, 64 * c, n0 + 64 * wg + r0, blk.hk, blk.b);
        }
        sm90::bulkCommit();
      } else if (PERSISTENT) {
        sm90::mbarArrive(kvEmpty(kvb));
      }
    } else {
      if (PERSISTENT) sm90::mbarArrive(kvEmpty(kvb));
      blk.storeKeys<Tag, DPAD / 8>(p, keyA, t, [&](int dt, int r) {
        return make_float4(dK[4 * dt + 2 * r], dK[4 * dt + 2 * r + 1], dV[4 * dt + 2 * r], dV[4 * dt + 2 * r + 1]);
      });
    }
  }
  if (storer) sm90::bulkWait<0>();  // the block's last stores are done
}

// One K/V tile of the dQ kernel (K at kTile, V after it, BN rows each), its first N keys: S =
// Q·Kᵀ and dP = dO·Vᵀ from shared memory, dS = P ⊙ (dP − Δ) in registers (the mask unless
// `full`), dQ += dS·K with dS as the register operand; every product complete on return.
template <typename Tag, int DPAD, int BM, int BN, int N>
__device__ __forceinline__ void dqTile(const FlashKernelParams& p, float (&dQ)[DPAD / 2], float (&sT)[N / 2],
                                       float (&dpT)[N / 2], u32 qRows, u32 oRows, u32 kTile, int n0, bool full,
                                       const int (&bandLo)[2], const int (&bandHi)[2], const int (&bandSink)[2],
                                       const float (&lse2)[2], const float (&dl)[2], int t) {
  constexpr int IN = WgmmaInputOf<Tag>::kValue;
  const u32 vTile = kTile + BN * DPAD * 2;
  sm90::wgmmaFence();
  headDimProduct<N, IN, DPAD, BM, BN>(sT, qRows, kTile);
  headDimProduct<N, IN, DPAD, BM, BN>(dpT, oRows, vTile);
  sm90::wgmmaCommit();
  sm90::wgmmaWait<0>();
  sm90::fenceRegisters(sT);
  sm90::fenceRegisters(dpT);
  sm90::fenceRegisters(dQ);

  // The mask is a pass of its own that full tiles skip.
  if (!full) {
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        if (!bandVisible(n0 + nt * 8 + 2 * t + (e & 1), bandLo[r], bandHi[r], bandSink[r])) sT[4 * nt + e] = negInf();
      }
  }
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float pe = fastExp2(fmaf(sT[4 * nt + e], p.scaleLog2, -lse2[r]));
      dpT[4 * nt + e] = pe * (dpT[4 * nt + e] - dl[r]);
    }
  u32 aS[N / 16][4];
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) packFragment<Tag>(aS[kk], dpT, kk);
  sm90::wgmmaFence();
  tileProduct<DPAD, IN, N>(dQ, aS, kTile, BN * 128);
  sm90::wgmmaCommit();
  sm90::wgmmaWait<0>();
  sm90::fenceRegisters(dQ);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) sm90::fenceRegisters(aS[kk]);
}

// =============================================================================================
// TMA: Q, dO, K and V arrive by TMA copies from `maps`, issued by one producer thread
// (FlashKernelSpec::tma).
template <typename Tag, int DPAD, int BN, int CONSUMERS, int STAGES, bool PERSISTENT = false, bool SINK_TILE = false,
          bool TMA = false>
__device__ __forceinline__ void flashBackwardDqWgmma(const FlashKernelParams& p, const FlashTensorMaps* maps = nullptr) {
  typedef WgmmaDqConfig<DPAD, BN, CONSUMERS, STAGES, PERSISTENT> Cfg;
  constexpr int BM = Cfg::BM, QB = Cfg::kQBuffers;
  extern __shared__ unsigned char smemRaw[];
  __shared__ __align__(8) sm90::u64 barriers[2 * STAGES + 2 * QB];  // full, empty per stage; qFull, qEmpty per buffer
  __shared__ int itemOfBuffer[QB];  // PERSISTENT: the work-list item whose Q and dO a buffer holds
  sm90::trapIfSharedBelow(Cfg::kSharedBytes);
  const u32 sQ0 = (smemAddr(smemRaw) + 1023u) & ~1023u;  // per buffer: Q, dO
  const u32 sStages = sQ0 + QB * 2 * Cfg::kQBytes;
  auto stage = [&](int s) { return sStages + s * 2 * Cfg::kTileBytes; };  // K, V
  const u32 bar = smemAddr(barriers);
  auto full = [&](int s) { return bar + 8 * s; };
  auto empty = [&](int s) { return bar + 8 * (STAGES + s); };
  auto qFull = [&](int s) { return bar + 8 * (2 * STAGES + s); };
  auto qEmpty = [&](int s) { return bar + 8 * (2 * STAGES + QB + s); };

  const int warp = threadIdx.x >> 5;
  WorkList work;  // PERSISTENT: (slice, query tile) items, the last tiles (the heaviest when causal) first
  work.init(p, PERSISTENT ? ceilDiv(p.qLen, BM) : 1, PERSISTENT ? p.batch * p.heads : 1, true);

  if (threadIdx.x == 0) {
    const u32 copiers = TMA ? 1 : 128;  // one arrival a producer thread, or the one thread's expected bytes
    sm90::mbarInitRange(full(0), STAGES, copiers);
    sm90::mbarInitRange(empty(0), STAGES, 128 * CONSUMERS);
    // PERSISTENT with cp.async: Q's and dO's copies, and a plain arrival that publishes the
    // buffer's item; with TMA the one arrival does both.
    sm90::mbarInitRange(qFull(0), QB, PERSISTENT && !TMA ? 2 * 128 : copiers);
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
      const u32 sQ = sQ0 + qb * 2 * Cfg::kQBytes;
      sm90::mbarArriveExpectBytes(qFull(qb), 2 * Cfg::kQBytes);  // also publishes itemOfBuffer (release)
      tmaSwizzled<BM, DPAD>(sQ, maps->q, blk.m0, blk.h, blk.b, qFull(qb));
      tmaSwizzled<BM, DPAD>(sQ + Cfg::kQBytes, maps->dO, blk.m0, blk.h, blk.b, qFull(qb));
      for (int j = tiles.next(0); j < tiles.nTiles; j = tiles.next(j + 1), ++i) {
        const int st = i % STAGES;
        sm90::mbarWait(empty(st), ((i / STAGES) & 1) ^ 1);
        sm90::mbarArriveExpectBytes(full(st), 2 * Cfg::kTileBytes);
        tmaSwizzled<BN, DPAD>(stage(st), maps->k, j * BN, blk.hk, blk.b, full(st));
        tmaSwizzled<BN, DPAD>(stage(st) + Cfg::kTileBytes, maps->v, j * BN, blk.hk, blk.b, full(st));
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
      const u32 sQ = sQ0 + qb * 2 * Cfg::kQBytes;
      loadSwizzled<BM, DPAD, 128>(sQ, slicePtr<u16>(p.q, blk.b, blk.h), p.q.seqStride, blk.m0, p.qLen, p.headDim, pid);
      loadSwizzled<BM, DPAD, 128>(sQ + Cfg::kQBytes, slicePtr<u16>(p.dO, blk.b, blk.h), p.dO.seqStride, blk.m0, p.qLen,
                                  p.headDim, pid);
      sm90::cpAsyncArriveOnLanding(qFull(qb));
      if (PERSISTENT) sm90::mbarArrive(qFull(qb));  // publishes itemOfBuffer (release)
      const u16* gK = slicePtr<u16>(p.k, blk.b, blk.hk);
      const u16* gV = slicePtr<u16>(p.v, blk.b, blk.hk);
      for (int j = tiles.next(0); j < tiles.nTiles; j = tiles.next(j + 1), ++i) {
        const int st = i % STAGES;
        sm90::mbarWait(empty(st), ((i / STAGES) & 1) ^ 1);
        loadSwizzled<BN, DPAD, 128>(stage(st), gK, p.k.seqStride, j * BN, p.kLen, p.headDim, pid);
        loadSwizzled<BN, DPAD, 128>(stage(st) + Cfg::kTileBytes, gV, p.v.seqStride, j * BN, p.kLen, p.headDim, pid);
        sm90::cpAsyncArriveOnLanding(full(st));
      }
    }
    cpAsyncCommit();
    cpAsyncWait<0>();
    return;
  }

  Cfg::Registers::enterConsumer();
  const int wg = warp / 4, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // TMA: the consumers stage dQ, scaled and rounded, in their rows of the Q buffer (its products
  // no longer read them) and store it in boxes of flashDqStoreRows rows (StoreBoxes); a storing
  // thread's arrival on the buffer's qEmpty waits until its store has read it, under the next
  // item's first product (or at its end, if it has no visible tile).
  constexpr int STORE_ROWS = TMA ? flashDqStoreRows(DPAD) : 0;
  typedef StoreBoxes<STORE_ROWS> Boxes;
  const bool storer = STORE_ROWS > 0 && threadIdx.x % Boxes::kThreadsPerBox == 0;
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
    const int rowA = m0 + 64 * wg + 16 * (warp % 4) + g;  // this thread's rows: rowA, rowA + 8
    const float* lse = (const float*)p.lse + (long long)bh * p.qLen;
    const float* delta = (const float*)p.delta + (long long)bh * p.qLen;
    float lse2[2], dl[2];
    int bandLo[2], bandHi[2], bandSink[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = rowA + 8 * r;
      lse2[r] = q < p.qLen ? backwardLse2(lse[q]) : posInf();
      dl[r] = q < p.qLen ? delta[q] : 0.f;
      tm.rowBand(q, bandLo[r], bandHi[r], bandSink[r]);
    }
    float dQ[DPAD / 2], s[BN / 2], dp[BN / 2];
#pragma unroll
    for (int k = 0; k < DPAD / 2; ++k) dQ[k] = 0.f;
#pragma unroll
    for (int k = 0; k < BN / 2; ++k) s[k] = dp[k] = 0.f;

    const u32 qRows = sQ0 + qb * 2 * Cfg::kQBytes + wg * 64 * 128, oRows = qRows + Cfg::kQBytes;
    // Each K/V tile: wait, dqTile, release. A first tile whose only visible keys are sinks below
    // kSinkKeys (tiles.sinkNarrow) runs kSinkKeys-key products: the other keys' dS is exactly 0.
    int j = tiles.next(0);
    bool released = false;  // the previous item's stored rows (STORE_ROWS)
    if (SINK_TILE && j == 0 && tiles.sinkNarrow) {
      const int st = i % STAGES;
      sm90::mbarWait(full(st), (i / STAGES) & 1);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      float sSink[kSinkKeys / 2] = {}, dpSink[kSinkKeys / 2] = {};
      dqTile<Tag, DPAD, BM, BN, kSinkKeys>(p, dQ, sSink, dpSink, qRows, oRows, stage(st), 0, false, bandLo, bandHi, bandSink,
                                           lse2, dl, t);
      sm90::mbarArrive(empty(st));
      releaseStoredQ(done);  // the last item's dQ store, under this product
      released = true;
      ++i;
      j = tiles.next(1);
    }
    for (; j < nTiles; j = tiles.next(j + 1), ++i) {
      const int st = i % STAGES;
      sm90::mbarWait(full(st), (i / STAGES) & 1);
      if (!TMA) sm90::fenceProxyAsync();  // cp.async wrote through the generic proxy
      const int n0 = j * BN, n1 = min(n0 + BN, p.kLen);
      dqTile<Tag, DPAD, BM, BN, BN>(p, dQ, s, dp, qRows, oRows, stage(st), n0, tiles.full(n0, n1) && n1 - n0 == BN, bandLo,
                                    bandHi, bandSink, lse2, dl, t);
      sm90::mbarArrive(empty(st));
      if (!released) releaseStoredQ(done);  // the last item's dQ store, under this product
      released = true;
    }
    if (STORE_ROWS > 0) {  // dQ through the warp's or warpgroup's rows of the Q buffer
      if (!released) releaseStoredQ(done);  // an item without visible tiles had no products
      const float scale[2] = {p.scale, p.scale};
      stageAccRows<Tag, DPAD, BM>(qRows, dQ, scale, warp % 4, lane);
      sm90::fenceProxyAsync();  // the TMA store reads through the async proxy
      Boxes::sync(wg);
      if (storer) {
        Boxes::template issue<DPAD, BM>(maps->dQ, qRows, m0 + 64 * wg, warp % 4, h, b);
        sm90::bulkCommit();
      } else if (PERSISTENT) {
        sm90::mbarArrive(qEmpty(qb));
      }
      continue;
    }
    if (PERSISTENT) sm90::mbarArrive(qEmpty(qb));  // every product of the item is complete

    u16* gdQ = sliceMutPtr<u16>(p.dQ, b, h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = rowA + 8 * r;
      if (q < p.qLen) storeAccRow<Tag, DPAD>(gdQ + (long long)q * p.dQ.seqStride, dQ, r, p.scale, t, p.headDim);
    }
  }
  if (storer) sm90::bulkWait<0>();  // the block's last dQ stores are done
}

}  // namespace flash
}  // namespace pa
