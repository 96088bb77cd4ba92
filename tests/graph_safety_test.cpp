// Issue 24, "no crash, no silent garbage, every mistake located": graph storage stays put while
// the graph grows, shape arithmetic cannot overflow, sizes are checked against memory before
// anything is allocated, and mistakes in explicit graphs name their YAML node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "common/errors.h"
#include "graph/graph.h"
#include "graph/verifier.h"
#include "passes/memory_plan.h"

namespace pa {
namespace {

RunOptions quiet(int64_t steps) {
  RunOptions o;
  o.device = "cpu";
  o.progress = ProgressMode::Quiet;
  o.printSummary = false;
  o.steps = steps;
  return o;
}

// Trains `yaml` for one step; returns the UserError's message, or "" when it trains. Any other
// exception fails the test (gtest reports it), as a crash does.
std::string errorOf(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    train(parseConfig(yaml, "cfg.yaml", sets), quiet(1));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

#define EXPECT_HAS(s, part) EXPECT_TRUE(contains(s, part)) << "message: " << (s) << "\nexpected to contain: " << (part)

// --- Reference stability --------------------------------------------------------------------

// References into the graph taken before thousands of adds read the same afterwards (with
// vector storage the first reallocation frees what they point at; ASan reports it, and without
// ASan the shape reads as garbage once the freed block is reused).
TEST(GraphStorage, ReferencesSurviveThousandsOfAdds) {
  Graph g;
  const ValueId x = g.addInput("x", {3, 5, 7});
  const Shape& shape = g.shape(x);
  const Node& node = g.producer(x);
  const Value& value = g.value(x);
  ValueId h = x;
  for (int i = 0; i < 5000; ++i) h = g.add(OpKind::Relu, {h});
  // Overwrite freed memory the way an allocator reusing it would.
  std::vector<std::vector<int64_t>> churn;
  for (int i = 0; i < 1000; ++i) churn.emplace_back(64, -7);
  EXPECT_EQ(shape, (Shape{3, 5, 7}));
  EXPECT_EQ(node.op, OpKind::Input);
  EXPECT_EQ(node.name, "x");
  EXPECT_EQ(node.outputs.front(), x);
  EXPECT_EQ(value.name, "x");
  EXPECT_EQ(&shape, &g.shape(x));
  EXPECT_EQ(&node, &g.node(node.id));
  EXPECT_EQ(g.shape(h), (Shape{3, 5, 7}));
}

// Issue 24's repro: a GQA attention with sink logits. Softmax's gradient rule passed a reference
// to the sink's shape into sumTo next to a call that adds nodes; once the storage moved, sumTo
// read freed memory ("cannot sum ... down to [8317990677852025460, ...]", or a segfault).
TEST(GraphStorage, GqaAttentionWithSinkLogitsTrains) {
  const std::string yaml =
      "name: g\n"
      "data: {kind: sine, window: 8, samples: 64, target: sequence}\n"
      "model: {input: [8, 1], layers: [{linear: {units: 8}}, {attention: {heads: 2, kv_heads: 1, sink_logits: true, "
      "causal: true, residual: true}}, {linear: {units: 1}}]}\n"
      "train: {batch_size: 4}\n";
  const TrainResult r = train(parseConfig(yaml, "g.yaml", {}), quiet(3));
  ASSERT_EQ(r.losses.size(), 3u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << l;
  EXPECT_EQ(r.parameterCount, (1 * 8 + 8) + (8 * 8 + 8) + 2 * (8 * 4 + 4) + (8 * 8 + 8) + 2 + (8 * 1 + 1));
}

// --- Sizes: checked products, memory checked before allocating -----------------------------

TEST(ShapeSizes, CheckedNumelRejectsOverflowNegativeAndHuge) {
  int64_t n = -1;
  EXPECT_TRUE(checkedNumel({2, 3, 4}, n));
  EXPECT_EQ(n, 24);
  EXPECT_TRUE(checkedNumel({}, n));
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(checkedNumel({kMaxElements}, n));
  EXPECT_FALSE(checkedNumel({kMaxElements + 1}, n));
  EXPECT_FALSE(checkedNumel({int64_t{1} << 32, int64_t{1} << 32}, n));      // 2^64: wraps to 0 unchecked
  EXPECT_FALSE(checkedNumel({int64_t{3} << 61, 4}, n));                     // overflows int64
  EXPECT_FALSE(checkedNumel({-1, 8}, n));
  EXPECT_TRUE(checkedNumel({0, int64_t{1} << 62}, n));  // a zero extent: no elements, nothing to overflow
  EXPECT_EQ(n, 0);
}

// Every way a value can get a huge shape is refused by Graph::add as a ShapeError naming the node.
TEST(ShapeSizes, GraphRefusesValuesBeyondTwoToTheFortyEight) {
  const int64_t big = int64_t{1} << 40;
  Graph g;
  EXPECT_THROW(g.addParam("w", {big, big}, "zeros"), ShapeError);
  EXPECT_THROW(g.addInput("x", {int64_t{1} << 32, int64_t{1} << 32}), ShapeError);  // 2^64 wraps to 0 unchecked
  EXPECT_THROW(g.addConstant(1.0, {-2, -3}), ShapeError);                         // (-2)(-3) = 6 unchecked
  const ValueId x = g.addInput("x", {4, 2, 8, 16});
  AttrMap rep;
  rep.set<attr::RepeatAxis>(1);
  rep.set<attr::Repeats>(int64_t{1} << 62);
  EXPECT_THROW(g.add(OpKind::RepeatHeads, {x}, rep), ShapeError);
  AttrMap bt;
  bt.set<attr::Shape>({big, 4, 2, 8, 16});
  EXPECT_THROW(g.add(OpKind::BroadcastTo, {x}, bt), ShapeError);
  AttrMap rs;
  rs.set<attr::Shape>({int64_t{1} << 62, int64_t{1} << 62, 0, -1});  // known product wraps to 0
  EXPECT_THROW(g.add(OpKind::Reshape, {x}, rs), ShapeError);
  const ValueId col = g.addParam("col", {int64_t{1} << 30, 1}, "zeros");
  const ValueId row = g.addParam("row", {1, int64_t{1} << 30}, "zeros");
  try {
    g.add(OpKind::MatMul, {col, row}, {}, "outer");
    ADD_FAILURE() << "a [2^30, 2^30] product was accepted";
  } catch (const ShapeError& e) {
    EXPECT_EQ(e.node(), "outer");
    EXPECT_HAS(std::string(e.what()), "more than 2^48 elements");
  }
}

// The memory check names the parameter that takes the most, with its origin, both sizes and
// the memory available; it passes where the need fits.
TEST(MemoryCheck, NamesTheLargestParameterItsOriginAndTheSizes) {
  Graph g;
  const ValueId x = g.addInput("input", {8, 1000});
  const ValueId w = g.addParam("w", {1000, 1000}, "xavier");
  g.node(g.value(w).producer).origin = "cfg.yaml:3:5: model.params.w.shape = [1000, 1000]";
  g.setOutput("prediction", g.add(OpKind::MatMul, {x, w}));
  MemoryLayout layout;  // fp32, weights + Adam moments
  const MemoryNeed need = memoryNeed(g, layout);
  EXPECT_EQ(need.largestParam, w);
  EXPECT_EQ(need.parameterBytes, 3 * 4 * 1000 * 1000);
  EXPECT_EQ(need.activationBytes, 4 * (8 * 1000 + 8 * 1000));  // input and output, both live throughout
  EXPECT_EQ(need.totalBytes, need.parameterBytes + need.activationBytes);
  EXPECT_NO_THROW(checkFitsMemory(g, need.totalBytes, "this machine", layout));
  try {
    checkFitsMemory(g, need.totalBytes - 1, "GPU 0 (test)", layout);
    ADD_FAILURE() << "no error one byte short";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, "cfg.yaml:3:5: model.params.w.shape = [1000, 1000] needs 3.8 MiB of weights");
    EXPECT_HAS(m, "GPU 0 (test) has 11.5 MiB");
  }
}

TEST(MemoryCheck, NamesTheLargestActivationWhenActivationsDominate) {
  Graph g;
  const ValueId x = g.addInput("input", {1 << 20, 64});
  const ValueId b = g.addParam("b", {64}, "zeros");
  g.setOutput("prediction", g.add(OpKind::Add, {x, b}, {}, "shifted"));
  try {
    checkFitsMemory(g, 1 << 20, "this machine", MemoryLayout{});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_HAS(std::string(e.what()), "activations do not fit");
    EXPECT_HAS(std::string(e.what()), "'input' [1048576, 64], takes 256.0 MiB");
  }
}

// A node without an origin (autodiff's) is located by the nearest origin upstream.
TEST(MemoryCheck, LargestActivationWithoutOriginIsLocatedUpstream) {
  Graph g;
  const ValueId x = g.addInput("input", {1 << 20, 64});
  g.node(g.value(x).producer).origin = "cfg.yaml:8:8: train.batch_size = 1048576";
  const ValueId w = g.addParam("w", {64, 128}, "xavier");
  g.setOutput("prediction", g.add(OpKind::MatMul, {x, w}, {}, "wide"));
  try {
    checkFitsMemory(g, 1 << 20, "this machine", MemoryLayout{});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("cfg.yaml:8:8: train.batch_size = 1048576: the model's activations do not fit", 0), 0u) << m;
    EXPECT_HAS(m, "'wide' [1048576, 128], takes 512.0 MiB");
  }
}

const char* kSineMlp =
    "name: t\n"
    "data: {kind: sine, window: 8, samples: 64}\n"
    "model:\n"
    "  input: [8]\n"
    "  layers:\n"
    "    - linear: {units: 16, activation: relu}\n"
    "    - linear: {units: 1}\n"
    "train: {batch_size: 4}\n";

// Issue 24: units = 10^12 segfaulted (or threw std::bad_alloc). It now fails before anything is
// allocated, naming the key, its value and both sizes.
TEST(MemoryCheck, HugeUnitsAreRefusedBeforeAllocatingWithTheKey) {
  const std::string m = errorOf(kSineMlp, {"model.layers.0.linear.units=1000000000000"});
  // The layer's place in the file, and the flag that set the value.
  EXPECT_HAS(m, "cfg.yaml:6:7 (with --set model.layers[0].linear.units=1000000000000): "
                "model.layers[0].linear.units = 1000000000000 needs 29.1 TiB of weights");
  EXPECT_HAS(m, "this machine has");
  // Larger still: the weight alone would exceed 2^48 elements; refused while the graph is built.
  const std::string m2 = errorOf(kSineMlp, {"model.layers.0.linear.units=100000000000000"});
  EXPECT_HAS(m2, "cfg.yaml:6:7 (with --set model.layers[0].linear.units=100000000000000): model.layers[0].linear: ");
  EXPECT_HAS(m2, "[8, 100000000000000] holds more than 2^48 elements");
}

// The activation case was not located ("the model's activations do not fit (the largest,
// 'fused-linear_5' ..."): it names the layer that made the largest, fused or not.
TEST(MemoryCheck, LargestActivationNamesItsLayer) {
  for (const char* fuse : {"false", "true"}) {
    const std::string m = errorOf(std::string(kSineMlp) + "compiler: {fuse: " + fuse + "}\n",
                                  {"model.layers.0.linear.units=1000000000000", "train.batch_size=32"});
    EXPECT_HAS(m, "cfg.yaml:6:7 (with --set model.layers[0].linear.units=1000000000000): "
                  "model.layers[0].linear.units = 1000000000000: the model's activations do not fit (the largest, '");
  }
}

const std::string kExplicit = "name: t\ndata: {kind: function, inputs: 3}\nmodel:\n";

TEST(MemoryCheck, HugeExplicitShapesAreLocated) {
  EXPECT_HAS(errorOf(kExplicit + "  params: {w: {shape: [100000000, 100000000, 100000000]}}\n  nodes:\n"
                                 "    - {op: matmul, inputs: [input, w], output: y}\n"),
             "cfg.yaml:4:23: model.params.w.shape: node 'w': attribute 'shape' [100000000, 100000000, 100000000] holds more "
             "than 2^48 elements (about 1.00e+24)");
  const std::string rep = errorOf(kExplicit + "  input: [1, 3, 1]\n  nodes:\n"
                                              "    - {op: repeat-heads, inputs: [input], output: r, axis: 1, repeats: 4611686018427387904}\n"
                                              "    - {op: sum, inputs: [r], output: y, axes: [1, 2]}\n");
  EXPECT_HAS(rep, "cfg.yaml:6:7: model.nodes[0]: repeat-heads: node 'r': repeating axis 1");
  const std::string bc = errorOf(kExplicit + "  nodes:\n"
                                             "    - {op: broadcast-to, inputs: [input], output: b, shape: [1000000000, 1000000000, 64, 3]}\n"
                                             "    - {op: sum, inputs: [b], output: y, axes: [0, 1]}\n");
  EXPECT_HAS(bc, "cfg.yaml:5:7: model.nodes[0]: broadcast-to: node 'b': attribute 'shape'");
  EXPECT_HAS(errorOf(kExplicit + "  input: [3000000000, 3000000000, 3000000000]\n  nodes:\n"
                                 "    - {op: sum, inputs: [input], output: y, axes: [1, 2, 3]}\n"),
             "cfg.yaml:4:10: model.input: [3000000000, 3000000000, 3000000000] holds about 2.70e+28 elements");
  // Set by --set, they name the flag.
  EXPECT_HAS(errorOf(kExplicit + "  input: [3]\n  nodes:\n    - {op: sum, inputs: [input], output: y, axes: [1]}\n",
                     {"model.input.0=9000000000000000000"}),
             "cfg.yaml:4:10 (with --set model.input[0]=9000000000000000000): model.input: [9000000000000000000] holds");
  EXPECT_HAS(errorOf(kExplicit + "  params: {w: {shape: [3, 1]}}\n  nodes:\n"
                                 "    - {op: matmul, inputs: [input, w], output: y}\n",
                     {"model.params.w.shape=[9223372036854775807, 8]"}),
             "--set model.params.w.shape=[9223372036854775807, 8]: model.params.w.shape: node 'w'");
}

// --- Located mistakes in explicit graphs and layers -----------------------------------------

// Shape errors of hand-written nodes name the YAML node (file:line:col, key path, op), not only
// the graph's node.
TEST(LocatedErrors, ExplicitShapeErrorsNameTheYamlNode) {
  const std::string base = kExplicit + "  params: {w: {shape: [2, 4]}}\n  nodes:\n";
  const std::string mm = errorOf(base + "    - {op: relu, inputs: [input], output: r}\n"
                                        "    - {op: matmul, inputs: [r, w], output: y}\n");
  EXPECT_HAS(mm, "cfg.yaml:7:7: model.nodes[1]: matmul: node 'y': matmul inner dimensions differ: [64, 3] · [2, 4]");
  EXPECT_HAS(errorOf(base + "    - {op: add, inputs: [input], output: y}\n"),
             "cfg.yaml:6:7: model.nodes[0]: add: node 'y': op 'add' takes 2 inputs, got 1");
  EXPECT_HAS(errorOf(base + "    - {op: reshape, inputs: [input], output: y, shape: [64, 5]}\n"),
             "cfg.yaml:6:7: model.nodes[0]: reshape: node 'y': cannot reshape [64, 3] (192 elements) to [64, 5]");
  EXPECT_HAS(errorOf(base + "    - {op: permute, inputs: [input], output: y, perm: [0, 0]}\n"),
             "cfg.yaml:6:7: model.nodes[0]: permute: node 'y': perm [0, 0] is not a permutation");
  EXPECT_HAS(errorOf(base + "    - {op: add, inputs: [input, w], output: y}\n"),
             "cfg.yaml:6:7: model.nodes[0]: add: node 'y': cannot broadcast [64, 3] with [2, 4]");
}

// An attribute of the wrong type threw std::bad_variant_access ("std::get: wrong index for
// variant", exit 1); it is now refused at the attribute with the type it needs.
TEST(LocatedErrors, AttributeOfTheWrongTypeNamesTheAttribute) {
  const std::string base = kExplicit + "  nodes:\n";
  EXPECT_HAS(errorOf(base + "    - {op: permute, inputs: [input], output: y, perm: first}\n"),
             "model.nodes[0].perm: attribute 'perm' of op 'permute' must be a list of integers, got \"first\"");
  EXPECT_HAS(errorOf(base + "    - {op: reshape, inputs: [input], output: y, shape: [64, 1.5, 2]}\n"),
             "must be a list of integers");
  EXPECT_HAS(errorOf(base + "    - {op: softmax, inputs: [input], output: y, axis: last}\n"),
             "attribute 'axis' of op 'softmax' must be an integer, got \"last\"");
  EXPECT_HAS(errorOf(base + "    - {op: scale, inputs: [input], output: y, value: half}\n"), "must be a number");
  // YAML's infinities are numbers (a mask's fill), as they are in lists.
  EXPECT_HAS(errorOf(base + "    - {op: attention-mask, inputs: [input], output: y, causal: true, fill: -.inf}\n"),
             "model.nodes[0]: the model's prediction [64, 3] does not match");
  // The graph checks the same for nodes built in code (a pass, a test): no bad_variant_access.
  Graph g;
  const ValueId x = g.addInput("x", {2, 3});
  AttrMap a;
  a.set("perm", std::string("10"));
  EXPECT_THROW(g.add(OpKind::Permute, {x}, a), ShapeError);
}

// relu-grad and the other backward-only ops were accepted, then refused by autodiff (exit 1).
TEST(LocatedErrors, BackwardOnlyOpsAreRefusedAtTheNode) {
  const std::string m = errorOf(kExplicit + "  nodes:\n"
                                            "    - {op: relu, inputs: [input], output: r}\n"
                                            "    - {op: relu-grad, inputs: [r, input], output: y}\n");
  EXPECT_HAS(m, "cfg.yaml:6:7: model.nodes[1].op: op 'relu-grad' is backward-only");
  EXPECT_HAS(m, "Valid ops: ");
  EXPECT_FALSE(contains(m.substr(m.find("Valid ops: ")), "relu-grad")) << m;
  EXPECT_HAS(errorOf(kExplicit + "  nodes:\n    - {op: flash-attention-grad, inputs: [input], output: y}\n"),
             "is backward-only");
}

TEST(LocatedErrors, UndefinedModelOutputListsTheDefinedValues) {
  const std::string m = errorOf(kExplicit + "  output: yy\n  nodes:\n"
                                            "    - {op: sum, inputs: [input], output: y, axes: [1], keepdims: true}\n");
  EXPECT_HAS(m, "cfg.yaml:4:11: model.output: no value named 'yy'; did you mean 'y'? Defined values: input, y");
  const std::string sum = "  nodes:\n    - {op: sum, inputs: [input], output: y, axes: [1], keepdims: true}\n";
  EXPECT_HAS(errorOf(kExplicit + sum, {"model.output=z"}), "--set model.output=z: model.output: no value named 'z'");
  // Left out, the output is the last node's: renaming that node's output keeps it so.
  EXPECT_EQ(errorOf(kExplicit + sum, {"model.nodes.0.output=z"}), "");
  // The input's extents disagree with the data's sample: located at model.input.
  EXPECT_HAS(errorOf(kExplicit + "  input: [2]\n" + sum),
             "cfg.yaml:4:10: model.input: [2] holds 2 elements but one data sample [3] holds 3");
}

// Names the trainer gives its own values ("target", "loss", "grad_seed", ...) collided after
// the model was built, with a message naming an internal node.
TEST(LocatedErrors, ReservedValueNamesAreRefusedWhereTheyAreWritten) {
  for (const char* name : {"target", "loss", "grad_seed", "grad/w", "w.bf16", "y:1"}) {
    const std::string m = errorOf(kExplicit + "  nodes:\n    - {op: sum, inputs: [input], output: '" + name +
                                  "', axes: [1], keepdims: true}\n");
    EXPECT_HAS(m, "cfg.yaml:5:7: model.nodes[0].output: '" + std::string(name) + "' is a name the trainer gives");
  }
  EXPECT_HAS(errorOf(kExplicit + "  params: {loss: {shape: [3, 1]}}\n  nodes:\n"
                                 "    - {op: matmul, inputs: [input, loss], output: y}\n"),
             "cfg.yaml:4:12: model.params.loss: 'loss' is a name the trainer gives");
}

TEST(LocatedErrors, PredictionTargetMismatchNamesTheLastLayerOrNode) {
  EXPECT_HAS(errorOf(kSineMlp, {"model.layers.1.linear.units=3"}),
             "cfg.yaml:7:7 (with --set model.layers[1].linear.units=3): model.layers[1].linear.units: the model's "
             "prediction [4, 3] does not match the target [4, 1]");
  EXPECT_HAS(errorOf(kExplicit + "  nodes:\n    - {op: relu, inputs: [input], output: y}\n"),
             "cfg.yaml:5:7: model.nodes[0]: the model's prediction [64, 3] does not match the target [64, 1]");
}

TEST(LocatedErrors, CastOnlyToTheDocumentedDtypes) {
  for (const char* t : {"f16", "f64", "int8"})
    EXPECT_HAS(errorOf(kExplicit + "  nodes:\n    - {op: cast, inputs: [input], output: c, dtype: " + t +
                       "}\n    - {op: sum, inputs: [c], output: y, axes: [1], keepdims: true}\n"),
               "cfg.yaml:5:7: model.nodes[0]: cast: node 'c': cast needs a 'dtype' attribute: f32 or bf16, got '" +
                   std::string(t) + "'");
  EXPECT_EQ(errorOf(kExplicit + "  nodes:\n    - {op: cast, inputs: [input], output: c, dtype: f32}\n"
                                "    - {op: sum, inputs: [c], output: y, axes: [1], keepdims: true}\n"),
            "");
}

// --- Start-up time linear in the layer count ------------------------------------------------

// The training step of an MLP of `layers` linear layers, fused as the default pipeline does.
Graph deepMlp(int layers) {
  std::string yaml = "name: deep\ndata: {kind: sine, window: 8, samples: 64}\nmodel:\n  input: [8]\n  layers:\n";
  for (int i = 0; i + 1 < layers; ++i) yaml += "    - linear: {units: 8, activation: relu}\n";
  yaml += "    - linear: {units: 1}\ntrain: {batch_size: 4}\ncompiler: {fuse: [linear, attention, elementwise]}\n";
  return compileTrainingGraph(parseConfig(yaml, "deep.yaml", {}), RunOptions{}, {8}, {1}, 4).model.graph;
}

// No two values live at the same time share bytes (positions in topological order; inputs,
// constants and graph outputs live throughout, as planMemory defines it).
void expectValidPlan(const Graph& g, const MemoryPlan& plan) {
  const std::vector<NodeId> order = g.topoOrder();
  const int64_t end = static_cast<int64_t>(order.size());
  std::vector<int64_t> first(g.numValues(), -2), last(g.numValues(), -2);
  for (int64_t pos = 0; pos < end; ++pos) {
    const Node& n = g.node(order[static_cast<size_t>(pos)]);
    for (ValueId v : n.inputs) last[v] = std::max(last[v], pos);
    const bool pinned = n.op == OpKind::Input || n.op == OpKind::Constant;
    for (ValueId v : n.outputs) {
      first[v] = pinned ? -1 : pos;
      last[v] = std::max(last[v], pinned ? end : pos);
    }
  }
  for (const auto& kv : g.outputs()) last[kv.second] = end;
  struct Span {
    int64_t first, last, lo, hi;
  };
  std::vector<Span> spans;
  std::vector<int64_t> liveDelta(static_cast<size_t>(end + 3), 0);  // aligned sizes live at each position
  for (size_t v = 0; v < g.numValues(); ++v) {
    if (plan.offset[v] < 0) continue;
    const int64_t n = numel(g.shape(static_cast<ValueId>(v)));
    spans.push_back({first[v], last[v], plan.offset[v], plan.offset[v] + n});
    ASSERT_LE(plan.offset[v] + n, plan.arenaElements);
    liveDelta[static_cast<size_t>(first[v] + 1)] += (n + 15) / 16 * 16;
    liveDelta[static_cast<size_t>(last[v] + 2)] -= (n + 15) / 16 * 16;
  }
  // No plan can beat the most bytes live at one time; a good one comes close.
  int64_t live = 0, peak = 0;
  for (int64_t d : liveDelta) peak = std::max(peak, live += d);
  EXPECT_LE(plan.arenaElements, peak + peak / 4) << "peak of live values " << peak;
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
  int64_t overlaps = 0;
  for (size_t i = 0; i < spans.size(); ++i)
    for (size_t j = i + 1; j < spans.size() && spans[j].lo < spans[i].hi; ++j)
      overlaps += !(spans[i].last < spans[j].first || spans[j].last < spans[i].first);
  EXPECT_EQ(overlaps, 0);
}

// Issue 24: 8,000 linear layers took ~25 s before the first step, nearly all of it in memory
// planning, whose greedy-by-size placement compares each value with every value placed before
// it. Large graphs are now placed in execution order with a free list: the work (counted, not
// timed) grows linearly with the model, and the plan is still valid.
TEST(LinearStartUp, MemoryPlanWorkGrowsLinearlyWithLayers) {
  const Graph small = deepMlp(1500), large = deepMlp(3000);
  const MemoryPlan ps = planMemory(small), pl = planMemory(large);
  ASSERT_GT(std::count_if(ps.offset.begin(), ps.offset.end(), [](int64_t o) { return o >= 0; }),
            static_cast<long>(kGreedyBySizeLimit));
  EXPECT_LT(pl.placementSteps, ps.placementSteps * 21 / 10) << ps.placementSteps << " then " << pl.placementSteps;
  expectValidPlan(large, pl);
  // Below the limit the tight greedy placement is kept (its work is quadratic, its plans valid).
  const Graph tiny = deepMlp(50);
  const MemoryPlan pt = planMemory(tiny);
  expectValidPlan(tiny, pt);
}

// The rewrite passes keep their use lists up to date instead of recomputing them after each
// rewrite, and replace uses through them: the fused deep model still has one fused-linear per
// layer forward and one matmul-act-grad per hidden layer backward, and verifies.
TEST(LinearStartUp, DeepModelFusesEveryLayer) {
  const Graph g = deepMlp(300);
  std::map<OpKind, int> count;
  for (NodeId id : g.topoOrder()) count[g.node(id).op]++;
  EXPECT_EQ(count[OpKind::FusedLinear], 300);
  EXPECT_EQ(count[OpKind::MatMulActGrad], 299);
  EXPECT_EQ(count[OpKind::ReluGrad], 0);
  verifyGraph(g);
}

}  // namespace
}  // namespace pa
