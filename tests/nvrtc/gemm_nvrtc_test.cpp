// CI test without a GPU: NVRTC compiles every generated GEMM variant (fp32 SIMT large / medium /
// small tiles, TF32 mma.sync, split-K and its reduce, each transpose combination, batches, each
// FusedLinear epilogue; tests/gemm_variants.h) for sm_80 and sm_90a, and the wgmma ones for
// sm_90a. What each variant emits is checked without NVRTC in gemm_emit_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"
#include "tests/nvrtc/compile_in_parallel.h"
#include "tests/gemm_variants.h"

namespace pa {
namespace {

using codegen::GemmTile;
using gemmtest::GemmProblem;
using gemmtest::Variant;

TEST(GemmNvrtc, CompilesEveryWgmmaVariantSm90a) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<test::CompileUnit> units;
  for (const Variant& v : gemmtest::wgmmaVariants()) units.push_back({v.name, v.kernel.name, v.kernel.source});
  // 2 output types × (3 tiles × (4 transposes + batched + 3 epilogues + 2 activation gradients +
  // 2 forced epilogue placements + 2 products whose C the threads store) + on small tiles only, 4
  // split products of 2 kernels each), and 2 bias-gradient products with their operand sums,
  // whole (one kernel) and split (two); on the ping-pong tile 4 transposes, batched, 2 epilogues,
  // an activation gradient, threads' stores and a bias gradient (one kernel each), a split product
  // and a split bias gradient (two each).
  EXPECT_EQ(units.size(), 2u * (3 * 14 + 4 * 2) + 2 * 3 + 10 + 2 * 2);
  const std::vector<std::string> failures = test::compileInParallel(units, "sm_90a", /*rejectWarnings=*/true);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// fp32 operands with EmitOptions::tf32 and ::wgmma: the wgmma kernel on TF32 for every tile,
// transpose, batch, split and epilogue. B stored N-major gets a transpose kernel first, or is
// transposed by the product kernel as it loads it (EmitOptions::tf32BLoad); A stored M-major is
// read into registers when its rows are whole 16-byte chunks (else copied); a single Aᵀ·B with
// M < N runs transposed (Bᵀ from registers, Aᵀ the N-major operand, C written transposed).
TEST(GemmNvrtc, CompilesEveryTf32WgmmaVariantSm90a) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  using codegen::Tf32BLoad;
  std::vector<test::CompileUnit> units;
  // copyA: the kernel's A is copied; nMajorB: its B is stored N-major (copied, or loaded transposed).
  auto add = [&](const std::string& name, const GemmProblem& p, GemmTile tile, int splits, bool copyA, bool nMajorB, bool expectSwap) {
    for (Tf32BLoad bLoad : {Tf32BLoad::Copy, Tf32BLoad::InKernel}) {
      const std::string variant = name + (bLoad == Tf32BLoad::Copy ? "_bcopy" : "_bkernel");
      Graph g;
      const NodeId id = gemmtest::buildGraph(g, p);
      codegen::EmitOptions opt;
      opt.wgmma = opt.tf32 = true;
      opt.gemmTile = tile;
      opt.gemmSplits = splits;
      opt.tf32BLoad = bLoad;
      int transposes = 0;
      bool wgmma = false, swapped = false;
      for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels) {
        units.push_back({variant + "_" + std::to_string(static_cast<int>(tile)) + "_" + k.name, k.name, k.source});
        transposes += k.name.find("_transpose_") != std::string::npos;
        const bool product = k.source.find("pa::gemm::wgmmaGemm<") != std::string::npos && k.source.find(", true>") != std::string::npos;
        wgmma |= product;
        swapped |= product && k.source.find("transC = true") != std::string::npos;
        if (product) {  // the kernel's A is node input 1 when swapped (its map is named after the input)
          const std::string a = expectSwap ? "1" : "0", b = expectSwap ? "0" : "1";
          const std::string bArg = nMajorB && bLoad == Tf32BLoad::InKernel ? "static_cast<const float*>(in" + b + ")" : "map" + b;
          EXPECT_NE(k.source.find(">>(map" + a + ", " + bArg + ","), std::string::npos) << variant;
        }
      }
      EXPECT_TRUE(wgmma) << variant;
      EXPECT_EQ(transposes, (copyA ? 1 : 0) + (nMajorB && bLoad == Tf32BLoad::Copy ? 1 : 0)) << variant;
      EXPECT_EQ(swapped, expectSwap) << variant;
    }
  };
  for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const GemmProblem p = gemmtest::matmulProblem(40, 100, 136, ta, tb);
      add("MatMul_t" + std::to_string(t), p, tile, 0, false, !tb, ta && !tb);
      if (tile == GemmTile::Small) add("MatMul_split_t" + std::to_string(t), p, tile, 3, false, !tb, ta && !tb);
    }
    // M-major A whose rows are not whole 16-byte chunks (M = 30): copied; Aᵀ·B with M > N: not swapped.
    add("MatMul_tA_tB_m30", gemmtest::matmulProblem(30, 100, 136, true, true), tile, 0, true, false, false);
    add("MatMul_tA_m100", gemmtest::matmulProblem(100, 40, 136, true, false), tile, 0, false, true, false);
    GemmProblem batched;
    batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
    add("MatMul_batched", batched, tile, 0, false, true, false);
    GemmProblem batchedT;  // a batch of Aᵀ·B: never swapped
    batchedT.a = {3, 128, 64}, batchedT.b = {3, 128, 96}, batchedT.ta = true;
    add("MatMul_batched_tA", batchedT, tile, 0, false, true, false);
    GemmProblem fused;
    fused.fused = true, fused.act = "gelu", fused.bias = true;
    fused.a = {4, 7, 32}, fused.b = {32, 40};
    add("FusedLinear_gelu", fused, tile, 0, false, true, false);
    GemmProblem actGrad = gemmtest::matmulProblem(40, 100, 136, false, true);  // fp32 x, four at a time
    actGrad.gradAct = "gelu";
    add("MatMulActGrad_gelu", actGrad, tile, 0, false, false, false);
  }
  const std::vector<std::string> failures = test::compileInParallel(units, "sm_90a", /*rejectWarnings=*/true);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

