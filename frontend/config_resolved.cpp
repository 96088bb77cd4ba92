// A config printed back as YAML with its defaults filled in (what checkpoints keep).
#include <string>
#include <vector>

#include "frontend/config.h"

namespace pa {

namespace {

// A string as one YAML scalar, quoted where plain text would be read as something else.
std::string scalar(const std::string& s) {
  YAML::Emitter e;
  e << YAML::DoubleQuoted << s;
  return e.c_str();
}

std::string list(const std::vector<std::string>& items) {
  std::string r = "[";
  for (size_t i = 0; i < items.size(); ++i) r += (i ? ", " : "") + items[i];
  return r + "]";
}

std::string ints(const std::vector<int64_t>& v) {
  std::vector<std::string> s;
  for (int64_t x : v) s.push_back(std::to_string(x));
  return list(s);
}

std::string names(const std::vector<std::string>& v) {
  std::vector<std::string> s;
  for (const std::string& x : v) s.push_back(scalar(x));
  return list(s);
}

// A YAML subtree in flow style, for the attributes of explicit nodes.
std::string flow(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

std::string dataYaml(const DataConfig& d) {
  std::string s = "{kind: " + d.kind + ", validation: " + exactNumber(d.validation) + ", shuffle: " + (d.shuffle ? "true" : "false");
  if (d.kind == "sine") {
    s += ", samples: " + std::to_string(d.samples) + ", noise: " + exactNumber(d.noise) + ", window: " + std::to_string(d.window) +
         ", horizon: " + std::to_string(d.horizon) + ", channels: " + std::to_string(d.channels) + ", target: " + d.target + (d.target == "delayed" ? ", delay: " + std::to_string(d.delay) : std::string()) +
         ", period: [" + exactNumber(d.periodMin) + ", " + exactNumber(d.periodMax) + "]";
  } else if (d.kind == "function") {
    s += ", samples: " + std::to_string(d.samples) + ", noise: " + exactNumber(d.noise) + ", fn: " + d.fn +
         ", inputs: " + std::to_string(d.inputs) + ", range: [" + exactNumber(d.rangeLo) + ", " + exactNumber(d.rangeHi) + "]";
  } else if (d.kind == "csv") {
    s += ", path: " + scalar(d.path) + ", header: " + (d.header ? "true" : "false");
    // Left out, the columns are decided by the file (all but the targets; the last column).
    if (!d.features.empty()) s += ", features: " + names(d.features);
    if (!d.targets.empty()) s += ", targets: " + names(d.targets);
  }
  return s + "}";
}

std::string modelYaml(const ModelConfig& m) {
  std::string s = "model:\n";
  if (!m.input.empty()) s += "  input: " + ints(m.input) + "\n";
  if (!m.explicitGraph()) {
    s += "  layers:\n";
    for (const auto& l : m.layers) s += "    - " + l->resolved() + "\n";
    return s;
  }
  if (!m.params.empty()) {
    s += "  params:\n";
    for (const ExplicitParam& p : m.params)
      s += "    " + scalar(p.name) + ": {shape: " + ints(p.shape) + ", init: " + p.init + "}\n";
  }
  s += "  nodes:\n";
  for (const ExplicitNode& n : m.nodes) {
    s += "    - {op: " + scalar(n.op) + ", inputs: " + names(n.inputs) + ", output: " + scalar(n.output);
    for (const auto& [key, value] : n.attrs) s += ", " + scalar(key) + ": " + flow(value.yaml());
    s += "}\n";
  }
  return s + "  output: " + scalar(m.output) + "\n";
}

std::string trainYaml(const TrainConfig& t) {
  const OptimizerConfig& o = t.optimizer;
  std::string s = "train:\n  loss: " + t.loss + "\n";
  s += "  optimizer: {type: " + o.type + ", lr: " + exactNumber(o.lr) + ", betas: [" + exactNumber(o.beta1) + ", " + exactNumber(o.beta2) +
       "], eps: " + exactNumber(o.eps) + ", weight_decay: " + exactNumber(o.weightDecay) +
       ", clip_grad_norm: " + exactNumber(o.clipGradNorm) + "}\n";
  s += "  batch_size: " + std::to_string(t.batchSize) + "\n";
  // steps and epochs > 0 together are refused; epochs 0 is "off".
  if (t.epochs > 0) s += "  epochs: " + std::to_string(t.epochs) + "\n";
  else s += "  steps: " + std::to_string(t.steps) + "\n  epochs: 0\n";
  s += "  log_every: " + std::to_string(t.logEvery) + "\n  lr_schedule: " + t.lrSchedule +
       "\n  warmup_steps: " + std::to_string(t.warmupSteps) + "\n";
  const CheckpointConfig& c = t.checkpoint;
  s += "  checkpoint: {";
  if (!c.dir.empty()) s += "dir: " + scalar(c.dir) + ", ";
  return s + "every: " + std::to_string(c.every) + ", keep: " + std::to_string(c.keep) + "}\n";
}

std::string compilerYaml(const CompilerConfig& c) {
  // compiler.fuse's fusions are the first passes of the list: written as passes, they read back
  // the same.
  return "compiler: {fuse: false, passes: " + list(c.passes) + ", gemm: " + gemmProviderName(c.gemm) +
         ", deterministic: " + (c.deterministic ? "true" : "false") + "}\n";
}

}  // namespace

std::string resolvedConfigYaml(const Config& cfg) {
  return "name: " + scalar(cfg.name) + "\nseed: " + std::to_string(cfg.seed) + "\ndevice: " + cfg.device +
         "\nprecision: " + precisionName(cfg.precision) + "\ndata: " + dataYaml(cfg.data) + "\n" + modelYaml(cfg.model) +
         trainYaml(cfg.train) + compilerYaml(cfg.compiler);
}

}  // namespace pa
