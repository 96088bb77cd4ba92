// CI test without a GPU: NVRTC compiles every generated GEMM variant (fp32 SIMT large / medium /
// small tiles, TF32 mma.sync, split-K and its reduce, the tail split, each transpose combination,
// batches, each FusedLinear epilogue) for the targets the runner compiles for: sm_80 (and the
// other pre-Hopper GPUs, which build the same source) and sm_90a (Hopper: the SIMT and mma.sync
// kernels beside the wgmma ones). Every variant here is one production reaches: the runner's
// tile tuning compiles each tile of each path, the shape's plan (codegen/gemm_plan.h) splits K
// and the tail; forced options only pick which. The plain sm_90 target, which no device gets
// (the runner asks for sm_90a on Hopper), is the sweep-only GemmNvrtcSweep (ctest label sweep).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"
#include "tests/nvrtc/compile_in_parallel.h"
#include "tests/gpu/gemm_harness.h"

namespace pa {
namespace {

using codegen::GemmTile;
using gemmtest::GemmProblem;

struct Variant {
  std::string name;
  codegen::Kernel kernel;
};

std::vector<Variant> allVariants() {
  std::vector<Variant> out;
  // tail: a tail split of that many ways, on a device of 2 SMs (so that the problems below have
  // tiles computed whole beside split ones).
  auto add = [&](const std::string& name, const GemmProblem& p, bool tf32, GemmTile tile, int splits = 0, int tail = 0) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    codegen::EmitOptions opt;
    opt.tf32 = tf32;
    opt.gemmTile = tile;
    opt.gemmSplits = splits;
    if (tail > 0) opt.gemmTailSplits = tail, opt.sms = 2;
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      out.push_back({name + (tf32 ? "_tf32" : "_fp32") + "_" + std::to_string(static_cast<int>(tile)) + "_" + k.name, k});
  };
  for (bool tf32 : {false, true})
    for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) {
      for (int t = 0; t < 4; ++t) {
        const GemmProblem p = gemmtest::matmulProblem(33, 100, 129, t & 1, t & 2);
        add("MatMul_t" + std::to_string(t), p, tf32, tile);
        if (tile == GemmTile::Large) add("MatMul_split_t" + std::to_string(t), p, tf32, tile, 3);
        if (tile == GemmTile::Large && !tf32) add("MatMul_tail_t" + std::to_string(t), p, tf32, tile, 0, 3);
      }
      GemmProblem batched;
      batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
      add("MatMul_batched", batched, tf32, tile);
      if (tile == GemmTile::Medium) continue;
      for (const char* act : {"none", "relu", "gelu"})
        for (bool bias : {false, true})
          for (bool tw : {false, true}) {
            GemmProblem p;
            p.fused = true, p.act = act, p.bias = bias, p.tb = tw;
            p.a = {4, 7, 36};
            p.b = tw ? Shape{40, 36} : Shape{36, 40};
            const std::string name = std::string("FusedLinear_") + act + (bias ? "_bias" : "") + (tw ? "_tW" : "");
            add(name, p, tf32, tile);
            if (tile == GemmTile::Large) add(name + "_split", p, tf32, tile, 2);
            if (tile == GemmTile::Large && !tf32) add(name + "_tail", p, tf32, tile, 0, 2);
          }
    }
  return out;
}

