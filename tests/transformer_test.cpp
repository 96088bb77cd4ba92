// Transformer blocks: repeat's parameter names and overrides, rotary positions against formulas
// written here independently of kernels/cpu (Llama's rotate_half and Meta's complex product),
// the delayed sine task, the example configs, and the mistakes these layers can be given.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numeric>
#include <set>

#include "common/rng.h"
#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "tests/config_error_of.h"
#include "runtime/cpu_executor.h"
#include "test_util.h"

namespace pa {
namespace {

std::string errorOf(const std::string& yaml, const std::vector<std::string>& sets = {}) { return test::configErrorOf(yaml, sets); }

const char* kBlocks =
    "name: t\n"
    "data: {kind: sine, window: 8, channels: 2, samples: 16, target: delayed, delay: 3}\n"
    "model:\n"
    "  input: [8, 2]\n"
    "  layers:\n"
    "    - linear: {units: 8, bias: false}\n"
    "    - repeat:\n"
    "        times: 4\n"
    "        layers:\n"
    "          - attention: {heads: 2, kv_heads: 1, causal: true, rope: true, pre_norm: rms, residual: true}\n"
    "          - mlp: {hidden: 12, activation: swiglu, pre_norm: rms, residual: true}\n"
    "        overrides: [{attention: {window: 2}}, {}]\n"
    "    - norm: rms\n"
    "    - linear: {units: 1}\n"
    "train: {batch_size: 2, steps: 2}\n";

std::set<std::string> paramNames(const Graph& g) {
  std::set<std::string> names;
  for (ValueId p : g.params()) names.insert(g.value(p).name);
  return names;
}

TEST(RepeatLayer, NamesParametersPerRepeatAndCyclesOverrides) {
  const Config c = parseConfig(kBlocks, "model.yaml", {});
  const BuiltModel m = buildModel(c, {8, 2}, {8, 1}, 2);
  const std::set<std::string> names = paramNames(m.graph);
  for (int r = 0; r < 4; ++r) {
    const std::string b = "blocks." + std::to_string(r) + ".";
    for (const char* what : {"attention.q_weight", "attention.o_bias", "attention.norm_gain", "mlp.gate_weight",
                             "mlp.up_weight", "mlp.down_bias", "mlp.norm_gain"})
      EXPECT_TRUE(names.count(b + what)) << b + what;
  }
  EXPECT_TRUE(names.count("layers.0.weight"));
  EXPECT_TRUE(names.count("layers.2.gain"));
  EXPECT_FALSE(names.count("blocks.4.attention.q_weight"));
  // Even repeats see 2 keys back, odd ones the whole causal past.
  std::vector<int64_t> windows;
  for (NodeId id : m.graph.topoOrder())
    if (m.graph.node(id).op == OpKind::AttentionMask) windows.push_back(m.graph.node(id).attrs.get<attr::WindowLeft>());
  EXPECT_EQ(windows, (std::vector<int64_t>{2, -1, 2, -1}));
  // The printed form parses back to the same model.
  const std::string text = c.model.layers[1]->resolved();
  EXPECT_NE(text.find("overrides: [{attention: {window: 2}}, {}]"), std::string::npos) << text;
}

TEST(RepeatLayer, KindsThatRepeatInTheListAreNumbered) {
  const std::string yaml =
      "name: t\ndata: {kind: function, inputs: 3}\nmodel:\n  input: [3]\n  layers:\n"
      "    - repeat: {times: 2, name: stack, layers: [{linear: {units: 3}}, {linear: {units: 3, activation: relu}}, {norm: layer}]}\n"
      "    - linear: {units: 1}\n";
  const BuiltModel m = buildModel(parseConfig(yaml, "m.yaml", {}), {3}, {1}, 2);
  const std::set<std::string> names = paramNames(m.graph);
  for (const char* n : {"stack.0.linear_0.weight", "stack.0.linear_1.bias", "stack.1.linear_1.weight", "stack.1.norm.gain",
                        "stack.1.norm.bias"})
    EXPECT_TRUE(names.count(n)) << n;
}

// Rope against Llama's rotate_half (half-split pairs) and Meta's complex product (interleaved
// pairs), written here from the published formulas.
TEST(Rope, MatchesRotateHalfAndTheComplexProduct) {
  const int64_t B = 2, H = 3, S = 7, D = 8;
  const double base = 500.0;
  for (bool interleaved : {false, true}) {
    for (const char* layout : {"bhsd", "bshd"}) {
      const bool bshd = std::string(layout) == "bshd";
      Graph g;
      const Shape shape = bshd ? Shape{B, S, H, D} : Shape{B, H, S, D};
      const ValueId x = g.addInput("x", shape);
      const ValueId y = g.add(OpKind::Rope, {x},
                              AttrMap().set<attr::RopeBase>(base).set<attr::Interleaved>(interleaved).set<attr::Layout>(std::string(layout)));
      g.setOutput("y", y);
      CpuExecutor<double> ex(g);
      test::fillRandom(ex.data(x), numel(shape), 11);
      ex.run();
      const double* in = ex.data(x);
      const double* out = ex.data(y);
      double worst = 0.0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t s = 0; s < S; ++s) {
            const int64_t row = bshd ? ((b * S + s) * H + h) * D : ((b * H + h) * S + s) * D;
            std::vector<double> ref(D);
            if (!interleaved) {
              // cos/sin of freqs repeated twice (cat(freqs, freqs)); rotate_half(x) = cat(-x2, x1).
              for (int64_t i = 0; i < D; ++i) {
                const double freq = 1.0 / std::pow(base, static_cast<double>(2 * (i % (D / 2))) / D);
                const double rot = i < D / 2 ? -in[row + i + D / 2] : in[row + i - D / 2];
                ref[i] = in[row + i] * std::cos(s * freq) + rot * std::sin(s * freq);
              }
            } else {
              for (int64_t j = 0; j < D / 2; ++j) {
                const double freq = 1.0 / std::pow(base, static_cast<double>(2 * j) / D);
                const std::complex<double> z(in[row + 2 * j], in[row + 2 * j + 1]);
                const std::complex<double> r = z * std::polar(1.0, s * freq);
                ref[2 * j] = r.real();
                ref[2 * j + 1] = r.imag();
              }
            }
            for (int64_t i = 0; i < D; ++i) worst = std::max(worst, std::fabs(ref[i] - out[row + i]));
          }
      EXPECT_LT(worst, 1e-13) << layout << (interleaved ? " interleaved" : " half-split");
    }
  }
}

TEST(SineData, DelayedTargetIsChannelZeroStepsBack) {
  const Config c = parseConfig("name: t\ndata: {kind: sine, window: 40, channels: 3, samples: 8, noise: 0, target: delayed, "
                               "delay: 15, validation: 0}\nmodel: {input: [40, 3], layers: [{linear: {units: 1}}]}\n",
                               "d.yaml", {});
  const DataSplit d = loadData(c.data, c.seed, ".");
  ASSERT_EQ(d.train.yShape, (std::vector<int64_t>{40, 1}));
  double worst = 0.0;
  for (int64_t i = 0; i < d.train.count; ++i)
    for (int64_t t = 15; t < 40; ++t)
      worst = std::max(worst, static_cast<double>(std::fabs(d.train.y[static_cast<size_t>(i * 40 + t)] - d.train.x[static_cast<size_t>((i * 40 + t - 15) * 3)])));
  EXPECT_LT(worst, 1e-6);  // float32 storage of the same sine
}

// The sine samples are made in parallel from per-sample generator states: they equal, bit for
// bit, one sequential pass over the stream (a period, a phase per channel, a normal per value).
TEST(SineData, ParallelSamplesEqualTheSequentialStream) {
  const Config c = parseConfig("name: t\ndata: {kind: sine, window: 5, channels: 3, samples: 37, noise: 0.5, target: next, "
                               "horizon: 2, validation: 0, shuffle: false}\nmodel: {input: [5, 3], layers: [{linear: {units: 2}}]}\n",
                               "d.yaml", {});
  const DataSplit d = loadData(c.data, c.seed, ".");
  ASSERT_EQ(d.train.count, 37);
  Rng rng = Rng::stream(c.seed, "data/sine");
  int differ = 0;
  for (int64_t i = 0; i < 37; ++i) {
    const double omega = 6.283185307179586 / rng.uniform(c.data.periodMin, c.data.periodMax);
    double phase[3];
    for (double& p : phase) p = rng.uniform(0.0, 6.283185307179586);
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t ch = 0; ch < 3; ++ch) {
        const float want = static_cast<float>(std::sin((ch + 1) * omega * t + phase[ch]) + 0.5 * rng.normal());
        differ += d.train.x[static_cast<size_t>((i * 5 + t) * 3 + ch)] != want;
      }
    for (int64_t k = 0; k < 2; ++k)
      differ += d.train.y[static_cast<size_t>(i * 2 + k)] != static_cast<float>(std::sin(omega * (5 + k) + phase[0]));
  }
  EXPECT_EQ(differ, 0);
}

