// End-to-end training: the golden trajectory, convergence on the examples, determinism,
// metrics and graph dumps.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "frontend/compare.h"
#include "frontend/config.h"
#include "frontend/trainer.h"
#include "tests/test_util.h"

namespace pa {
namespace {

namespace fs = std::filesystem;

fs::path tempDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("pa_test_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

RunOptions quiet() {
  RunOptions o;
  o.device = "cpu";  // these are the CPU backend's tests, wherever they run
  o.progress = ProgressMode::Quiet;
  o.printSummary = false;
  return o;
}

using test::readFile;

// The golden run: values from tests/golden/mlp_adam_golden.py, an independent pure-Python
// float64 implementation (plain lists; no shared code). The same data, initial weights and Adam
// hyper-parameters (data exactly representable in float32, the datasets' storage type) go
// through the whole project: CSV loading, layer lowering, autodiff, the CPU
// kernels and the optimizer.
class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, TwoLayerMlpFiveAdamSteps) {
  const fs::path dir = tempDir("golden");
  std::ofstream(dir / "data.csv") << "x0,x1,x2,y0,y1\n"
                                     "0.5,-1.0,2.0,1.0,-1.0\n"
                                     "1.5,0.25,-0.5,0.5,0.25\n"
                                     "-2.0,1.0,0.75,-0.75,2.0\n"
                                     "0.125,0.25,0.375,0.0,0.5\n";
  const std::string yaml =
      "name: golden\nprecision: " + GetParam() +
      "\ndata: {kind: csv, path: data.csv, targets: [y0, y1], validation: 0.0, shuffle: false}\n"
      "model:\n  layers:\n    - linear: {units: 4, activation: relu}\n    - linear: {units: 2}\n"
      "train: {optimizer: {lr: 0.01, betas: [0.9, 0.999], eps: 1.0e-8}, batch_size: 4, steps: 5, log_every: 5}\n";
  std::ofstream(dir / "golden.yaml") << yaml;
  RunOptions o = quiet();
  o.initialParams["layers.0.weight"] = {0.2, -0.1, 0.4, 0.3, -0.5, 0.25, 0.1, -0.2, 0.3, 0.6, -0.4, 0.15};
  o.initialParams["layers.0.bias"] = {0.05, -0.02, 0.1, 0.0};
  o.initialParams["layers.1.weight"] = {0.3, -0.6, 0.5, 0.2, -0.25, 0.4, 0.1, 0.7};
  o.initialParams["layers.1.bias"] = {0.01, -0.03};
  const TrainResult r = train(loadConfig((dir / "golden.yaml").string(), {}), o);
  const double expected[5] = {0.7977563710937499, 0.7646472808012018, 0.734348539857462, 0.7067209542481453,
                              0.681007754431328};
  const double expectedB2[2] = {-0.03956575777729271, 0.02020542015589343};
  // float64 agrees to rounding (~1e-15 relative); float32 keeps ~7 digits through five steps,
  // and Adam's normalised update amplifies early rounding by at most ~1/eps_rel, so 1e-5.
  const double tol = GetParam() == "fp64" ? 1e-12 : 1e-5;
  ASSERT_EQ(r.losses.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(r.losses[i], expected[i], tol * expected[i]) << "step " << i + 1;
  const std::vector<double>& b2 = r.finalParams.at("layers.1.bias");
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(b2[i], expectedB2[i], GetParam() == "fp64" ? 1e-12 : 1e-5);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, Golden, ::testing::Values("fp64", "fp32"));

// The default example must learn the sine task. The target (a unit sine) has variance 0.5, so
// always predicting the mean scores 0.5; 5e-3 is 1% of that, and a model that learned nothing
// useful cannot reach it. The example reaches ~1e-3 (README), leaving room for other BLAS builds.
TEST(Convergence, SineMlpReachesValidationMseBelowFiveThousandths) {
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_mlp.yaml", {});
  const TrainResult r = train(cfg, quiet());
  ASSERT_GE(r.finalValidation, 0.0);
  EXPECT_LT(r.finalValidation, 5e-3);
}

// y = sin(x) is smooth and noise-free: an MLP must fit it to within 1e-3 MSE (the known answer
// is exact; the example reaches ~3e-5).
TEST(Convergence, FunctionMlpFitsSineBelowOneThousandth) {
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/function_mlp.yaml", {});
  const TrainResult r = train(cfg, quiet());
  EXPECT_LT(r.finalValidation, 1e-3);
}

// --verbose's start-up line reads TrainResult::startup: the frontend's phases, then the first two
// steps, each timed (non-negative, and the whole no longer than the run took around it). A
// generated dataset is made beside the session, which waits for it (its own phase); a CSV file is
// read among the checks.
void expectPhases(const Config& cfg, const std::vector<std::string>& names) {
  RunOptions o;
  o.progress = ProgressMode::Quiet;
  o.printSummary = false;
  o.device = "cpu";
  const auto t0 = std::chrono::steady_clock::now();
  const TrainResult r = train(cfg, o);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.startup.size(), names.size());
  double sum = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(r.startup[i].first.substr(0, names[i].size()), names[i]);
    EXPECT_GE(r.startup[i].second, 0.0) << names[i];
    sum += r.startup[i].second;
  }
  EXPECT_LE(sum, wall);
}

TEST(Startup, PhasesAreRecordedInOrder) {
  expectPhases(loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_mlp.yaml", {"data.samples=256", "train.steps=3"}),
               {"checks", "graphs and passes", "waiting for the data (made beside the session in ", "session", "first step",
                "second step"});
  const fs::path dir = tempDir("startup_csv");
  std::ofstream(dir / "data.csv") << "x,y\n1,2\n3,4\n5,6\n7,8\n";
  std::ofstream(dir / "c.yaml") << "data: {kind: csv, path: data.csv, validation: 0.25}\n"
                                   "model: {layers: [{linear: {units: 1}}]}\ntrain: {batch_size: 2, steps: 3}\n";
  expectPhases(loadConfig((dir / "c.yaml").string(), {}),
               {"checks and data", "graphs and passes", "session", "first step", "second step"});
}

TEST(Determinism, SameSeedGivesBitIdenticalLosses) {
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml", {"train.steps=20"});
  const TrainResult a = train(cfg, quiet());
  const TrainResult b = train(cfg, quiet());
  ASSERT_EQ(a.losses.size(), 20u);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(double)));
  const Config other = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml", {"train.steps=20", "seed=1"});
  const TrainResult c = train(other, quiet());
  EXPECT_NE(a.losses.back(), c.losses.back());  // the seed does reach the run
}

