// The backward epilogue fusions (passes/fuse_epilogue.cpp) in the before/after style: fuse-loss
// (MseLoss and its gradient into MseLossGrad) and fuse-bias-grad (a weight-gradient MatMul and
// its layer's bias SumTo into MatMulBiasGrad). Each pattern is found where it should be and left
// alone where it must be; the fused graph's loss and gradients equal the unfused graph's bit for
// bit in float64 (the CPU references keep the unfused order), on awkward sizes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "codegen/emit.h"
#include "graph/verifier.h"
#include "passes/autodiff.h"
#include "passes/dce.h"
#include "passes/fusion.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "runtime/cpu_executor.h"
#include "pass_test_util.h"
#include "test_util.h"
#include "training_graph.h"

namespace pa {
namespace {

using test::applyOne;
using test::countOps;

// Runs both graphs in float64 on the same parameters (by name) and inputs, and expects every
// graph output of `before` to be bitwise equal in `after`.
void expectBitwiseEqualOutputs(const Graph& before, const Graph& after, uint64_t seed) {
  const auto params = test::randomParams(before, seed);
  std::map<std::string, std::vector<double>> byName;
  for (const auto& kv : params) byName[before.value(kv.first).name] = kv.second;
  CpuExecutor<double> eb(before), ea(after);
  std::vector<std::vector<double>> keep;
  keep.reserve(2 * byName.size());
  for (auto [g, ex] : {std::pair<const Graph*, CpuExecutor<double>*>{&before, &eb}, {&after, &ea}}) {
    for (ValueId p : g->params()) {
      keep.push_back(byName.at(g->value(p).name));
      ex->bind(p, keep.back().data());
    }
    for (ValueId in : g->inputs()) test::fillRandom(ex->data(in), numel(g->shape(in)), seed + 100);
    ex->run();
  }
  for (const auto& [name, v] : before.outputs()) {
    ASSERT_TRUE(after.hasOutput(name)) << name;
    const ValueId w = after.output(name);
    const int64_t n = numel(before.shape(v));
    ASSERT_EQ(n, numel(after.shape(w))) << name;
    EXPECT_EQ(std::memcmp(eb.data(v), ea.data(w), static_cast<size_t>(n) * sizeof(double)), 0) << name << " differs";
  }
}

const int64_t kRows[] = {1, 7, 257};
const int64_t kUnits[] = {1, 3, 129};

// ---- fuse-loss -----------------------------------------------------------------------------

// A prediction (a parameter, so that it has a gradient) against a target, its MSE as "loss".
Graph lossGraph(int64_t rows, int64_t units) {
  Graph g;
  const ValueId p = g.addParam("p", {rows, units}, "xavier");
  const ValueId t = g.addInput("target", {rows, units});
  g.setOutput("loss", g.add(OpKind::MseLoss, {p, t}, {}, "loss"));
  appendBackward(g, g.output("loss"), g.params());
  return g;
}

TEST(FuseLoss, MseLossAndItsGradientBecomeOneNodeWithTheSameBits) {
  for (int64_t rows : kRows)
    for (int64_t units : kUnits) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(units));
      const Graph before = lossGraph(rows, units);
      Graph after = before;
      EXPECT_EQ(applyOne(after, makeFuseLossGradPattern()), 1);
      auto c = countOps(after);
      EXPECT_EQ(c[OpKind::MseLossGrad], 1);
      EXPECT_EQ(c[OpKind::MseLoss] + c[OpKind::Sub] + c[OpKind::Scale] + c[OpKind::Mul], 0);
      expectBitwiseEqualOutputs(before, after, 5);
    }
}

// The target's gradient (Scale(dp, -1)) stays and reads the fused node's gradient.
TEST(FuseLoss, TheTargetsGradientStays) {
  Graph g;
  const ValueId p = g.addParam("p", {7, 3}, "xavier"), t = g.addParam("t", {7, 3}, "xavier");
  g.setOutput("loss", g.add(OpKind::MseLoss, {p, t}, {}, "loss"));
  appendBackward(g, g.output("loss"), g.params());
  Graph fused = g;
  EXPECT_EQ(applyOne(fused, makeFuseLossGradPattern()), 1);
  EXPECT_EQ(countOps(fused)[OpKind::Scale], 1);
  expectBitwiseEqualOutputs(g, fused, 9);
}