// Generated samples are made straight into their place in the split: the validation rows are
// the shuffled order's first floor(validation × count) samples, the training rows the rest, as
// if the whole unshuffled set had been made and then permuted (data.shuffle's Fisher-Yates on
// the stream "data/split").
TEST(SineData, SamplesLandWhereTheShuffledSplitPutsThem) {
  for (const std::string data : {"{kind: sine, window: 6, channels: 2, samples: 41, noise: 0.3, target: sequence",
                                 "{kind: function, fn: cubic, inputs: 3, samples: 41, noise: 0.1"}) {
    const std::string model = "\nmodel: {layers: [{linear: {units: 1}}]}\n";
    const Config split = parseConfig("name: t\ndata: " + data + ", validation: 0.3}" + model, "d.yaml", {});
    const Config whole = parseConfig("name: t\ndata: " + data + ", validation: 0, shuffle: false}" + model, "d.yaml", {});
    const DataSplit s = loadData(split.data, split.seed, "."), w = loadData(whole.data, whole.seed, ".");
    ASSERT_EQ(s.validation.count, 12) << data;
    ASSERT_EQ(s.train.count, 29) << data;
    std::vector<int64_t> idx(41);
    std::iota(idx.begin(), idx.end(), 0);
    Rng rng = Rng::stream(split.seed, "data/split");
    for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[rng.below(i)]);
    const int64_t xs = w.train.xSize(), ys = w.train.ySize();
    int differ = 0;
    for (int64_t p = 0; p < 41; ++p) {
      const Dataset& d = p < 12 ? s.validation : s.train;
      const int64_t row = p < 12 ? p : p - 12, j = idx[static_cast<size_t>(p)];
      differ += !std::equal(d.x.begin() + row * xs, d.x.begin() + (row + 1) * xs, w.train.x.begin() + j * xs);
      differ += !std::equal(d.y.begin() + row * ys, d.y.begin() + (row + 1) * ys, w.train.y.begin() + j * ys);
    }
    EXPECT_EQ(differ, 0) << data;
  }
}

