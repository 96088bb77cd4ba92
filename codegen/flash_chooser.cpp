// Which FlashAttention instantiation runs a problem: one chooser per kernel path, a dispatcher,
// and the checks of a problem against what the kernels support.
#include <algorithm>
#include <cmath>

#include "codegen/flash_spec.h"
#include "common/flash_attention_limits.h"

namespace pa {

namespace {

int padHeadDim(int d) {
  for (int p : {32, 64, 96, 128, 256})
    if (d <= p) return p;
  return 0;
}
int ceilDiv(long long a, long long b) { return (int)((a + b - 1) / b); }

bool isProductKind(FlashKernelKind kind) {
  return kind == FlashKernelKind::kForward || kind == FlashKernelKind::kBwdDkDv || kind == FlashKernelKind::kBwdDq;
}

// Whether an fp32 product kernel runs on the FP64 tensor cores (FlashFp64Mma). kAuto, where DMMA
// runs at full rate and at head dims <= 64 (its limit): the forward on grids of at least
// kFp64MmaForwardMinBlocks 64-row blocks; the backward (dK/dV and dQ alike) up to
// kFp64MmaBackwardMaxKeys keys on grids of at least kFp64MmaBackwardMinBlocks 32-key blocks, where
// it measured faster than FFMA and its dQ is the deterministic per-key-block shares
// (bench/RESULTS_flash.md, "The fp32 backward on FFMA against the FP64 tensor cores").
bool usesFp64Mma(FlashKernelKind kind, const FlashAttentionConfig& c, const FlashTarget& target) {
  if (c.tf32) return false;  // TF32 wins (with kOn, validate refuses the problem)
  switch (c.fp64Mma) {
    case FlashFp64Mma::kOn: return true;
    case FlashFp64Mma::kOff: return false;
    case FlashFp64Mma::kAuto:
      if (!target.fullRateFp64 || c.headDim > 64) return false;
      if (kind == FlashKernelKind::kForward) return (long long)c.batch * c.heads * ceilDiv(c.qLen, 64) >= kFp64MmaForwardMinBlocks;
      return c.kLen <= kFp64MmaBackwardMaxKeys && (long long)c.batch * c.kvHeads * ceilDiv(c.kLen, 32) >= kFp64MmaBackwardMinBlocks;
  }
  return false;
}

// The head dim the sm_90a wgmma kernels run a 16-bit problem at (the columns past the problem's
// are zeros), or 0 where the mma.sync kernels run it: head dims 33-64 pad to 64, 65-128 to 128,
// 129-192 to 192 and 193-256 to 256. At 96 the wgmma kernels at 128 run 1.3-1.5x faster than
// mma.sync at 96; at 16 and 32 the wgmma kernels at 64 are up to 1.4x slower than mma.sync at 32
// (bench/RESULTS_flash.md, "Head dims 16, 32 and 96 on wgmma"). 192 is three of the kernels'
// 64-column blocks: a quarter of 256's products.
int wgmmaHeadDim(int headDim) {
  return headDim <= 32 ? 0 : headDim <= 64 ? 64 : headDim <= 128 ? 128 : headDim <= 192 ? 192 : headDim <= 256 ? 256 : 0;
}

// The sm_90a wgmma kernels: 16-bit types at head dims 33-256 (wgmmaHeadDim); the backward only in
// the default scheme (atomic dQ stays on mma.sync).
bool usesWgmma(FlashKernelKind kind, const FlashAttentionConfig& c, const FlashTarget& target, const FlashTuning& tuning) {
  return c.dtype != kFlashF32 && target.wgmma && tuning.wgmma && wgmmaHeadDim(c.headDim) > 0 &&
         (kind == FlashKernelKind::kForward || !c.atomicDq);
}

FlashKernelSpec baseSpec(FlashKernelKind kind, const FlashAttentionConfig& cfg) {
  FlashKernelSpec s;
  s.kind = kind;
  s.dtype = cfg.dtype;
  s.dpad = padHeadDim(cfg.headDim);
  s.warps = 4;
  s.tile = 64;
  s.mtiles = 1;
  return s;
}

// R rows (fp32 forward: query rows; backward: keys of dK/dV, query rows of dQ) per thread of the
// FFMA kernels. Large R loads shared memory less per FFMA; small R makes more blocks, which short
// sequences need to fill the GPU (their blocks are latency bound), but every block streams all of
// the other operand, so R = 1 pays only for lengths <= 128. The rule (from the R sweeps in
// bench/RESULTS_flash.md): the largest R of `choices` whose grid has >= 1.9 blocks per
// multiprocessor, else R = 2 (1 up to 128 rows); `unknown` where the SM count is.
int ffmaRows(long long slices, int len, int multiprocessors, std::initializer_list<int> choices, int unknown) {
  if (multiprocessors <= 0) return unknown;
  for (int r : choices)
    if (10 * slices * ceilDiv(len, 16 * r) >= 19LL * multiprocessors) return r;
  return len <= 128 ? 1 : 2;
}

// The choosers below see the product kernels only (kForward, kBwdDkDv, kBwdDq; isProductKind).

// Blocks per key block of the fp32 FFMA dK/dV kernel (FlashKernelSpec::querySplit; R = 4 where
// above 1): of 1, 2 and 4 parts, the fewest with the least estimated time, where each block's
// query tiles (items) are its steps, two blocks share a multiprocessor at padded head dims <= 64,
// a step of a block alone on one takes 0.64 of a shared one's, and the grid runs in waves of two
// blocks an SM. Under a causal mask or a window the key blocks' work differs, and a grid of fewer
// than 1.5 waves ends more evenly in twice the parts (up to 4). From the (R, parts) sweeps on the
// H200 at 512-4096 keys (bench/RESULTS_flash.md, "The fp32 dK/dV kernel's query tiles split among
// blocks"); below 512 keys, at wider heads (one block an SM) and without the SM count: 1.
int ffmaQuerySplit(const FlashAttentionConfig& cfg, int dpad, int multiprocessors) {
  if (multiprocessors <= 0 || dpad > 64 || cfg.kLen < 512) return 1;
  const long long blocks = (long long)cfg.batch * cfg.kvHeads * ceilDiv(cfg.kLen, 64);
  const long long items = (long long)(cfg.heads / cfg.kvHeads) * ceilDiv(cfg.qLen, 64);
  const long long slots = 2LL * multiprocessors;
  const bool unequal = cfg.mask.causal || cfg.mask.windowLeft >= 0 || cfg.mask.windowRight >= 0;
  int best = 1;
  double bestCost = 0.0;
  for (int parts : {1, 2, 4}) {
    if (items < parts) break;
    const long long n = blocks * parts, steps = ceilDiv(items, (long long)parts);
    const double cost = n <= multiprocessors ? 0.64 * steps : (double)ceilDiv(n, slots) * steps;
    if (parts == 1 || cost < bestCost) best = parts, bestCost = cost;
  }
  if (unequal && best < 4 && 2 * blocks * best < 3 * slots) best *= 2;
  return best;
}

// fp32 on the exact FFMA kernels: 128 threads, R rows per thread (ffmaRows). The dK/dV kernel's
// part in dQ (Fp32DqMode in flash_attention_bwd_ffma.cuh): up to kMaxDqPartialBlocks key blocks
// their per-block shares, summed in order; beyond, atomics unless the backward must be
// deterministic, then the separate dQ kernel (two recomputed products). `atomicDq` asks for
// atomics always.
FlashKernelSpec chooseFfma(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target,
                           const FlashTuning& tuning) {
  FlashKernelSpec s = baseSpec(kind, cfg);
  const int mp = target.multiprocessors;
  if (kind == FlashKernelKind::kForward) {
    // Two blocks of R = 8 fit an SM at head dim <= 64 only.
    s.mtiles = s.dpad <= 64 ? ffmaRows((long long)cfg.batch * cfg.heads, cfg.qLen, mp, {8, 4, 2}, 4)
                            : ffmaRows((long long)cfg.batch * cfg.heads, cfg.qLen, mp, {4, 2}, 4);
    if (tuning.f32FwdRows) s.mtiles = tuning.f32FwdRows;
    return s;
  }
  const bool dkdv = kind == FlashKernelKind::kBwdDkDv;
  const long long slices = (long long)cfg.batch * (dkdv ? cfg.kvHeads : cfg.heads);
  // Above padded head dim 64 one dK/dV block fills an SM's shared memory at R = 2 and 4 alike, so
  // R = 4 from about one block an SM (b1 h8 S1024 d128 on the H200: 424 against R = 2's 525 µs).
  if (dkdv && s.dpad > 64 && mp > 0)
    s.mtiles = 100 * slices * ceilDiv(cfg.kLen, 64) >= 95LL * mp ? 4 : 2;
  else
    s.mtiles = ffmaRows(slices, dkdv ? cfg.kLen : cfg.qLen, mp, {4, 2}, 4);
  if (dkdv) {
    s.querySplit = tuning.f32BwdSplit ? tuning.f32BwdSplit : ffmaQuerySplit(cfg, s.dpad, mp);
    if (s.querySplit > 1) s.mtiles = 4;
  }
  if (tuning.f32BwdRows) s.mtiles = tuning.f32BwdRows;
  if (dkdv) {
    s.dqPartial = !cfg.atomicDq && ceilDiv(cfg.kLen, 16 * s.mtiles) <= kMaxDqPartialBlocks;
    s.atomicDq = cfg.atomicDq || (!s.dqPartial && !cfg.deterministic);
  }
  return s;
}

// A grid of fewer blocks than multiprocessors leaves most of the GPU idle, and each block is
// latency bound: the fp32 mma.sync kernels halve the rows of a block there (forward and dQ: one
// m-tile unless a tuning override set it; dK/dV: 2 warps = 32 keys, default dQ scheme). Measured
// in bench/RESULTS_flash.md.
void shrinkSmallGrids(FlashKernelSpec& s, const FlashAttentionConfig& cfg, int multiprocessors, const FlashTuning& tuning) {
  if (multiprocessors <= 0) return;
  const bool dkdv = s.kind == FlashKernelKind::kBwdDkDv;
  const long long slices = (long long)cfg.batch * (dkdv ? cfg.kvHeads : cfg.heads);
  if (slices * ceilDiv(dkdv ? cfg.kLen : cfg.qLen, s.rowsPerBlock()) >= multiprocessors) return;
  const int mtOverride = s.kind == FlashKernelKind::kForward ? tuning.fwdMtiles : tuning.dqMtiles;
  if (!dkdv && s.mtiles == 2 && !mtOverride) s.mtiles = 1;
  if (dkdv && !s.atomicDq && !s.dqPartial && s.warps == 4) s.warps = 2;
}

// fp32 on the FP64 tensor cores (DMMA: the mma.sync kernels with MmaStep<F64Tag>). FP64 fragments
// take twice TF32's registers: at head dims <= 64 (validation allows no more) the tiles that fit
// 255 registers without spills (ptxas -v on sm_90) are one m-tile of 64-key tiles in the forward,
// 4 warps over 32-row query tiles in dK/dV and one m-tile over 32 keys in dQ. Its dK/dV kernel
// takes part in dQ as the FFMA one does (5 products a tile pair): per-key-block shares summed in
// order up to kMaxDqPartialBlocks key blocks, beyond them atomics unless the backward must be
// deterministic (then the dQ kernel). f64FwdWarps = 8 makes 128-row forward blocks, one an SM.
FlashKernelSpec chooseF64Mma(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target,
                             const FlashTuning& tuning) {
  FlashKernelSpec s = baseSpec(kind, cfg);
  s.f64 = true;
  if (kind == FlashKernelKind::kForward) {
    s.tile = 64;
    if (tuning.f64FwdWarps) s.warps = tuning.f64FwdWarps;
    if (tuning.fwdTile) s.tile = tuning.fwdTile;
    if (tuning.fwdMtiles) s.mtiles = tuning.fwdMtiles;
  } else if (kind == FlashKernelKind::kBwdDkDv) {
    s.tile = 32;
    s.dqPartial = !cfg.atomicDq && ceilDiv(cfg.kLen, s.rowsPerBlock()) <= kMaxDqPartialBlocks;
    s.atomicDq = cfg.atomicDq || (!s.dqPartial && !cfg.deterministic);
  } else {  // kBwdDq
    s.mtiles = tuning.dqMtiles ? tuning.dqMtiles : 1;
    s.tile = tuning.dqTile ? tuning.dqTile : 32;
  }
  shrinkSmallGrids(s, cfg, target.multiprocessors, tuning);
  return s;
}

// The mma.sync kernels, 16-bit types or fp32 with TF32 operands. Forward: 128-row blocks (2
// m-tiles per warp) as FlashAttention-2 does, except at head dim 256 where two m-tiles of
// accumulators would not fit the register file; 64 keys per tile at head dim <= 64, 32 above,
// where S of 2 x 64 keys beside O would exceed it (tile sweep in bench/RESULTS_flash.md). dQ: the
// forward's 128-row blocks; S and dP of 2 x 32 keys beside dQ above head dim 64. TF32 fragments
// take twice the registers of 16-bit ones, so its backward takes the tiles that fit 255 registers
// without spills (ptxas -v): dQ over 32 keys, 2 m-tiles at head dim <= 64 and 1 above; dK/dV over
// 64 query rows at head dim <= 64, 32 above and with atomic dQ. Backward with atomicDq
// (FlashAttention-2's scheme): 8 warps x 16 keys share each Q/dO tile; 4 at head dim 256, where
// the key tiles of 128 rows would not fit shared memory. TF32: 8 at head dim 64 only (its 4-byte
// rows do not fit above; below, the dQ product's column split needs 16 columns a warp).
FlashKernelSpec chooseMmaSync(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target,
                              const FlashTuning& tuning) {
  FlashKernelSpec s = baseSpec(kind, cfg);
  s.tf32 = cfg.dtype == kFlashF32;
  if (kind == FlashKernelKind::kForward) {
    s.mtiles = s.dpad <= 128 ? 2 : 1;
    if (s.mtiles == 2 && s.dpad > 64) s.tile = 32;
    if (tuning.fwdTile) s.tile = tuning.fwdTile;
    if (tuning.fwdMtiles) s.mtiles = tuning.fwdMtiles;
  } else if (kind == FlashKernelKind::kBwdDq) {
    s.mtiles = tuning.dqMtiles ? tuning.dqMtiles : s.dpad <= (s.tf32 ? 64 : 128) ? 2 : 1;
    if (s.tf32 || (s.mtiles == 2 && s.dpad > 64)) s.tile = 32;
    if (tuning.dqTile) s.tile = tuning.dqTile;
  } else {  // kBwdDkDv
    if (s.tf32) s.tile = cfg.atomicDq || s.dpad > 64 ? 32 : 64;
    if (cfg.atomicDq) {
      s.atomicDq = true;
      s.warps = s.tf32 ? (s.dpad == 64 ? 8 : 4) : (s.dpad <= 128 ? 8 : 4);
    }
  }
  if (s.tf32) shrinkSmallGrids(s, cfg, target.multiprocessors, tuning);
  return s;
}

// Sinks below kFlashSinkTileKeys beside a left window: the first key tile of a block far enough
// from the start holds only sink keys (FlashKernelSpec::sinkTile).
bool hasSinkTile(const FlashAttentionConfig& c) {
  return c.mask.sinks > 0 && c.mask.sinks <= kFlashSinkTileKeys && c.mask.windowLeft >= 0;
}

// GQA's dK/dV on the sm_90a kernels, per query head (fp32 partials and a reduce kernel) or per KV
// head (a block walks its group's query heads with dK and dV in registers: no partials, no
// reduce, but `group` times fewer and heavier items). Estimated in units of one streamed tile's
// products: w(kb) is the count of query tiles the mask leaves visible to key block kb (the
// kernel's own test); per KV head gives batch · kvHeads items of group · w(kb) + 1, per query
// head batch · heads items of w(kb) + 1 (the 1: an item's K/V loads and its stores); a list's
// time is the longer of its heaviest item and its total over the SMs (the work list starts the
// heaviest first); per query head adds the reduce's bytes (the partials read, dK and dV written)
// at kReduceBandwidth. kTileFlopsPerSm is a dK/dV tile's four products' rate on one SM. Both
// constants and the cases the rule was checked on: bench/RESULTS_flash.md, "GQA's dK/dV per KV
// head by a rule". Memoised per thread: the chooser runs at every launch.
constexpr double kTileFlopsPerSm = 2.9e12;  // FLOP/s
constexpr double kReduceBandwidth = 3.3e12;  // bytes/s

bool tileVisible(const FlashAttentionConfig& c, long long m0, long long m1, long long n0, long long n1) {
  long long lo0, hi0, lo1, hi1;
  attentionBand(c.mask, m0, c.qLen, c.kLen, &lo0, &hi0);
  attentionBand(c.mask, m1 - 1, c.qLen, c.kLen, &lo1, &hi1);
  if (lo0 <= n1 - 1 && hi1 >= n0 && lo0 <= hi1) return true;
  return n0 <= attentionSinkLimit(c.mask, m1 - 1, c.qLen, c.kLen);
}

bool dkdvPerQueryHeadEstimate(const FlashAttentionConfig& c, int multiprocessors, int bn, int bq, int dpad) {
  const int group = c.heads / c.kvHeads, nKB = ceilDiv(c.kLen, bn), nQT = ceilDiv(c.qLen, bq);
  double maxW = 0, sumW = 0;
  for (int kb = 0; kb < nKB; ++kb) {
    const long long n0 = (long long)kb * bn, n1 = std::min<long long>(n0 + bn, c.kLen);
    int w = 0;
    for (int qt = 0; qt < nQT; ++qt)
      w += tileVisible(c, (long long)qt * bq, std::min<long long>((long long)qt * bq + bq, c.qLen), n0, n1);
    maxW = std::max<double>(maxW, w);
    sumW += w;
  }
  const double sms = multiprocessors, slicesKv = (double)c.batch * c.kvHeads, slicesQ = (double)c.batch * c.heads;
  const double perKv = std::max(group * maxW + 1, slicesKv * (group * sumW + nKB) / sms);
  const double perQ = std::max(maxW + 1, slicesQ * (sumW + nKB) / sms);
  const double tileSeconds = 8.0 * bq * bn * dpad / kTileFlopsPerSm;
  const double reduceBytes = 2.0 * c.kLen * c.headDim * (slicesQ * 4 + slicesKv * 2);
  return perQ * tileSeconds + reduceBytes / kReduceBandwidth < perKv * tileSeconds;
}

bool dkdvPerQueryHead(const FlashAttentionConfig& c, const FlashTarget& target, const FlashTuning& tuning, int bn, int bq,
                      int dpad) {
  if (c.heads == c.kvHeads) return false;
  if (tuning.splitKv >= 0) return tuning.splitKv != 0;
  if (target.multiprocessors <= 0) return true;
  struct Entry {
    int key[14];
    bool perQ;
  };
  const int key[14] = {c.batch, c.heads, c.kvHeads, c.qLen, c.kLen, c.headDim, c.mask.causal, c.mask.alignBottomRight,
                       c.mask.windowLeft, c.mask.windowRight, c.mask.sinks, target.multiprocessors, bn, bq * 1024 + dpad};
  thread_local Entry memo[8];
  thread_local int used = 0, next = 0;
  for (int i = 0; i < used; ++i)
    if (std::equal(key, key + 14, memo[i].key)) return memo[i].perQ;
  Entry& e = memo[next];
  next = (next + 1) % 8, used = std::min(used + 1, 8);
  std::copy(key, key + 14, e.key);
  e.perQ = dkdvPerQueryHeadEstimate(c, target.multiprocessors, bn, bq, dpad);
  return e.perQ;
}

// The wgmma forward's wide key tiles: rows that see at least kWideFwdTileKeys keys (no left window
// narrower than that). There, at padded head dim 128, 160-key tiles in blocks of one item each are
// 2-4 % faster than 128-key tiles in the persistent kernel (the softmax's and the rescale's fixed
// cost a tile spread over more keys; bench/RESULTS_flash.md, "Wide key tiles"); at 4,096 keys and
// below they are slower (a partial last tile, fewer tiles to overlap), at head dim 64 slower
// everywhere.
constexpr int kWideFwdTileKeys = 8192;
bool wideFwdTiles(const FlashAttentionConfig& cfg) {
  const long long band = cfg.mask.windowLeft < 0 ? cfg.kLen : std::min<long long>(cfg.kLen, cfg.mask.windowLeft + 1LL);
  return band >= kWideFwdTileKeys;
}

// sm_90a, 16-bit types at padded head dims 64, 128, 192 and 256 (wgmmaHeadDim; above 128 one
// backward item a block, two consumer warpgroups, the tiles below): the fastest of the sweeps in
// bench/RESULTS_flash.md. Forward: a producer warpgroup, 128-key tiles in a two-stage ring, and
// three consumer warpgroups (192 query rows) at head dim 64 from 2048 queries on, two (128 rows)
// otherwise (shorter sequences waste more of a 192-row block on the partial last tile and on
// causal imbalance); the two warpgroups of head dims 128 and 256 take turns issuing (ping-pong); where
// the SM count is known, a persistent kernel (one block an SM over a work list, heaviest query
// tiles first); at 256 64-key tiles; at 128, rows that see 8,192 keys or more take 160-key tiles
// and one item a block (wideFwdTiles). dK/dV and dQ (flash_attention_bwd_wgmma.cuh): two consumer
// warpgroups (128 keys / query rows), streamed tiles of 128 rows at head dim 64 and 64 at 128 (128
// spills heavily there), two stages; at 256 see below.
FlashKernelSpec chooseWgmma(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target,
                            const FlashTuning& tuning) {
  FlashKernelSpec s = baseSpec(kind, cfg);
  s.wgmma = true;
  s.dpad = wgmmaHeadDim(cfg.headDim);
  s.stages = 2;
  if (kind == FlashKernelKind::kForward) {
    // Rows that see 8,192 keys or more at head dim 128 take 160-key tiles, one item a block
    // (wideFwdTiles); elsewhere 128-key tiles.
    const bool wide = s.dpad == 128 && wideFwdTiles(cfg);
    s.tile = wide ? 160 : 128;
    s.warps = s.dpad == 64 && cfg.qLen >= 2048 ? 12 : 8;
    if (tuning.fwdTile) s.tile = tuning.fwdTile;
    if (tuning.fwdWarpgroups) s.warps = 4 * tuning.fwdWarpgroups;
    if (tuning.fwdStages) s.stages = tuning.fwdStages;
    // Above 128 what fits (the kernel's assert): 64-key tiles and two warpgroups; at 256 two stages.
    if (s.dpad > 128) {
      s.tile = 64, s.warps = std::min(s.warps, 8);
      if (s.dpad == 256 || s.sharedBytes() > kSm90MaxSharedBytes) s.stages = 2;
    }
    s.pingpong = s.dpad >= 128 && s.warps == 8;
    if (tuning.fwdPingPong >= 0) s.pingpong = tuning.fwdPingPong != 0 && s.warps >= 8;
    // Persistent where the SM count is known and the second Q buffer fits an sm_90 block.
    s.persistent = target.multiprocessors > 0 && (wide ? tuning.fwdPersistent == 1 : tuning.fwdPersistent != 0);
    if (s.persistent && s.sharedBytes() > kSm90MaxSharedBytes) s.persistent = false;
    s.sinkTile = hasSinkTile(cfg) && tuning.sinkTile != 0;
  } else {
    s.tile = s.dpad == 64 ? 128 : 64;
    s.warps = 8;
    if (tuning.bwdTile) s.tile = tuning.bwdTile;
    if (kind == FlashKernelKind::kBwdDq && tuning.dqTile) s.tile = tuning.dqTile;
    if (tuning.bwdWarpgroups) s.warps = 4 * tuning.bwdWarpgroups;
    if (tuning.bwdStages) s.stages = tuning.bwdStages;
    // Above 128 (the kernels' asserts): dK/dV's two warpgroups share 64 keys (one holds dV, the
    // other dK) over 64-query tiles; dQ's 128 query rows stream 32-key tiles in three stages at 256
    // (1-2 % faster than two; 64-key tiles do not fit), 64-key tiles in two at 192 (forward +
    // backward 4-5 % faster than 32-key tiles in three; 32 where the tuning asks); the tuning's
    // stages where they fit, else two.
    if (s.dpad > 128) {
      const bool dq64 = s.dpad == 192 && tuning.dqTile != 32;
      s.tile = kind == FlashKernelKind::kBwdDq && !dq64 ? 32 : 64, s.warps = 8;
      if (kind == FlashKernelKind::kBwdDq && !tuning.bwdStages) s.stages = 3;
      if (s.sharedBytes() > kSm90MaxSharedBytes) s.stages = 2;
    }
    // Persistent where the SM count is known: with TMA loads flat to 11 % faster than one item a
    // block at padded head dims 64 and 128 (bench/RESULTS_flash.md, "Persistent backward" and
    // "TMA loads"); GQA's dK/dV per KV head needs it most: its items are `group` times longer,
    // and its heaviest (the key blocks with sinks) must start first. Above 128 one item a block
    // (the dK/dV kernel's warpgroup roles).
    s.persistent = target.multiprocessors > 0 && tuning.bwdPersistent != 0 && s.dpad <= 128;
    if (s.persistent && s.sharedBytes() > kSm90MaxSharedBytes) s.persistent = false;
    s.sinkTile = kind == FlashKernelKind::kBwdDq && hasSinkTile(cfg) && tuning.sinkTile != 0;
  }
  s.tma = tuning.tma != 0;
  return s;
}

// The backward's small kernels (preprocess, sink reduce, dQ conversion and reductions): one
// instantiation per dtype, or per the dK/dV kernel's key blocks for the fp32 dQ reduce.
FlashKernelSpec chooseAuxiliary(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target,
                                const FlashTuning& tuning) {
  FlashKernelSpec s = baseSpec(kind, cfg);
  s.dpad = 0;
  if (kind == FlashKernelKind::kBwdDqReduce) {  // the dK/dV kernel's key blocks (16 R keys) and query tiles
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target, tuning);
    s.mtiles = dkdv.ffma() ? dkdv.mtiles : dkdv.warps;
    s.tile = dkdv.ffma() ? 64 : dkdv.tile;
  }
  if (kind == FlashKernelKind::kBwdSinkReduce) s.dtype = kFlashF32;
  return s;
}

[[noreturn]] void fail(const std::string& what) { throw FlashAttentionError("flash attention: " + what); }


}  // namespace

