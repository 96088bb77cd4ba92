// fuse-mlp and the fused-mlp ops on the CPU: which chains the pass takes and which it leaves, the
// fused node against the unfused layers in float64 on awkward shapes (forward and every
// gradient), errors of hand-written nodes, mlp_tiny trained with and without the fusion, and the
// CUDA kernels' launch shapes (no GPU or NVRTC needed).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "codegen/emit.h"
#include "common/mlp_limits.h"
#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "graph/node_attrs.h"
#include "graph/verifier.h"
#include "passes/autodiff.h"
#include "passes/fusion.h"
#include "passes/pass_manager.h"
#include "runtime/cpu_executor.h"
#include "tests/test_util.h"
#include "tests/training_graph.h"

namespace pa {
namespace {

int count(const Graph& g, OpKind op) {
  int c = 0;
  for (NodeId id : g.topoOrder()) c += g.node(id).op == op;
  return c;
}

BuiltModel build(const std::string& modelYaml, std::vector<int64_t> input, std::vector<int64_t> target, int64_t batch = 3) {
  const Config cfg = parseConfig("name: t\ndata: {kind: function}\nmodel:\n" + modelYaml, "test.yaml", {});
  return buildModel(cfg, input, target, batch);
}

// The largest difference of the loss and of every parameter gradient between two training graphs
// on the same random parameters (by name) and inputs, relative to max(1, the first's magnitude).
double worstDifference(const Graph& a, const Graph& b, uint64_t seed) {
  const auto params = test::randomParams(a, seed);
  std::map<std::string, std::vector<double>> byName;
  for (const auto& kv : params) byName[a.value(kv.first).name] = kv.second;
  CpuExecutor<double> ea(a), eb(b);
  std::vector<std::vector<double>> storage;
  storage.reserve(2 * byName.size());
  for (auto [g, ex] : {std::pair<const Graph*, CpuExecutor<double>*>{&a, &ea}, {&b, &eb}}) {
    for (ValueId p : g->params()) {
      storage.push_back(byName.at(g->value(p).name));
      ex->bind(p, storage.back().data());
    }
    for (ValueId in : g->inputs()) test::fillRandom(ex->data(in), numel(g->shape(in)), seed + std::hash<std::string>{}(g->value(in).name));
    ex->run();
  }
  double worst = 0;
  for (const auto& [name, v] : a.outputs()) {
    const ValueId w = b.output(name);
    const double *x = ea.data(v), *y = eb.data(w);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < numel(a.shape(v)); ++i) {
      EXPECT_TRUE(std::isfinite(x[i]) && std::isfinite(y[i])) << name;
      diff = std::max(diff, std::fabs(x[i] - y[i]));
      scale = std::max(scale, std::fabs(x[i]));
    }
    worst = std::max(worst, diff / std::max(1.0, scale));
  }
  return worst;
}

// Runs `passes` on a copy of the model and appends both backwards; returns the fused forward.
Graph fuseAndCompare(const BuiltModel& m, const std::vector<std::string>& passes, const PassTarget& target = {}) {
  Graph before = m.graph, after = m.graph;
  PipelineOptions po;
  po.target = target;
  runPipeline(after, passes, po);
  verifyGraph(after);
  const Graph forward = after;
  for (Graph* g : {&before, &after}) {
    appendBackward(*g, g->output("loss"), g->params());
    verifyGraph(*g);
  }
  EXPECT_LE(worstDifference(before, after, 11), 1e-12);
  return forward;
}

const char* kThreeLayers =
    "  layers: [{linear: {units: 7, activation: relu}}, {linear: {units: 5, activation: relu}}, {linear: {units: 2}}]\n";

TEST(FuseMlp, ChainOfLinearLayersBecomesOneNode) {
  const Graph g = fuseAndCompare(build(kThreeLayers, {3, 4}, {3, 2}), {"fuse-linear", "fuse-mlp"});
  EXPECT_EQ(count(g, OpKind::FusedMlp), 1);
  EXPECT_EQ(count(g, OpKind::FusedLinear), 0);
  for (NodeId id : g.topoOrder())
    if (g.node(id).op == OpKind::FusedMlp) {
      EXPECT_EQ(g.node(id).attrs.get<attr::MlpActivations>(), "relu,relu,none");
      EXPECT_EQ(g.node(id).attrs.get<attr::MlpBiases>(), (std::vector<int64_t>{1, 1, 1}));
    }
}

TEST(FuseMlp, TanhAndSigmoidJoinTheirLayers) {
  const Graph g = fuseAndCompare(build("  layers: [{linear: {units: 6, activation: tanh}}, {linear: {units: 3, activation: sigmoid}}, "
                                       "{linear: {units: 1}}]\n",
                                       {1}, {1}),
                                 {"fuse-linear", "fuse-mlp"});
  EXPECT_EQ(count(g, OpKind::FusedMlp), 1);
  EXPECT_EQ(count(g, OpKind::Tanh) + count(g, OpKind::Sigmoid) + count(g, OpKind::FusedLinear), 0);
}

TEST(FuseMlp, AWidthOverTheLimitCutsTheChain) {
  // 4 -> 129 -> 3 -> 2: layers 1 and 2 touch the 129-wide value, and layer 3 alone is no chain,
  // so nothing fuses; 4 -> 128 -> 3 -> 2 fuses whole.
  const Graph wide = fuseAndCompare(
      build("  layers: [{linear: {units: 129, activation: relu}}, {linear: {units: 3}}, {linear: {units: 2}}]\n", {4}, {2}),
      {"fuse-linear", "fuse-mlp"});
  EXPECT_EQ(count(wide, OpKind::FusedMlp), 0);
  EXPECT_EQ(count(wide, OpKind::FusedLinear), 3);
  const Graph fits = fuseAndCompare(
      build("  layers: [{linear: {units: 128, activation: relu}}, {linear: {units: 3}}, {linear: {units: 2}}]\n", {4}, {2}),
      {"fuse-linear", "fuse-mlp"});
  EXPECT_EQ(count(fits, OpKind::FusedMlp), 1);
  const Graph wideInput = fuseAndCompare(
      build("  layers: [{linear: {units: 8, activation: relu}}, {linear: {units: 3}}, {linear: {units: 2}}]\n", {130}, {2}),
      {"fuse-linear", "fuse-mlp"});
  EXPECT_EQ(count(wideInput, OpKind::FusedMlp), 1);  // the 130-wide first layer stays; the other two fuse
  EXPECT_EQ(count(wideInput, OpKind::FusedLinear), 1);
}

TEST(FuseMlp, AnIntermediateWithAnotherUserStopsTheChain) {
  const std::string nodes =
      "  input: [4]\n  params: {w1: {shape: [4, 5]}, b1: {shape: [5]}, w2: {shape: [5, 5]}, w3: {shape: [5, 5]}}\n  nodes:\n"
      "    - {op: matmul, inputs: [input, w1], output: m1}\n"
      "    - {op: add, inputs: [m1, b1], output: a1}\n"
      "    - {op: relu, inputs: [a1], output: h1}\n"
      "    - {op: matmul, inputs: [h1, w2], output: m2}\n"
      "    - {op: relu, inputs: [m2], output: h2}\n"
      "    - {op: matmul, inputs: [h2, w3], output: m3}\n"
      "    - {op: relu, inputs: [m3], output: h3}\n"
      "    - {op: add, inputs: [h3, h1], output: y}\n";  // h1 read again: layers 1-2 cannot fuse
  const Graph g = fuseAndCompare(build(nodes, {4}, {5}), {"fuse-linear", "fuse-mlp"});
  EXPECT_EQ(count(g, OpKind::FusedMlp), 1);  // layers 2 and 3 (h2 has one user)
  EXPECT_EQ(count(g, OpKind::FusedLinear), 1);
}

// precision bf16 fuses the same chains (the node computes in fp32 on the master weights). The
// trainer's bf16 step of a small MLP is then its fp32 step: lower-bf16 finds nothing to store in
// bf16 and no operand to cast, since the train node keeps its hidden outputs on chip.
TEST(FuseMlp, Bf16TargetFusesTheChainToo) {
  PassTarget bf16;
  bf16.operands16Bit = true;
  const Graph g = fuseAndCompare(build(kThreeLayers, {3, 4}, {3, 2}), {"fuse-linear", "fuse-mlp"}, bf16);
  EXPECT_EQ(count(g, OpKind::FusedMlp), 1);
  EXPECT_EQ(count(g, OpKind::FusedLinear), 0);
  for (const char* config : {"mlp_tiny", "sine_mlp", "function_mlp"}) {
    const Graph step = test::trainingGraph(config, false, "bf16", {"compiler.fuse=[linear, elementwise, mlp]"});
    ASSERT_TRUE(step.storageTypes()) << config;
    EXPECT_EQ(count(step, OpKind::FusedMlpTrain), 1) << config;
    EXPECT_EQ(count(step, OpKind::Cast), 0) << config;
    for (NodeId id : step.topoOrder())
      for (ValueId v : step.node(id).outputs) EXPECT_EQ(step.value(v).type.dtype, DType::F32) << config << " " << step.value(v).name;
  }
}

int trainNodes(const Graph& g) { return count(g, OpKind::FusedMlpTrain) + count(g, OpKind::FusedMlp) + count(g, OpKind::FusedMlpGrad); }

TEST(FuseMlp, TheSmallExamplesAndTrueFuseTheirChain) {
  const std::vector<std::string> withoutMlp = {"compiler.fuse=[linear, attention, elementwise]"};
  EXPECT_EQ(trainNodes(test::trainingGraph("mlp_tiny", false, "fp32", withoutMlp)), 0);
  EXPECT_EQ(trainNodes(test::trainingGraph("mlp_tiny", true)), 0);
  // The training step: the forward, the loss and the backward in one FusedMlpTrain (fuse-mlp-train),
  // for the examples as shipped (mlp listed) and under fuse: true.
  for (const char* config : {"mlp_tiny", "sine_mlp", "function_mlp"})
    for (const std::vector<std::string>& sets : {std::vector<std::string>{}, std::vector<std::string>{"compiler.fuse=true"}}) {
      const Graph g = test::trainingGraph(config, false, "fp32", sets);
      EXPECT_EQ(count(g, OpKind::FusedMlpTrain), 1) << config;
      EXPECT_EQ(count(g, OpKind::FusedMlp) + count(g, OpKind::FusedMlpGrad) + count(g, OpKind::MseLossGrad), 0) << config;
      EXPECT_EQ(count(g, OpKind::FusedLinear) + count(g, OpKind::MatMul) + count(g, OpKind::MatMulActGrad), 0) << config;
    }
  // Past the rows where the node pays, fuse: true leaves mlp_tiny's 64-wide layers to the GEMMs.
  const Graph big = test::trainingGraph("mlp_tiny", false, "fp32", {"compiler.fuse=true", "data.samples=9200", "train.batch_size=8193"});
  EXPECT_EQ(trainNodes(big), 0);
  EXPECT_EQ(count(big, OpKind::FusedLinear), 3);
}

// fuse-mlp's rule (common/mlp_limits.h): at most 8,192 rows where every width is at most 64, at
// most 1,024 where one is wider (none under bf16, whose layers run on 16-bit tensor cores); a
// narrower chain further down a rejected one still fuses.
TEST(FuseMlp, ChainsWithMoreRowsThanPayAreLeftToTheLayers) {
  const std::vector<std::string> passes = {"fuse-linear", "fuse-mlp"};
  const char* narrow = "  layers: [{linear: {units: 64, activation: relu}}, {linear: {units: 64, activation: relu}}, {linear: {units: 2}}]\n";
  const char* wide = "  layers: [{linear: {units: 128, activation: relu}}, {linear: {units: 3}}, {linear: {units: 2}}]\n";
  for (auto [yaml, rows] : {std::pair<const char*, int64_t>{narrow, kMlpNarrowMaxRows}, {wide, kMlpWideMaxRows}}) {
    const Graph at = fuseAndCompare(build(yaml, {4}, {2}, rows), passes);
    EXPECT_EQ(count(at, OpKind::FusedMlp), 1) << rows;
    EXPECT_EQ(count(at, OpKind::FusedLinear), 0) << rows;
    const Graph over = fuseAndCompare(build(yaml, {4}, {2}, rows + 1), passes);
    EXPECT_EQ(count(over, OpKind::FusedMlp), 0) << rows + 1;
    EXPECT_EQ(count(over, OpKind::FusedLinear), 3) << rows + 1;
  }
  // 1 -> 128 -> 64 -> 64 -> 1 at 4,096 rows: chains rooted at the first two layers touch the
  // 128-wide value; the last two layers are 64 wide and fuse.
  const Graph tail = fuseAndCompare(build("  layers: [{linear: {units: 128, activation: relu}}, {linear: {units: 64, activation: relu}}, "
                                          "{linear: {units: 64, activation: relu}}, {linear: {units: 1}}]\n",
                                          {1}, {1}, 4096),
                                    passes);
  EXPECT_EQ(count(tail, OpKind::FusedMlp), 1);
  EXPECT_EQ(count(tail, OpKind::FusedLinear), 2);
  // bf16: the 64-wide chain up to the same rows; the 128-wide one not even at one row.
  PassTarget bf16;
  bf16.operands16Bit = true;
  EXPECT_EQ(count(fuseAndCompare(build(narrow, {4}, {2}, kMlpNarrowMaxRows), passes, bf16), OpKind::FusedMlp), 1);
  EXPECT_EQ(count(fuseAndCompare(build(narrow, {4}, {2}, kMlpNarrowMaxRows + 1), passes, bf16), OpKind::FusedMlp), 0);
  EXPECT_EQ(count(fuseAndCompare(build(wide, {4}, {2}, 1), passes, bf16), OpKind::FusedMlp), 0);
  EXPECT_EQ(count(fuseAndCompare(build(wide, {4}, {2}, 1), passes), OpKind::FusedMlp), 1);
  // --verbose says why, once per chain (at its head, not for the chains rooted inside it).
  Graph g = build("  layers: [{linear: {units: 128, activation: relu}}, {linear: {units: 64, activation: relu}}, "
                  "{linear: {units: 64, activation: relu}}, {linear: {units: 1}}]\n",
                  {1}, {1}, 4096)
                .graph;
  PipelineOptions po;
  const std::vector<PassStats> stats = runPipeline(g, passes, po);
  ASSERT_EQ(stats[1].notes.size(), 1u) << stats[1].notes.back();
  EXPECT_NE(stats[1].notes[0].find("model.layers[0]"), std::string::npos) << stats[1].notes[0];
  EXPECT_NE(stats[1].notes[0].find("4096 rows, 128 wide"), std::string::npos) << stats[1].notes[0];
  EXPECT_NE(stats[1].notes[0].find("up to 1024 rows"), std::string::npos) << stats[1].notes[0];
  po.target.operands16Bit = true;
  Graph g16 = build(wide, {4}, {2}, 1).graph;
  const std::vector<PassStats> stats16 = runPipeline(g16, passes, po);
  ASSERT_EQ(stats16[1].notes.size(), 1u);
  EXPECT_NE(stats16[1].notes[0].find("under bf16"), std::string::npos) << stats16[1].notes[0];
  Graph fits = build(narrow, {4}, {2}, 64).graph;
  EXPECT_TRUE(runPipeline(fits, passes, PipelineOptions{})[1].notes.empty());
  // The rows are every leading dimension's: [64, 128, 4] is 8,192 rows.
  EXPECT_EQ(count(fuseAndCompare(build(narrow, {128, 4}, {128, 2}, 64), passes), OpKind::FusedMlp), 1);
  EXPECT_EQ(count(fuseAndCompare(build(narrow, {128, 4}, {128, 2}, 65), passes), OpKind::FusedMlp), 0);
}

TEST(FuseMlp, MlpNeedsLinearBeforeIt) {
  try {
    parseConfig("name: t\ndata: {kind: function}\nmodel: {layers: [{linear: {units: 1}}]}\ncompiler: {fuse: [mlp, linear]}\n",
                "cfg.yaml", {});
    FAIL() << "accepted mlp before linear";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("list linear before it"), std::string::npos) << e.what();
  }
}

