// Issue 24, "no crash, no silent garbage, every mistake located": graph storage stays put while
// the graph grows, shape arithmetic cannot overflow, sizes are checked against memory before
// anything is allocated, and mistakes in explicit graphs name their YAML node.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "graph/errors.h"
#include "graph/graph.h"

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

}  // namespace
}  // namespace pa
