// CPU checks of the FlashAttention kernel choice: each chooser's rules, unique names, and that the
// production list (what flash_nvrtc_tests compiles) holds every kernel the example configs run.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "codegen/flash_spec.h"
#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/trainer.h"

namespace pa {
namespace {

std::set<std::string> namesOf(const std::vector<FlashKernelSpec>& a, const std::vector<FlashKernelSpec>& b = {}) {
  std::set<std::string> names;
  for (const auto* list : {&a, &b})
    for (const FlashKernelSpec& s : *list) names.insert(s.name());
  return names;
}

TEST(FlashSpec, SpecNamesAreUnique) {
  for (const auto& list : {flashProductionKernelSpecs(), flashSweepKernelSpecs()}) {
    std::set<std::string> names;
    for (const FlashKernelSpec& s : list) EXPECT_TRUE(names.insert(s.name()).second) << s.name();
  }
}

// The launcher finds loaded kernels by FlashKernelSpec::key(): two instantiations (different
// names, over both lists) never share a key.
TEST(FlashSpec, SpecKeysAreUniqueWhereNamesAre) {
  std::map<unsigned long long, std::string> byKey;
  for (const auto& list : {flashProductionKernelSpecs(), flashSweepKernelSpecs()})
    for (const FlashKernelSpec& s : list) {
      const auto [at, fresh] = byKey.emplace(s.key(), s.name());
      EXPECT_TRUE(fresh || at->second == s.name()) << s.name() << " and " << at->second << " share key " << s.key();
    }
}

// 16-bit head dims 33-256 run on wgmma on sm_90a, 96 padded to 128 (faster there than mma.sync
// at 96), 129-192 padded to 192 and 193-256 to 256; 32 and below stay on mma.sync (faster than
// wgmma at 64). Above 128 every kernel keeps to what fits shared memory whatever the tuning asks:
// the forward 64-key tiles and two consumer warpgroups taking turns (two stages at 256; at 192 a
// third where asked, and persistent where its second Q buffer fits), dK/dV two warpgroups sharing
// 64 keys over 64-query tiles, dQ 128 query rows over 32-key tiles in three stages at 256, 64-key
// tiles in two at 192 (32-key tiles in three where asked); the backward one item a block.
TEST(FlashSpec, Sm90aKernelsUseWgmmaWhereTheyApply) {
  FlashAttentionConfig cfg;
  cfg.qLen = cfg.kLen = 4096;
  for (FlashDType dt : {kFlashF32, kFlashF16, kFlashBF16})
    for (int d : {8, 32, 40, 64, 96, 128, 136, 192, 200, 256}) {
      cfg.dtype = dt;
      cfg.headDim = d;
      const bool want = dt != kFlashF32 && d > 32;
      const int dpad = d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : 256;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        const FlashKernelSpec s = chooseFlashSpec(k, cfg, {132, true});
        EXPECT_EQ(s.wgmma, want) << s.name();
        if (!want) continue;
        EXPECT_EQ(s.dpad, dpad) << s.name() << ": the wgmma kernels' head dims";
        EXPECT_LE(s.sharedBytes(), 227 * 1024) << s.name();
      }
      if (want && d > 128) {
        FlashTuning asks;
        asks.fwdTile = 128, asks.fwdWarpgroups = 3, asks.fwdStages = 3;
        asks.bwdTile = 128, asks.dqTile = 32, asks.bwdWarpgroups = 3, asks.bwdStages = 3;
        for (bool asked : {false, true})
          for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
            const FlashKernelSpec s = chooseFlashSpec(k, cfg, {132, true}, asked ? asks : FlashTuning{});
            const bool at192 = dpad == 192, dq = k == FlashKernelKind::kBwdDq;
            EXPECT_EQ(s.tile, dq && (asked || !at192) ? 32 : 64) << s.name();
            EXPECT_EQ(s.warps, 8) << s.name();
            // Shared memory (KB): dQ 96 of Q and dO at 192 (128 at 256) + 24 (32) a stage of
            // 32-key tiles, 48 of 64-key ones; dK/dV 48 (64) of K and V + 50 (66) a stage + 16;
            // the forward 48 (64) of Q + 48 (64) a stage.
            const int stages = dq ? (at192 && !asked ? 2 : 3) : at192 && asked ? 3 : 2;
            EXPECT_EQ(s.stages, stages) << s.name();
            if (k == FlashKernelKind::kForward) {
              EXPECT_TRUE(s.pingpong) << s.name();
            }
            EXPECT_EQ(s.rowsPerBlock(), k == FlashKernelKind::kBwdDkDv ? 64 : 128) << s.name();
            // A second Q buffer fits the forward at 192 in two stages (193 KB), nothing else.
            EXPECT_EQ(s.persistent, k == FlashKernelKind::kForward && at192 && !asked) << s.name();
            EXPECT_LE(s.sharedBytes(), 227 * 1024) << s.name();
          }
      }
      EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, false}).wgmma) << dt << " d" << d;
      for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        cfg.atomicDq = dt != kFlashF32;  // the atomic scheme stays on mma.sync
        EXPECT_FALSE(chooseFlashSpec(k, cfg, {132, true}).wgmma) << dt << " d" << d;
        cfg.atomicDq = false;
      }
    }
}