// ---- the ops against the unfused layers, float64 ------------------------------------------

struct Shape3 {
  int64_t rows;
  std::vector<int64_t> widths;  // K0, N1, ..., NL
  std::vector<MlpActivation> acts;
  std::vector<int64_t> biases;
};

// x [rows, K0] (a parameter, so dx is checked too) through FusedLinear layers (with a Tanh or
// Sigmoid after an activation-free one), or through one FusedMlp node.
Graph mlpGraph(const Shape3& s, bool fused) {
  Graph g;
  const ValueId x = g.addParam("x", Shape{s.rows, s.widths[0]}, "xavier");
  std::vector<ValueId> ins{x};
  ValueId h = x;
  for (size_t i = 0; i + 1 < s.widths.size(); ++i) {
    const ValueId w = g.addParam("w" + std::to_string(i), Shape{s.widths[i], s.widths[i + 1]}, "xavier");
    const ValueId b = s.biases[i] ? g.addParam("b" + std::to_string(i), Shape{s.widths[i + 1]}, "zeros") : kNoValue;
    ins.push_back(w);
    if (b != kNoValue) ins.push_back(b);
    if (fused) continue;
    std::vector<ValueId> li{h, w};
    if (b != kNoValue) li.push_back(b);
    h = g.add(OpKind::FusedLinear, li, AttrMap().set<attr::Activation>(s.acts[i] == MlpActivation::Relu ? "relu" : "none"));
    if (s.acts[i] == MlpActivation::Tanh) h = g.add(OpKind::Tanh, {h});
    if (s.acts[i] == MlpActivation::Sigmoid) h = g.add(OpKind::Sigmoid, {h});
  }
  if (fused) h = g.add(OpKind::FusedMlp, ins, AttrMap().set<attr::MlpActivations>(mlpActivationsString(s.acts)).set<attr::MlpBiases>(s.biases));
  g.setOutput("y", h);
  test::addWeightedSumLoss(g, h);
  appendBackward(g, g.output("loss"), g.params());
  verifyGraph(g);
  return g;
}

