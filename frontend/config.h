// The resolved training configuration: every key of README's "Config reference", with defaults.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/settings.h"
#include "frontend/config_node.h"
#include "frontend/layers/layer.h"

namespace pa {

struct Dataset;  // frontend/datasets.h

// Where the keys of a config were set, for mistakes found after parsing (a data file, the batch
// size against the data): a key's file:line:col, its --set flag, or the file alone for a key
// left at its default. A default-constructed one (configs built in code) names the key only.
class ConfigLocator {
public:
  ConfigLocator() = default;
  explicit ConfigLocator(const CfgNode& root) : root_(std::make_shared<CfgNode>(root)) {}
  // "model.yaml:9:21", "--set train.batch_size=9" or "model.yaml"; "" without a file.
  std::string location(const std::string& keyPath) const;
  // Whether the file or a --set flag gives the key (false for a config built in code).
  bool isSet(const std::string& keyPath) const;
  // Throws ConfigError "<location>: <keyPath>: <message>"; "" is the config as a whole.
  [[noreturn]] void fail(const std::string& keyPath, const std::string& message) const;

private:
  std::string locate(const std::string& keyPath, bool& present) const;
  std::shared_ptr<const CfgNode> root_;
};

struct DataConfig {
  std::string kind = "sine";  // sine | function | csv | arrays
  int64_t samples = 4096;     // sine, function
  double noise = 0.01;        // std of Gaussian noise added to inputs (sine) or targets (function)
  double validation = 0.1;    // fraction held out
  bool shuffle = true;
  // sine
  int64_t window = 64, horizon = 1, channels = 1;
  std::string target = "next";  // next: the `horizon` values after the window; sequence: x[t+horizon] for each t;
                                // delayed: x[t-delay] for each t
  int64_t delay = 0;              // target delayed: how many steps back
  double periodMin = 8.0, periodMax = 64.0;  // in time steps
  // function
  std::string fn = "sin";  // sin | cos | sinc | gaussian | cubic | abs
  int64_t inputs = 1;
  double rangeLo = -3.14159265358979, rangeHi = 3.14159265358979;
  // csv
  std::string path;  // relative to the config file's folder
  std::vector<std::string> features, targets;
  bool header = true;
  // arrays: the samples, given by a library caller (the Python module's Model.train(x=, y=));
  // split for validation as any other kind's
  std::shared_ptr<const Dataset> arrays;
  ConfigLocator where;  // the config's keys, for data errors found when loading
};

struct ExplicitParam {
  std::string name;
  std::vector<int64_t> shape;
  std::string init = "xavier";
  // file:line:col (or the --set flag) of its shape and of its name (the key), for messages
  std::string location, nameLocation;
};

struct ExplicitNode {
  std::string op, output, path, location;
  std::vector<std::string> inputs;
  std::vector<std::pair<std::string, CfgNode>> attrs;
};

struct ModelConfig {
  std::vector<int64_t> input;  // one sample's shape; empty: the data's sample shape
  std::vector<std::shared_ptr<const Layer>> layers;  // layer sugar, parsed by frontend/layers/
  std::vector<ExplicitParam> params;
  std::vector<ExplicitNode> nodes;
  std::string output;  // explicit form: the value that is the prediction (default: last node)
  // file:line:col (or the --set flag) of model.input and model.output, for messages; the
  // file alone (or "" for a config built in code) where the key is not set.
  std::string inputLocation, outputLocation;
  bool explicitGraph() const { return !nodes.empty(); }
};

struct OptimizerConfig {
  std::string type = "adam";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
  double clipGradNorm = 0.0;  // 0: off
};

// train.checkpoint: where and how often `train` saves (frontend/checkpoint.h).
struct CheckpointConfig {
  std::string dir;      // "" (the default): no checkpoints; relative to the working folder
  int64_t every = 0;    // also every this many steps; 0: only at the end (and on SIGINT/SIGTERM)
  int64_t keep = 3;     // the newest this many step checkpoints stay; 0 keeps all; a run's final one always stays
};

struct TrainConfig {
  std::string loss = "mse";
  OptimizerConfig optimizer;
  int64_t batchSize = 64;
  int64_t steps = 1000;
  int64_t epochs = 0;  // > 0 replaces steps: epochs * (train samples / batch); not both in one file
  int64_t logEvery = 100;
  std::string lrSchedule = "constant";  // constant | cosine
  int64_t warmupSteps = 0;
  CheckpointConfig checkpoint;
};

struct CompilerConfig {
  std::vector<std::string> passes;  // the pipeline before autodiff; see README
  GemmProvider gemm = GemmProvider::Auto;  // generated | cublaslt | auto: who runs the GEMMs on the GPU
  bool deterministic = false;       // GPU: no kernel with atomics (FlashAttention's fp32 backward)
};

struct Config {
  std::string file;  // path of the YAML file
  std::string name = "model";
  uint64_t seed = 0;
  std::string device = "auto";     // auto | cpu | cuda
  Precision precision = Precision::Fp32;  // fp32 | fp64 | tf32 | bf16
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  CompilerConfig compiler;
  ConfigLocator where;  // the config's keys, for mistakes found after parsing
};

// Loads and validates a config; `overrides` are "key.path=value" strings from --set.
// Throws ConfigError (file:line:col, key path, valid choices) on any mistake.
Config loadConfig(const std::string& file, const std::vector<std::string>& overrides);
// Parses a config from YAML text (tests); `file` names it in messages.
Config parseConfig(const std::string& yamlText, const std::string& file, const std::vector<std::string>& overrides);

// The config as YAML with every key the config alone decides written out (defaults filled in,
// --set overrides applied), in README's order; parseConfig of it gives the same config, and its
// resolvedConfigYaml the same text. Checkpoints keep it (frontend/checkpoint.h).
std::string resolvedConfigYaml(const Config& cfg);

}  // namespace pa