// The fp32 backward's part in dQ: per-key-block shares while they are few, atomics beyond, the
// separate dQ kernel when the backward must be deterministic, atomics whenever atomicDq asks.
TEST(FlashSpec, Fp32DqSchemeFollowsLengthAndDeterminism) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.headDim = 64, cfg.qLen = 4096;
  struct Want {
    int kLen;
    bool deterministic, atomicDq, wantPartial, wantAtomic;
  };
  // chooseFlashSpec without a multiprocessor count keeps R = 4: 64 keys per block, 8 blocks = 512 keys.
  for (const Want& w : {Want{512, false, false, true, false}, Want{513, false, false, false, true},
                        Want{4096, false, false, false, true}, Want{4096, true, false, false, false},
                        Want{512, true, false, true, false}, Want{100, false, true, false, true}}) {
    cfg.kLen = w.kLen, cfg.deterministic = w.deterministic, cfg.atomicDq = w.atomicDq;
    const FlashKernelSpec s = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg);
    EXPECT_EQ(s.dqPartial, w.wantPartial) << "kLen " << w.kLen << " det " << w.deterministic;
    EXPECT_EQ(s.atomicDq, w.wantAtomic) << "kLen " << w.kLen << " det " << w.deterministic;
    EXPECT_NE(s.source().find(w.wantPartial ? "kDqPartial" : w.wantAtomic ? "kDqAtomic" : "kDqSeparate"), std::string::npos)
        << s.source();
  }
}

// The fp32 FFMA dK/dV kernel splits its key blocks' query tiles among 2 or 4 blocks (then R = 4)
// where that estimates faster (ffmaQuerySplit: waves of two blocks an SM), from 512 keys at padded
// head dims <= 64; the backward then runs the reduce of the parts' partials. Not without an SM
// count, not on grids that already fill the GPU in whole waves, not at head dim 128.
TEST(FlashSpec, Fp32QuerySplitOnShortSequencesOfLargeGpus) {
  const std::set<std::string> production = namesOf(flashProductionKernelSpecs());
  const FlashTarget h100{132, false, true}, unknown{};
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.batch = 1, cfg.heads = 8, cfg.kvHeads = 8, cfg.headDim = 64;
  struct Want {
    int batch, heads, len, headDim, parts;
  };
  // R = 4 makes batch · heads · len / 64 blocks; 264 run at once on 132 multiprocessors.
  for (const Want& w : {Want{1, 8, 4096, 64, 1}, Want{1, 8, 2048, 64, 1}, Want{1, 8, 1536, 64, 4}, Want{1, 8, 1024, 64, 2},
                        Want{1, 8, 1000, 64, 2}, Want{1, 8, 768, 64, 2}, Want{1, 8, 512, 64, 4}, Want{1, 8, 256, 64, 1},
                        Want{4, 8, 1024, 64, 1}, Want{1, 4, 1024, 64, 4}, Want{1, 8, 1024, 32, 2}, Want{1, 8, 1024, 128, 1}, Want{1, 8, 2048, 128, 1}}) {
    cfg.batch = w.batch, cfg.heads = cfg.kvHeads = w.heads, cfg.qLen = cfg.kLen = w.len, cfg.headDim = w.headDim;
    SCOPED_TRACE("b" + std::to_string(w.batch) + " h" + std::to_string(w.heads) + " len " + std::to_string(w.len) + " d" +
                 std::to_string(w.headDim));
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, h100);
    ASSERT_TRUE(dkdv.ffma()) << dkdv.name();
    EXPECT_EQ(dkdv.querySplit, w.parts) << dkdv.name();
    if (w.parts > 1 || w.headDim > 64) {  // above 64 one block an SM: R = 4 from about one a multiprocessor
      EXPECT_EQ(dkdv.mtiles, 4);
    }
    bool reduce = false;
    for (const FlashKernelSpec& s : flashKernelsOf(cfg, true, h100)) {
      reduce |= s.kind == FlashKernelKind::kBwdDkDvReduce;
      EXPECT_TRUE(production.count(s.name())) << s.name();
    }
    EXPECT_EQ(reduce, w.parts > 1);
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, unknown).querySplit, 1);
  }
  // Under a causal mask a grid of fewer than 1.5 waves takes twice the parts (up to 4).
  cfg.headDim = 64, cfg.mask.causal = 1;
  for (const Want& w : {Want{1, 8, 4096, 64, 1}, Want{1, 8, 2048, 64, 2}, Want{1, 8, 1536, 64, 4}, Want{1, 8, 1024, 64, 4},
                        Want{1, 8, 768, 64, 4}, Want{2, 8, 1024, 64, 2}, Want{1, 8, 256, 64, 1}}) {
    cfg.batch = w.batch, cfg.heads = cfg.kvHeads = w.heads, cfg.qLen = cfg.kLen = w.len;
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, h100).querySplit, w.parts)
        << "causal b" << w.batch << " h" << w.heads << " len " << w.len;
  }
  cfg.mask = AttentionMaskSpec{};
  // Head dim 128 below one block an SM keeps R = 2's twice as many blocks.
  cfg.batch = 1, cfg.heads = cfg.kvHeads = 8, cfg.qLen = cfg.kLen = 512, cfg.headDim = 128;
  EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, h100).mtiles, 2);
  // The override reaches any split, and the name and source carry it.
  FlashTuning tuning;
  tuning.f32BwdSplit = 4;
  cfg.batch = 4, cfg.qLen = cfg.kLen = 4096;
  const FlashKernelSpec forced = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, h100, tuning);
  EXPECT_EQ(forced.querySplit, 4);
  EXPECT_NE(forced.name().find("_qs4"), std::string::npos) << forced.name();
  EXPECT_NE(forced.source().find("kDqAtomic, 4>"), std::string::npos) << forced.source();
}