TEST(FusedMlpOp, MatchesTheUnfusedLayersOnAwkwardShapes) {
  using A = MlpActivation;
  const std::vector<std::vector<int64_t>> widthSets = {{1, 64, 64, 1}, {3, 1, 3}, {100, 128, 1}, {64, 100, 3, 128, 64}};
  const A cycle[] = {A::Relu, A::Tanh, A::None, A::Sigmoid};
  int cases = 0;
  for (int64_t rows : {1, 7, 257})
    for (const auto& widths : widthSets) {
      Shape3 s{rows, widths, {}, {}};
      for (size_t i = 0; i + 1 < widths.size(); ++i) {
        s.acts.push_back(i + 2 == widths.size() ? A::None : cycle[(i + static_cast<size_t>(rows)) % 4]);
        s.biases.push_back((i + static_cast<size_t>(rows)) % 3 != 1);
      }
      SCOPED_TRACE("rows " + std::to_string(rows) + ", layers " + mlpActivationsString(s.acts));
      const Graph unfused = mlpGraph(s, false), fused = mlpGraph(s, true);
      EXPECT_LE(worstDifference(unfused, fused, 100 + static_cast<uint64_t>(cases)), 1e-12);
      ++cases;
    }
}

// Under precision bf16, where the backward is a node of its own (dx wanted: x is a parameter),
// the hidden outputs it reads are stored in bf16 like every activation, and the CPU rounds them
// after the node as the GPU stores them; the weight and bias gradients and y stay fp32 outputs.
TEST(FusedMlpOp, Bf16StoresTheSavedHiddenOutputsOnly) {
  Shape3 s{7, {3, 5, 4, 2}, {MlpActivation::Tanh, MlpActivation::Relu, MlpActivation::None}, {1, 0, 1}};
  Graph g = mlpGraph(s, true);
  lowerToBf16(g);
  verifyGraph(g);
  int hidden = 0;
  for (NodeId id : g.topoOrder()) {
    const Node& n = g.node(id);
    if (n.op == OpKind::FusedMlp) {
      EXPECT_EQ(g.value(n.outputs[0]).type.dtype, DType::F32);  // y: a graph output
      for (size_t i = 1; i < n.outputs.size(); ++i, ++hidden) EXPECT_EQ(g.value(n.outputs[i]).type.dtype, DType::BF16);
    }
    if (n.op == OpKind::FusedMlpGrad) {
      for (ValueId v : n.outputs) EXPECT_EQ(g.value(v).type.dtype, DType::F32) << g.value(v).name;
    }
    EXPECT_NE(n.op, OpKind::Cast);
  }
  EXPECT_EQ(hidden, 2);
  const auto params = test::randomParams(g, 5);
  CpuExecutor<double> cpu(g);
  std::vector<std::vector<double>> storage;
  storage.reserve(params.size());
  for (const auto& [p, v] : params) {
    storage.push_back(v);
    cpu.bind(p, storage.back().data());
  }
  for (ValueId in : g.inputs()) test::fillRandom(cpu.data(in), numel(g.shape(in)), 6);
  cpu.run();
  for (NodeId id : g.topoOrder()) {
    const Node& n = g.node(id);
    if (n.op != OpKind::FusedMlp) continue;
    for (size_t i = 1; i < n.outputs.size(); ++i)
      for (int64_t e = 0; e < numel(g.shape(n.outputs[i])); ++e) {
        const double h = cpu.data(n.outputs[i])[e];
        EXPECT_EQ(h, static_cast<double>(roundToBf16(static_cast<float>(h))));
      }
  }
}