// Rng::Jump(n) lands where n calls of next() do, for counts around the word and power-of-two edges.
TEST(SineData, GeneratorJumpEqualsStepping) {
  for (uint64_t n : {0ull, 1ull, 2ull, 63ull, 64ull, 65ull, 255ull, 256ull, 1000ull, 131329ull}) {
    Rng stepped = Rng::stream(7, "jump");
    const Rng::State from = stepped.state();
    for (uint64_t k = 0; k < n; ++k) stepped.next();
    EXPECT_EQ(Rng::Jump(n).apply(from), stepped.state()) << n << " draws";
  }
}

TEST(TransformerConfigs, MistakesNameTheKey) {
  auto has = [](const std::string& e, const std::string& what) {
    EXPECT_NE(e.find(what), std::string::npos) << "expected '" << what << "' in: " << e;
  };
  has(errorOf(kBlocks, {"model.layers.1.repeat.layers.0.attention.post_norm=rms"}), "pre_norm or post_norm, not both");
  has(errorOf(kBlocks, {"model.layers.1.repeat.layers.0.attention.rope={dims: 3}"}), "rope.dims: must be even");
  has(errorOf(kBlocks, {"model.layers.1.repeat.layers.0.attention.head_dim=3"}), "head dim 3 is odd");
  has(errorOf(kBlocks, {"model.layers.1.repeat.layers.0.attention.rope={dims: 6}", "model.layers.1.repeat.layers.0.attention.head_dim=4"}),
      "6 exceeds the head dim 4");
  has(errorOf(kBlocks, {"model.layers.1.repeat.overrides=[{atention: {window: 2}}]"}), "did you mean 'attention'");
  has(errorOf(kBlocks, {"model.layers.1.repeat.overrides=[{attention: {windw: 2}}]"}), "did you mean 'window'");
  // A mistake inside an override written in the file is reported at its line and column.
  {
    std::string yaml = kBlocks;
    yaml.replace(yaml.find("{window: 2}"), 11, "{windw: 2}");
    const std::string e = errorOf(yaml);
    has(e, "model.yaml:12:");
    has(e, "model.layers[1].repeat.overrides[0].attention.windw");
    std::string missing = kBlocks;
    missing.replace(missing.find("overrides: [{attention: {window: 2}}, {}]"), 41, "overrides: [{attention: {heads: 3}}, {}]");
    has(errorOf(missing), "model.yaml:12:");  // 3 heads do not divide the width: named at the override
  }
  has(errorOf(kBlocks, {"model.layers.1.repeat.times=0"}), "times");
  has(errorOf(kBlocks, {"model.layers.1.repeat.layers=[]"}), "non-empty list of layers");
  has(errorOf(kBlocks, {"model.layers.1.repeat.layers.1.mlp.activation=swiglo"}), "did you mean 'swiglu'");
  has(errorOf(kBlocks, {"model.layers.2.norm=batch"}), "expected layer or rms");
  has(errorOf(kBlocks, {"model.layers.2.norm={kind: rms, eps: 0}"}), "eps");
  has(errorOf(kBlocks, {"data.target=sequence"}), "delay is for target: delayed");
  has(errorOf(kBlocks, {"model.layers.0.linear.residual=true"}), "units 8 differs from the input width 2");
  EXPECT_EQ(errorOf(kBlocks), "");
}

// The two example transformers build, fuse every residual add into the next norm, and print a
// resolved config that parses back to itself.
TEST(TransformerConfigs, ExamplesBuildAndFuse) {
  for (const char* name : {"tiny_gpt", "tiny_llama"}) {
    const Config c = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml",
                                {"data.window=16", "model.input=[16, 8]", "data.delay=5", "data.samples=8", "train.batch_size=2",
                                 "model.layers.0.linear.units=32", "model.layers.1.repeat.layers.1.mlp.hidden=48",
                                 "model.layers.1.repeat.layers.0.attention.head_dim=4"});
    const std::string text = resolvedConfigYaml(c);
    EXPECT_EQ(resolvedConfigYaml(parseConfig(text, "resolved.yaml", {})), text) << text;
    RunOptions o;
    o.device = "cpu";
    o.progress = ProgressMode::Quiet;
    o.printSummary = false;
    o.steps = 2;
    const TrainResult r = train(c, o);
    ASSERT_EQ(r.losses.size(), 2u) << name;
    EXPECT_TRUE(std::isfinite(r.losses.back())) << name;
    EXPECT_GT(r.trainNodes, 0u);
  }
}

}  // namespace
}  // namespace pa