// The epilogue kernels that follow a cuBLASLt product: every FusedLinear epilogue with each part
// cuBLASLt may or may not have applied, and matmul-act-grad's two derivatives.
std::vector<Variant> libraryEpilogues() {
  std::vector<Variant> out;
  for (const char* act : {"none", "relu", "gelu"})
    for (bool bias : {false, true})
      for (int applied = 0; applied < 4; ++applied) {
        GemmProblem p;
        p.fused = true, p.act = act, p.bias = bias;
        p.a = {4, 7, 36};
        p.b = {36, 40};
        Graph g;
        const NodeId id = gemmtest::buildGraph(g, p);
        for (const codegen::Kernel& k : codegen::libraryGemmEpilogue(g, id, applied & 1, applied & 2).kernels)
          out.push_back({std::string("lib_") + act + (bias ? "_bias" : "") + "_" + std::to_string(applied), k});
      }
  for (const char* act : {"relu", "gelu"}) {
    Graph g;
    const ValueId a = g.addParam("a", {33, 17}, "xavier"), b = g.addParam("b", {17, 9}, "xavier");
    const ValueId x = g.addParam("x", {33, 9}, "xavier");
    AttrMap t;
    t.set<attr::GradActivation>(act);
    const ValueId y = g.add(OpKind::MatMulActGrad, {a, b, x}, t);
    for (const codegen::Kernel& k : codegen::libraryGemmEpilogue(g, g.producer(y).id, false, false).kernels)
      out.push_back({std::string("lib_actgrad_") + act, k});
  }
  {  // the copy of a transposed B that lets cuBLASLt run the product untransposed
    GemmProblem p;
    p.a = {100, 33}, p.b = {70, 33}, p.tb = true;
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    for (const codegen::Kernel& k : codegen::libraryGemmTransposeB(g, id).kernels) out.push_back({"lib_transpose_b", k});
  }
  return out;
}

TEST(GemmNvrtc, LibraryEpiloguesDoWhatTheLibraryLeft) {
  // Nothing left: no bias, or bias and ReLU both applied by cuBLASLt, or a plain MatMul.
  std::map<std::string, bool> hasKernel;
  for (const Variant& v : libraryEpilogues()) hasKernel[v.name] = true;
  EXPECT_FALSE(hasKernel.count("lib_none_0"));
  EXPECT_FALSE(hasKernel.count("lib_relu_bias_3"));
  EXPECT_FALSE(hasKernel.count("lib_none_bias_1"));
  EXPECT_TRUE(hasKernel.count("lib_none_bias_0"));  // bias not applied: the kernel adds it
  EXPECT_TRUE(hasKernel.count("lib_relu_bias_1"));  // ReLU not applied
  EXPECT_TRUE(hasKernel.count("lib_gelu_3"));       // GELU is never cuBLASLt's (tanh form)
  EXPECT_TRUE(hasKernel.count("lib_actgrad_relu") && hasKernel.count("lib_actgrad_gelu"));
  for (const Variant& v : libraryEpilogues()) {
    if (v.name.find("gelu") != std::string::npos) {
      EXPECT_NE(v.kernel.source.find("erff("), std::string::npos) << v.name;
    }
    if (v.name == "lib_relu_bias_1") {
      EXPECT_NE(v.kernel.source.find("fmaxf("), std::string::npos);
    }
  }
}

// bf16 operands with EmitOptions::wgmma (an sm_90a device): the wgmma kernel for every tile,
// transpose, batch, split and epilogue, with bf16 and fp32 outputs.
std::vector<Variant> wgmmaVariants() {
  std::vector<Variant> out;
  auto add = [&](const std::string& name, const GemmProblem& p, GemmTile tile, bool bf16Out, int splits = 0) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    gemmtest::storeOperandsInBf16(g, id, bf16Out);
    codegen::EmitOptions opt;
    opt.wgmma = true;
    opt.gemmTile = tile;
    opt.gemmSplits = splits;
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      out.push_back({name + (bf16Out ? "_bf16out_" : "_f32out_") + std::to_string(static_cast<int>(tile)) + "_" + k.name, k});
  };
  for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small})
    for (bool bf16Out : {true, false}) {
      for (int t = 0; t < 4; ++t) {
        const GemmProblem p = gemmtest::matmulProblem(40, 104, 136, t & 1, t & 2);
        add("MatMul_t" + std::to_string(t), p, tile, bf16Out);
        if (tile == GemmTile::Small) add("MatMul_split_t" + std::to_string(t), p, tile, bf16Out, 3);
      }
      GemmProblem batched;
      batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
      add("MatMul_batched", batched, tile, bf16Out);
      for (const char* act : {"none", "relu", "gelu"}) {
        GemmProblem p;
        p.fused = true, p.act = act, p.bias = true;
        p.a = {4, 7, 32}, p.b = {32, 40};
        add(std::string("FusedLinear_") + act, p, tile, bf16Out);
      }
    }
  return out;
}

