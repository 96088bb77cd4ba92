// The generated GEMM's choices without compiling anything (CPU suite): which template and
// headers each variant uses, what the kernels after a cuBLASLt product do, where bf16 operands
// take the wgmma kernel and where a tail split pays. nvrtc/gemm_nvrtc_test.cpp compiles them.
#include <gtest/gtest.h>

#include <map>

#include "codegen/embedded_kernels.h"
#include "codegen/gemm_plan.h"
#include "tests/gemm_variants.h"

namespace pa {
namespace {

using codegen::GemmTile;
using gemmtest::GemmProblem;
using gemmtest::Variant;

TEST(GemmEmit, LibraryEpiloguesDoWhatTheLibraryLeft) {
  // Nothing left: no bias, or bias and ReLU both applied by cuBLASLt, or a plain MatMul.
  std::map<std::string, bool> hasKernel;
  for (const Variant& v : gemmtest::libraryEpilogues()) hasKernel[v.name] = true;
  EXPECT_FALSE(hasKernel.count("lib_none_0"));
  EXPECT_FALSE(hasKernel.count("lib_relu_bias_3"));
  EXPECT_FALSE(hasKernel.count("lib_none_bias_1"));
  EXPECT_TRUE(hasKernel.count("lib_none_bias_0"));  // bias not applied: the kernel adds it
  EXPECT_TRUE(hasKernel.count("lib_relu_bias_1"));  // ReLU not applied
  EXPECT_TRUE(hasKernel.count("lib_gelu_3"));       // GELU is never cuBLASLt's (tanh form)
  EXPECT_TRUE(hasKernel.count("lib_actgrad_relu") && hasKernel.count("lib_actgrad_gelu"));
  // SwiGLU's pairs always run after the library product; a bias it did not add runs first.
  EXPECT_TRUE(hasKernel.count("lib_swiglu_3") && !hasKernel.count("lib_swiglu_3_2"));
  EXPECT_TRUE(hasKernel.count("lib_swiglu_bias_0") && hasKernel.count("lib_swiglu_bias_0_2"));
  EXPECT_FALSE(hasKernel.count("lib_swiglu_bias_1_2"));
  // Rope's turn always runs after the library product, with a bias it did not add in the same pass.
  EXPECT_TRUE(hasKernel.count("lib_rope_3") && !hasKernel.count("lib_rope_3_2"));
  EXPECT_TRUE(hasKernel.count("lib_rope_bias_0") && !hasKernel.count("lib_rope_bias_0_2"));
  for (const Variant& v : gemmtest::libraryEpilogues()) {
    if (v.name.find("gelu") != std::string::npos) {
      EXPECT_NE(v.kernel.source.find("erff("), std::string::npos) << v.name;
    }
    if (v.name.find("rope") != std::string::npos) {
      EXPECT_NE(v.kernel.source.find("sincosf("), std::string::npos) << v.name;
      EXPECT_EQ(v.kernel.source.find("in2[n]") != std::string::npos, v.name == "lib_rope_bias_0" || v.name == "lib_rope_bias_2") << v.name;
    }
    if (v.name == "lib_relu_bias_1") {
      EXPECT_NE(v.kernel.source.find("fmaxf("), std::string::npos);
    }
  }
}

TEST(GemmEmit, Bf16OperandsTakeTheWgmmaKernelWhereTheyCan) {
  // The product reads both operands through TMA maps; a K split's partial sums go to a reduce
  // kernel.
  for (const Variant& v : gemmtest::wgmmaVariants()) {
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

// Where the wgmma kernel runs each epilogue (EmitOptions::wgmmaEpilogue Auto): on the staged raw
// sums where it reads or writes more than C (GELU's saved input, SwiGLU's h, an activation
// gradient's x, which it reads four at a time through kAux), on the fragments where it does not.
TEST(GemmEmit, WgmmaEpiloguesThatReadOrWriteMoreThanCRunOnTheStagedSums) {
  int seen = 0;
  for (const Variant& v : gemmtest::wgmmaVariants()) {
    if (v.kernel.name.find("_reduce") != std::string::npos || v.name.find("_split") != std::string::npos) continue;
    const bool actGrad = v.name.find("MatMulActGrad_") == 0, forced = v.name.find("_staged") != std::string::npos ||
                                                                     v.name.find("_fragments") != std::string::npos;
    const bool staged = forced ? v.name.find("_staged") != std::string::npos : actGrad || v.name.find("FusedLinear_gelu") == 0;
    EXPECT_NE(v.kernel.source.find(std::string("kStageRaw = ") + (staged ? "true" : "false")), std::string::npos) << v.name;
    EXPECT_NE(v.kernel.source.find(std::string("kAux = ") + (actGrad ? "true" : "false")), std::string::npos) << v.name;
    EXPECT_EQ(v.kernel.source.find("withAux(float v, float s)") != std::string::npos, actGrad) << v.name;
    ++seen;
  }
  // 2 output types × 3 tiles × 14 products that are not split, 2 bias gradients, 10 ping-pong products
  EXPECT_EQ(seen, 2 * 3 * 14 + 2 + 10);
}

// MatMulBiasGrad on the bf16 wgmma kernel: the bias operand (stored [K, L], so MN-major: A
// transposed, B as stored) summed inside the product where the sums are fp32; split products write
// fp64 partial sums that the reduce kernel adds; bf16 sums get the column-sum kernels after it.
TEST(GemmEmit, Bf16WeightGradientsSumTheBiasOperandInsideTheProduct) {
  struct Case {
    const char* operand;
    bool ta, tb;
    int splits;
    bool inside;  // (false: bf16 outputs)
  };
  for (const Case& k : {Case{"b", true, false, 0, true}, Case{"a", true, true, 0, true}, Case{"b", true, false, 3, true},
                        Case{"b", true, false, 0, false}}) {
    SCOPED_TRACE(std::string(k.operand) + (k.ta ? " tA" : "") + (k.tb ? " tB" : "") + ", " + std::to_string(k.splits) + " splits" +
                 (k.inside ? "" : ", bf16 outputs"));
    GemmProblem p = gemmtest::matmulProblem(256, 512, 2048, k.ta, k.tb);
    p.biasGrad = k.operand;
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    gemmtest::storeOperandsInBf16(g, id, !k.inside);
    codegen::EmitOptions opt;
    opt.wgmma = true, opt.gemmTile = GemmTile::Large, opt.gemmSplits = k.splits;
    const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
    const std::string sums = std::string("pa::gemm::OperandSums<") + (std::string(k.operand) == "a" ? "1" : "2") +
                             (k.splits > 1 ? ", double>" : ", float>{out1}");
    ASSERT_FALSE(nk.kernels.empty());
    EXPECT_NE(nk.kernels[0].source.find("pa::gemm::wgmmaGemm<"), std::string::npos);
    EXPECT_EQ(nk.kernels[0].source.find(sums) != std::string::npos, k.inside);
    EXPECT_EQ(nk.kernels.size(), k.inside ? (k.splits > 1 ? 2u : 1u) : 3u);  // else the product and two column-sum kernels
    if (k.inside && k.splits > 1) {
      EXPECT_NE(nk.kernels[1].source.find("splitReduceSums<"), std::string::npos);
    }
  }
}

// The split-K reduce's elements a thread (kernels/gemm_common.cuh, splitReduce): 4 where N is a
// multiple of 4, the S chunks fit 32 registers and MN / 1024 blocks still cover the SMs; 2 where
// only MN / 512 do (or S·4 > 32 ≥ S·2); else 1 (N odd, 32 splits, a grid too small).
TEST(GemmEmit, SplitReduceTakesTheWidestChunksItsShapeAllows) {
  struct Case {
    int64_t m, n, k;
    int splits, sms, width;
  };
  for (const Case& k : {Case{1024, 1024, 8192, 4, 132, 4}, Case{256, 512, 2048, 3, 132, 2}, Case{256, 512, 2048, 3, 2, 4},
                        Case{512, 512, 8192, 16, 132, 2}, Case{256, 256, 8192, 32, 132, 1}, Case{1000, 1001, 1000, 3, 132, 1},
                        Case{136, 264, 4000, 3, 132, 1}}) {
    SCOPED_TRACE(std::to_string(k.m) + "x" + std::to_string(k.n) + "x" + std::to_string(k.k) + ", " + std::to_string(k.splits) +
                 " splits, " + std::to_string(k.sms) + " SMs");
    GemmProblem p = gemmtest::matmulProblem(k.m, k.n, k.k, true, false);
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    gemmtest::storeOperandsInBf16(g, id, false);
    codegen::EmitOptions opt;
    opt.wgmma = true, opt.gemmTile = GemmTile::Large, opt.gemmSplits = k.splits, opt.sms = k.sms;
    const codegen::NodeKernels nk = codegen::emitNode(g, id, opt);
    ASSERT_FALSE(nk.kernels.empty());
    const codegen::Kernel& reduce = nk.kernels.back();  // (after any operand copies and the product)
    ASSERT_NE(reduce.name.find("_reduce"), std::string::npos);
    EXPECT_NE(reduce.source.find("_problem, " + std::to_string(k.width) + ">(scratch"), std::string::npos);
    EXPECT_EQ(reduce.grid[0], static_cast<unsigned>((k.m * k.n / k.width + 255) / 256));
  }
}

// GemmTile::PingPong: the bf16 wgmma kernel with ping-pong consumers (128 × 128 tiles, the
// medium tile's ring and grid), operand sums included; where they do not apply (TF32, fp32
// operands on the other kernels) the same emission as Medium.
TEST(GemmEmit, PingPongTakesTheBf16WgmmaKernelElseTheMediumTile) {
  auto emit = [](const GemmProblem& p, bool bf16, bool tf32, GemmTile tile) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    if (bf16) gemmtest::storeOperandsInBf16(g, id, p.biasGrad.empty());
    codegen::EmitOptions opt;
    opt.wgmma = true, opt.tf32 = tf32, opt.gemmTile = tile, opt.sms = 132;
    return codegen::emitNode(g, id, opt);
  };
  auto sources = [](const codegen::NodeKernels& nk) {
    std::string s;
    for (const codegen::Kernel& k : nk.kernels) s += k.source;
    return s;
  };
  GemmProblem swiglu;
  swiglu.fused = true, swiglu.act = "swiglu", swiglu.a = {8192, 512}, swiglu.b = {512, 3072};
  GemmProblem actGrad = gemmtest::matmulProblem(1000, 512, 64, false, true);
  actGrad.gradAct = "relu";
  GemmProblem biasGrad = gemmtest::matmulProblem(256, 512, 2048, true, false);
  biasGrad.biasGrad = "b";
  for (const GemmProblem& p : {gemmtest::matmulProblem(201, 264, 72, false, true), swiglu, actGrad, biasGrad}) {
    const codegen::NodeKernels pp = emit(p, true, false, GemmTile::PingPong), medium = emit(p, true, false, GemmTile::Medium);
    ASSERT_EQ(pp.kernels.size(), 1u);
    EXPECT_NE(pp.kernels[0].source.find("WgmmaConfig<128, 2, 6, false, true>"), std::string::npos);
    EXPECT_EQ(pp.kernels[0].grid, medium.kernels[0].grid);
    EXPECT_EQ(pp.kernels[0].block, medium.kernels[0].block);
    EXPECT_EQ(pp.kernels[0].sharedBytes, medium.kernels[0].sharedBytes);
  }
  const GemmProblem plain = gemmtest::matmulProblem(201, 264, 72, false, true);
  EXPECT_EQ(sources(emit(plain, false, true, GemmTile::PingPong)), sources(emit(plain, false, true, GemmTile::Medium)));
  EXPECT_EQ(sources(emit(plain, false, false, GemmTile::PingPong)), sources(emit(plain, false, false, GemmTile::Medium)));
  EXPECT_EQ(sources(emit(plain, false, true, GemmTile::Medium)).find("true, true>"), std::string::npos);
}

// Where the wgmma kernel stores C by TMA (EmitOptions::wgmmaTmaStores): the epilogues on the
// fragments (and a split product's partial sums, fp32) whose rows are whole 16-byte chunks; the
// staged-raw epilogues, N = 100 in bf16 and the forced cases store by the threads.
TEST(GemmEmit, WgmmaProductsStoreCByTmaWhereItsRowsAreWholeChunks) {
  int tma = 0, threads = 0;
  for (const Variant& v : gemmtest::wgmmaVariants()) {
    if (v.kernel.name.find("_reduce") != std::string::npos) continue;
    const bool split = v.kernel.name.find("_split") != std::string::npos;
    const bool staged = v.kernel.source.find("kStageRaw = true") != std::string::npos;
    const bool bf16Rows100 = v.name.find("MatMul_n100_t2_bf16out") == 0;
    const bool want = split || (!staged && !bf16Rows100 && v.name.find("_threadstores") == std::string::npos);
    int maps = 0;
    for (const codegen::KernelArg& a : v.kernel.args) {
      if (a.kind != codegen::KernelArg::OutputTensorMap && !(a.kind == codegen::KernelArg::ScratchTensorMap && a.index < 0)) continue;
      ++maps;
      EXPECT_EQ(a.kind == codegen::KernelArg::ScratchTensorMap, split) << v.name;
      EXPECT_EQ(a.map.elementBytes, split || v.name.find("_f32out") != std::string::npos ? 4u : 2u) << v.name;
      EXPECT_EQ(a.map.box[0] * a.map.elementBytes, 128u) << v.name;
      EXPECT_EQ(a.map.box[1], 64u) << v.name;
    }
    EXPECT_EQ(maps, want ? 1 : 0) << v.name;
    EXPECT_EQ(v.kernel.source.find(split ? ", mapParts)" : ", mapOut") != std::string::npos, want) << v.name;
    ++(want ? tma : threads);
  }
  EXPECT_GT(tma, 0);
  EXPECT_GT(threads, 0);
}

TEST(GemmEmit, EmbedsTheTemplates) {
  for (const char* name : {"kernels/gemm_common.cuh", "kernels/gemm_ptx.cuh", "kernels/gemm_simt.cuh", "kernels/gemm_tf32.cuh",
                           "kernels/mma_f64.cuh", "kernels/gemm_wgmma.cuh"}) {
    bool found = false;
    for (const auto& f : codegen::embeddedKernelFiles()) found |= std::string(f.name) == name;
    EXPECT_TRUE(found) << name;
  }
}

TEST(GemmEmit, OptionsPickThePath) {
  for (const Variant& v : gemmtest::allVariants()) {
    const bool tf32 = v.name.find("_tf32") != std::string::npos, tail = v.name.find("_tail") != std::string::npos;
    const bool f64 = v.name.find("_f64") != std::string::npos;
    const bool reduce = v.kernel.name.find("_reduce") != std::string::npos;
    const char* expected = reduce ? (tail ? "pa::gemm::simtTailReduce<" : "pa::gemm::splitReduce<")
                           : tf32 ? "pa::gemm::tf32Gemm<"
                           : f64  ? "pa::gemm::f64Gemm<"
                           : tail ? "pa::gemm::simtGemmTail<"
                                  : "pa::gemm::simtGemm<";
    EXPECT_NE(v.kernel.source.find(expected), std::string::npos) << v.name;
    // Each kernel includes its family's header only: split-K's reduce the shared one.
    const char* header = reduce && !tail ? "kernels/gemm_common.cuh" : tf32 || f64 ? "kernels/gemm_tf32.cuh" : "kernels/gemm_simt.cuh";
    EXPECT_EQ(v.kernel.headers, std::vector<std::string>{header}) << v.name;
  }
}

// The tail split from the shape (fp32, large tiles, 132 SMs): where the last wave is a small part
// of a long product; not where it is nearly full, nor for batches, TF32 or K splits.
TEST(GemmEmit, TailSplitWhereTheLastWaveIsPartial) {
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

// fp32 products under precision fp32: the FP64 tensor-core kernel where the target runs FP64 at
// full rate (or forced), the SIMT kernel elsewhere (or forced); the FP64 kernel takes the SIMT
// plan's tiles, one block an SM, never a tail split, and splits that fill one wave
// (chooseF64Gemm). TF32 and bf16 operands keep their kernels.
TEST(GemmEmit, Fp32ProductsTakeTheFp64KernelOnFullRateTargets) {
  auto emit = [](const GemmProblem& p, bool fullRate, codegen::Fp32Gemm engine, bool tf32 = false) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    codegen::EmitOptions opt;
    opt.fullRateFp64 = fullRate, opt.fp32Gemm = engine, opt.tf32 = tf32;
    return codegen::emitNode(g, id, opt);
  };
  auto uses = [](const codegen::NodeKernels& nk, const char* algo) {
    for (const codegen::Kernel& k : nk.kernels)
      if (k.source.find(algo) != std::string::npos) return true;
    return false;
  };
  using codegen::Fp32Gemm;
  const GemmProblem square = gemmtest::matmulProblem(8192, 4096, 4096, false, false);
  const codegen::NodeKernels f64 = emit(square, true, Fp32Gemm::Auto);
  ASSERT_EQ(f64.kernels.size(), 1u);  // no tail split (the SIMT kernel splits this one's last wave)
  EXPECT_TRUE(uses(f64, "pa::gemm::f64Gemm<"));
  EXPECT_NE(f64.kernels[0].source.find("Tf32Config<128, 128, 16, 2, 4, 2>"), std::string::npos);
  EXPECT_NE(f64.kernels[0].source.find("__launch_bounds__(256, 1)"), std::string::npos);
  EXPECT_EQ(f64.kernels[0].block[0], 256u);
  EXPECT_EQ(f64.kernels[0].grid[0], 2048u);
  EXPECT_EQ(f64.kernels[0].headers, std::vector<std::string>{"kernels/gemm_tf32.cuh"});
  EXPECT_TRUE(uses(emit(square, false, Fp32Gemm::Auto), "pa::gemm::simtGemmTail<"));
  EXPECT_TRUE(uses(emit(square, true, Fp32Gemm::Simt), "pa::gemm::simtGemmTail<"));
  EXPECT_TRUE(uses(emit(square, false, Fp32Gemm::F64Mma), "pa::gemm::f64Gemm<"));
  EXPECT_TRUE(uses(emit(square, true, Fp32Gemm::F64Mma, true), "pa::gemm::tf32Gemm<"));
  // Weight gradients the large tiles cannot fill: split into one wave of blocks, then the shared
  // reduce. 1024×1024: 64 tiles, 2 splits (the SIMT plan's too); 256×768: 12 tiles, 11 splits
  // (the SIMT plan's 32 make three waves); 256×256: 4 tiles, 33 splits; 256×768 with K 1024: 128
  // of K a split at least, so 8.
  struct Dw {
    int64_t m, n, k;
    int splits;
  };
  for (const Dw& d : {Dw{1024, 1024, 8192, 2}, Dw{256, 768, 8192, 11}, Dw{256, 256, 8192, 33}, Dw{256, 768, 1024, 8}}) {
    SCOPED_TRACE(std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k));
    const codegen::NodeKernels split = emit(gemmtest::matmulProblem(d.m, d.n, d.k, true, false), true, Fp32Gemm::Auto);
    EXPECT_EQ(codegen::chooseF64Gemm(1, d.m, d.n, d.k), (std::pair<codegen::GemmTile, int>{codegen::GemmTile::Large, d.splits}));
    ASSERT_EQ(split.kernels.size(), 2u);
    EXPECT_TRUE(uses(split, "pa::gemm::f64Gemm<"));
    EXPECT_NE(split.kernels[0].source.find("splits = " + std::to_string(d.splits) + ";"), std::string::npos);
    EXPECT_EQ(split.kernels[0].grid[2], static_cast<unsigned>(d.splits));
    EXPECT_TRUE(uses(split, "pa::gemm::splitReduce<"));
  }
  EXPECT_EQ(codegen::chooseF64Gemm(1, 1024, 1024, 8192), codegen::chooseGemm(false, 1, 1024, 1024, 8192));
  EXPECT_EQ(codegen::chooseF64Gemm(1, 8192, 4096, 4096), codegen::chooseGemm(false, 1, 8192, 4096, 4096));  // no split
  EXPECT_EQ(codegen::chooseF64Gemm(1, 384, 256, 1024), codegen::chooseGemm(false, 1, 384, 256, 1024));    // medium tiles
}

}  // namespace
}  // namespace pa