// tf32 moves the fp32 forward, dK/dV and dQ onto the mma.sync kernels with TF32Tag (same tiles
// rules as the 16-bit types, within shared memory); the other backward kernels and the 16-bit
// types ignore it; the wgmma kernels are never chosen for it.
TEST(FlashSpec, Tf32RunsTheTensorCoreKernels) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.tf32 = true, cfg.qLen = cfg.kLen = 4096;
  for (int d : {8, 32, 64, 96, 128, 256})
    for (bool atomic : {false, true}) {
      cfg.headDim = d, cfg.atomicDq = atomic;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        if (k != FlashKernelKind::kForward && d > 128) continue;
        const FlashKernelSpec s = chooseFlashSpec(k, cfg, {132, true});
        EXPECT_TRUE(s.tf32) << s.name();
        EXPECT_FALSE(s.wgmma) << s.name();
        EXPECT_NE(s.name().find("_tf32_"), std::string::npos) << s.name();
        EXPECT_NE(s.source().find("pa::flash::TF32Tag"), std::string::npos) << s.source();
        EXPECT_EQ(s.threads(), 32 * s.warps) << s.name();
        EXPECT_LE(s.sharedBytes(), 227 * 1024) << s.name();
        if (k == FlashKernelKind::kBwdDkDv) {
          EXPECT_EQ(s.atomicDq, atomic) << s.name();
          EXPECT_FALSE(s.dqPartial) << s.name();
        }
      }
      for (FlashKernelKind k : {FlashKernelKind::kBwdPreprocess, FlashKernelKind::kBwdDqConvert}) {
        const FlashKernelSpec s = chooseFlashSpec(k, cfg, {132, true});
        EXPECT_FALSE(s.tf32) << s.name();
        EXPECT_NE(s.source().find("pa::flash::F32Tag"), std::string::npos) << s.source();
      }
    }
  cfg.atomicDq = false, cfg.headDim = 64, cfg.dtype = kFlashBF16;  // 16-bit inputs: no effect
  const FlashKernelSpec bf = chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, false});
  EXPECT_FALSE(bf.tf32);
  EXPECT_NE(bf.source().find("pa::flash::BF16Tag"), std::string::npos);
}

// fp64Mma runs the mma.sync kernels with FP64 fragments in the tiles that fit their registers
// (one m-tile, 4 warps, 64-key forward tiles, 32-row backward tiles); dK/dV adds dQ with atomics
// unless the backward is deterministic, then the dQ kernel runs; the small kernels stay fp32.
TEST(FlashSpec, Fp64MmaRunsTheTensorCoreKernelsInTilesThatFit) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.fp64Mma = FlashFp64Mma::kOn, cfg.batch = 4, cfg.heads = cfg.kvHeads = 8, cfg.qLen = cfg.kLen = 4096;
  for (int d : {8, 32, 40, 64})
    for (bool det : {false, true}) {
      cfg.headDim = d, cfg.deterministic = det;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        for (bool wgmma : {false, true}) {
          const FlashKernelSpec s = chooseFlashSpec(k, cfg, {132, wgmma});
          EXPECT_TRUE(s.f64) << s.name();
          EXPECT_FALSE(s.tf32 || s.wgmma || s.ffma()) << s.name();
          EXPECT_NE(s.name().find("_f64mma_"), std::string::npos) << s.name();
          EXPECT_NE(s.source().find("pa::flash::F64Tag"), std::string::npos) << s.source();
          EXPECT_EQ(s.mtiles, 1) << s.name();
          EXPECT_EQ(s.warps, 4) << s.name();
          EXPECT_EQ(s.tile, k == FlashKernelKind::kForward ? 64 : 32) << s.name();
          EXPECT_EQ(s.threads(), 128) << s.name();
          EXPECT_EQ(s.rowsPerBlock(), 64) << s.name();
          EXPECT_LE(s.sharedBytes(), 227 * 1024) << s.name();
          if (k == FlashKernelKind::kBwdDkDv) {
            EXPECT_EQ(s.atomicDq, !det) << s.name();
            EXPECT_FALSE(s.dqPartial) << s.name();
          }
        }
      }
      for (FlashKernelKind k : {FlashKernelKind::kBwdPreprocess, FlashKernelKind::kBwdDqConvert}) {
        const FlashKernelSpec s = chooseFlashSpec(k, cfg, {132, true});
        EXPECT_FALSE(s.f64) << s.name();
        EXPECT_NE(s.source().find("pa::flash::F32Tag"), std::string::npos) << s.source();
      }
    }
  // Up to kMaxDqPartialBlocks key blocks (64 keys each) the dK/dV kernel writes per-key-block dQ
  // shares, deterministic or not, and the fp32 reduce sums them over its 16·4-key blocks and
  // 32-row query tiles; one key block more and atomics (or, deterministic, the dQ kernel) again.
  FlashAttentionConfig shortKeys = cfg;
  shortKeys.headDim = 64;
  for (bool det : {false, true}) {
    shortKeys.deterministic = det;
    shortKeys.qLen = shortKeys.kLen = 64 * kMaxDqPartialBlocks;
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, shortKeys, {132, false});
    EXPECT_TRUE(dkdv.dqPartial && !dkdv.atomicDq) << dkdv.name();
    EXPECT_EQ(dkdv.warps, 4) << dkdv.name();
    EXPECT_NE(dkdv.source().find("flashBackwardDkDvMma<pa::flash::F64Tag, 64, 4, 32, false, true>"), std::string::npos)
        << dkdv.source();
    FlashAttentionConfig atomic = shortKeys;  // the same carve-up: the dS^T tile the shares are made from
    atomic.atomicDq = true, atomic.deterministic = false;
    EXPECT_EQ(dkdv.sharedBytes(), chooseFlashSpec(FlashKernelKind::kBwdDkDv, atomic, {132, false}).sharedBytes());
    const FlashKernelSpec reduce = chooseFlashSpec(FlashKernelKind::kBwdDqReduce, shortKeys, {132, false});
    EXPECT_EQ(reduce.mtiles, 4);
    EXPECT_EQ(reduce.tile, 32);
    EXPECT_NE(reduce.source().find("flashBackwardDqReduceF32<4, 32>"), std::string::npos) << reduce.source();
    EXPECT_NE(reduce.name().find("_q32"), std::string::npos) << reduce.name();
    const std::vector<FlashKernelSpec> kernels = flashKernelsOf(shortKeys, true, {132, false});
    EXPECT_TRUE(std::any_of(kernels.begin(), kernels.end(), [](const FlashKernelSpec& s) { return s.kind == FlashKernelKind::kBwdDqReduce; }));
    shortKeys.qLen = shortKeys.kLen = 64 * kMaxDqPartialBlocks + 1;
    const FlashKernelSpec longer = chooseFlashSpec(FlashKernelKind::kBwdDkDv, shortKeys, {132, false});
    EXPECT_FALSE(longer.dqPartial) << longer.name();
    EXPECT_EQ(longer.atomicDq, !det) << longer.name();
  }
  // Every one of these is among the instantiations the NVRTC tests build (kOn is the bench's: the
  // sweep list).
  const std::set<std::string> all = namesOf(flashSweepKernelSpecs(), flashProductionKernelSpecs());
  for (int d : {32, 64})
    for (bool det : {false, true}) {
      cfg.headDim = d, cfg.deterministic = det;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
        EXPECT_TRUE(all.count(chooseFlashSpec(k, cfg, {132, false}).name()))
            << chooseFlashSpec(k, cfg, {132, false}).name();
    }
}