// Not the pattern: a gradient scaled by another factor, and a dy that depends on the loss itself
// (the fused node would need its own output).
TEST(FuseLoss, LeavesOtherGraphsAlone) {
  for (int variant = 0; variant < 2; ++variant) {
    Graph g;
    const ValueId p = g.addParam("p", {7, 3}, "xavier"), t = g.addInput("target", {7, 3});
    const ValueId loss = g.add(OpKind::MseLoss, {p, t});
    const ValueId diff = g.add(OpKind::Sub, {p, t});
    const ValueId scaled = g.add(OpKind::Scale, {diff}, AttrMap().set<attr::ScaleFactor>(variant == 0 ? 1.0 / 21 : 2.0 / 21));
    const ValueId dy = variant == 0 ? g.addConstant(1.0, {}) : loss;
    g.setOutput("loss", loss);
    g.setOutput("grad", g.add(OpKind::Mul, {scaled, dy}));
    Graph fused = g;
    EXPECT_EQ(applyOne(fused, makeFuseLossGradPattern()), 0) << variant;
    EXPECT_EQ(countOps(fused)[OpKind::MseLossGrad], 0);
  }
}

// ---- fuse-bias-grad ------------------------------------------------------------------------

// One FusedLinear layer with a bias (x [..., K] an input; w [K, N] or [N, K] with transpose_w),
// ReLU or not, and its MSE against a target.
Graph linearGraph(Shape x, int64_t units, bool transposeW, const std::string& act) {
  Graph g;
  const int64_t k = x.back();
  const ValueId xi = g.addInput("x", x);
  const ValueId w = g.addParam("w", transposeW ? Shape{units, k} : Shape{k, units}, "xavier");
  const ValueId b = g.addParam("b", {units}, "xavier");
  const ValueId y = g.add(OpKind::FusedLinear, {xi, w, b}, AttrMap().set<attr::Activation>(act).set<attr::TransposeW>(transposeW));
  Shape ys = x;
  ys.back() = units;
  g.setOutput("loss", g.add(OpKind::MseLoss, {y, g.addInput("target", ys)}, {}, "loss"));
  appendBackward(g, g.output("loss"), g.params());
  return g;
}

TEST(FuseBiasGrad, WeightAndBiasGradientsBecomeOneNodeWithTheSameBits) {
  for (int64_t rows : kRows)
    for (int64_t units : kUnits)
      for (bool tw : {false, true})
        for (bool batched : {false, true}) {
          SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(units) + (tw ? " transpose_w" : "") + (batched ? " [2, rows, 5]" : ""));
          const Graph before = linearGraph(batched ? Shape{2, rows, 5} : Shape{rows, 5}, units, tw, rows == 7 ? "relu" : "none");
          Graph after = before;
          EXPECT_EQ(applyOne(after, makeFuseBiasGradPattern()), 1);
          auto c = countOps(after);
          EXPECT_EQ(c[OpKind::MatMulBiasGrad], 1);
          EXPECT_EQ(c[OpKind::SumTo], 0);
          for (NodeId id : after.topoOrder())
            if (after.node(id).op == OpKind::MatMulBiasGrad) {
              EXPECT_EQ(after.node(id).attrs.get<attr::BiasOperand>(), tw ? "a" : "b");
            }
          expectBitwiseEqualOutputs(before, after, 3);
        }
}

// A rewrite's nodes run where the nodes they replace ran (Node::place): the weight and bias
// gradients of each layer, which only the optimizer reads, are not left to the end of the step,
// where they would keep every layer's input and output gradient alive at once. So the fusion
// never grows the activation arena.
TEST(FuseBiasGrad, DoesNotGrowTheActivationArena) {
  Graph before;
  ValueId h = before.addInput("x", {512, 64});
  for (int layer = 0; layer < 4; ++layer) {
    const std::string i = std::to_string(layer);
    const ValueId w = before.addParam("w" + i, {64, 64}, "xavier"), b = before.addParam("b" + i, {64}, "xavier");
    h = before.add(OpKind::FusedLinear, {h, w, b}, AttrMap().set<attr::Activation>("relu"));
  }
  before.setOutput("loss", before.add(OpKind::MseLoss, {h, before.addInput("target", {512, 64})}, {}, "loss"));
  appendBackward(before, before.output("loss"), before.params());
  Graph after = before;
  EXPECT_EQ(applyOne(after, makeFuseBiasGradPattern()), 4);
  EXPECT_EQ(applyOne(after, makeFuseLossGradPattern()), 1);
  const int64_t was = planMemory(before).arenaElements, is = planMemory(after).arenaElements;
  EXPECT_LE(is, was) << "the fused step needs " << is << " floats of activations, the unfused " << was;
}

