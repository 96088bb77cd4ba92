// Every class of user mistake gives one clear message naming where it is, and `train` exits 2.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "runtime/cuda/cuda_driver.h"

namespace pa {
namespace {

namespace fs = std::filesystem;

const char* kGood =
    "name: t\n"
    "data: {kind: sine, window: 8, samples: 64, target: sequence}\n"
    "model:\n"
    "  input: [8, 1]\n"
    "  layers:\n"
    "    - linear: {units: 8}\n"
    "    - attention: {heads: 2, causal: true}\n"
    "    - linear: {units: 1}\n"
    "train: {batch_size: 4, steps: 2}\n";

// Parses (and, for shape errors, builds) a config; returns the error message or "" if none.
std::string errorOf(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    Config c = parseConfig(yaml, "model.yaml", sets);
    RunOptions o;
    o.device = "cpu";
    o.progress = ProgressMode::Quiet;
    o.printSummary = false;
    o.steps = 1;
    train(c, o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(ConfigErrors, GoodConfigTrains) { EXPECT_EQ(errorOf(kGood), ""); }

TEST(ConfigErrors, MalformedYamlNamesLineAndColumn) {
  const std::string e = errorOf("name: t\ndata: {kind: sine\nmodel: [\n");
  EXPECT_NE(e.find("model.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed YAML"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownKeySuggestsTheClosest) {
  const std::string e = errorOf(replaced(kGood, "heads: 2", "haeds: 2"));
  EXPECT_NE(e.find("model.yaml:7:19"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers[1].attention"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'heads'"), std::string::npos) << e;
  EXPECT_NE(e.find("Valid keys:"), std::string::npos) << e;
}

TEST(ConfigErrors, WrongTypeNamesKeyPath) {
  const std::string e = errorOf(replaced(kGood, "batch_size: 4", "batch_size: four"));
  EXPECT_NE(e.find("model.yaml:9:21: train.batch_size: expected an integer, got 'four'"), std::string::npos) << e;
}

TEST(ConfigErrors, GemmProviderIsOneOfThree) {
  const std::string e = errorOf(kGood, {"compiler.gemm=cublas"});
  EXPECT_NE(e.find("compiler.gemm"), std::string::npos) << e;
  EXPECT_NE(e.find("valid: generated, cublaslt, auto"), std::string::npos) << e;
  for (const char* ok : {"generated", "cublaslt", "auto"})  // the CPU ignores the key
    EXPECT_EQ(errorOf(kGood, {std::string("compiler.gemm=") + ok}), "") << ok;
  EXPECT_EQ(parseConfig(kGood, "model.yaml", {}).compiler.gemm, "auto");
}

TEST(ConfigErrors, DeterministicIsABoolean) {
  EXPECT_FALSE(parseConfig(kGood, "model.yaml", {}).compiler.deterministic);
  EXPECT_TRUE(parseConfig(kGood, "model.yaml", {"compiler.deterministic=true"}).compiler.deterministic);
  const std::string e = errorOf(kGood, {"compiler.deterministic=sometimes"});
  EXPECT_NE(e.find("compiler.deterministic"), std::string::npos) << e;
}

TEST(ConfigErrors, MissingRequiredKey) {
  const std::string e = errorOf(replaced(kGood, "    - linear: {units: 8}\n", "    - linear: {activation: relu}\n"));
  EXPECT_NE(e.find("missing required key 'units'"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers[0].linear"), std::string::npos) << e;
  EXPECT_NE(errorOf("name: t\nmodel: {layers: [{linear: {units: 1}}]}\n").find("missing required key 'data'"), std::string::npos);
}

TEST(ConfigErrors, HeadsNotDividingTheWidth) {
  const std::string e = errorOf(replaced(kGood, "heads: 2", "heads: 3"));
  EXPECT_NE(e.find("3 heads do not divide the width 8"), std::string::npos) << e;
  EXPECT_NE(e.find("model.yaml:7:7"), std::string::npos) << e;
}

TEST(ConfigErrors, KvHeadsNotDividingHeads) {
  const std::string e = errorOf(replaced(kGood, "heads: 2", "heads: 4, kv_heads: 3"));
  EXPECT_NE(e.find("kv_heads (3) must divide heads (4)"), std::string::npos) << e;
}

TEST(ConfigErrors, NegativeWindowAndSinks) {
  EXPECT_NE(errorOf(replaced(kGood, "causal: true", "window: {left: -2}")).find("left: must be >= 0, got -2"),
            std::string::npos);
  EXPECT_NE(errorOf(replaced(kGood, "causal: true", "window: -1")).find("must be >= 0"), std::string::npos);
  EXPECT_NE(errorOf(replaced(kGood, "causal: true", "sinks: -1")).find("sinks: must be >= 0, got -1"), std::string::npos);
}

TEST(ConfigErrors, UnknownLayerSuggests) {
  const std::string e = errorOf(replaced(kGood, "    - linear: {units: 1}\n", "    - linaer: {units: 1}\n"));
  EXPECT_NE(e.find("unknown layer 'linaer'; did you mean 'linear'?"), std::string::npos) << e;
  EXPECT_NE(e.find("model.yaml:8:"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownOpListsValidOnes) {
  const std::string yaml =
      "name: t\ndata: {kind: function}\nmodel:\n  params: {w: {shape: [1, 1]}}\n  nodes:\n"
      "    - {op: matmull, inputs: [input, w], output: y}\n";
  const std::string e = errorOf(yaml);
  EXPECT_NE(e.find("unknown op 'matmull'; did you mean 'matmul'?"), std::string::npos) << e;
  EXPECT_NE(e.find("model.yaml:6:7"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownAttributeAndValueName) {
  const std::string base = "name: t\ndata: {kind: function}\nmodel:\n  params: {w: {shape: [1, 1]}}\n  nodes:\n";
  EXPECT_NE(errorOf(base + "    - {op: matmul, inputs: [input, w], output: y, transpose: true}\n").find("has no attribute 'transpose'"),
            std::string::npos);
  EXPECT_NE(errorOf(base + "    - {op: matmul, inputs: [input, v], output: y}\n").find("no value named 'v'"), std::string::npos);
}

TEST(ConfigErrors, ShapeMismatchNamesTheNodeAndBothShapes) {
  const std::string yaml =
      "name: t\ndata: {kind: function, inputs: 3}\nmodel:\n  params: {w: {shape: [2, 4]}}\n  nodes:\n"
      "    - {op: matmul, inputs: [input, w], output: y}\n";
  const std::string e = errorOf(yaml);
  EXPECT_NE(e.find("node 'y'"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 3]"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 4]"), std::string::npos) << e;
}

TEST(ConfigErrors, BadChoiceListsValidChoices) {
  const std::string e = errorOf(replaced(kGood, "kind: sine", "kind: sin"));
  EXPECT_NE(e.find("'sin' is not valid; did you mean 'sine'? Valid choices: sine, function, csv"), std::string::npos) << e;
}

TEST(ConfigErrors, SetOverridesAreCheckedAndNamed) {
  EXPECT_EQ(errorOf(kGood, {"train.steps=3", "model.layers.1.attention.heads=4"}), "");
  const std::string e = errorOf(kGood, {"train.optimizer.lr=fast"});
  EXPECT_NE(e.find("--set train.optimizer.lr=fast"), std::string::npos) << e;
  EXPECT_NE(e.find("expected a finite number"), std::string::npos) << e;
  EXPECT_NE(errorOf(kGood, {"train.stepz=3"}).find("did you mean 'steps'"), std::string::npos);
  EXPECT_NE(errorOf(kGood, {"model.layers.9.linear.units=3"}).find("past the end"), std::string::npos);
  EXPECT_NE(errorOf(kGood, {"nonsense"}).find("expected key.path=value"), std::string::npos);
}

class CsvErrors : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pa_csv_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string run(const std::string& csv) {
    std::ofstream(dir_ / "d.csv") << csv;
    return errorOf("name: t\ndata: {kind: csv, path: " + (dir_ / "d.csv").string() +
                   "}\nmodel: {layers: [{linear: {units: 1}}]}\ntrain: {batch_size: 1}\n");
  }
  fs::path dir_;
};

TEST_F(CsvErrors, MissingFile) {
  const std::string e = errorOf("name: t\ndata: {kind: csv, path: /nonexistent/x.csv}\nmodel: {layers: [{linear: {units: 1}}]}\n");
  EXPECT_NE(e.find("cannot read CSV file '/nonexistent/x.csv'"), std::string::npos) << e;
}

TEST_F(CsvErrors, UnreadableFile) {
  // A directory in place of the file cannot be read as CSV (root reads any file, so a
  // permission test would not fail here).
  fs::create_directories(dir_ / "dir.csv");
  const std::string e = errorOf("name: t\ndata: {kind: csv, path: " + (dir_ / "dir.csv").string() +
                                "}\nmodel: {layers: [{linear: {units: 1}}]}\n");
  EXPECT_NE(e.find("dir.csv"), std::string::npos) << e;
}

TEST_F(CsvErrors, NonNumericCellNamesLineAndColumn) {
  const std::string e = run("a,b,y\n1,2,3\n4,five,6\n");
  EXPECT_NE(e.find("d.csv:3:3: column 'b': 'five' is not a number"), std::string::npos) << e;
}

TEST_F(CsvErrors, NanCell) {
  const std::string e = run("a,y\n1,2\nnan,3\n");
  EXPECT_NE(e.find("d.csv:3:1: column 'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("NaN"), std::string::npos) << e;
}

TEST_F(CsvErrors, RaggedRowAndUnknownColumn) {
  EXPECT_NE(run("a,y\n1,2\n3\n").find("expected 2 cells, got 1"), std::string::npos);
  std::ofstream(dir_ / "d.csv") << "a,y\n1,2\n";
  const std::string e = errorOf("name: t\ndata: {kind: csv, path: " + (dir_ / "d.csv").string() +
                                ", targets: [z]}\nmodel: {layers: [{linear: {units: 1}}]}\ntrain: {batch_size: 1}\n");
  EXPECT_NE(e.find("no column 'z'"), std::string::npos) << e;
}

int runTrain(const std::string& args) {
  const std::string cmd = std::string(PA_TRAIN_BINARY) + " " + args + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Cli, UserMistakesExitWithCodeTwo) {
  const fs::path dir = fs::temp_directory_path() / ("pa_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "bad.yaml") << replaced(kGood, "heads: 2", "haeds: 2");
  std::ofstream(dir / "good.yaml") << kGood;
  EXPECT_EQ(runTrain("--config " + (dir / "bad.yaml").string()), 2);
  EXPECT_EQ(runTrain("--config " + (dir / "missing.yaml").string()), 2);
  if (!cuda::Driver::instance().available()) {  // without a GPU, asking for one is a user mistake
    EXPECT_EQ(runTrain("--config " + (dir / "good.yaml").string() + " --device cuda"), 2);
  }
  EXPECT_EQ(runTrain("--config " + (dir / "good.yaml").string() + " --bogus-flag"), 2);
  EXPECT_EQ(runTrain("--config " + (dir / "good.yaml").string() + " --steps 2 --progress none"), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pa