TEST(FusedMlpOp, HandWrittenNodesGetClearErrors) {
  const std::string head = "  input: [3]\n  params: {w1: {shape: [3, 4]}, b1: {shape: [4]}, w2: {shape: [4, 1]}, wide: {shape: [4, 129]}}\n"
                           "  nodes:\n";
  struct Bad {
    std::string node, message;
  };
  const Bad bad[] = {
      {"    - {op: fused-mlp, inputs: [input, w1, b1, w2], activations: 'relu,gelu', biases: [1, 0], output: y}\n", "'gelu' is not one of"},
      {"    - {op: fused-mlp, inputs: [input, w1, b1, w2], activations: 'relu', output: y}\n", "inputs, got 4"},
      {"    - {op: fused-mlp, inputs: [input, w1, b1, wide], activations: 'relu,none', biases: [1, 0], output: y}\n", "widths are 1 to 128"},
      {"    - {op: fused-mlp, inputs: [input, w2, w1], activations: 'relu,none', biases: [0, 0], output: y}\n", "expects"},
      {"    - {op: fused-mlp, inputs: [input, w1, b1, w2], activations: 'relu,none', biases: [1, 2], output: y}\n", "0 or 1"},
  };
  for (const Bad& b : bad) {
    try {
      build(head + b.node, {3}, {1});
      ADD_FAILURE() << "accepted: " << b.node;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
    }
  }
  // A valid hand-written node trains like the layers it stands for.
  const BuiltModel m = build(head + "    - {op: fused-mlp, inputs: [input, w1, b1, w2], activations: 'relu,none', biases: [1, 0], output: y}\n",
                             {3}, {1});
  EXPECT_EQ(count(m.graph, OpKind::FusedMlp), 1);
}

