// CI test without a GPU: NVRTC compiles every flash attention instantiation for sm_80 and sm_90.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"
#include "tests/nvrtc/compile_in_parallel.h"
#include "kernels/flash_attention.h"

namespace pa {
namespace {

TEST(FlashNvrtc, EmbedsEveryTemplate) {
  std::set<std::string> names;
  for (const auto& f : codegen::embeddedKernelFiles()) names.insert(f.name);
  for (const char* want : {"common/attention_mask.h", "kernels/flash_attention_params.h",
                           "kernels/flash_attention_common.cuh", "kernels/flash_attention_fwd.cuh",
                           "kernels/flash_attention_bwd.cuh", "kernels/flash_attention_fwd_wgmma.cuh",
                           "kernels/flash_attention_bwd_wgmma.cuh", "kernels/wgmma.cuh"})
    EXPECT_TRUE(names.count(want)) << want << " is not embedded";
}

TEST(FlashNvrtc, SpecNamesAreUnique) {
  std::set<std::string> names;
  for (const FlashKernelSpec& s : allFlashKernelSpecs()) EXPECT_TRUE(names.insert(s.name()).second) << s.name();
}

TEST(FlashNvrtc, CompileErrorCarriesKernelNameAndLog) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  codegen::CompileRequest req;
  req.kernelName = "broken_kernel";
  req.source = "extern \"C\" __global__ void broken_kernel() { undeclared_thing(); }\n";
  try {
    codegen::Nvrtc::instance().compile(req);
    FAIL() << "a broken source compiled";
  } catch (const codegen::NvrtcError& e) {
    EXPECT_EQ(e.kernel(), "broken_kernel");
    EXPECT_NE(e.log().find("undeclared_thing"), std::string::npos) << e.log();
  }
}

// Compiles the instantiations for one architecture on every core (the wgmma forwards only for
// sm_90a, the others for every target); reports every failure.
void compileAll(const std::string& arch, bool wgmma, size_t atLeast) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<test::CompileUnit> units;
  for (const FlashKernelSpec& s : allFlashKernelSpecs())
    if (!s.wgmma || wgmma) units.push_back({s.name(), s.name(), s.source()});
  const std::vector<std::string> failures = test::compileInParallel(units, arch, /*rejectWarnings=*/false);
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GE(units.size(), atLeast);
}

TEST(FlashNvrtc, CompilesEveryInstantiationSm80) { compileAll("sm_80", false, 40); }
TEST(FlashNvrtc, CompilesEveryInstantiationSm90) { compileAll("sm_90", false, 40); }
// The launcher's own sm_90a choices: the wgmma forwards besides everything else.
TEST(FlashNvrtc, CompilesEveryInstantiationSm90a) { compileAll("sm_90a", true, 50); }

TEST(FlashNvrtc, Sm90aKernelsUseWgmmaWhereTheyApply) {
  FlashAttentionConfig cfg;
  for (FlashDType dt : {kFlashF32, kFlashF16, kFlashBF16})
    for (int d : {8, 32, 40, 64, 96, 128, 200}) {
      cfg.dtype = dt;
      cfg.headDim = d;
      const bool want = dt != kFlashF32 && ((d > 32 && d <= 64) || (d > 96 && d <= 128));
      EXPECT_EQ(FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg, {132, true}).wgmma, want) << dt << " d" << d;
      EXPECT_FALSE(FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg, {132, false}).wgmma) << dt << " d" << d;
      for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        cfg.atomicDq = false;
        EXPECT_EQ(FlashAttention::chooseSpec(k, cfg, {132, true}).wgmma, want) << dt << " d" << d;
        cfg.atomicDq = dt != kFlashF32;  // the atomic scheme stays on mma.sync
        EXPECT_FALSE(FlashAttention::chooseSpec(k, cfg, {132, true}).wgmma) << dt << " d" << d;
        cfg.atomicDq = false;
      }
    }
}

// The fp32 backward's part in dQ: per-key-block shares while they are few, atomics beyond, the
// separate dQ kernel when the backward must be deterministic, atomics whenever atomicDq asks.
TEST(FlashNvrtc, Fp32DqSchemeFollowsLengthAndDeterminism) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.headDim = 64, cfg.qLen = 4096;
  struct Want {
    int kLen;
    bool deterministic, atomicDq, wantPartial, wantAtomic;
  };
  // chooseSpec without a multiprocessor count keeps R = 4: 64 keys per block, 8 blocks = 512 keys.
  for (const Want& w : {Want{512, false, false, true, false}, Want{513, false, false, false, true},
                        Want{4096, false, false, false, true}, Want{4096, true, false, false, false},
                        Want{512, true, false, true, false}, Want{100, false, true, false, true}}) {
    cfg.kLen = w.kLen, cfg.deterministic = w.deterministic, cfg.atomicDq = w.atomicDq;
    const FlashKernelSpec s = FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg);
    EXPECT_EQ(s.dqPartial, w.wantPartial) << "kLen " << w.kLen << " det " << w.deterministic;
    EXPECT_EQ(s.atomicDq, w.wantAtomic) << "kLen " << w.kLen << " det " << w.deterministic;
    EXPECT_NE(s.source().find(w.wantPartial ? "kDqPartial" : w.wantAtomic ? "kDqAtomic" : "kDqSeparate"), std::string::npos)
        << s.source();
  }
}