TEST(GemmNvrtc, Bf16OperandsTakeTheWgmmaKernelWhereTheyCan) {
  // The product reads both operands through TMA maps; a K split's partial sums go to a reduce
  // kernel.
  for (const Variant& v : wgmmaVariants()) {
    const bool reduce = v.kernel.name.find("_reduce") != std::string::npos;
    EXPECT_NE(v.kernel.source.find(reduce ? "pa::gemm::splitReduce<" : "pa::gemm::wgmmaGemm<"), std::string::npos) << v.name;
    EXPECT_EQ(v.kernel.headers, std::vector<std::string>{reduce ? "kernels/gemm_common.cuh" : "kernels/gemm_wgmma.cuh"}) << v.name;
    if (reduce) continue;
    EXPECT_GT(v.kernel.sharedBytes, 48u * 1024) << v.name;
    ASSERT_GE(v.kernel.args.size(), 2u) << v.name;
    EXPECT_EQ(v.kernel.args[0].kind, codegen::KernelArg::InputTensorMap) << v.name;
    EXPECT_EQ(v.kernel.args[1].kind, codegen::KernelArg::InputTensorMap) << v.name;
  }
  // Without wgmma, or with a contiguous extent that is not a multiple of 8 (K = 129 here), the
  // operands are widened for the TF32 kernel instead.
  GemmProblem odd;
  odd.a = {40, 129}, odd.b = {129, 104};
  GemmProblem even;
  even.a = {40, 136}, even.b = {136, 104};
  for (int c = 0; c < 3; ++c) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, c == 2 ? odd : even);
    gemmtest::storeOperandsInBf16(g, id, true);
    codegen::EmitOptions opt;
    opt.wgmma = c != 1;
    const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
    bool widened = false, wgmma = false;
    for (const codegen::Kernel& k : nk.kernels) {
      widened |= k.name.find("_widen_") != std::string::npos;
      wgmma |= k.source.find("pa::gemm::wgmmaGemm<") != std::string::npos;
    }
    EXPECT_EQ(wgmma, c == 0) << c;
    EXPECT_EQ(widened, c != 0) << c;
  }
}

TEST(GemmNvrtc, CompilesEveryWgmmaVariantSm90a) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<test::CompileUnit> units;
  for (const Variant& v : wgmmaVariants()) units.push_back({v.name, v.kernel.name, v.kernel.source});
  // 3 tiles × 2 output types × (4 transposes + 4 split products (2 kernels each) on small tiles
  // only + batched + 3 epilogues).
  EXPECT_EQ(units.size(), 2u * (3 * 8 + 4 * 2));
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
  }
  const std::vector<std::string> failures = test::compileInParallel(units, "sm_90a", /*rejectWarnings=*/true);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(GemmNvrtc, EmbedsTheTemplates) {
  for (const char* name : {"kernels/gemm_common.cuh", "kernels/gemm_ptx.cuh", "kernels/gemm_simt.cuh", "kernels/gemm_tf32.cuh",
                           "kernels/gemm_wgmma.cuh"}) {
    bool found = false;
    for (const auto& f : codegen::embeddedKernelFiles()) found |= std::string(f.name) == name;
    EXPECT_TRUE(found) << name;
  }
}

TEST(GemmNvrtc, OptionsPickThePath) {
  for (const Variant& v : allVariants()) {
    const bool tf32 = v.name.find("_tf32") != std::string::npos, tail = v.name.find("_tail") != std::string::npos;
    const bool reduce = v.kernel.name.find("_reduce") != std::string::npos;
    const char* expected = reduce ? (tail ? "pa::gemm::simtTailReduce<" : "pa::gemm::splitReduce<")
                           : tf32 ? "pa::gemm::tf32Gemm<"
                           : tail ? "pa::gemm::simtGemmTail<"
                                  : "pa::gemm::simtGemm<";
    EXPECT_NE(v.kernel.source.find(expected), std::string::npos) << v.name;
    // Each kernel includes its family's header only: split-K's reduce the shared one.
    const char* header = reduce && !tail ? "kernels/gemm_common.cuh" : tf32 ? "kernels/gemm_tf32.cuh" : "kernels/gemm_simt.cuh";
    EXPECT_EQ(v.kernel.headers, std::vector<std::string>{header}) << v.name;
  }
}