// A fused-MLP node's one kernel within a target's limits: dynamic shared memory within the
// target's opt-in maximum (163 KB sm_80, 227 KB sm_90a), a grid within 65535 blocks; where
// `minScratchFloats` is given (a gradient kernel), the grid whole 8-block clusters on sm_90a and
// a scratch of at least minScratchFloats(grid) floats asked to start zeroed (the counters).
void expectLaunchFits(const codegen::NodeKernels& nk, bool sm90, const std::function<size_t(unsigned)>& minScratchFloats) {
  ASSERT_EQ(nk.kernels.size(), 1u);
  const codegen::Kernel& k = nk.kernels[0];
  EXPECT_LE(k.sharedBytes, (sm90 ? 227u : 163u) * 1024) << k.name;
  EXPECT_GE(k.grid[0], 1u);
  EXPECT_LE(k.grid[0], 65535u);
  if (minScratchFloats) {
    EXPECT_EQ(k.grid[0] % (sm90 ? 8 : 1), 0u);
    EXPECT_TRUE(nk.zeroScratch);
    EXPECT_GE(nk.scratchBytes, minScratchFloats(k.grid[0]) * sizeof(float));
  }
}

// The kernels' launches on every shape class up to the limits (16 layers of 128, a batch of more
// than 65535 tiles), for an sm_80 and an sm_90a target: dynamic shared memory within the
// target's opt-in maximum (163 KB, 227 KB), grids within 65535 blocks, the backward's grid a
// whole number of 8-block clusters on sm_90a, and every gradient's scratch (the counters at
// least) asked to start zeroed.
TEST(FusedMlpKernels, LaunchesFitEveryTarget) {
  struct Case {
    int64_t rows;
    std::vector<int64_t> widths;
  };
  std::vector<Case> cases = {{1, {1, 1}}, {17, {3, 64, 1}}, {256, {1, 64, 64, 1}}, {1000, {128, 128, 128, 128}}, {3'000'000, {7, 100, 3}}};
  cases.push_back({4099, std::vector<int64_t>(static_cast<size_t>(kMlpMaxLayers) + 1, kMlpMaxWidth)});
  cases.push_back({1, std::vector<int64_t>(static_cast<size_t>(kMlpMaxLayers) + 1, kMlpMaxWidth)});
  for (const Case& c : cases) {
    Graph g;
    std::vector<ValueId> ins{g.addParam("x", Shape{c.rows, c.widths[0]}, "xavier")};
    std::vector<MlpActivation> acts;
    for (size_t i = 0; i + 1 < c.widths.size(); ++i) {
      ins.push_back(g.addParam("w" + std::to_string(i), Shape{c.widths[i], c.widths[i + 1]}, "xavier"));
      ins.push_back(g.addParam("b" + std::to_string(i), Shape{c.widths[i + 1]}, "zeros"));
      acts.push_back(MlpActivation::Tanh);
    }
    const ValueId y = g.add(OpKind::FusedMlp, ins, AttrMap().set<attr::MlpActivations>(mlpActivationsString(acts)));
    test::addWeightedSumLoss(g, y);
    appendBackward(g, g.output("loss"), g.params());
    for (bool sm90 : {false, true}) {
      SCOPED_TRACE("rows " + std::to_string(c.rows) + ", " + std::to_string(c.widths.size() - 1) + " layers, " + (sm90 ? "sm_90a" : "sm_80"));
      codegen::EmitOptions opt;
      opt.wgmma = sm90;
      int kernels = 0;
      for (NodeId id : g.topoOrder()) {
        const OpKind op = g.node(id).op;
        if (op != OpKind::FusedMlp && op != OpKind::FusedMlpGrad) continue;
        if (op == OpKind::FusedMlpGrad) expectLaunchFits(codegen::emitNode(g, id, opt), sm90, [](unsigned) { return size_t{8}; });
        else expectLaunchFits(codegen::emitNode(g, id, opt), sm90, nullptr);
        ++kernels;
      }
      EXPECT_EQ(kernels, 2);
    }
  }
}