FlashKernelSpec chooseFlashSpec(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target,
                                const FlashTuning& tuning) {
  if (!isProductKind(kind)) return chooseAuxiliary(kind, cfg, target, tuning);
  if (cfg.dtype == kFlashF32) {
    if (cfg.tf32) return chooseMmaSync(kind, cfg, target, tuning);
    if (usesFp64Mma(kind, cfg, target)) return chooseF64Mma(kind, cfg, target, tuning);
    return chooseFfma(kind, cfg, target, tuning);
  }
  if (usesWgmma(kind, cfg, target, tuning)) return chooseWgmma(kind, cfg, target, tuning);
  return chooseMmaSync(kind, cfg, target, tuning);
}

bool flashSplitKvHeads(const FlashAttentionConfig& c, const FlashTarget& target, const FlashTuning& tuning) {
  if (c.dtype == kFlashF32 || c.heads == c.kvHeads) return false;
  if (!usesWgmma(FlashKernelKind::kBwdDkDv, c, target, tuning)) return tuning.splitKv != 0;
  const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, c, target, tuning);
  return dkdvPerQueryHead(c, target, tuning, dkdv.rowsPerBlock(), dkdv.tile, dkdv.dpad);
}

std::vector<FlashKernelSpec> flashKernelsOf(const FlashAttentionConfig& c, bool backward, const FlashTarget& target,
                                            const FlashTuning& tuning) {
  if (!backward) return {chooseFlashSpec(FlashKernelKind::kForward, c, target, tuning)};
  std::vector<FlashKernelSpec> specs = {chooseFlashSpec(FlashKernelKind::kBwdPreprocess, c, target, tuning)};
  if (c.sinkLogits) specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdSinkReduce, c, target, tuning));
  const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, c, target, tuning);
  specs.push_back(dkdv);
  if (flashSplitKvHeads(c, target, tuning) || dkdv.querySplit > 1)
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDvReduce, c, target, tuning));
  if (dkdv.atomicDq)
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDqConvert, c, target, tuning));
  else if (dkdv.dqPartial)
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDqReduce, c, target, tuning));
  else
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDq, c, target, tuning));
  return specs;
}