// The fp32 default (FlashFp64Mma::kAuto): the forward on the FP64 tensor cores only on a target
// with full-rate FP64, at head dims <= 64, from kFp64MmaForwardMinBlocks blocks of 64 query rows;
// never with tf32, and the same instantiation as kOn's forward (in the production list). kOff and
// the other targets keep the FFMA kernels. The backward (below) only on grids these small ones
// never reach.
TEST(FlashSpec, Fp32DefaultPutsTheForwardOnTheFp64TensorCoresWhereFullRate) {
  const std::set<std::string> all = namesOf(flashProductionKernelSpecs());
  const FlashTarget h100{132, true, true}, a100{108, false, true}, l40{142, false, false};
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.batch = 1, cfg.heads = cfg.kvHeads = 8;
  for (int d : {8, 32, 64, 96, 128})
    for (int len : {1, 128, 129, 192, 193, 4096}) {  // 8, 16, 24, 24, 32, 512 blocks
      cfg.headDim = d, cfg.qLen = cfg.kLen = len;
      const long long blocks = 8LL * ((len + 63) / 64);
      const bool fits = d <= 64 && blocks >= kFp64MmaForwardMinBlocks;
      for (const FlashTarget& t : {h100, a100, l40}) {
        const FlashKernelSpec fwd = chooseFlashSpec(FlashKernelKind::kForward, cfg, t);
        EXPECT_EQ(fwd.f64, fits && t.fullRateFp64) << fwd.name() << " len " << len;
        if (fwd.f64) {
          FlashAttentionConfig on = cfg;
          on.fp64Mma = FlashFp64Mma::kOn;
          EXPECT_EQ(fwd.name(), chooseFlashSpec(FlashKernelKind::kForward, on, t).name());
          EXPECT_TRUE(all.count(fwd.name())) << fwd.name();
        }
        for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
          EXPECT_TRUE(chooseFlashSpec(k, cfg, t).ffma()) << d << " " << len;
        FlashAttentionConfig other = cfg;
        other.fp64Mma = FlashFp64Mma::kOff;
        EXPECT_TRUE(chooseFlashSpec(FlashKernelKind::kForward, other, t).ffma());
        other = cfg;
        other.tf32 = true;
        EXPECT_TRUE(chooseFlashSpec(FlashKernelKind::kForward, other, t).tf32);
        EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kForward, other, t).f64);
      }
    }
  // The 16-bit types never take it.
  cfg.dtype = kFlashBF16, cfg.headDim = 64, cfg.qLen = cfg.kLen = 4096;
  EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kForward, cfg, h100).f64);
}