// mlp_tiny on the CPU with mlp fusion follows the run without it: the fused node calls the same
// CPU kernels in the same order, so the float32 losses agree to rounding.
TEST(FuseMlp, MlpTinyTrainsAsWithoutTheFusion) {
  RunOptions o;
  o.progress = ProgressMode::Quiet;
  o.printSummary = false;
  o.device = "cpu";
  const std::string path = std::string(PA_SOURCE_DIR) + "/configs/mlp_tiny.yaml";
  const TrainResult plain = train(loadConfig(path, {"train.steps=60", "train.log_every=30", "compiler.fuse=[linear, elementwise]"}), o);
  const TrainResult fused = train(loadConfig(path, {"train.steps=60", "train.log_every=30", "compiler.fuse=[linear, elementwise, mlp]"}), o);
  ASSERT_EQ(plain.losses.size(), 60u);
  ASSERT_EQ(fused.losses.size(), plain.losses.size());
  double worst = 0;
  for (size_t i = 0; i < plain.losses.size(); ++i) worst = std::max(worst, std::fabs(fused.losses[i] - plain.losses[i]) / plain.losses[i]);
  EXPECT_LE(worst, 1e-5);
  EXPECT_NEAR(fused.finalValidation, plain.finalValidation, 1e-5 * plain.finalValidation);
}