// Not the pattern: a bias gradient without a weight-gradient product (the bias added to a
// parameter directly), and a product by a batched right side.
TEST(FuseBiasGrad, LeavesOtherGraphsAlone) {
  {
    Graph g;
    const ValueId x = g.addParam("x", {7, 3}, "xavier"), b = g.addParam("b", {3}, "xavier");
    const ValueId y = g.add(OpKind::Add, {x, b});
    g.setOutput("loss", g.add(OpKind::MseLoss, {y, g.addInput("target", {7, 3})}, {}, "loss"));
    appendBackward(g, g.output("loss"), g.params());
    EXPECT_EQ(countOps(g)[OpKind::SumTo], 1);
    EXPECT_EQ(applyOne(g, makeFuseBiasGradPattern()), 0);
  }
  {
    Graph g;
    const ValueId x = g.addParam("x", {2, 7, 5}, "xavier"), w = g.addParam("w", {2, 5, 3}, "xavier");
    const ValueId b = g.addParam("b", {3}, "xavier");
    const ValueId y = g.add(OpKind::Add, {g.add(OpKind::MatMul, {x, w}), b});
    g.setOutput("loss", g.add(OpKind::MseLoss, {y, g.addInput("target", {2, 7, 3})}, {}, "loss"));
    appendBackward(g, g.output("loss"), g.params());
    EXPECT_EQ(applyOne(g, makeFuseBiasGradPattern()), 0);
  }
}

// The shape rules: the summed operand must be stored [K, L], both operands plain matrices.
TEST(FuseBiasGrad, ShapeRulesOfTheOp) {
  Graph g;
  const ValueId a = g.addParam("a", {7, 5}, "xavier"), b = g.addParam("b", {7, 3}, "xavier");
  AttrMap ok;
  ok.set<attr::TransposeA>(true).set<attr::BiasOperand>(std::string("b"));
  const Node& n = g.producer(g.add(OpKind::MatMulBiasGrad, {a, b}, ok));
  EXPECT_EQ(g.shape(n.outputs[0]), (Shape{5, 3}));
  EXPECT_EQ(g.shape(n.outputs[1]), (Shape{3}));
  AttrMap onA = ok;
  onA.set<attr::BiasOperand>(std::string("a"));
  EXPECT_EQ(g.shape(g.producer(g.add(OpKind::MatMulBiasGrad, {a, b}, onA)).outputs[1]), (Shape{5}));
  AttrMap bad;
  bad.set<attr::BiasOperand>(std::string("a"));  // a without transpose_a is stored [M, K]
  EXPECT_THROW(g.add(OpKind::MatMulBiasGrad, {g.addParam("c", {5, 7}, "xavier"), b}, bad), std::exception);
  AttrMap which = ok;
  which.set<attr::BiasOperand>(std::string("c"));
  EXPECT_THROW(g.add(OpKind::MatMulBiasGrad, {a, b}, which), std::exception);
}

// ---- the training pipeline and the examples ------------------------------------------------

TEST(EpilogueFusions, RunAfterAutodiffWithTheirKinds) {
  auto has = [](const std::vector<std::string>& v, const char* n) { return std::find(v.begin(), v.end(), n) != v.end(); };
  const TrainPipeline all = trainPipeline({"fuse-linear", "fuse-attention", "fuse-elementwise"}, Precision::Fp32, false);
  EXPECT_TRUE(has(all.training, "fuse-loss"));
  EXPECT_TRUE(has(all.training, "fuse-bias-grad"));
  EXPECT_EQ(all.training[1], "fuse-loss");  // first after autodiff, before fuse-elementwise takes the Sub, Scale, Mul
  const TrainPipeline none = trainPipeline({"fuse-linear", "fuse-elementwise"}, Precision::Fp32, true);
  EXPECT_FALSE(has(none.training, "fuse-loss"));
  EXPECT_FALSE(has(none.training, "fuse-bias-grad"));
  const TrainPipeline linearOnly = trainPipeline({"fuse-linear"}, Precision::Fp32, false);
  EXPECT_FALSE(has(linearOnly.training, "fuse-loss"));
  EXPECT_TRUE(has(linearOnly.training, "fuse-bias-grad"));
}

