// Both layer kinds, lowered by the frontend from YAML, against finite differences in float64:
// linear with every activation, attention with every mask combination and GQA ratio.
#include <gtest/gtest.h>

#include <cmath>

#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "test_util.h"

namespace pa {
namespace {

struct LayerCase {
  std::string name;
  std::string layers;             // YAML list of layers
  std::vector<int64_t> input;     // one sample's shape
  std::vector<int64_t> target;
};
void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }  // ctest's names: see op_cases.h

Config configFor(const LayerCase& c) {
  std::string in = "[";
  for (size_t i = 0; i < c.input.size(); ++i) in += (i ? ", " : "") + std::to_string(c.input[i]);
  in += "]";
  const std::string yaml = "name: t\ndata: {kind: function}\nmodel:\n  input: " + in + "\n  layers:\n" + c.layers;
  return parseConfig(yaml, "test.yaml", {});
}

class LayerGradCheck : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerGradCheck, MatchesFiniteDifferencesInFloat64) {
  const LayerCase& c = GetParam();
  const Config cfg = configFor(c);
  const int64_t batch = 2;
  BuiltModel m = buildModel(cfg, c.input, c.target, batch);
  const uint64_t seed = std::hash<std::string>{}(c.name);
  std::map<std::string, std::pair<double, double>> ranges;
  for (ValueId p : m.graph.params()) ranges[m.graph.value(p).name] = {-0.7, 0.7};
  const auto init = test::randomParams(m.graph, seed, ranges);
  const test::GradCheckResult r = test::gradCheck(m.graph, init, [&](CpuExecutor<double>& ex) {
    test::fillRandom(ex.data(m.x), numel(m.graph.shape(m.x)), seed + 1);
    test::fillRandom(ex.data(m.y), numel(m.graph.shape(m.y)), seed + 2);
  });
  EXPECT_GT(r.checked, 0);
  EXPECT_FALSE(r.anyNonFinite);
  EXPECT_LT(r.maxError, 1e-6) << "worst at " << r.where;
}

std::vector<LayerCase> layerCases() {
  std::vector<LayerCase> cs;
  for (const char* act : {"relu", "gelu", "tanh", "sigmoid", "none"}) {
    cs.push_back({std::string("linear_") + act,
                  std::string("    - linear: {units: 5, activation: ") + act + "}\n    - linear: {units: 2, bias: false}\n",
                  {3}, {2}});
  }
  struct Mask {
    const char* name;
    const char* yaml;
  };
  const Mask masks[] = {
      {"none", ""},
      {"causal", ", causal: true"},
      {"causalBottomRight", ", causal: true, align: bottom-right"},
      {"windowLeft", ", window: {left: 1}"},
      {"windowBoth", ", window: {left: 1, right: 1}"},
      {"causalWindow", ", causal: true, window: {left: 2}"},
      {"causalWindowSinks", ", causal: true, window: {left: 1}, sinks: 2"},
      {"windowSinks", ", window: {left: 0, right: 0}, sinks: 1"},
  };
  for (const Mask& m : masks) {
    for (int kv : {4, 2, 1}) {
      for (bool sinkLogits : {false, true}) {
        LayerCase c;
        c.name = std::string("attention_") + m.name + "_kv" + std::to_string(kv) + (sinkLogits ? "_sinkLogits" : "");
        c.layers = std::string("    - attention: {heads: 4, kv_heads: ") + std::to_string(kv) + m.yaml +
                   (sinkLogits ? ", sink_logits: true" : "") + ", residual: true}\n    - linear: {units: 1}\n";
        c.input = {5, 8};
        c.target = {5, 1};
        cs.push_back(c);
      }
    }
  }
  return cs;
}

INSTANTIATE_TEST_SUITE_P(Layers, LayerGradCheck, ::testing::ValuesIn(layerCases()),
                         [](const ::testing::TestParamInfo<LayerCase>& i) { return i.param.name; });

TEST(AttentionLayer, LowersToTheDocumentedPrimitives) {
  LayerCase c{"", "    - attention: {heads: 4, kv_heads: 2, causal: true, sink_logits: true, residual: true}\n", {5, 8}, {5, 8}};
  BuiltModel m = buildModel(configFor(c), c.input, c.target, 2);
  std::map<OpKind, int> count;
  for (const Node& n : m.graph.nodes()) count[n.op]++;
  EXPECT_EQ(count[OpKind::RepeatHeads], 2);   // K and V for grouped-query attention
  EXPECT_EQ(count[OpKind::AttentionMask], 1);
  EXPECT_EQ(count[OpKind::Softmax], 1);
  EXPECT_EQ(count[OpKind::Scale], 1);
  EXPECT_EQ(count[OpKind::MatMul], 6);        // q, k, v, o projections, QKᵀ, PV
  EXPECT_EQ(count[OpKind::Param], 9);         // 4 weights, 4 biases, sink logits
}

}  // namespace
}  // namespace pa