void compileAll(const std::string& arch) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<Variant> variants = gemmtest::allVariants();
  const size_t generated = variants.size();
  for (Variant& v : gemmtest::libraryEpilogues()) variants.push_back(std::move(v));
  std::vector<test::CompileUnit> units;
  for (const Variant& v : variants) units.push_back({v.name, v.kernel.name, v.kernel.source});
  const std::vector<std::string> failures = test::compileInParallel(units, arch, /*rejectWarnings=*/true);
  for (const auto& f : failures) ADD_FAILURE() << f;
  // Per precision: 3 tiles × (4 transposes + batched), 4 split products (2 kernels each), 2
  // tiles × 20 FusedLinear epilogues (5 activations × bias × transposed weight) and 20 split ones
  // (2 kernels each); fp32 also 4 tail-split products and 20 tail-split FusedLinear (2 kernels each);
  // FP64: 3 tiles × (4 transposes + batched), a split product (2 kernels) and 4 FusedLinear and a
  // split one (2 kernels); MatMulBiasGrad: 2 operands × (FP64, TF32) × (3 tiles + a split
  // product of 2 kernels).
  EXPECT_EQ(generated, 2u * (3 * 5 + 4 * 2 + 2 * 20 + 20 * 2) + (4 + 20) * 2 + (3 * 5 + 2 + 4 + 2) + 2 * 2 * (3 + 2));
  EXPECT_GT(variants.size(), generated);
}

TEST(GemmNvrtc, CompilesEveryVariantSm80) { compileAll("sm_80"); }
// sm_90a, not sm_90: what the runner compiles for on an H100 (no device gets plain sm_90).
TEST(GemmNvrtc, CompilesEveryVariantSm90a) { compileAll("sm_90a"); }
// The plain sm_90 target (ctest label sweep, gemm_nvrtc_sweep_tests).
TEST(GemmNvrtcSweep, CompilesEveryVariantSm90) { compileAll("sm_90"); }

}  // namespace
}  // namespace pa