// Every linear layer with a bias of the MLP examples fuses its bias gradient; one loss each
// (attn_block: its q, k and v projections are one packed GEMM, the example listing qkv; mlp_tiny
// without the `mlp` its config lists, which would make its step one fused-mlp-train node).
TEST(EpilogueFusions, ExampleTrainingGraphs) {
  const std::map<std::string, int> biasGrads = {{"mlp_tiny", 3}, {"mlp_wide", 4}, {"attn_block", 5}};
  const std::vector<std::string> layers = {"compiler.fuse=[linear, attention, elementwise]"};
  for (const auto& [config, expected] : biasGrads) {
    SCOPED_TRACE(config);
    auto fused = countOps(test::trainingGraph(config, false, "fp32", config == "mlp_tiny" ? layers : std::vector<std::string>{}));
    EXPECT_EQ(fused[OpKind::MseLossGrad], 1);
    EXPECT_EQ(fused[OpKind::MatMulBiasGrad], expected);
    EXPECT_EQ(fused[OpKind::SumTo], 0);
    auto plain = countOps(test::trainingGraph(config, true));
    EXPECT_EQ(plain[OpKind::MseLossGrad] + plain[OpKind::MatMulBiasGrad], 0);
  }
  auto bf16 = countOps(test::trainingGraph("mlp_tiny", false, "bf16", layers));
  EXPECT_EQ(bf16[OpKind::MseLossGrad], 1);
  EXPECT_EQ(bf16[OpKind::MatMulBiasGrad], 3);
}

// ---- the emitted kernels (no NVRTC: codegen_nvrtc_tests compiles them) ---------------------

NodeId findOp(const Graph& g, OpKind op) {
  for (NodeId id : g.topoOrder())
    if (g.node(id).op == op) return id;
  return -1;
}

// One launch for the loss and the gradient at every size: one block up to 65536 terms, else a
// block per chunk with the last-block-done sum, whose counter needs a zeroed scratch.
TEST(EpilogueKernels, MseLossGradIsOneLaunch) {
  for (int64_t rows : {int64_t{7}, int64_t{8192}}) {
    Graph g = lossGraph(rows, 129);
    applyOne(g, makeFuseLossGradPattern());
    const codegen::NodeKernels nk = codegen::emitNode(g, findOp(g, OpKind::MseLossGrad));
    ASSERT_EQ(nk.kernels.size(), 1u);
    EXPECT_EQ(nk.zeroScratch, rows == 8192);
    EXPECT_NE(nk.kernels[0].source.find(rows == 8192 ? "out1[i + 256 * u] = ((p[u] - t[u]) * " : "out1[i] = ((p - t) * "), std::string::npos);
    if (rows == 8192) {
      EXPECT_NE(nk.kernels[0].source.find("*done = 0u"), std::string::npos);
    }
  }
}