TEST(Metrics, CsvAndJsonLinesHoldEveryStep) {
  const fs::path dir = tempDir("metrics");
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_mlp.yaml", {"train.log_every=5"});
  RunOptions o = quiet();
  o.steps = 10;
  o.metricsPath = (dir / "m.csv").string();
  const TrainResult r = train(cfg, o);
  std::istringstream csv(readFile(dir / "m.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "step,loss,val_loss,lr,step_ms");
  int rows = 0, withVal = 0;
  while (std::getline(csv, line)) {
    ++rows;
    const std::string val = line.substr(line.find(',', line.find(',') + 1) + 1);
    withVal += val[0] != ',';
  }
  EXPECT_EQ(rows, 10);
  EXPECT_EQ(withVal, 2);  // steps 5 and 10
  o.metricsPath = (dir / "m.jsonl").string();
  train(cfg, o);
  const std::string json = readFile(dir / "m.jsonl");
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 10);
  EXPECT_NE(json.find("\"val_loss\":null"), std::string::npos);
  EXPECT_NE(json.find("\"step\":10"), std::string::npos);
  fs::remove_all(dir);
}

TEST(DumpGraph, WritesEveryStageAndShowsTheFusedNodes) {
  const fs::path dir = tempDir("dump");
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml", {});
  RunOptions o = quiet();
  o.steps = 1;
  o.dumpGraphDir = dir.string();
  train(cfg, o);
  for (const char* stem : {"00-frontend", "01-fuse-linear", "02-fuse-attention", "03-fuse-qkv", "04-fuse-elementwise",
                           "05-autodiff", "06-fuse-loss", "07-fuse-linear-grad", "08-fuse-bias-grad", "09-fuse-elementwise",
                           "10-cse", "11-dce", "12-verify"}) {
    EXPECT_TRUE(fs::exists(dir / (std::string(stem) + ".txt"))) << stem;
    EXPECT_TRUE(fs::exists(dir / (std::string(stem) + ".dot"))) << stem;
  }
  const std::string lowered = readFile(dir / "00-frontend.txt");
  EXPECT_NE(lowered.find("attention-mask("), std::string::npos);
  EXPECT_NE(lowered.find("softmax("), std::string::npos);
  // After the forward passes: the attention block is one packed FlashAttention node (the example
  // lists qkv) and every linear layer a FusedLinear: 3 in the model, o, and q, k, v as one.
  const std::string fused = readFile(dir / "04-fuse-elementwise.txt");
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = fused.find(what); at != std::string::npos; at = fused.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("= flash-attention-qkv("), 1u);
  EXPECT_EQ(count("= flash-attention("), 0u);
  EXPECT_EQ(count("= fused-linear("), 5u);
  EXPECT_EQ(count("= softmax("), 0u);
  EXPECT_EQ(count("= matmul("), 0u);
  EXPECT_EQ(readFile(dir / "00-frontend.dot").rfind("digraph", 0), 0u);
  fs::remove_all(dir);
}

