// The graph IR, verifier, printers and pass driver.
#include <gtest/gtest.h>

#include <sstream>

#include "common/errors.h"
#include "graph/printer.h"
#include "graph/verifier.h"
#include "passes/dce.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"

namespace pa {
namespace {

TEST(Graph, ShapeErrorNamesTheNodeAndBothShapes) {
  Graph g;
  const ValueId a = g.addInput("a", {2, 3});
  const ValueId b = g.addParam("w", {4, 5}, "xavier");
  try {
    g.add(OpKind::MatMul, {a, b}, {}, "proj");
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("node 'proj'"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  }
  EXPECT_THROW(g.add(OpKind::Add, {a, b}), ShapeError);
  EXPECT_THROW(g.add(OpKind::Relu, {a, a}), ShapeError);  // arity
  EXPECT_THROW(g.add(OpKind::Reshape, {a}, AttrMap().set<attr::Shape>({5})), ShapeError);
  EXPECT_THROW(g.add(OpKind::Permute, {a}, AttrMap().set<attr::Perm>({0, 0})), ShapeError);
  EXPECT_THROW(g.add(OpKind::Softmax, {a}, AttrMap().set<attr::Axis>(2)), ShapeError);
}

// Every value has at most kMaxRank dimensions (the CPU kernels' strided views hold that many):
// Graph::add refuses more, by name, whichever op makes them (an input, a parameter, a reshape, a
// broadcast), and takes exactly kMaxRank (found by the config fuzzer: a model.input of 81 ones
// reached the CPU kernels and crashed).
TEST(Graph, ValuesOfMoreThanMaxRankDimensionsAreRefused) {
  Graph g;
  const Shape eight(kMaxRank, 1), nine(kMaxRank + 1, 1);
  const ValueId a = g.addInput("a", eight);
  EXPECT_EQ(g.shape(a).size(), static_cast<size_t>(kMaxRank));
  try {
    g.addInput("b", nine);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("node 'b'"), std::string::npos) << m;
    EXPECT_NE(m.find("output has 9 dimensions; at most 8 are supported"), std::string::npos) << m;
  }
  EXPECT_THROW(g.addParam("w", nine, "xavier"), ShapeError);
  EXPECT_THROW(g.add(OpKind::Reshape, {a}, AttrMap().set<attr::Shape>(std::vector<int64_t>(kMaxRank + 1, 1))), ShapeError);
  const ValueId c = g.addParam("c", {1}, "zeros");
  EXPECT_NO_THROW(g.add(OpKind::Add, {a, c}));  // broadcast up to kMaxRank
}

// attrs.def and ops.def agree: every attribute an op names has a typed key, every typed key is
// some op's, and a key declared twice (two defaults) has one kind.
TEST(Graph, AttributeListMatchesTheOpList) {
  struct Key {
    const char* key;
    AttrKind kind;
  };
  const Key keys[] = {
#define PA_ATTR(Name, Key, Kind, Default) {Key, AttrKind::Kind},
#include "graph/attrs.def"
  };
  for (const Key& k : keys) {
    AttrKind kind;
    ASSERT_TRUE(attrKindOf(k.key, kind));
    EXPECT_EQ(kind, k.kind) << k.key << " is declared with two kinds";
    bool used = false;
    for (int op = 0; op < kNumOps; ++op) used = used || opHasAttr(static_cast<OpKind>(op), k.key);
    EXPECT_TRUE(used) << k.key << " is no op's attribute";
  }
  for (int op = 0; op < kNumOps; ++op) {
    std::istringstream names(opInfo(static_cast<OpKind>(op)).attrs);
    AttrKind kind;
    for (std::string name; names >> name;) EXPECT_TRUE(attrKindOf(name, kind)) << name << " has no entry in attrs.def";
  }
}

TEST(Graph, VerifierCatchesUseBeforeDefinitionAndErasedProducers) {
  Graph g;
  const ValueId x = g.addInput("x", {2, 2});
  const ValueId r = g.add(OpKind::Relu, {x});
  const ValueId t = g.add(OpKind::Tanh, {r});
  g.setOutput("out", t);
  verifyGraph(g);
  g.node(g.value(r).producer).erased = true;  // t now reads a value nobody defines
  EXPECT_THROW(verifyGraph(g), ShapeError);
  g.node(g.value(r).producer).erased = false;
  g.node(g.value(r).producer).inputs[0] = t;  // a cycle: relu reads tanh's output
  EXPECT_THROW(verifyGraph(g), ShapeError);
}

TEST(Graph, VerifierCatchesStaleTypes) {
  Graph g;
  const ValueId x = g.addInput("x", {2, 2});
  const ValueId y = g.addInput("y", {2, 3});
  const ValueId s = g.add(OpKind::Relu, {x});
  g.node(g.value(s).producer).inputs[0] = y;  // recorded [2, 2], inferred [2, 3]
  EXPECT_THROW(verifyGraph(g), ShapeError);
}

TEST(Graph, TextAndDotPrintersAreDeterministicAndComplete) {
  auto build = [] {
    Graph g;
    const ValueId x = g.addInput("x", {4, 3});
    const ValueId w = g.addParam("w", {3, 2}, "xavier");
    const ValueId y = g.add(OpKind::MatMul, {x, w}, AttrMap().set<attr::TransposeB>(false));
    g.setOutput("y", g.add(OpKind::Scale, {y}, AttrMap().set<attr::ScaleFactor>(0.5)));
    return g;
  };
  const Graph a = build(), b = build();
  EXPECT_EQ(graphToText(a, "t"), graphToText(b, "t"));
  EXPECT_EQ(graphToDot(a, "t"), graphToDot(b, "t"));
  const std::string text = graphToText(a, "t");
  EXPECT_NE(text.find("%matmul = matmul(%x, %w) {transpose_b=false} : f32[4, 2]"), std::string::npos) << text;
  EXPECT_NE(text.find("output y = %scale"), std::string::npos) << text;
  const std::string dot = graphToDot(a, "t");
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  EXPECT_NE(dot.find("n0 -> n2"), std::string::npos) << dot;
}

TEST(Passes, DceRemovesOnlyDeadNodes) {
  Graph g;
  const ValueId x = g.addInput("x", {2, 2});
  const ValueId live = g.add(OpKind::Relu, {x});
  g.add(OpKind::Tanh, {g.add(OpKind::Exp, {x})});  // nobody uses these two
  g.addParam("unused_param", {3}, "zeros");        // parameters stay: they are bound outside
  g.setOutput("out", live);
  const size_t before = g.liveNodeCount();
  EXPECT_EQ(eliminateDeadCode(g), 2);
  EXPECT_EQ(g.liveNodeCount(), before - 2);
  verifyGraph(g);
  EXPECT_EQ(g.params().size(), 1u);
}

TEST(Passes, RegistryRejectsUnknownNamesAndBadOrder) {
  EXPECT_NE(PassRegistry::builtin().find("dce"), nullptr);
  EXPECT_NE(PassRegistry::builtin().find("autodiff"), nullptr);
  try {
    validatePipeline({"dce", "fuse-everything"});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("valid passes:"), std::string::npos);
  }
  PassRegistry r;
  r.add({"x", "", {}, {}, [](Graph&, PassStats&, const PassTarget&) {}});
  EXPECT_THROW(r.add({"x", "", {}, {}, [](Graph&, PassStats&, const PassTarget&) {}}), std::logic_error);
}

// The training pipeline's policy (README, "Passes"): the forward passes as configured (less the
// fusions under --no-fuse), the clean-up after autodiff by what was fused, bf16 lowering before
// the last dce and the verifier, and the validation graph's forward passes lowered the same way.
TEST(Passes, TrainPipelineFollowsTheSettings) {
  using V = std::vector<std::string>;
  const V configured = {"fuse-linear", "fuse-elementwise", "cse"};
  const TrainPipeline fp32 = trainPipeline(configured, Precision::Fp32, false);
  EXPECT_EQ(fp32.forward, configured);
  EXPECT_EQ(fp32.training,
            (V{"autodiff", "fuse-loss", "fuse-linear-grad", "fuse-bias-grad", "fuse-elementwise", "cse", "dce", "verify"}));
  EXPECT_EQ(fp32.validation, configured);
  const TrainPipeline bf16 = trainPipeline(configured, Precision::Bf16, false);
  EXPECT_EQ(bf16.training, (V{"autodiff", "fuse-loss", "fuse-linear-grad", "fuse-bias-grad", "fuse-elementwise", "cse", "lower-bf16",
                              "dce", "verify"}));
  EXPECT_EQ(bf16.validation, (V{"fuse-linear", "fuse-elementwise", "cse", "lower-bf16", "dce"}));
  const TrainPipeline unfused = trainPipeline(configured, Precision::Tf32, true);
  EXPECT_EQ(unfused.forward, V{"cse"});
  EXPECT_EQ(unfused.training, (V{"autodiff", "cse", "dce", "verify"}));
  const TrainPipeline apart = trainPipeline(configured, Precision::Fp32, false, /*biasGradInProduct=*/false);
  EXPECT_EQ(apart.training, (V{"autodiff", "fuse-loss", "fuse-linear-grad", "fuse-elementwise", "cse", "dce", "verify"}));
  EXPECT_TRUE(passTargetOf(Precision::Bf16).operands16Bit);
  for (Precision p : {Precision::Fp32, Precision::Fp64, Precision::Tf32}) EXPECT_FALSE(passTargetOf(p).operands16Bit);
}

TEST(Passes, PipelineRecordsStatistics) {
  Graph g;
  const ValueId x = g.addInput("x", {2, 2});
  g.add(OpKind::Exp, {x});
  g.setOutput("out", g.add(OpKind::Relu, {x}));
  const std::vector<PassStats> s = runPipeline(g, {"dce", "verify"}, PipelineOptions{});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].pass, "dce");
  EXPECT_EQ(s[0].nodesBefore, 3u);
  EXPECT_EQ(s[0].nodesAfter, 2u);
  EXPECT_EQ(s[0].counters.at("nodes removed"), 1);
}

}  // namespace
}  // namespace pa