// The generated path: the GEMM's kernels, then SumTo's column sums; the library path: nothing
// after cuBLASLt's BGRAD epilogue, the column sums where cuBLASLt did not take it.
TEST(EpilogueKernels, MatMulBiasGradOnBothProviders) {
  Graph g = linearGraph({8192, 5}, 129, false, "none");
  applyOne(g, makeFuseBiasGradPattern());
  const NodeId id = findOp(g, OpKind::MatMulBiasGrad);
  const codegen::NodeKernels nk = codegen::emitNode(g, id);
  ASSERT_GE(nk.kernels.size(), 2u);
  EXPECT_NE(nk.kernels.back().name.find("colsum_final"), std::string::npos);  // K = 8192: the split column sum
  for (size_t i = 0; i < nk.kernels.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_NE(nk.kernels[i].name, nk.kernels[j].name);
  const codegen::LibraryGemm lg = codegen::libraryGemmOf(g, id);
  EXPECT_TRUE(lg.supported);
  EXPECT_EQ(lg.biasGradOf, 1);
  EXPECT_FALSE(lg.bias);
  EXPECT_TRUE(codegen::libraryGemmEpilogue(g, id, true, false).kernels.empty());
  EXPECT_EQ(codegen::libraryGemmEpilogue(g, id, false, false).kernels.size(), 2u);
}

// A layer to one output: its forward is the row dot, its weight gradient with its bias gradient
// the column product, its input gradient the outer product, one kernel each, whatever the GEMM
// options; the column product leaves its ticket as it found it (the runner zeroes the scratch
// once). 16-byte accesses where a row allows them (256 features), scalar ones where not (5).
TEST(EpilogueKernels, ALayerToOneOutputTakesOneKernelPerProduct) {
  for (int64_t k : {int64_t{5}, int64_t{256}}) {
    SCOPED_TRACE("features " + std::to_string(k));
    Graph g;
    const ValueId x = g.addParam("x", {8192, k}, "xavier");  // a parameter, so that dx exists
    const ValueId w = g.addParam("w", {k, 1}, "xavier");
    const ValueId y = g.add(OpKind::FusedLinear, {x, w, g.addParam("b", {1}, "xavier")});
    g.setOutput("loss", g.add(OpKind::MseLoss, {y, g.addInput("target", {8192, 1})}, {}, "loss"));
    appendBackward(g, g.output("loss"), g.params());
    applyOne(g, makeFuseBiasGradPattern());
    const std::string vec = k % 4 == 0 ? "VEC = 4" : "VEC = 1";
    for (codegen::Fp32Gemm engine : {codegen::Fp32Gemm::Auto, codegen::Fp32Gemm::Simt}) {
      codegen::EmitOptions opt;
      opt.fullRateFp64 = true;
      opt.fp32Gemm = engine;
      const codegen::NodeKernels fwd = codegen::emitNode(g, findOp(g, OpKind::FusedLinear), opt);
      ASSERT_EQ(fwd.kernels.size(), 1u);
      EXPECT_NE(fwd.kernels[0].name.find("_rowdot"), std::string::npos);
      EXPECT_NE(fwd.kernels[0].source.find(vec), std::string::npos);
      EXPECT_NE(fwd.kernels[0].source.find("v += (float)in2[0];"), std::string::npos);  // the bias
      const codegen::NodeKernels wg = codegen::emitNode(g, findOp(g, OpKind::MatMulBiasGrad), opt);
      ASSERT_EQ(wg.kernels.size(), 1u);
      EXPECT_NE(wg.kernels[0].name.find("_colprod"), std::string::npos);
      EXPECT_NE(wg.kernels[0].source.find(vec), std::string::npos);
      EXPECT_NE(wg.kernels[0].source.find("out1[0] = (float)bred[0]"), std::string::npos);
      EXPECT_NE(wg.kernels[0].source.find("tickets[blockIdx.x] = 0u"), std::string::npos);
      EXPECT_TRUE(wg.zeroScratch);
      EXPECT_GE(wg.kernels[0].grid[1], 2u);  // K = 8192 is cut into parts
      const codegen::NodeKernels dx = codegen::emitNode(g, g.producer(g.output("grad/x")).id, opt);
      ASSERT_EQ(dx.kernels.size(), 1u);
      EXPECT_NE(dx.kernels[0].name.find("_outer"), std::string::npos);
      EXPECT_NE(dx.kernels[0].source.find(vec), std::string::npos);
    }
  }
}

// On the mma.sync kernels (fp32 where FP64 runs at full rate) the product sums the bias operand
// itself: a split product's partial sums go to the scratch after the partial products and its
// reduce kernel adds them into output 1; a whole product writes output 1 directly. Either operand.
TEST(EpilogueKernels, MatMulBiasGradSumsInsideTheMmaSyncProduct) {
  codegen::EmitOptions opt;
  opt.fullRateFp64 = true;
  for (bool tw : {false, true}) {
    SCOPED_TRACE(tw ? "transpose_w (dY is A)" : "dY is B");
    Graph g = linearGraph({8192, 5}, 129, tw, "none");
    applyOne(g, makeFuseBiasGradPattern());
    const NodeId id = findOp(g, OpKind::MatMulBiasGrad);
    const std::string operand = tw ? "1" : "2";
    const codegen::NodeKernels split = codegen::emitNode(g, id, opt);  // K = 8192 on 1-2 tiles: split
    ASSERT_EQ(split.kernels.size(), 2u);
    EXPECT_NE(split.kernels[0].source.find("pa::gemm::f64Gemm<"), std::string::npos);
    EXPECT_NE(split.kernels[0].source.find("pa::gemm::OperandSums<" + operand + ", double>"), std::string::npos);
    EXPECT_NE(split.kernels[1].source.find("pa::gemm::splitReduceSums<"), std::string::npos);
    EXPECT_NE(split.kernels[1].source.find("out1"), std::string::npos);
    EXPECT_EQ(split.kernels[0].source.find("out1"), std::string::npos);
    codegen::EmitOptions whole = opt;
    whole.gemmTile = codegen::GemmTile::Medium;  // forced tiles: one product, no split
    const codegen::NodeKernels one = codegen::emitNode(g, id, whole);
    ASSERT_EQ(one.kernels.size(), 1u);
    EXPECT_NE(one.kernels[0].source.find("pa::gemm::OperandSums<" + operand + ", float>{out1}"), std::string::npos);
    opt.fp32Gemm = codegen::Fp32Gemm::Simt;  // the SIMT kernel: SumTo's column sums after the product
    const codegen::NodeKernels simt = codegen::emitNode(g, id, opt);
    EXPECT_NE(simt.kernels.back().name.find("colsum"), std::string::npos);
    EXPECT_EQ(simt.kernels[0].source.find("OperandSums"), std::string::npos);
    opt.fp32Gemm = codegen::Fp32Gemm::Auto;
  }
}

}  // namespace
}  // namespace pa