TEST(Compare, FusedAndUnfusedAgreeOnTheExamples) {
  for (const char* name : {"sine_mlp", "sine_attention"}) {
    const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml", {"train.steps=40"});
    std::FILE* sink = std::tmpfile();
    const CompareResult r = compareFusedUnfused(cfg, quiet(), sink);
    std::fclose(sink);
    EXPECT_TRUE(r.agree) << name;
    EXPECT_LE(r.maxLossRelDiff, 1e-5) << name;
    EXPECT_LT(r.fused.trainNodes, r.unfused.trainNodes) << name;
    ASSERT_FALSE(r.gradRelDiff.empty());
  }
}

// fuse-qkv: the attention examples with their projections packed, fp32 and bf16, and tiny_llama
// narrowed (rope on the packed Q and K, GQA, pre-norm blocks).
TEST(Compare, PackedQkvAgreesOnTheAttentionExamples) {
  const std::string fuse = "compiler.fuse=[linear, attention, qkv, norm, elementwise]";
  struct Case {
    const char* config;
    std::vector<std::string> sets;
  };
  const Case cases[] = {
      {"sine_attention", {"train.steps=40", fuse}},
      {"sine_attention", {"train.steps=3", "data.samples=256", "precision=bf16", "model.layers.2.linear.activation=gelu", fuse}},
      {"tiny_llama",
       {"train.steps=3", "data.window=32", "model.input=[32, 8]", "data.delay=8", "data.samples=16", "train.batch_size=2",
        "model.layers.0.linear.units=64", "model.layers.1.repeat.layers.0.attention.head_dim=8",
        "model.layers.1.repeat.layers.1.mlp.hidden=96", fuse}}};
  for (const Case& c : cases) {
    const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + c.config + ".yaml", c.sets);
    RunOptions o = quiet();
    int packed = 0;
    o.testGraphHook = [&](Graph& g) {
      for (const Node& n : g.nodes()) packed += !n.erased && n.op == OpKind::FlashAttentionQkv;
    };
    std::FILE* sink = std::tmpfile();
    const CompareResult r = compareFusedUnfused(cfg, o, sink);
    std::fclose(sink);
    EXPECT_TRUE(r.agree) << c.config << " " << c.sets[c.sets.size() - 2];
    EXPECT_GE(packed, 1) << c.config << ": the fused graph has a packed attention";
  }
}