// tf32 moves the fp32 forward, dK/dV and dQ onto the mma.sync kernels with TF32Tag (same tiles
// rules as the 16-bit types, within shared memory); the other backward kernels and the 16-bit
// types ignore it; the wgmma kernels are never chosen for it.
TEST(FlashNvrtc, Tf32RunsTheTensorCoreKernels) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.tf32 = true, cfg.qLen = cfg.kLen = 4096;
  for (int d : {8, 32, 64, 96, 128, 256})
    for (bool atomic : {false, true}) {
      cfg.headDim = d, cfg.atomicDq = atomic;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        if (k != FlashKernelKind::kForward && d > 128) continue;
        const FlashKernelSpec s = FlashAttention::chooseSpec(k, cfg, {132, true});
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
        const FlashKernelSpec s = FlashAttention::chooseSpec(k, cfg, {132, true});
        EXPECT_FALSE(s.tf32) << s.name();
        EXPECT_NE(s.source().find("pa::flash::F32Tag"), std::string::npos) << s.source();
      }
    }
  cfg.atomicDq = false, cfg.headDim = 64, cfg.dtype = kFlashBF16;  // 16-bit inputs: no effect
  const FlashKernelSpec bf = FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg, {132, false});
  EXPECT_FALSE(bf.tf32);
  EXPECT_NE(bf.source().find("pa::flash::BF16Tag"), std::string::npos);
}

// fp64Mma runs the mma.sync kernels with FP64 fragments in the tiles that fit their registers
// (one m-tile, 4 warps, 64-key forward tiles, 32-row backward tiles); dK/dV adds dQ with atomics
// unless the backward is deterministic, then the dQ kernel runs; the small kernels stay fp32.
TEST(FlashNvrtc, Fp64MmaRunsTheTensorCoreKernelsInTilesThatFit) {
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.fp64Mma = FlashFp64Mma::kOn, cfg.batch = 4, cfg.heads = cfg.kvHeads = 8, cfg.qLen = cfg.kLen = 4096;
  for (int d : {8, 32, 40, 64})
    for (bool det : {false, true}) {
      cfg.headDim = d, cfg.deterministic = det;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq}) {
        for (bool wgmma : {false, true}) {
          const FlashKernelSpec s = FlashAttention::chooseSpec(k, cfg, {132, wgmma});
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
        const FlashKernelSpec s = FlashAttention::chooseSpec(k, cfg, {132, true});
        EXPECT_FALSE(s.f64) << s.name();
        EXPECT_NE(s.source().find("pa::flash::F32Tag"), std::string::npos) << s.source();
      }
    }
  // Every one of these is among the instantiations the compile tests above build.
  std::set<std::string> all;
  for (const FlashKernelSpec& s : allFlashKernelSpecs()) all.insert(s.name());
  for (int d : {32, 64})
    for (bool det : {false, true}) {
      cfg.headDim = d, cfg.deterministic = det;
      for (FlashKernelKind k : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
        EXPECT_TRUE(all.count(FlashAttention::chooseSpec(k, cfg, {132, false}).name()))
            << FlashAttention::chooseSpec(k, cfg, {132, false}).name();
    }
}

// The fp32 default (FlashFp64Mma::kAuto): the forward on the FP64 tensor cores only on a target
// with full-rate FP64, at head dims <= 64, from kFp64MmaForwardMinBlocks blocks of 64 query rows;
// never the backward, never with tf32, and the same instantiation as kOn's forward (compiled by
// the tests above). kOff and the other targets keep the FFMA kernels.
TEST(FlashNvrtc, Fp32DefaultPutsTheForwardOnTheFp64TensorCoresWhereFullRate) {
  std::set<std::string> all;
  for (const FlashKernelSpec& s : allFlashKernelSpecs()) all.insert(s.name());
  const FlashTarget h100{132, true, true}, a100{108, false, true}, l40{142, false, false};
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.batch = 1, cfg.heads = cfg.kvHeads = 8;
  for (int d : {8, 32, 64, 96, 128})
    for (int len : {1, 128, 129, 192, 193, 4096}) {  // 8, 16, 24, 24, 32, 512 blocks
      cfg.headDim = d, cfg.qLen = cfg.kLen = len;
      const long long blocks = 8LL * ((len + 63) / 64);
      const bool fits = d <= 64 && blocks >= kFp64MmaForwardMinBlocks;
      for (const FlashTarget& t : {h100, a100, l40}) {
        const FlashKernelSpec fwd = FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg, t);
        EXPECT_EQ(fwd.f64, fits && t.fullRateFp64) << fwd.name() << " len " << len;
        if (fwd.f64) {
          FlashAttentionConfig on = cfg;
          on.fp64Mma = FlashFp64Mma::kOn;
          EXPECT_EQ(fwd.name(), FlashAttention::chooseSpec(FlashKernelKind::kForward, on, t).name());
          EXPECT_TRUE(all.count(fwd.name())) << fwd.name();
        }
        for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
          EXPECT_TRUE(FlashAttention::chooseSpec(k, cfg, t).ffma()) << d << " " << len;
        FlashAttentionConfig other = cfg;
        other.fp64Mma = FlashFp64Mma::kOff;
        EXPECT_TRUE(FlashAttention::chooseSpec(FlashKernelKind::kForward, other, t).ffma());
        other = cfg;
        other.tf32 = true;
        EXPECT_TRUE(FlashAttention::chooseSpec(FlashKernelKind::kForward, other, t).tf32);
        EXPECT_FALSE(FlashAttention::chooseSpec(FlashKernelKind::kForward, other, t).f64);
      }
    }
  // The 16-bit types never take it.
  cfg.dtype = kFlashBF16, cfg.headDim = 64, cfg.qLen = cfg.kLen = 4096;
  EXPECT_FALSE(FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg, h100).f64);
}

}  // namespace
}  // namespace pa
