// Keeping what is trained: checkpoints and a bit-exact resume, the files' contents, pruning,
// --init-from, predict, --dump-batches, the resolved config, and every bad input with its message.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "frontend/checkpoint.h"
#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/safetensors.h"
#include "frontend/trainer.h"
#include "tests/test_util.h"

namespace pa {
namespace {

namespace fs = std::filesystem;

fs::path tempDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("pa_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

RunOptions quiet() {
  RunOptions o;
  o.device = "cpu";  // the CPU backend's tests, wherever they run (tests/gpu has the GPU's)
  o.progress = ProgressMode::Quiet;
  o.printSummary = false;
  return o;
}

using test::readFile;

std::string example(const std::string& name) { return std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml"; }

// Runs a command line; returns its exit code (-1 when a signal ended it), stdout and stderr.
int runCommand(const std::string& cmd, std::string* out = nullptr, std::string* err = nullptr) {
  const fs::path o = fs::temp_directory_path() / ("pa_ckpt_out_" + std::to_string(::getpid()));
  const fs::path e = fs::temp_directory_path() / ("pa_ckpt_err_" + std::to_string(::getpid()));
  const int status = std::system((cmd + " >" + o.string() + " 2>" + e.string()).c_str());
  if (out) *out = readFile(o);
  if (err) *err = readFile(e);
  fs::remove(o);
  fs::remove(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool bitIdentical(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// The resume cases: small data so that 60 steps cross several epochs (the batch order's
// reshuffles must be restored too), each precision of the CPU, and the options a step reads.
struct ResumeCase {
  std::string name, config;
  std::vector<std::string> sets;
};

class Resume : public ::testing::TestWithParam<ResumeCase> {};

// A run of 60 steps and a run of 30 resumed for 30 more give the same losses and the same
// final weights, byte for byte.
TEST_P(Resume, ContinuesBitForBit) {
  const ResumeCase& c = GetParam();
  const fs::path dir = tempDir("resume_" + c.name);
  std::vector<std::string> sets = c.sets;
  sets.insert(sets.end(), {"data.samples=400", "train.batch_size=32", "train.log_every=7"});
  const Config cfg = loadConfig(example(c.config), sets);
  RunOptions whole = quiet();
  whole.steps = 60;
  const TrainResult full = train(cfg, whole);
  ASSERT_EQ(full.losses.size(), 60u);

  Config every30 = cfg;
  every30.train.checkpoint.every = 30;
  RunOptions first = whole;
  first.checkpointDir = (dir / "ck").string();
  const TrainResult a = train(every30, first);
  EXPECT_TRUE(bitIdentical(a.losses, full.losses)) << "saving a checkpoint changed the run";
  ASSERT_TRUE(fs::exists(dir / "ck" / "step-00000030" / kModelFile));

  RunOptions second = whole;
  second.resumeFrom = (dir / "ck" / "step-00000030").string();
  const TrainResult b = train(cfg, second);
  EXPECT_EQ(b.firstStep, 31);
  ASSERT_EQ(b.losses.size(), 30u);
  EXPECT_TRUE(bitIdentical(b.losses, std::vector<double>(full.losses.begin() + 30, full.losses.end())))
      << "step 31: " << b.losses[0] << " resumed, " << full.losses[30] << " uninterrupted";
  for (const auto& [name, v] : full.finalParams) EXPECT_TRUE(bitIdentical(b.finalParams.at(name), v)) << name;
  ASSERT_FALSE(b.validation.empty());
  EXPECT_EQ(b.validation.back().second, full.validation.back().second);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, Resume,
    ::testing::Values(ResumeCase{"sine_mlp", "sine_mlp", {}},
                      ResumeCase{"attention_cosine_warmup", "sine_attention", {"train.warmup_steps=10"}},
                      ResumeCase{"clip_decay_fp64", "function_mlp",
                                 {"precision=fp64", "train.optimizer.clip_grad_norm=0.5", "train.optimizer.weight_decay=0.01"}},
                      ResumeCase{"bf16_attention", "sine_attention", {"precision=bf16"}},
                      ResumeCase{"unshuffled", "sine_mlp", {"data.shuffle=false"}}),
    [](const ::testing::TestParamInfo<ResumeCase>& i) { return i.param.name; });

// The files: the graph's parameter names and shapes in F32 (what PyTorch loads by name), Adam's
// moments beside them, and metadata that reads back (the resolved config parses).
TEST(Checkpoint, FilesHoldTheGraphsNamesShapesMomentsAndConfig) {
  const fs::path dir = tempDir("files");
  RunOptions o = quiet();
  o.steps = 5;
  o.checkpointDir = dir.string();
  const Config cfg = loadConfig(example("sine_attention"), {"data.samples=256"});
  const TrainResult r = train(cfg, o);
  EXPECT_EQ(r.checkpoint, (dir / "step-00000005").string());
  const safetensors::File model = safetensors::File::read((dir / "step-00000005" / kModelFile).string());
  const safetensors::File state = safetensors::File::read((dir / "step-00000005" / kStateFile).string());
  ASSERT_EQ(model.tensors().size(), r.finalParams.size());
  for (const auto& [name, values] : r.finalParams) {
    const safetensors::TensorInfo* t = model.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, safetensors::DType::F32) << name;
    EXPECT_TRUE(bitIdentical(model.toDoubles(*t), values)) << name;
    ASSERT_NE(state.find("exp_avg/" + name), nullptr) << name;
    ASSERT_NE(state.find("exp_avg_sq/" + name), nullptr) << name;
    EXPECT_EQ(state.find("exp_avg/" + name)->shape, t->shape);
  }
  EXPECT_EQ(model.find("layers.1.q_weight")->shape, (std::vector<int64_t>{32, 32}));  // [in, out]
  EXPECT_EQ(model.find("layers.1.k_weight")->shape, (std::vector<int64_t>{32, 16}));  // 2 KV heads of 8
  EXPECT_EQ(model.find("layers.1.sink_logits")->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(model.metadata().at("step"), "5");
  EXPECT_EQ(model.metadata().at("input_shape"), "[64,1]");
  EXPECT_EQ(state.metadata().at("final"), "true");
  EXPECT_EQ(state.metadata().at("total_steps"), "5");
  EXPECT_EQ(state.find("data.rng")->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(state.find("data.order")->dtype, safetensors::DType::I64);
  // The config as the run was planned: --steps 5 is its length.
  const Config back = parseConfig(state.metadata().at("config"), "config", {});
  Config planned = cfg;
  planned.train.steps = 5;
  EXPECT_EQ(resolvedConfigYaml(back), resolvedConfigYaml(planned));
  EXPECT_EQ(back.model.layers.size(), 4u);
  fs::remove_all(dir);
}

// Every example, a CSV config and an explicit graph print back to YAML that parses to the same
// config: the text a checkpoint keeps is a config.
TEST(Checkpoint, ResolvedConfigParsesBackToItself) {
  std::vector<Config> configs;
  for (const char* name : {"sine_mlp", "sine_attention", "function_mlp", "mlp_tiny", "mlp_wide", "attn_block"})
    configs.push_back(loadConfig(example(name), {}));
  configs.push_back(parseConfig("name: 'odd: name'\ndata: {kind: csv, path: d.csv, targets: [y], features: [a, b]}\n"
                                "model: {layers: [{linear: {units: 3, activation: gelu, bias: false}}]}\n"
                                "train: {epochs: 2, checkpoint: {dir: out, every: 5, keep: 0}}\n"
                                "compiler: {fuse: [linear], passes: [cse], gemm: generated, deterministic: true}\n",
                                "csv.yaml", {}));
  configs.push_back(parseConfig("data: {kind: function, inputs: 3, range: [-1.5, 2.25]}\n"
                                "model:\n  input: [3]\n  params: {w: {shape: [3, 1], init: he}}\n"
                                "  nodes:\n    - {op: matmul, inputs: [input, w], output: y, transpose_b: false}\n"
                                "    - {op: scale, inputs: [y], output: z, value: 0.5}\n",
                                "explicit.yaml", {}));
  configs.push_back(loadConfig(example("sine_attention"), {"model.layers.1.attention.window={left: 3, right: 2}",
                                                           "model.layers.1.attention.head_dim=8", "seed=12345"}));
  for (const Config& c : configs) {
    const std::string text = resolvedConfigYaml(c);
    const Config back = parseConfig(text, "resolved.yaml", {});
    EXPECT_EQ(resolvedConfigYaml(back), text) << text;
  }
  EXPECT_NE(resolvedConfigYaml(configs[8]).find("window: {left: 3, right: 2}"), std::string::npos);
}

// train.checkpoint.keep: the newest K step checkpoints stay, and a run's final one survives a
// later run's pruning.
TEST(Checkpoint, KeepsTheNewestAndEveryFinalOne) {
  const fs::path dir = tempDir("keep");
  const Config cfg = loadConfig(example("sine_mlp"), {"data.samples=400", "train.batch_size=16", "train.checkpoint.every=10",
                                                      "train.checkpoint.keep=2"});
  RunOptions o = quiet();
  o.steps = 45;
  o.checkpointDir = dir.string();
  train(cfg, o);
  auto folders = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(folders(), (std::vector<std::string>{"step-00000040", "step-00000045"}));
  o.steps = 80;
  o.resumeFrom = dir.string();  // the folder of checkpoints: its newest
  const TrainResult r = train(cfg, o);
  EXPECT_EQ(r.firstStep, 46);
  EXPECT_EQ(folders(), (std::vector<std::string>{"step-00000045", "step-00000070", "step-00000080"}));
  fs::remove_all(dir);
}

// A save removes what saves that died left (temporary folders of processes that are gone), not
// the temporary folder of a process still running.
TEST(Checkpoint, ASaveRemovesTheTemporariesOfDeadSavesOnly) {
  const fs::path dir = tempDir("leftovers");
  const fs::path dead = dir / ".tmp-step-00000007-999999999", alive = dir / ".tmp-step-00000007-1";
  fs::create_directories(dead);
  fs::create_directories(alive);
  std::ofstream(dead / kModelFile) << "half";
  RunOptions o = quiet();
  o.steps = 1;
  o.checkpointDir = dir.string();
  train(loadConfig(example("sine_mlp"), {"data.samples=200", "train.batch_size=16"}), o);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));  // pid 1 runs
  EXPECT_TRUE(fs::exists(dir / "step-00000001" / kStateFile));
  fs::remove_all(dir);
}

// A resumed run whose model differs names the first parameter that differs, with both shapes;
// one on other data says so; options that change the trajectory only warn.
TEST(Checkpoint, ResumeRefusesAnotherModelAndOtherData) {
  const fs::path dir = tempDir("mismatch");
  RunOptions o = quiet();
  o.steps = 3;
  o.checkpointDir = dir.string();
  train(loadConfig(example("sine_mlp"), {"data.samples=400"}), o);
  o.checkpointDir.clear();
  o.resumeFrom = dir.string();
  o.steps = 6;
  try {
    train(loadConfig(example("sine_mlp"), {"data.samples=400", "model.layers.1.linear.units=32"}), o);
    ADD_FAILURE() << "a different model resumed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'layers.1.weight' is [64, 32] in this model and [64, 64] in the checkpoint"),
              std::string::npos)
        << e.what();
  }
  try {
    train(loadConfig(example("sine_mlp"), {"data.samples=500"}), o);
    ADD_FAILURE() << "resumed on other data";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("covers 360 training samples, this run's data has 450"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(train(loadConfig(example("sine_mlp"), {"data.samples=400", "train.optimizer.lr=0.01"}), o));
  fs::remove_all(dir);
}

// The order of batches across a resume: --dump-batches of the whole run holds the resumed run's
// rows after the checkpoint's step, and its data is the run's.
TEST(Checkpoint, DumpBatchesRecordsTheRowsOfEveryStep) {
  const fs::path dir = tempDir("batches");
  const Config cfg = loadConfig(example("sine_mlp"), {"data.samples=200", "train.batch_size=16"});
  RunOptions o = quiet();
  o.steps = 25;
  o.dumpBatchesPath = (dir / "all.safetensors").string();
  train(cfg, o);
  o.steps = 12;
  o.dumpBatchesPath.clear();
  o.checkpointDir = (dir / "ck").string();
  train(cfg, o);
  o.checkpointDir.clear();
  o.steps = 25;
  o.resumeFrom = (dir / "ck").string();
  o.dumpBatchesPath = (dir / "rest.safetensors").string();
  train(cfg, o);
  const safetensors::File all = safetensors::File::read((dir / "all.safetensors").string());
  const safetensors::File rest = safetensors::File::read((dir / "rest.safetensors").string());
  EXPECT_EQ(all.find("batches")->shape, (std::vector<int64_t>{25, 16}));
  EXPECT_EQ(rest.find("batches")->shape, (std::vector<int64_t>{13, 16}));
  EXPECT_EQ(rest.metadata().at("first_step"), "13");
  const std::vector<int64_t> a = all.toInt64(*all.find("batches")), b = rest.toInt64(*rest.find("batches"));
  EXPECT_EQ(std::vector<int64_t>(a.begin() + 12 * 16, a.end()), b);
  EXPECT_EQ(all.find("train.x")->shape, (std::vector<int64_t>{180, 64, 1}));  // the data's sample shape
  EXPECT_EQ(all.find("validation.y")->shape, (std::vector<int64_t>{20, 1}));
  const DataSplit data = loadData(cfg.data, cfg.seed, ".");
  const std::vector<double> x = all.toDoubles(*all.find("train.x"));
  EXPECT_TRUE(std::equal(x.begin(), x.end(), data.train.x.begin()));
  // 180 samples make 11 whole batches an epoch: 25 steps reshuffled twice, and every epoch's
  // rows are distinct.
  for (int64_t e = 0; e < 2; ++e) {
    std::vector<int64_t> epoch(a.begin() + e * 11 * 16, a.begin() + (e + 1) * 11 * 16);
    std::sort(epoch.begin(), epoch.end());
    EXPECT_EQ(std::adjacent_find(epoch.begin(), epoch.end()), epoch.end());
  }
  fs::remove_all(dir);
}

// --init-from: the file's values are the first step's weights; the tensors that do not fit are
// listed, all of them, and --init-from-partial loads the rest.
TEST(InitFrom, LoadsWeightsByNameAndListsEveryMismatch) {
  const fs::path dir = tempDir("init");
  const Config cfg = loadConfig(example("sine_mlp"), {"data.samples=200", "train.batch_size=16"});
  std::vector<safetensors::Tensor> tensors;
  std::map<std::string, std::vector<double>> expected;
  const std::map<std::string, std::vector<int64_t>> shapes = {{"layers.0.weight", {64, 64}}, {"layers.0.bias", {64}},
                                                              {"layers.1.weight", {64, 64}}, {"layers.1.bias", {64}},
                                                              {"layers.2.weight", {64, 1}},  {"layers.2.bias", {1}}};
  int k = 0;
  for (const auto& [name, shape] : shapes) {
    std::vector<double> v(static_cast<size_t>(shape.size() == 2 ? shape[0] * shape[1] : shape[0]));
    for (double& x : v) x = 0.01 * ((k++ % 17) - 8);
    expected[name] = v;
    // F64 in the file (PyTorch's double tensors): read exactly, stored as the run's float.
    tensors.push_back(safetensors::Tensor::fromDoubles(name, safetensors::DType::F64, shape, v));
  }
  safetensors::write((dir / "w.safetensors").string(), tensors, {});
  RunOptions o = quiet();
  o.steps = 0;
  o.initFrom = (dir / "w.safetensors").string();
  const TrainResult r = train(cfg, o);
  for (const auto& [name, v] : expected)
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(r.finalParams.at(name)[i], static_cast<double>(static_cast<float>(v[i])));

  tensors.erase(tensors.begin());  // layers.0.bias missing
  tensors[0].shape = {64, 32};     // layers.0.weight mis-shaped
  tensors[0].bytes.resize(64 * 32 * 8);
  tensors.push_back(safetensors::Tensor::i64("step", {1}, {3}));  // extra, and not a float
  safetensors::write((dir / "bad.safetensors").string(), tensors, {});
  o.initFrom = (dir / "bad.safetensors").string();
  try {
    train(cfg, o);
    ADD_FAILURE() << "mismatched weights loaded";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("3 tensor(s) do not match"), std::string::npos) << m;
    EXPECT_NE(m.find("missing: 'layers.0.bias', expected [64]"), std::string::npos) << m;
    EXPECT_NE(m.find("mismatched: 'layers.0.weight', expected [64, 64] (a floating-point dtype), found [64, 32] F64"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("extra: 'step' [1] I64"), std::string::npos) << m;
  }
  o.initFromPartial = true;
  const TrainResult partial = train(cfg, o);
  EXPECT_EQ(partial.finalParams.at("layers.1.weight")[5], static_cast<double>(static_cast<float>(expected["layers.1.weight"][5])));
  EXPECT_NE(partial.finalParams.at("layers.0.weight")[5], static_cast<double>(static_cast<float>(expected["layers.0.weight"][5])));
  fs::remove_all(dir);
}

// Damaged checkpoints and folders without one: a message naming the file and the problem.
TEST(Checkpoint, DamagedOrMissingCheckpointsAreNamed) {
  const fs::path dir = tempDir("damaged");
  RunOptions o = quiet();
  o.steps = 2;
  o.checkpointDir = (dir / "ck").string();
  const Config cfg = loadConfig(example("sine_mlp"), {"data.samples=200", "train.batch_size=16"});
  train(cfg, o);
  o.checkpointDir.clear();
  auto errorOf = [&](const fs::path& resume) {
    RunOptions r = o;
    r.resumeFrom = resume.string();
    try {
      train(cfg, r);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  fs::create_directories(dir / "empty");
  EXPECT_NE(errorOf(dir / "empty").find("no checkpoint in this folder"), std::string::npos);
  EXPECT_NE(errorOf(dir / "nowhere").find("no such file or folder"), std::string::npos);
  std::ofstream(dir / "empty" / "notes.txt") << "x";
  EXPECT_NE(errorOf(dir / "empty" / "notes.txt").find("not a checkpoint"), std::string::npos);
  const fs::path step = dir / "ck" / "step-00000002";
  fs::copy(dir / "ck", dir / "cut", fs::copy_options::recursive);
  fs::resize_file(dir / "cut" / "step-00000002" / kStateFile, 100);
  const std::string cut = errorOf(dir / "cut");
  EXPECT_NE(cut.find((dir / "cut" / "step-00000002" / kStateFile).string()), std::string::npos) << cut;
  EXPECT_NE(cut.find("header length"), std::string::npos) << cut;
  // The model file of another step: the two files do not belong together.
  fs::copy(dir / "ck", dir / "mixed", fs::copy_options::recursive);
  RunOptions more = o;
  more.steps = 3;
  more.checkpointDir = (dir / "later").string();
  train(cfg, more);
  fs::copy_file(dir / "later" / "step-00000003" / kModelFile, dir / "mixed" / "step-00000002" / kModelFile,
                fs::copy_options::overwrite_existing);
  EXPECT_NE(errorOf(dir / "mixed").find("come from different checkpoints"), std::string::npos) << errorOf(dir / "mixed");
  fs::remove_all(dir);
}

// A full disk while saving: the run stops with exit 2 naming the file, the checkpoints already
// there stay whole, and no temporary is left. The disk is made "full" by a file size limit
// (RLIMIT_FSIZE) set in the child before it runs `train`.
TEST(Checkpoint, AFullDiskLeavesThePreviousCheckpointWhole) {
  const fs::path dir = tempDir("full");
  const std::string base = std::string(PA_TRAIN_BINARY) + " -c " + example("sine_mlp") +
                           " --set data.samples=400 --progress none --checkpoint-dir " + dir.string();
  ASSERT_EQ(runCommand(base + " --steps 5"), 0);
  const std::string before = readFile(dir / "step-00000005" / kStateFile);
  std::string out, err;
  // The state file is ~190 kB; 100 kB stops its write half way.
  const int code = runCommand("ulimit -f 100 && " + base + " --steps 8 --set train.checkpoint.every=4", &out, &err);
  EXPECT_EQ(code, 2) << err;
  EXPECT_NE(err.find("cannot write"), std::string::npos) << err;
  EXPECT_NE(err.find(dir.string()), std::string::npos) << err;
  EXPECT_EQ(readFile(dir / "step-00000005" / kStateFile), before);
  EXPECT_NO_THROW(readCheckpoint((dir / "step-00000005").string()));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
  EXPECT_FALSE(fs::exists(dir / "step-00000004"));
  fs::remove_all(dir);
}

// The command line: flags that cannot go together, folders that cannot take checkpoints.
TEST(Checkpoint, CommandLineMistakesExitTwo) {
  const fs::path dir = tempDir("cli");
  std::ofstream(dir / "file") << "x";
  const std::string base = std::string(PA_TRAIN_BINARY) + " -c " + example("sine_mlp") + " --steps 1 --progress none ";
  std::string err;
  EXPECT_EQ(runCommand(base + "--checkpoint-dir " + (dir / "file").string(), nullptr, &err), 2);
  EXPECT_NE(err.find("--checkpoint-dir " + (dir / "file").string() + ": is a file"), std::string::npos) << err;
  EXPECT_EQ(runCommand(base + "--checkpoint-dir " + (dir / "file" / "sub").string(), nullptr, &err), 2);
  EXPECT_EQ(runCommand(base + "--checkpoint-dir /proc/pa-no-such-folder", nullptr, &err), 2);
  EXPECT_NE(err.find("--checkpoint-dir /proc/pa-no-such-folder: cannot create the folder"), std::string::npos) << err;
  EXPECT_EQ(runCommand(base + "--set train.checkpoint.dir=" + (dir / "file").string(), nullptr, &err), 2);
  EXPECT_NE(err.find("train.checkpoint.dir: "), std::string::npos) << err;
  EXPECT_EQ(runCommand(base + "--resume " + dir.string() + " --init-from w.safetensors", nullptr, &err), 2);
  EXPECT_NE(err.find("--resume cannot be combined with --init-from"), std::string::npos) << err;
  EXPECT_EQ(runCommand(base + "--compare --checkpoint-dir " + dir.string(), nullptr, &err), 2);
  EXPECT_EQ(runCommand(base + "--init-from-partial", nullptr, &err), 2);
  EXPECT_EQ(runCommand(base + "--init-from " + (dir / "file").string(), nullptr, &err), 2);
  EXPECT_NE(err.find((dir / "file").string() + ": truncated"), std::string::npos) << err;
  EXPECT_EQ(runCommand(base + "--resume " + dir.string(), nullptr, &err), 2);
  EXPECT_NE(err.find("no checkpoint in this folder"), std::string::npos) << err;
  EXPECT_EQ(runCommand(base + "--set train.checkpoint.every=-1", nullptr, &err), 2);
  EXPECT_NE(err.find("train.checkpoint.every"), std::string::npos) << err;
  fs::remove_all(dir);
}

// The data fingerprint: any changed byte, in the first chunk, the last partial one or the
// targets, changes it, as does moving values between inputs and targets.
TEST(Checkpoint, DataFingerprintSeesEveryByte) {
  std::vector<float> x(700000), y(3);  // 2.8 MB: two whole 1 MiB chunks and a partial one
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 977) * 0.5f;
  const uint64_t h = dataFingerprint(x, y);
  EXPECT_EQ(dataFingerprint(x, y), h);
  for (size_t at : {size_t{0}, size_t{300000}, x.size() - 1}) {
    std::vector<float> other = x;
    other[at] = std::nextafter(other[at], 1e9f);
    EXPECT_NE(dataFingerprint(other, y), h) << at;
  }
  std::vector<float> ty = y;
  ty[2] = 1.0f;
  EXPECT_NE(dataFingerprint(x, ty), h);
  std::vector<float> shortX(x.begin(), x.end() - 1), longY{x.back(), 0.0f, 0.0f, 0.0f};
  EXPECT_NE(dataFingerprint(shortX, longY), dataFingerprint(x, std::vector<float>{0.0f, 0.0f, 0.0f}));
}

// A checkpoint written before data_fingerprint2 (its metadata has data_fingerprint, the bytes'
// FNV-1a) resumes on the same data without a warning, and warns on other data.
TEST(Checkpoint, OlderCheckpointsFingerprintIsStillCompared) {
  const fs::path dir = tempDir("fingerprint_v1");
  const std::string sets = " --set data.samples=400 --progress none ";
  const std::string base = std::string(PA_TRAIN_BINARY) + " -c " + example("sine_mlp") + sets;
  ASSERT_EQ(runCommand(base + "--steps 3 --checkpoint-dir " + dir.string()), 0);
  fs::path statePath;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == "state.safetensors") statePath = e.path();
  ASSERT_FALSE(statePath.empty());
  const Config cfg = loadConfig(example("sine_mlp"), {"data.samples=400"});
  const DataSplit data = loadData(cfg.data, cfg.seed, std::string(PA_SOURCE_DIR) + "/configs");
  const std::string original = readFile(statePath);
  auto rewrite = [&](uint64_t v1) {  // the file as an older version wrote it
    const safetensors::File f = safetensors::File::parse(original, statePath.string());
    std::vector<safetensors::Tensor> tensors;
    for (const safetensors::TensorInfo& t : f.tensors()) {
      safetensors::Tensor c;
      c.name = t.name;
      c.dtype = t.dtype;
      c.shape = t.shape;
      c.bytes.assign(f.data(t), f.data(t) + (t.end - t.begin));
      tensors.push_back(std::move(c));
    }
    safetensors::Metadata m = f.metadata();
    ASSERT_EQ(m.erase("data_fingerprint2"), 1u);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(v1));
    m["data_fingerprint"] = hex;
    safetensors::write(statePath.string(), tensors, m);
  };
  const uint64_t v1 = dataFingerprintV1(data.train.x, data.train.y);
  std::string err;
  const std::string resume = base + "--steps 5 --resume " + statePath.parent_path().string();  // this checkpoint
  rewrite(v1);
  ASSERT_EQ(runCommand(resume, nullptr, &err), 0) << err;
  EXPECT_EQ(err.find("training data differs"), std::string::npos) << err;
  rewrite(v1 ^ 1);
  ASSERT_EQ(runCommand(resume, nullptr, &err), 0) << err;
  EXPECT_NE(err.find("the training data differs from the checkpoint's"), std::string::npos) << err;
  fs::remove_all(dir);
}

// Ctrl-C: the step in flight finishes, a checkpoint is written, `train` exits 130; resuming it
// gives the steps an uninterrupted run would have, and the metrics file continues.
TEST(Checkpoint, CtrlCSavesAndTheRunResumesWhereItStopped) {
  const fs::path dir = tempDir("sigint");
  const fs::path metrics = dir / "m.csv", out = dir / "out.txt";
  const std::string config = example("sine_mlp");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(PA_TRAIN_BINARY, PA_TRAIN_BINARY, "-c", config.c_str(), "--device", "cpu", "--steps", "100000000",
          "--progress", "lines", "--metrics", metrics.c_str(), "--checkpoint-dir", (dir / "ck").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  auto rows = [&] {
    std::ifstream f(metrics);
    return std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && rows() <= 20) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string text = readFile(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 143) << text;
  const size_t at = text.find("interrupted (SIGTERM) after step ");
  ASSERT_NE(at, std::string::npos) << text;
  const long long last = std::stoll(text.substr(at + std::strlen("interrupted (SIGTERM) after step ")));
  const fs::path folder = dir / "ck" / checkpointFolderName(last);
  EXPECT_NE(text.find("checkpoint: " + folder.string()), std::string::npos) << text;
  const Checkpoint c = readCheckpoint(folder.string());
  EXPECT_EQ(c.state.step, last);
  EXPECT_FALSE(c.final);

  // Continue to `last` + 30 with the same metrics file; the first `last` rows stay.
  const std::string resume = std::string(PA_TRAIN_BINARY) + " -c " + config + " --device cpu --progress none --steps " +
                             std::to_string(last + 30) + " --resume " + (dir / "ck").string() + " --metrics " +
                             metrics.string();
  ASSERT_EQ(runCommand(resume), 0);
  const Config cfg = loadConfig(config, {});
  RunOptions o = quiet();
  o.steps = last + 30;
  const TrainResult full = train(cfg, o);
  std::istringstream csv(readFile(metrics));
  std::string line;
  std::getline(csv, line);
  long long expect = 1;
  while (std::getline(csv, line)) {
    ASSERT_EQ(std::stoll(line.substr(0, line.find(','))), expect) << line;
    const size_t c1 = line.find(',') + 1;
    EXPECT_NEAR(std::stod(line.substr(c1, line.find(',', c1) - c1)), full.losses[static_cast<size_t>(expect - 1)],
                1e-8 * full.losses[static_cast<size_t>(expect - 1)])
        << "step " << expect;
    ++expect;
  }
  EXPECT_EQ(expect - 1, last + 30);
  fs::remove_all(dir);
}

// predict: the config's validation rows give the MSE training reported (over the same whole
// batches), a CSV with targets gives its MSE, and every mistake exits 2 with its location.
TEST(Predict, PredictsTheValidationSplitAndCsvRows) {
  const fs::path dir = tempDir("predict");
  const Config cfg = loadConfig(example("sine_mlp"), {"data.samples=500", "train.batch_size=16"});
  RunOptions o = quiet();
  o.steps = 20;
  o.checkpointDir = (dir / "ck").string();
  const TrainResult r = train(cfg, o);
  // 50 validation rows; training validates on whole batches of 16, the first 48.
  const std::string predict = std::string(PA_PREDICT_BINARY) + " --weights " + (dir / "ck").string();
  std::string out, err;
  ASSERT_EQ(runCommand(predict + " --split validation --batch 7 --output " + (dir / "p.csv").string(), &out, &err), 0) << err;
  EXPECT_NE(out.find("predicted 50 rows"), std::string::npos) << out;
  const DataSplit data = loadData(cfg.data, cfg.seed, ".");
  std::istringstream p(readFile(dir / "p.csv"));
  std::string line;
  std::getline(p, line);
  EXPECT_EQ(line, "y0");
  double sq = 0;
  int n = 0;
  while (std::getline(p, line)) {
    const double d = std::stod(line) - data.validation.y[static_cast<size_t>(n)];
    if (n < 48) sq += d * d;
    ++n;
  }
  EXPECT_EQ(n, 50);
  // float32 sums of 16 squared errors per batch against double: ~1e-7 relative.
  EXPECT_NEAR(sq / 48, r.finalValidation, 1e-5 * r.finalValidation);

  // A CSV of inputs x0..x63 and the target y0: its MSE; then the inputs alone.
  std::string csv, inputs;
  for (int c = 0; c < 64; ++c) csv += (c ? ",x" : "x") + std::to_string(c);
  inputs = csv + "\n";
  csv += ",y0\n";
  for (int row = 0; row < 3; ++row) {
    std::string xs;
    for (int c = 0; c < 64; ++c) xs += (c ? "," : "") + std::to_string(data.validation.x[static_cast<size_t>(row * 64 + c)]);
    csv += xs + "," + std::to_string(data.validation.y[static_cast<size_t>(row)]) + "\n";
    inputs += xs + "\n";
  }
  std::ofstream(dir / "in.csv") << csv;
  std::ofstream(dir / "x.csv") << inputs;
  ASSERT_EQ(runCommand(predict + " --input " + (dir / "in.csv").string() + " --output " + (dir / "q.csv").string(), &out, &err), 0)
      << err;
  EXPECT_NE(out.find("predicted 3 rows"), std::string::npos) << out;
  EXPECT_NE(out.find("MSE"), std::string::npos) << out;
  ASSERT_EQ(runCommand(predict + " --input " + (dir / "x.csv").string() + " --output " + (dir / "r.csv").string(), &out, &err), 0)
      << err;
  EXPECT_EQ(out.find("MSE"), std::string::npos) << out;
  EXPECT_EQ(readFile(dir / "q.csv"), readFile(dir / "r.csv"));

  std::ofstream(dir / "short.csv") << "a,b\n1,2\n";
  EXPECT_EQ(runCommand(predict + " --input " + (dir / "short.csv").string() + " --output " + (dir / "s.csv").string(), &out, &err), 2);
  EXPECT_NE(err.find((dir / "short.csv").string() + ":1:1: 2 columns; the model takes 64"), std::string::npos) << err;
  std::string nanRow = "nan";
  for (int c = 1; c < 64; ++c) nanRow += ",0";
  std::ofstream(dir / "nan.csv") << inputs.substr(0, inputs.find('\n')) << "\n" << nanRow << "\n";
  EXPECT_EQ(runCommand(predict + " --input " + (dir / "nan.csv").string() + " --output " + (dir / "s.csv").string(), &out, &err), 2);
  EXPECT_NE(err.find((dir / "nan.csv").string() + ":2:"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir / "s.csv"));
  EXPECT_EQ(runCommand(predict + " --output " + (dir / "s.csv").string(), &out, &err), 2);
  EXPECT_NE(err.find("give --input FILE.csv or --split"), std::string::npos) << err;
  safetensors::write((dir / "bare.safetensors").string(), {safetensors::Tensor::f32("w", {1}, {1.0f})}, {});
  EXPECT_EQ(runCommand(std::string(PA_PREDICT_BINARY) + " --weights " + (dir / "bare.safetensors").string() +
                           " --split validation --output " + (dir / "s.csv").string(),
                       &out, &err),
            2);
  EXPECT_NE(err.find("--config: required"), std::string::npos) << err;
  EXPECT_EQ(runCommand(std::string(PA_PREDICT_BINARY) + " --weights " + (dir / "bare.safetensors").string() + " -c " +
                           example("sine_mlp") + " --split validation --output " + (dir / "s.csv").string(),
                       &out, &err),
            2);
  EXPECT_NE(err.find("missing: 'layers.0.weight'"), std::string::npos) << err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pa