// fuse-mlp-train: a model's FusedMlp, its MSE and their gradient node become one FusedMlpTrain,
// which the CPU runs with the three nodes' kernels in their order, so in float64 the loss, the
// prediction and every gradient equal the unfused step's bit for bit.
TEST(FuseMlpTrain, TheStepBecomesOneNodeEqualToTheThree) {
  for (const char* layers : {kThreeLayers, "  layers: [{linear: {units: 6, activation: relu}}, {linear: {units: 1}}]\n"}) {
    const BuiltModel m = build(layers, {4}, {layers == kThreeLayers ? 2 : 1}, 5);
    Graph forward = m.graph;
    runPipeline(forward, {"fuse-linear", "fuse-mlp"}, PipelineOptions{});
    ASSERT_EQ(count(forward, OpKind::FusedMlp), 1);
    Graph three = forward, one = forward;
    runPipeline(three, {"autodiff", "fuse-loss", "dce"}, PipelineOptions{});
    runPipeline(one, {"autodiff", "fuse-loss", "fuse-mlp-train", "dce"}, PipelineOptions{});
    EXPECT_EQ(count(three, OpKind::FusedMlpGrad), 1);
    EXPECT_EQ(count(one, OpKind::FusedMlpTrain), 1);
    for (OpKind op : {OpKind::FusedMlp, OpKind::FusedMlpGrad, OpKind::MseLossGrad}) EXPECT_EQ(count(one, op), 0);
    EXPECT_EQ(worstDifference(three, one, 17), 0.0);
  }
}

// Left alone where the node would not hold the step: dx wanted (x a parameter), y read by another
// node, weights over kMlpTrainMaxFloats; and without fuse-loss there is no MseLossGrad to take.
TEST(FuseMlpTrain, LeftAloneWhereOneNodeCannotHoldTheStep) {
  auto step = [](bool xParam, bool otherUser, std::vector<int64_t> widths, std::vector<std::string> passes) {
    Graph g;
    std::vector<ValueId> ins{xParam ? g.addParam("x", Shape{9, widths[0]}, "xavier") : g.addInput("x", Shape{9, widths[0]})};
    std::vector<MlpActivation> acts;
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      ins.push_back(g.addParam("w" + std::to_string(i), Shape{widths[i], widths[i + 1]}, "xavier"));
      ins.push_back(g.addParam("b" + std::to_string(i), Shape{widths[i + 1]}, "xavier"));
      acts.push_back(i + 2 == widths.size() ? MlpActivation::None : MlpActivation::Relu);
    }
    const ValueId y = g.add(OpKind::FusedMlp, ins, AttrMap().set<attr::MlpActivations>(mlpActivationsString(acts)));
    ValueId loss = g.add(OpKind::MseLoss, {y, g.addInput("target", Shape{9, widths.back()})});
    if (otherUser) loss = g.add(OpKind::Add, {loss, g.add(OpKind::MseLoss, {g.add(OpKind::Tanh, {y}), y})});
    g.setOutput("loss", loss);
    runPipeline(g, passes, PipelineOptions{});
    return g;
  };
  const std::vector<std::string> all = {"autodiff", "fuse-loss", "fuse-mlp-train", "dce"};
  EXPECT_EQ(count(step(false, false, {3, 8, 2}, all), OpKind::FusedMlpTrain), 1);  // the control
  EXPECT_EQ(count(step(true, false, {3, 8, 2}, all), OpKind::FusedMlpTrain), 0);
  EXPECT_EQ(count(step(false, true, {3, 8, 2}, all), OpKind::FusedMlpTrain), 0);
  EXPECT_EQ(count(step(false, false, {128, 128, 128, 1}, all), OpKind::FusedMlpTrain), 0);
  EXPECT_EQ(count(step(false, false, {128, 128, 1}, all), OpKind::FusedMlpTrain), 1);
  EXPECT_THROW(step(false, false, {3, 8, 2}, {"autodiff", "fuse-mlp-train"}), UserError);  // needs fuse-loss before it
}