// bf16: each graph against the unfused fp32 graph (see the note in frontend/compare.h). The
// attention example agrees (with GELU for its ReLU, so its gradients decide too, and as it is);
// the same with a bug injected into the fused graph (FlashAttention's window narrowed from 16 to
// 2, forward and backward) does not.
TEST(Compare, Bf16JudgesEachGraphAgainstFp32AndCatchesAWrongFusedNode) {
  const std::string path = std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml";
  const std::vector<std::string> gelu = {"train.steps=3", "precision=bf16", "model.layers.2.linear.activation=gelu",
                                         "data.samples=256"};
  std::FILE* sink = std::tmpfile();
  const CompareResult ok = compareFusedUnfused(loadConfig(path, gelu), quiet(), sink);
  EXPECT_TRUE(ok.againstFp32);
  EXPECT_TRUE(ok.gradientsGated);
  EXPECT_TRUE(ok.agree) << "loss ratio " << ok.lossErrRatio << ", gradient ratio " << ok.gradErrRatio;
  const CompareResult relu =
      compareFusedUnfused(loadConfig(path, {"train.steps=3", "precision=bf16", "data.samples=256"}), quiet(), sink);
  EXPECT_FALSE(relu.gradientsGated);
  EXPECT_TRUE(relu.agree) << "loss ratio " << relu.lossErrRatio;
  RunOptions broken = quiet();
  int edited = 0;
  broken.testGraphHook = [&](Graph& g) {
    for (const Node& n : g.nodes())
      if (!n.erased && (n.op == OpKind::FlashAttention || n.op == OpKind::FlashAttentionGrad ||
                        n.op == OpKind::FlashAttentionQkv || n.op == OpKind::FlashAttentionQkvGrad)) {
        g.node(n.id).attrs.set<attr::WindowLeft>(2);
        ++edited;
      }
  };
  const CompareResult bad = compareFusedUnfused(loadConfig(path, gelu), broken, sink);
  std::fclose(sink);
  EXPECT_EQ(edited, 2);
  EXPECT_FALSE(bad.agree) << "loss ratio " << bad.lossErrRatio << ", gradient ratio " << bad.gradErrRatio;
}

TEST(Compare, FusedAttentionNeedsLessActivationMemory) {
  // At S = 256 the unfused step keeps several [batch, heads, S, S] tensors; the fused one none.
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml",
                                {"train.steps=1", "data.window=256", "model.input=[256, 1]", "data.samples=64", "train.batch_size=2"});
  std::FILE* sink = std::tmpfile();
  const CompareResult r = compareFusedUnfused(cfg, quiet(), sink);
  std::fclose(sink);
  EXPECT_TRUE(r.agree);
  const size_t scores = 2 * 4 * 256 * 256 * sizeof(float);  // one [B, H, S, S] float tensor
  EXPECT_GE(r.unfused.activationBytes, 2 * scores);
  EXPECT_LT(r.fused.activationBytes, scores);
}

// Ctrl-C: `train` finishes the step in flight, prints a summary and exits 130; the metrics file
// holds every step taken, each once, and nothing half-written.
TEST(Interrupt, CtrlCFinishesTheStepSummarisesAndExits130) {
  const fs::path dir = tempDir("interrupt");
  const fs::path metrics = dir / "m.csv", out = dir / "out.txt";
  const std::string config = std::string(PA_SOURCE_DIR) + "/configs/sine_mlp.yaml";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(PA_TRAIN_BINARY, PA_TRAIN_BINARY, "-c", config.c_str(), "--device", "cpu", "--steps", "100000000",
          "--progress", "lines", "--metrics", metrics.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until it is training (the metrics file has rows), then interrupt it.
  auto rowsWritten = [&] {
    std::ifstream f(metrics);
    return std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (rowsWritten() > 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string text = readFile(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  const size_t at = text.find("interrupted (Ctrl-C) after step ");
  ASSERT_NE(at, std::string::npos) << text;
  const long long last = std::stoll(text.substr(at + std::strlen("interrupted (Ctrl-C) after step ")));
  EXPECT_NE(text.find("done: " + std::to_string(last) + " steps"), std::string::npos) << text;
  // One header and one complete row per step, in order.
  std::ifstream rows(metrics);
  std::string line;
  std::getline(rows, line);
  long long expect = 1;
  while (std::getline(rows, line)) {
    ASSERT_EQ(std::stoll(line.substr(0, line.find(','))), expect) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 4) << line;
    ++expect;
  }
  EXPECT_EQ(expect - 1, last);
  fs::remove_all(dir);
}

TEST(Precision, Fp64AndFp32TrajectoriesAgree) {
  const Config c32 = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml", {"train.steps=10"});
  const Config c64 = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/sine_attention.yaml", {"train.steps=10", "precision=fp64"});
  const TrainResult a = train(c32, quiet());
  const TrainResult b = train(c64, quiet());
  // float32 rounding (~6e-8 relative per op) through ten steps stays well under 1e-4.
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4 * b.losses[i]) << i;
}

}  // namespace
}  // namespace pa
