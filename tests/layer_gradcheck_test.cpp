// Every layer kind, lowered by the frontend from YAML, against finite differences in float64:
// linear with every activation, attention with every mask combination and GQA ratio, rotary
// positions and block norms, mlp with every activation, norm, position and repeat.
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
  for (const char* act : {"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "none"}) {
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
  // Transformer blocks (odd widths, a head dim rope only partly turns).
  const LayerCase blocks[] = {
      {"attention_rope_preRms_kv2", "    - attention: {heads: 4, kv_heads: 2, head_dim: 4, causal: true, rope: {base: 50}, pre_norm: rms, residual: true, bias: false}\n    - linear: {units: 1}\n", {5, 6}, {5, 1}},
      {"attention_ropeInterleavedPartial_postLayer", "    - attention: {heads: 2, head_dim: 6, rope: {dims: 4, interleaved: true}, post_norm: layer, residual: true, sink_logits: true}\n    - linear: {units: 1}\n", {5, 6}, {5, 1}},
      {"mlp_gelu_tanh_preLayer", "    - mlp: {hidden: 7, activation: gelu_tanh, pre_norm: {kind: layer, eps: 0.01}, residual: true}\n    - linear: {units: 2}\n", {3, 5}, {3, 2}},
      {"mlp_swiglu_noBias", "    - mlp: {hidden: 6, activation: swiglu, bias: false, residual: true, pre_norm: rms}\n    - linear: {units: 2}\n", {3, 5}, {3, 2}},
      {"mlp_silu_postRms", "    - mlp: {hidden: 4, activation: silu, post_norm: rms}\n    - linear: {units: 2}\n", {5}, {2}},
      {"linear_residual_preNorm", "    - linear: {units: 5, activation: relu, residual: true, pre_norm: layer}\n    - linear: {units: 2}\n", {5}, {2}},
      {"norm_layer_and_rms", "    - linear: {units: 5}\n    - norm: layer\n    - norm: {kind: rms, eps: 0.1}\n    - linear: {units: 2}\n", {3}, {2}},
      {"position_learned", "    - position: {kind: learned}\n    - attention: {heads: 2, causal: true}\n    - linear: {units: 1}\n", {5, 4}, {5, 1}},
      {"position_sinusoidal", "    - position: {kind: sinusoidal}\n    - attention: {heads: 1}\n    - linear: {units: 1}\n", {5, 3}, {5, 1}},
      {"repeat_alternatingWindows", "    - repeat: {times: 3, layers: [{attention: {heads: 2, causal: true, pre_norm: rms, residual: true, rope: true}}, {mlp: {hidden: 6, activation: swiglu, pre_norm: rms, residual: true}}], overrides: [{attention: {window: 1}}, {}]}\n    - norm: rms\n    - linear: {units: 1}\n", {5, 4}, {5, 1}},
  };
  for (const LayerCase& b : blocks) cs.push_back(b);
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