// kAuto's backward: on the FP64 tensor cores, dK/dV and dQ alike, where the target runs FP64 at
// full rate, at head dims <= 64, up to kFp64MmaBackwardMaxKeys keys and from
// kFp64MmaBackwardMinBlocks blocks of 32 keys (batch x kvHeads x ceil(kLen / 32)); there dQ comes
// from the deterministic per-key-block shares. attn_block (batch 32, 4 heads, 256 keys, head dim
// 64) takes it; one KV head of GQA counts once.
TEST(FlashSpec, Fp32DefaultPutsTheBackwardOnTheFp64TensorCoresOnLargeGridsOfShortKeys) {
  const std::set<std::string> all = namesOf(flashProductionKernelSpecs());
  const FlashTarget h100{132, true, true}, a100{108, false, true}, l40{142, false, false};
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32;
  struct Case {
    int batch, heads, kvHeads, len;
  };
  for (const Case& c : {Case{32, 4, 4, 256}, Case{32, 4, 4, 512}, Case{32, 4, 4, 513}, Case{1, 8, 8, 512}, Case{8, 4, 4, 256},
                        Case{16, 4, 4, 256}, Case{15, 4, 4, 256},  // 512 blocks of 32 keys (the least), 480
                        Case{4, 8, 8, 256}, Case{4, 8, 8, 128}, Case{8, 16, 4, 256}, Case{8, 16, 2, 256}})
    for (int d : {32, 64, 96}) {
      cfg.batch = c.batch, cfg.heads = c.heads, cfg.kvHeads = c.kvHeads, cfg.qLen = cfg.kLen = c.len, cfg.headDim = d;
      const long long blocks = (long long)c.batch * c.kvHeads * ((c.len + 31) / 32);
      const bool fits = d <= 64 && c.len <= kFp64MmaBackwardMaxKeys && blocks >= kFp64MmaBackwardMinBlocks;
      for (const FlashTarget& t : {h100, a100, l40}) {
        SCOPED_TRACE(std::to_string(c.batch) + "x" + std::to_string(c.heads) + "/" + std::to_string(c.kvHeads) + " len " +
                     std::to_string(c.len) + " d " + std::to_string(d));
        const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, t);
        EXPECT_EQ(dkdv.f64, fits && t.fullRateFp64) << dkdv.name();
        EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg, t).f64, dkdv.f64);
        if (dkdv.f64) {
          EXPECT_TRUE(dkdv.dqPartial && !dkdv.atomicDq) << dkdv.name();
          for (const FlashKernelSpec& s : flashKernelsOf(cfg, true, t)) EXPECT_TRUE(all.count(s.name())) << s.name();
        }
      }
    }
}

// Every kernel the choosers pick for the FlashAttention nodes of every example config (and the
// test configs), at each
// precision that reaches them and on each target (the launcher's view with the device's SM count,
// and codegen's dumps, which lack it), is in the production list that NVRTC CI compiles.
TEST(FlashSpec, ProductionListHoldsEveryExampleConfigsKernels) {
  const std::set<std::string> production = namesOf(flashProductionKernelSpecs());
  const FlashTarget targets[] = {{0, false, false}, {108, false, true}, {132, true, true}, {142, false, false}};
  int nodes = 0;
  std::vector<std::filesystem::path> configs;
  for (const char* dir : {"/configs", "/tests/configs"})
    for (const auto& entry : std::filesystem::directory_iterator(std::string(PA_SOURCE_DIR) + dir))
      if (entry.path().extension() == ".yaml") configs.push_back(entry.path());
  for (const std::filesystem::path& path : configs) {
    for (const char* precision : {"fp32", "tf32", "bf16"}) {
      const Config cfg = loadConfig(path.string(), {"data.samples=64", std::string("precision=") + precision});
      DataSplit data = loadData(cfg.data, cfg.seed, path.parent_path().string());
      const Graph g = compileTrainingGraph(cfg, RunOptions{}, data.train.xShape, data.train.yShape, cfg.train.batchSize)
                          .model.graph;
      const bool tf32 = std::string(precision) == "tf32";
      for (NodeId id : g.topoOrder()) {
        const Node& n = g.node(id);
        const bool backward = n.op == OpKind::FlashAttentionGrad || n.op == OpKind::FlashAttentionQkvGrad;
        if (n.op != OpKind::FlashAttention && n.op != OpKind::FlashAttentionQkv && !backward) continue;
        ++nodes;
        const std::string where = path.filename().string() + " " + precision + " " + n.name;
        for (const FlashTarget& t : targets)
          for (const FlashKernelSpec& s : flashKernelsOf(codegen::flashConfigOf(g, n, tf32), backward, t))
            EXPECT_TRUE(production.count(s.name())) << s.name() << " (" << where << ", " << t.multiprocessors << " SMs)";
        for (bool wgmma : {false, true})
          for (bool fullRateFp64 : {false, true}) {
            codegen::EmitOptions opt;
            opt.tf32 = tf32, opt.wgmma = wgmma, opt.fullRateFp64 = fullRateFp64;
            for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
              EXPECT_TRUE(production.count(k.name)) << k.name << " (" << where << ", dump)";
          }
      }
    }
  }
  EXPECT_GT(nodes, 0) << "no example config has a FlashAttention node";
}