void validateFlashConfig(const FlashAttentionConfig& c, bool backward) {
  if (c.batch < 1 || c.heads < 1 || c.kvHeads < 1)
    fail("batch, heads and kvHeads must be >= 1 (got " + std::to_string(c.batch) + ", " +
         std::to_string(c.heads) + ", " + std::to_string(c.kvHeads) + ")");
  if (c.heads % c.kvHeads != 0)
    fail("query heads (" + std::to_string(c.heads) + ") must be a multiple of kv heads (" +
         std::to_string(c.kvHeads) + ")");
  if (c.qLen < 0 || c.kLen < 0) fail("sequence lengths must be >= 0");
  // The shape limits fuse-attention also reads (common/flash_attention_limits.h).
  const std::string cannot = flashCudaCannotRun(c.batch, c.heads, c.headDim, backward && c.dtype == kFlashF32);
  if (!cannot.empty()) fail(cannot);
  if (c.mask.windowLeft < -1 || c.mask.windowRight < -1 || c.mask.sinks < 0)
    fail("window offsets must be >= -1 (-1 = unbounded) and sinks >= 0");
  if (!(c.scale >= 0.f) || !std::isfinite(c.scale)) fail("scale must be finite and >= 0 (0 = 1/sqrt(head dim))");
  if (c.tf32 && c.dtype != kFlashF32)
    fail(std::string("tf32 applies to fp32 inputs only; these are ") + flashDTypeName(c.dtype) +
         " (their products already run on the tensor cores)");
  const bool fp64MmaOn = c.fp64Mma == FlashFp64Mma::kOn;  // kAuto falls back to FFMA where DMMA cannot run
  if (fp64MmaOn && c.dtype != kFlashF32)
    fail(std::string("fp64Mma applies to fp32 inputs only; these are ") + flashDTypeName(c.dtype));
  if (fp64MmaOn && c.tf32) fail("tf32 and fp64Mma both set: choose one way to run fp32 on the tensor cores");
  if (fp64MmaOn && c.headDim > 64)
    fail("fp64Mma supports head dim <= 64 (got " + std::to_string(c.headDim) +
         "): above, its fp64 fragments spill registers; use the default FFMA kernels or tf32");
  if (backward && c.deterministic && c.atomicDq)
    fail("deterministic and atomicDq both set: fp32 atomics make dQ's summation order vary from run to "
         "run, so a deterministic backward cannot use them; drop atomicDq");
}

}  // namespace pa