// Hand-written fused-mlp-train nodes: wrong input counts, a target of the wrong shape, a dy of
// more than one element and weights over the shared-memory bound are refused with the node named.
TEST(FuseMlpTrain, HandWrittenNodesGetClearErrors) {
  auto node = [](Shape target, Shape dy, int64_t width, bool dropBias) {
    Graph g;
    std::vector<ValueId> ins{g.addInput("x", Shape{5, width}), g.addInput("t", target), g.addInput("dy", dy),
                             g.addParam("w1", Shape{width, width}, "xavier"), g.addParam("b1", Shape{width}, "zeros"),
                             g.addParam("w2", Shape{width, width}, "xavier"), g.addParam("b2", Shape{width}, "zeros")};
    if (dropBias) ins.pop_back();
    g.add(OpKind::FusedMlpTrain, ins, AttrMap().set<attr::MlpActivations>("relu,none"));
  };
  EXPECT_NO_THROW(node({5, 8}, {}, 8, false));
  auto message = [&](Shape target, Shape dy, int64_t width, bool dropBias) {
    try {
      node(target, dy, width, dropBias);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({5, 8}, {}, 8, true).find("inputs, got 6"), std::string::npos);
  EXPECT_NE(message({5, 7}, {}, 8, false).find("target [5, 7] must be y's shape [5, 8]"), std::string::npos);
  EXPECT_NE(message({5, 8}, {2}, 8, false).find("must hold one element"), std::string::npos);
  EXPECT_NE(message({5, 128}, {}, 128, false).find("holds at most"), std::string::npos);
}

// The train kernel's launches within every target's limits, from one row to more tiles than
// 65535 blocks, up to the weight bound (a 128 × 128 layer beside others; 16 layers of 32).
TEST(FusedMlpKernels, TrainKernelLaunchesFitEveryTarget) {
  struct Case {
    int64_t rows;
    std::vector<int64_t> widths;
  };
  std::vector<Case> cases = {{1, {1, 1}}, {17, {3, 64, 1}}, {256, {1, 64, 64, 1}}, {3'000'000, {7, 100, 3}}, {4099, {128, 128, 64}}};
  cases.push_back({1000, std::vector<int64_t>(static_cast<size_t>(kMlpMaxLayers) + 1, 32)});
  for (const Case& c : cases) {
    const size_t layers = c.widths.size() - 1;
    const Graph g = test::mlpTrainGraph(c.rows, c.widths, std::vector<MlpActivation>(layers, MlpActivation::Tanh),
                                        std::vector<int64_t>(layers, 1));
    ASSERT_EQ(count(g, OpKind::FusedMlpTrain), 1);
    for (bool sm90 : {false, true}) {
      SCOPED_TRACE("rows " + std::to_string(c.rows) + ", " + std::to_string(layers) + " layers, " + (sm90 ? "sm_90a" : "sm_80"));
      codegen::EmitOptions opt;
      opt.wgmma = sm90;
      for (NodeId id : g.topoOrder()) {
        if (g.node(id).op != OpKind::FusedMlpTrain) continue;
        // The gradient's scratch, then the loss's counter and a double per block.
        expectLaunchFits(codegen::emitNode(g, id, opt), sm90, [](unsigned grid) { return size_t{8 + 1 + 2 * grid}; });
      }
    }
  }
}

}  // namespace
}  // namespace pa