// The sm_90a 16-bit forward, dK/dV and dQ kernels run persistent (one block an SM over a work
// list) where the SM count is known (the backward's rule: at padded head dim 64; the tuning's 1
// forces it), with a second buffer of what a block keeps (Q; K and V; Q and dO); not in dumps for
// an unknown device, nor with the tuning's 0.
TEST(FlashSpec, PersistentForwardWhereTheSmCountIsKnown) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashBF16, cfg.batch = 2, cfg.heads = 8, cfg.kvHeads = 2, cfg.qLen = cfg.kLen = 1024;
  for (int d : {64, 128}) {
    cfg.headDim = d;
    const FlashKernelSpec on = chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, true, true});
    const FlashKernelSpec unknown = chooseFlashSpec(FlashKernelKind::kForward, cfg, {0, true, true});
    EXPECT_TRUE(on.persistent) << on.name();
    EXPECT_FALSE(unknown.persistent) << unknown.name();
    EXPECT_NE(on.name().find("_ps"), std::string::npos) << on.name();
    EXPECT_EQ(unknown.name().find("_ps"), std::string::npos) << unknown.name();
    EXPECT_NE(on.source().find(", true, false, true>"), std::string::npos) << on.source();  // persistent, no sink tile, TMA
    EXPECT_EQ(on.sharedBytes() - unknown.sharedBytes(), on.rowsPerBlock() * d * 2);  // the second Q buffer
    EXPECT_LE(on.sharedBytes(), 227 * 1024) << on.name();
    FlashTuning off;
    off.fwdPersistent = 0;
    EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, true, true}, off).persistent);
    for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
      FlashTuning bon;
      bon.bwdPersistent = 1;
      EXPECT_TRUE(chooseFlashSpec(k, cfg, {132, true, true}).persistent) << d;  // the rule
      const FlashKernelSpec b = chooseFlashSpec(k, cfg, {132, true, true}, bon);
      const FlashKernelSpec bu = chooseFlashSpec(k, cfg, {0, true, true}, bon);
      EXPECT_TRUE(b.persistent) << b.name();
      EXPECT_FALSE(bu.persistent) << bu.name();
      // persistent (dQ: no sink tile), TMA
      EXPECT_NE(b.source().find(k == FlashKernelKind::kBwdDq ? ", true, false, true>" : ", true, true>"), std::string::npos)
          << b.source();
      EXPECT_EQ(b.sharedBytes() - bu.sharedBytes(), 2 * b.rowsPerBlock() * d * 2);  // the second K, V / Q, dO
      EXPECT_LE(b.sharedBytes(), 227 * 1024) << b.name();
      FlashTuning boff;
      boff.bwdPersistent = 0;
      EXPECT_FALSE(chooseFlashSpec(k, cfg, {132, true, true}, boff).persistent);
    }
  }
  cfg.headDim = 64;
  EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, false, true}).persistent);  // mma.sync
  FlashTuning big;  // d 128, 128-key tiles, three stages: no room for a second Q buffer
  big.fwdTile = 128, big.fwdStages = 3, big.fwdWarpgroups = 2;
  cfg.headDim = 128;
  const FlashKernelSpec three = chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, true, true}, big);
  EXPECT_FALSE(three.persistent) << three.name();
  EXPECT_LE(three.sharedBytes(), 227 * 1024) << three.name();
}

// The wgmma forward at padded head dim 128 takes 160-key tiles, one item a block, where rows see
// 8,192 keys or more (no left window narrower than that); 128-key tiles in the persistent kernel
// below that, at head dim 64, and under a window of 1,023 keys. The tuning's tile and persistence
// override it, and the wide kernel fits an sm_90 block's shared memory.
TEST(FlashSpec, WideForwardTilesWhereRowsSeeLongKeys) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashBF16, cfg.batch = 1, cfg.heads = 16, cfg.kvHeads = 16, cfg.headDim = 128;
  const FlashTarget h200{132, true, true};
  auto fwd = [&](const FlashTuning& t = {}) { return chooseFlashSpec(FlashKernelKind::kForward, cfg, h200, t); };
  for (int len : {4096, 8191}) {
    cfg.qLen = cfg.kLen = len;
    EXPECT_EQ(fwd().tile, 128) << len;
    EXPECT_TRUE(fwd().persistent) << len;
  }
  for (int causal : {0, 1}) {
    cfg.mask = AttentionMaskSpec{};
    cfg.mask.causal = causal;
    cfg.qLen = cfg.kLen = 8192;
    const FlashKernelSpec wide = fwd();
    EXPECT_EQ(wide.tile, 160) << wide.name();
    EXPECT_FALSE(wide.persistent) << wide.name();
    EXPECT_LE(wide.sharedBytes(), kSm90MaxSharedBytes) << wide.name();
    EXPECT_NE(wide.name().find("_t160_"), std::string::npos) << wide.name();
    cfg.qLen = 64;  // the keys decide, not the queries
    EXPECT_EQ(fwd().tile, 160);
    cfg.qLen = 8192;
    cfg.mask.windowLeft = 1023;  // rows see about 1,024 keys
    EXPECT_EQ(fwd().tile, 128);
    EXPECT_TRUE(fwd().persistent);
    cfg.mask.windowLeft = 8191;
    EXPECT_EQ(fwd().tile, 160);
  }
  cfg.mask = AttentionMaskSpec{};
  FlashTuning t;
  t.fwdTile = 128;
  EXPECT_EQ(fwd(t).tile, 128);
  EXPECT_FALSE(fwd(t).persistent);  // the rule's one item a block stands
  t.fwdPersistent = 1;
  EXPECT_TRUE(fwd(t).persistent);
  t.fwdTile = 0;
  EXPECT_TRUE(fwd(t).persistent);  // 160-key tiles with two Q buffers: 225 KB
  EXPECT_EQ(fwd(t).tile, 160);
  cfg.headDim = 64;
  EXPECT_EQ(fwd().tile, 128);
  EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, h200).tile, 128);  // the backward keeps its tiles
  cfg.headDim = 128;
  EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg, h200).tile, 64);
  EXPECT_NE(chooseFlashSpec(FlashKernelKind::kForward, cfg, {132, false, true}).tile, 160);  // mma.sync: its own tiles
}

