// Every op of ops.def against finite differences in float64, on random inputs, including
// broadcasting, transposes, batched matmuls, masks with q_len != kv_len and fully masked rows.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "graph/verifier.h"
#include "op_cases.h"
#include "test_util.h"

namespace pa {
namespace {

using test::OpCase;
using test::allCases;

// Backward-only ops are covered through the forward op whose rule emits them.
const std::map<OpKind, OpKind> kEmittedBy = {
    {OpKind::ReluGrad, OpKind::Relu},       {OpKind::GeluGrad, OpKind::Gelu},
    {OpKind::TanhGrad, OpKind::Tanh},       {OpKind::SigmoidGrad, OpKind::Sigmoid},
    {OpKind::SoftmaxGrad, OpKind::Softmax}, {OpKind::SoftmaxSinkGrad, OpKind::Softmax},
    {OpKind::FlashAttentionGrad, OpKind::FlashAttention}, {OpKind::FlashAttentionQkvGrad, OpKind::FlashAttentionQkv},
    {OpKind::SiluGrad, OpKind::Silu},       {OpKind::GeluTanhGrad, OpKind::GeluTanh},
    {OpKind::LayerNormGrad, OpKind::LayerNorm}, {OpKind::RmsNormGrad, OpKind::RmsNorm},
    {OpKind::SwigluGrad, OpKind::FusedLinear},      {OpKind::FusedMlpGrad, OpKind::FusedMlp},
};

class OpGradCheck : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpGradCheck, MatchesFiniteDifferencesInFloat64) {
  const OpCase& c = GetParam();
  Graph g;
  const ValueId out = c.build(g);
  test::addWeightedSumLoss(g, out);
  verifyGraph(g);
  const uint64_t seed = std::hash<std::string>{}(c.name);
  const auto init = test::randomParams(g, seed, c.ranges);
  const ValueId w = g.findValue("loss_weights");
  const test::GradCheckResult r = test::gradCheck(g, init, [&](CpuExecutor<double>& ex) {
    test::fillRandom(ex.data(w), numel(g.shape(w)), seed + 1);
  });
  verifyGraph(g);
  EXPECT_GT(r.checked, 0);
  EXPECT_FALSE(r.anyNonFinite) << c.name;
  EXPECT_LT(r.maxError, 1e-6) << c.name << ": worst at " << r.where;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpGradCheck, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

TEST(OpTable, EveryDifferentiableOpHasAGradientCase) {
  std::set<OpKind> covered;
  for (const OpCase& c : allCases()) covered.insert(c.op);
  for (int k = 0; k < kNumOps; ++k) {
    const OpInfo& info = opInfo(static_cast<OpKind>(k));
    if (info.grad == GradKind::Differentiable) {
      EXPECT_TRUE(covered.count(info.kind)) << info.name << " has no gradient case";
    }
  }
}

// Backward-only ops that a pass makes from a checked rule's output instead of a rule itself;
// fusion_test.cpp (matmul-act-grad), epilogue_fusion_test.cpp (matmul-bias-grad,
// mse-loss-grad) and fused_mlp_test.cpp (fused-mlp-train) check each against the graph it replaces.
const std::set<OpKind> kMadeByBackwardFusion = {OpKind::MatMulActGrad, OpKind::MatMulBiasGrad, OpKind::MseLossGrad,
                                                OpKind::FusedMlpTrain};

TEST(OpTable, EveryBackwardOnlyOpIsEmittedByACheckedRule) {
  for (int k = 0; k < kNumOps; ++k) {
    const OpInfo& info = opInfo(static_cast<OpKind>(k));
    if (info.grad != GradKind::BackwardOnly || kMadeByBackwardFusion.count(info.kind)) continue;
    auto it = kEmittedBy.find(info.kind);
    ASSERT_NE(it, kEmittedBy.end()) << info.name << " has no forward op in kEmittedBy";
    // Some case of the forward op must actually emit it.
    bool emitted = false;
    for (const OpCase& c : allCases()) {
      if (c.op != it->second) continue;
      Graph g;
      test::addWeightedSumLoss(g, c.build(g));
      appendBackward(g, g.output("loss"), g.params());
      for (const Node& n : g.nodes()) emitted |= n.op == info.kind;
    }
    EXPECT_TRUE(emitted) << info.name << " never appears in a checked backward graph";
  }
}

TEST(OpTable, NamesRoundTripAndAreUnique) {
  std::set<std::string> names;
  for (int k = 0; k < kNumOps; ++k) {
    const OpInfo& info = opInfo(static_cast<OpKind>(k));
    EXPECT_TRUE(names.insert(info.name).second) << "duplicate op name " << info.name;
    OpKind back;
    ASSERT_TRUE(opFromName(info.name, back));
    EXPECT_EQ(static_cast<int>(back), k);
  }
}

}  // namespace
}  // namespace pa