// The tail split from the shape (fp32, large tiles, 132 SMs): where the last wave is a small part
// of a long product; not where it is nearly full, nor for batches, TF32 or K splits.
TEST(GemmNvrtc, TailSplitWhereTheLastWaveIsPartial) {
  auto emit = [](const GemmProblem& p, bool tf32) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    codegen::EmitOptions opt;
    opt.tf32 = tf32;
    return codegen::emitNode(g, id, opt);
  };
  auto tailOf = [](const codegen::NodeKernels& nk) {
    return nk.kernels[0].source.find("pa::gemm::simtGemmTail<") != std::string::npos;
  };
  // 8192×4096×4096: 2048 tiles, 15 waves and 68 tiles; split 5 ways (pieces of 832 of K: 340
  // pieces, 3 rounds of 0.2 of a tile).
  const codegen::NodeKernels square = emit(gemmtest::matmulProblem(8192, 4096, 4096, false, false), false);
  ASSERT_EQ(square.kernels.size(), 2u);
  EXPECT_TRUE(tailOf(square));
  EXPECT_NE(square.kernels[0].source.find("tailTiles = 68LL;"), std::string::npos);
  EXPECT_NE(square.kernels[0].source.find("tailSplits = 5;"), std::string::npos);
  EXPECT_EQ(square.kernels[0].grid[0], 2048u - 68 + 68 * 5);
  EXPECT_NE(square.kernels[1].source.find("pa::gemm::simtTailReduce<"), std::string::npos);
  EXPECT_EQ(square.scratchBytes, size_t{68} * 5 * 128 * 128 * sizeof(float));
  // 8192×1024×1024: 512 tiles, the fourth wave 116 of 132: nothing to gain.
  EXPECT_FALSE(tailOf(emit(gemmtest::matmulProblem(8192, 1024, 1024, false, false), false)));
  EXPECT_EQ(emit(gemmtest::matmulProblem(8192, 1024, 1024, false, false), false).kernels.size(), 1u);
  // TF32 (mma.sync: two blocks an SM) and batches keep the plain kernel.
  EXPECT_FALSE(tailOf(emit(gemmtest::matmulProblem(8192, 4096, 4096, false, false), true)));
  GemmProblem batched;
  batched.a = {2, 4096, 4096}, batched.b = {2, 4096, 4096};
  EXPECT_FALSE(tailOf(emit(batched, false)));
}

void compileAll(const std::string& arch) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<Variant> variants = allVariants();
  const size_t generated = variants.size();
  for (Variant& v : libraryEpilogues()) variants.push_back(std::move(v));
  std::vector<test::CompileUnit> units;
  for (const Variant& v : variants) units.push_back({v.name, v.kernel.name, v.kernel.source});
  const std::vector<std::string> failures = test::compileInParallel(units, arch, /*rejectWarnings=*/true);
  for (const auto& f : failures) ADD_FAILURE() << f;
  // Per precision: 3 tiles × (4 transposes + batched), 4 split products (2 kernels each), 2
  // tiles × 12 FusedLinear epilogues and 12 split ones (2 kernels each); fp32 also 4 tail-split
  // products and 12 tail-split FusedLinear (2 kernels each).
  EXPECT_EQ(generated, 2u * (3 * 5 + 4 * 2 + 2 * 12 + 12 * 2) + (4 + 12) * 2);
  EXPECT_GT(variants.size(), generated);
}

TEST(GemmNvrtc, CompilesEveryVariantSm80) { compileAll("sm_80"); }
TEST(GemmNvrtc, CompilesEveryVariantSm90a) { compileAll("sm_90a"); }
TEST(GemmNvrtcSweep, CompilesEveryVariantSm90) { compileAll("sm_90"); }

}  // namespace
}  // namespace pa