// GQA's dK/dV on the sm_90a kernels runs per KV head where the estimate (flash_chooser.cpp,
// dkdvPerQueryHead) finds its fewer, heavier items no slower than per query head plus the
// partials' reduce: with a window (every key block's items alike) and on grids of several waves;
// per query head where one item would outlast the rest (a short causal grid; sink keys that
// every query of a long sequence sees). Per KV head, the dK/dV kernel is persistent at head dim
// 128 too and no reduce kernel runs; the tuning's 0 / 1 force either; unknown devices and the
// mma.sync kernels keep per query head.
TEST(FlashSpec, GqaDkDvPerKvHeadByTheEstimate) {
  const FlashTarget hopper{132, true, true};
  auto cfgOf = [](int b, int hq, int hk, int s, int d, int window, int sinks) {
    FlashAttentionConfig c;
    c.dtype = kFlashBF16, c.batch = b, c.heads = hq, c.kvHeads = hk, c.qLen = c.kLen = s, c.headDim = d;
    c.mask.causal = 1, c.mask.windowLeft = window, c.mask.sinks = sinks;
    return c;
  };
  struct Case {
    FlashAttentionConfig cfg;
    bool perQueryHead;
  };
  const Case cases[] = {{cfgOf(8, 8, 2, 1024, 64, -1, 0), true},       // tiny_llama: 128 items, key block 0 the heaviest
                        {cfgOf(8, 8, 2, 1024, 64, 128, 0), false},     // tiny_gpt's windowed layers
                        {cfgOf(4, 16, 4, 4096, 128, -1, 0), false},    // 512 items: about four waves
                        {cfgOf(4, 16, 4, 4096, 128, 1023, 0), false},
                        {cfgOf(4, 16, 4, 4096, 128, 1023, 4), false},  // the sink blocks first in the list
                        {cfgOf(1, 16, 4, 16384, 128, 1023, 4), true}}; // one sink block: 4 x 256 tiles
  for (const Case& c : cases) {
    SCOPED_TRACE("b" + std::to_string(c.cfg.batch) + " s" + std::to_string(c.cfg.qLen) + " d" + std::to_string(c.cfg.headDim) +
                 " window " + std::to_string(c.cfg.mask.windowLeft) + " sinks " + std::to_string(c.cfg.mask.sinks));
    EXPECT_EQ(flashSplitKvHeads(c.cfg, hopper), c.perQueryHead);
    const std::vector<FlashKernelSpec> specs = flashKernelsOf(c.cfg, true, hopper);
    const bool reduce = std::any_of(specs.begin(), specs.end(), [](const FlashKernelSpec& s) { return s.kind == FlashKernelKind::kBwdDkDvReduce; });
    EXPECT_EQ(reduce, c.perQueryHead);
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, c.cfg, hopper);
    EXPECT_TRUE(dkdv.persistent) << dkdv.name();  // either scheme, where the SM count is known
    EXPECT_LE(dkdv.sharedBytes(), 227 * 1024) << dkdv.name();
    for (int forced : {0, 1}) {
      FlashTuning t;
      t.splitKv = forced;
      EXPECT_EQ(flashSplitKvHeads(c.cfg, hopper, t), forced == 1);
    }
    EXPECT_TRUE(flashSplitKvHeads(c.cfg, {0, true, true}));      // SM count unknown
    EXPECT_TRUE(flashSplitKvHeads(c.cfg, {132, false, true}));   // mma.sync kernels
    FlashAttentionConfig mha = c.cfg;
    mha.kvHeads = mha.heads;
    EXPECT_FALSE(flashSplitKvHeads(mha, hopper));
  }
}

// The sm_90a forward and dQ kernels carry the narrow sink tile where the mask has 1 to
// kFlashSinkTileKeys sinks beside a left window (the only masks whose first key tile can hold
// nothing but sinks); never the dK/dV kernel, other masks, or with the tuning's 0.
TEST(FlashSpec, SinkTileWhereSinksSitBesideAWindow) {
  const FlashTarget hopper{132, true, true};
  FlashAttentionConfig c;
  c.dtype = kFlashBF16, c.batch = 2, c.heads = 8, c.kvHeads = 2, c.qLen = c.kLen = 2048, c.headDim = 64;
  struct Mask {
    int causal, windowLeft, sinks;
    bool tile;
  };
  for (const Mask& m : {Mask{1, 128, 4, true}, Mask{0, 300, kFlashSinkTileKeys, true}, Mask{1, 128, kFlashSinkTileKeys + 1, false},
                        Mask{1, -1, 4, false}, Mask{1, 128, 0, false}, Mask{0, -1, 0, false}}) {
    c.mask.causal = m.causal, c.mask.windowLeft = m.windowLeft, c.mask.sinks = m.sinks;
    SCOPED_TRACE("window " + std::to_string(m.windowLeft) + " sinks " + std::to_string(m.sinks));
    for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDq}) {
      const FlashKernelSpec s = chooseFlashSpec(k, c, hopper);
      EXPECT_EQ(s.sinkTile, m.tile) << s.name();
      EXPECT_EQ(s.name().find("_sk") != std::string::npos, m.tile) << s.name();
      // persistent, sink tile, TMA
      EXPECT_EQ(s.source().find(", true, true, true>") != std::string::npos, m.tile) << s.source();
      FlashTuning off;
      off.sinkTile = 0;
      EXPECT_FALSE(chooseFlashSpec(k, c, hopper, off).sinkTile);
      EXPECT_FALSE(chooseFlashSpec(k, c, {132, false, true}).sinkTile);  // mma.sync
    }
    EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kBwdDkDv, c, hopper).sinkTile);
  }
}

// FlashTuning::bwdStages deepens the wgmma backward's ring of streamed tiles; a persistent kernel
// whose second buffer would then outgrow an sm_90 block's shared memory runs one item a block.
TEST(FlashSpec, BackwardStagesByTheTuning) {
  const FlashTarget hopper{132, true, true};
  FlashAttentionConfig c;
  c.dtype = kFlashBF16, c.batch = 2, c.heads = 8, c.kvHeads = 2, c.qLen = c.kLen = 2048;
  FlashTuning three;
  three.bwdStages = 3;
  for (int d : {64, 128})
    for (FlashKernelKind kind : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
      c.headDim = d;
      const FlashKernelSpec two = chooseFlashSpec(kind, c, hopper), deep = chooseFlashSpec(kind, c, hopper, three);
      SCOPED_TRACE(deep.name());
      EXPECT_EQ(two.stages, 2);
      EXPECT_EQ(deep.stages, 3);
      EXPECT_NE(deep.name().find("_wg_s3"), std::string::npos);
      EXPECT_LE(deep.sharedBytes(), kSm90MaxSharedBytes);
      FlashKernelSpec persistentDeep = deep;
      persistentDeep.persistent = true;
      EXPECT_EQ(deep.persistent, persistentDeep.sharedBytes() <= kSm90MaxSharedBytes);
      FlashKernelSpec shallow = deep;  // the same kernel with two stages: one stage's tiles (and statistics) less
      shallow.stages = 2;
      const int stageBytes = 2 * deep.tile * d * 2 + (kind == FlashKernelKind::kBwdDkDv ? (20 * deep.tile + 1023) / 1024 * 1024 : 0);
      EXPECT_EQ(deep.sharedBytes() - shallow.sharedBytes(), stageBytes);
    }
}

// The sm_90a wgmma forward, dK/dV and dQ kernels load with TMA (a second, __grid_constant__
// argument of tensor maps); FlashTuning::tma = 0 keeps cp.async; no other kernel takes maps.
TEST(FlashSpec, WgmmaKernelsLoadWithTma) {
  const FlashTarget hopper{132, true, true};
  FlashAttentionConfig c;
  c.dtype = kFlashBF16, c.batch = 2, c.heads = 8, c.kvHeads = 2, c.qLen = c.kLen = 2048;
  c.mask.causal = 1, c.mask.windowLeft = 128, c.mask.sinks = 4;  // the dQ kernel's sink tile beside TMA
  for (int d : {40, 64, 96, 128}) {
    c.headDim = d;
    for (FlashKernelKind kind : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
      const FlashKernelSpec s = chooseFlashSpec(kind, c, hopper);
      SCOPED_TRACE(s.name());
      ASSERT_TRUE(s.wgmma);
      EXPECT_TRUE(s.tma);
      EXPECT_NE(s.name().find("_tma"), std::string::npos);
      EXPECT_NE(s.source().find("const __grid_constant__ pa::FlashTensorMaps maps"), std::string::npos) << s.source();
      EXPECT_NE(s.source().find(", true>(p, &maps)"), std::string::npos) << s.source();  // the template's TMA argument
      FlashTuning off;
      off.tma = 0;
      const FlashKernelSpec plain = chooseFlashSpec(kind, c, hopper, off);
      EXPECT_FALSE(plain.tma);
      EXPECT_EQ(plain.name().find("_tma"), std::string::npos) << plain.name();
      EXPECT_EQ(plain.source().find("FlashTensorMaps"), std::string::npos) << plain.source();
      EXPECT_NE(plain.source().find("(p);"), std::string::npos) << plain.source();
      EXPECT_NE(plain.name(), s.name());
      EXPECT_FALSE(chooseFlashSpec(kind, c, {132, false, true}).tma);  // mma.sync
    }
    for (bool backward : {false, true})
      for (const FlashKernelSpec& k : flashKernelsOf(c, backward, hopper))
        EXPECT_EQ(k.tma, k.kind == FlashKernelKind::kForward || k.kind == FlashKernelKind::kBwdDkDv ||
                             k.kind == FlashKernelKind::kBwdDq)
            << k.name();
  }
  c.dtype = kFlashF32;
  EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kForward, c, hopper).tma);
}

}  // namespace
}  // namespace pa
