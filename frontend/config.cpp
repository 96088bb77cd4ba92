// Config parsing and validation. Each section lists its valid keys once, in checkKeys.
#include "frontend/config.h"

#include <cassert>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "passes/pass_manager.h"

namespace pa {

std::string ConfigLocator::location(const std::string& keyPath) const {
  bool present = false;
  return locate(keyPath, present);
}

std::string ConfigLocator::locate(const std::string& keyPath, bool& present) const {
  present = false;
  if (!root_) return "";
  // Walk "a.b[2].c" as far as the tree goes; a key left at its default is located at the file.
  // (YAML::Node's assignment writes through to the tree, so the walk rebinds with reset.)
  YAML::Node n;
  n.reset(root_->yaml());
  size_t i = 0;
  while (i < keyPath.size()) {
    YAML::Node next;
    if (keyPath[i] == '[') {
      const size_t close = keyPath.find(']', i);
      const size_t idx = std::stoul(keyPath.substr(i + 1, close - i - 1));
      i = close + 1;
      if (!n.IsSequence() || idx >= n.size()) return root_->with(YAML::Node(), keyPath).location();
      next.reset(n[idx]);
    } else {
      if (keyPath[i] == '.') ++i;
      const size_t end = std::min(keyPath.find_first_of(".[", i), keyPath.size());
      const std::string key = keyPath.substr(i, end - i);
      i = end;
      const YAML::Node& cn = n;  // const lookup: never inserts
      if (!n.IsMap() || !cn[key]) return root_->with(YAML::Node(), keyPath).location();
      next.reset(cn[key]);
    }
    n.reset(next);
  }
  present = true;
  return root_->with(n, keyPath).location();
}

bool ConfigLocator::isSet(const std::string& keyPath) const {
  bool present = false;
  locate(keyPath, present);
  return present;
}

void ConfigLocator::fail(const std::string& keyPath, const std::string& message) const {
  bool present = false;
  const std::string at = locate(keyPath, present);
  if (at.empty()) throw UserError(keyPath + ": " + message);
  throw ConfigError(at, keyPath, message + (present ? "" : " (the key is not set: this is its default)"));
}

namespace {

// Applies one --set override to the YAML tree, creating missing map keys.
void applyOverride(YAML::Node& root, const std::string& text, ConfigSource& src) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set " + text, "", "expected key.path=value");
  const std::string path = text.substr(0, eq), value = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (path.back() == '.') parts.push_back("");  // getline drops a trailing empty segment
  for (const std::string& p : parts)
    if (p.empty())
      throw ConfigError("--set " + text, "",
                        "'" + path + "' has an empty key (a leading, trailing or doubled dot); expected key.path=value, e.g. train.batch_size=32");
  YAML::Node cur = root;
  std::string walked;
  // Messages use the dotted path with [i] for list indices, as the parser builds it; a numeric
  // key of a map (a new key '99', say) stays a key, so that a mistake about it names this flag.
  std::string keyPath;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    const bool last = i + 1 == parts.size();
    keyPath += cur.IsSequence() ? "[" + p + "]" : (keyPath.empty() ? "" : ".") + p;
    YAML::Node next;
    if (cur.IsSequence()) {
      size_t idx = 0;
      try {
        idx = std::stoul(p);
      } catch (const std::exception&) {
        throw ConfigError("--set " + text, walked, "'" + p + "' is not a list index");
      }
      if (idx >= cur.size())
        throw ConfigError("--set " + text, walked, "index " + p + " is past the end of a list of " + std::to_string(cur.size()));
      if (last) {
        cur[idx] = YAML::Load(value);
        break;
      }
      next.reset(cur[idx]);
    } else {
      if (!cur.IsMap() && !cur.IsNull())
        throw ConfigError("--set " + text, walked, "is a value, not a map: cannot set '" + p + "' under it");
      if (last) {
        cur[p] = YAML::Load(value);
        break;
      }
      if (!cur[p]) cur[p] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[p]);
    }
    walked += (walked.empty() ? "" : ".") + p;
    cur.reset(next);
  }
  src.overrides[keyPath] = value;
}

// The largest magnitude a float32 holds: data is stored in float32.
constexpr double kFloatMax = FLT_MAX;

void parseData(const CfgNode& n, DataConfig& d) {
  d.kind = n.getChoice("kind", d.kind, {"sine", "function", "csv", "arrays"});
  const std::vector<std::string> common = {"kind", "validation", "shuffle"};
  std::vector<std::string> allowed = common;
  if (d.kind == "sine")
    allowed.insert(allowed.end(), {"samples", "noise", "window", "horizon", "channels", "target", "period", "delay"});
  else if (d.kind == "function")
    allowed.insert(allowed.end(), {"samples", "noise", "fn", "inputs", "range"});
  else if (d.kind == "csv")
    allowed.insert(allowed.end(), {"path", "features", "targets", "header"});
  n.checkKeys(allowed);
  d.validation = n.getDoubleIn("validation", d.validation, 0.0, 0.9);
  d.shuffle = n.getBool("shuffle", d.shuffle);
  if (d.kind == "sine") {
    d.samples = n.getIntIn("samples", d.samples, 2, INT64_MAX);
    d.noise = n.getDoubleIn("noise", d.noise, 0.0, 1e3);
    d.window = n.getIntIn("window", d.window, 1, 1 << 20);
    d.horizon = n.getIntIn("horizon", d.horizon, 1, 1 << 20);
    d.channels = n.getIntIn("channels", d.channels, 1, 1 << 16);
    d.target = n.getChoice("target", d.target, {"next", "sequence", "delayed"});
    if (d.target == "delayed") {
      if (!n.has("delay")) n.child("target").fail("target delayed needs data.delay, how many steps back each position's target lies");
      d.delay = n.getIntIn("delay", 0, 1, 1 << 20);
    } else if (n.has("delay")) {
      n.child("delay").fail("delay is for target: delayed (target is " + d.target + ")");
    }
    if (n.has("period")) {
      const CfgNode p = n.child("period");
      const std::vector<double> v = p.asDoubles();
      if (v.size() != 2 || v[0] <= 0 || v[1] < v[0]) p.fail("expected [min, max] periods in steps, 0 < min <= max");
      d.periodMin = v[0];
      d.periodMax = v[1];
    }
  } else if (d.kind == "function") {
    d.samples = n.getIntIn("samples", d.samples, 2, INT64_MAX);
    d.noise = n.getDoubleIn("noise", 0.0, 0.0, 1e3);
    d.fn = n.getChoice("fn", d.fn, {"sin", "cos", "sinc", "gaussian", "cubic", "abs"});
    d.inputs = n.getIntIn("inputs", d.inputs, 1, 1 << 16);
    if (n.has("range")) {
      const CfgNode r = n.child("range");
      const std::vector<double> v = r.asDoubles();
      if (v.size() != 2 || !(v[0] < v[1])) r.fail("expected [low, high] with low < high");
      for (size_t i = 0; i < 2; ++i)
        if (std::fabs(v[i]) > kFloatMax)
          r.item(i).fail(formatNumber(v[i]) + " is beyond float32 (data is stored in float32: |x| <= 3.4e38)");
      d.rangeLo = v[0];
      d.rangeHi = v[1];
    }
  } else if (d.kind == "csv") {
    d.path = n.child("path").asString();
    if (d.path.empty()) n.child("path").fail("expected the CSV file's path, got an empty string");
    d.header = n.getBool("header", d.header);
    auto names = [&](const char* key) {
      std::vector<std::string> r;
      if (!n.has(key)) return r;
      const CfgNode c = n.child(key);
      if (c.isScalar()) return std::vector<std::string>{c.asString()};
      if (!c.isSequence()) c.fail("expected a column name or a list of them, got " + std::string(c.isMap() ? "a map" : "nothing"));
      if (c.size() == 0) c.fail("an empty list; leave the key out for the default");
      for (size_t i = 0; i < c.size(); ++i) {
        r.push_back(c.item(i).asString());
        if (std::find(r.begin(), r.end() - 1, r.back()) != r.end() - 1)
          c.item(i).fail("column '" + r.back() + "' is listed twice");
      }
      return r;
    };
    d.features = names("features");
    d.targets = names("targets");
    for (size_t i = 0; i < d.targets.size(); ++i)
      if (std::find(d.features.begin(), d.features.end(), d.targets[i]) != d.features.end()) {
        const CfgNode t = n.child("targets");
        (t.isSequence() ? t.item(i) : t)
            .fail("column '" + d.targets[i] + "' is both a feature (data.features, " + n.child("features").location() +
                  ") and a target; a model would see its own answer");
      }
  }
}

void parseModel(const CfgNode& n, ModelConfig& m) {
  n.checkKeys({"input", "layers", "params", "nodes", "output"});
  m.inputLocation = m.outputLocation = n.source().file;
  if (n.has("input")) {
    m.inputLocation = n.child("input").location();
    m.input = n.child("input").asInts();
    if (m.input.empty()) n.child("input").fail("an empty list; leave the key out for the data's sample shape");
    for (int64_t d : m.input)
      if (d < 1) n.child("input").fail("every extent must be at least 1");
  }
  const bool layers = n.has("layers"), nodes = n.has("nodes");
  if (layers == nodes) n.fail("give either 'layers' (layer sugar) or 'params' and 'nodes' (explicit graph), not " + std::string(layers ? "both" : "neither"));
  if (layers) {
    if (n.has("params") || n.has("output")) n.fail("'params' and 'output' belong to the explicit form (with 'nodes')");
    const CfgNode ls = n.child("layers");
    if (!ls.isSequence() || ls.size() == 0) ls.fail("expected a non-empty list of layers");
    for (size_t i = 0; i < ls.size(); ++i) m.layers.push_back(parseLayer(ls.item(i)));
    return;
  }
  if (n.has("params")) {
    const CfgNode ps = n.child("params");
    if (!ps.isMap()) ps.fail("expected a map of parameter name -> {shape, init}");
    for (const auto& kv : ps.yaml()) {
      const std::string name = ps.scalarKey(kv.first);
      const CfgNode p = ps.child(name);
      p.checkKeys({"shape", "init"});
      ExplicitParam e;
      e.name = name;
      e.nameLocation = ps.with(kv.first, p.path()).location();
      e.location = p.child("shape").location();
      e.shape = p.child("shape").asInts();
      for (int64_t d : e.shape)
        if (d < 1) p.child("shape").fail("every extent must be at least 1");
      e.init = p.getChoice("init", e.init, {"he", "xavier", "zeros", "ones", "normal"});
      m.params.push_back(e);
    }
  }
  const CfgNode ns = n.child("nodes");
  if (!ns.isSequence() || ns.size() == 0) ns.fail("expected a non-empty list of nodes");
  for (size_t i = 0; i < ns.size(); ++i) {
    const CfgNode it = ns.item(i);
    if (!it.isMap()) it.fail("a node is a map: {op, inputs, output, <attributes>}");
    ExplicitNode e;
    e.path = it.path();
    e.location = it.location();
    e.op = it.child("op").asString();
    e.output = it.child("output").asString();
    if (it.has("inputs")) {  // constants have none
      const CfgNode ins = it.child("inputs");
      if (ins.isScalar()) e.inputs.push_back(ins.asString());
      else if (!ins.isSequence()) ins.fail("expected a value name or a list of them, got " + std::string(ins.isMap() ? "a map" : "nothing"));
      else
        for (size_t j = 0; j < ins.size(); ++j) e.inputs.push_back(ins.item(j).asString());
    }
    for (const std::string& k : it.keys())
      if (k != "op" && k != "inputs" && k != "output") e.attrs.emplace_back(k, it.child(k));
    m.nodes.push_back(std::move(e));
  }
  m.output = n.getString("output", m.nodes.back().output);
  // Left out, the output is the last node's: a mistake about it is that node's.
  m.outputLocation = n.has("output") ? n.child("output").location() : m.nodes.back().location;
}

void parseTrain(const CfgNode& n, TrainConfig& t) {
  n.checkKeys({"loss", "optimizer", "batch_size", "steps", "epochs", "log_every", "lr_schedule", "warmup_steps",
               "checkpoint"});
  t.loss = n.getChoice("loss", t.loss, {"mse"});
  if (n.has("optimizer")) {
    const CfgNode o = n.child("optimizer");
    o.checkKeys({"type", "lr", "betas", "eps", "weight_decay", "clip_grad_norm"});
    t.optimizer.type = o.getChoice("type", "adam", {"adam"});
    t.optimizer.lr = o.getDoubleIn("lr", t.optimizer.lr, 0.0, 1e3);
    if (o.has("betas")) {
      const CfgNode b = o.child("betas");
      const std::vector<double> v = b.asDoubles();
      if (v.size() != 2 || v[0] < 0 || v[0] >= 1 || v[1] < 0 || v[1] >= 1) b.fail("expected [beta1, beta2], each in [0, 1)");
      t.optimizer.beta1 = v[0];
      t.optimizer.beta2 = v[1];
    }
    // eps = 0 divides by zero where a parameter's gradient has always been 0 (NaN weights).
    t.optimizer.eps = o.getPositive("eps", t.optimizer.eps, 1.0);
    t.optimizer.weightDecay = o.getDoubleIn("weight_decay", t.optimizer.weightDecay, 0.0, 1e3);
    t.optimizer.clipGradNorm = o.getDoubleIn("clip_grad_norm", t.optimizer.clipGradNorm, 0.0, 1e12);
  }
  t.batchSize = n.getIntIn("batch_size", t.batchSize, 1, 1 << 24);
  t.steps = n.getIntIn("steps", t.steps, 0, INT64_MAX);
  t.epochs = n.getIntIn("epochs", t.epochs, 0, 1 << 30);
  // Both in one place is ambiguous; a --set of either replaces the file's other one.
  if (t.epochs > 0 && n.has("steps")) {
    const bool stepsSet = n.child("steps").location().rfind("--set ", 0) == 0;
    const bool epochsSet = n.child("epochs").location().rfind("--set ", 0) == 0;
    if (stepsSet == epochsSet)
      n.child("epochs").fail("give train.steps or train.epochs, not both (train.steps is set at " +
                             n.child("steps").location() + ")");
    if (epochsSet) t.steps = TrainConfig().steps;
    else t.epochs = 0;
  }
  t.logEvery = n.getIntIn("log_every", t.logEvery, 1, INT64_MAX);
  t.lrSchedule = n.getChoice("lr_schedule", t.lrSchedule, {"constant", "cosine"});
  t.warmupSteps = n.getIntIn("warmup_steps", t.warmupSteps, 0, INT64_MAX);
  if (n.has("checkpoint")) {
    const CfgNode c = n.child("checkpoint");
    if (!c.isMap()) c.fail("expected a map {dir, every, keep}");
    c.checkKeys({"dir", "every", "keep"});
    t.checkpoint.dir = c.getString("dir", t.checkpoint.dir);
    if (c.has("dir") && t.checkpoint.dir.empty()) c.child("dir").fail("an empty folder name; leave the key out for no checkpoints");
    t.checkpoint.every = c.getIntIn("every", t.checkpoint.every, 0, INT64_MAX);
    t.checkpoint.keep = c.getIntIn("keep", t.checkpoint.keep, 0, 1 << 30);
  }
}

void parseCompiler(const CfgNode& n, CompilerConfig& c) {
  n.checkKeys({"fuse", "passes", "gemm", "deterministic"});
  c.deterministic = n.getBool("deterministic", c.deterministic);
  if (n.has("gemm")) {
    const CfgNode m = n.child("gemm");
    const std::string name = m.asString();
    if (!parseGemmProvider(name, c.gemm))
      m.fail("'" + name + "' is not a GEMM provider; valid: " + joinChoices(settingNames(kGemmProviders, gemmProviderName)));
  }
  if (n.has("passes")) {
    const CfgNode p = n.child("passes");
    if (!p.isSequence()) p.fail("expected a list of pass names");
    const std::vector<std::string> valid = forwardPassNames();
    for (size_t i = 0; i < p.size(); ++i) {
      const std::string name = p.item(i).asString();
      if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
        const bool later = PassRegistry::builtin().find(name) != nullptr;
        p.item(i).fail(later ? "pass '" + name + "' is run by the trainer itself, on the whole training step" +
                                   (name == "lower-bf16" ? " with precision: bf16" : "") +
                                   " (README, \"Passes\"); compiler.passes is for the forward graph. Valid passes here: " +
                                   joinChoices(valid)
                             : "unknown pass '" + name + "'" + suggestion(name, valid, "passes"));
      }
      c.passes.push_back(name);
    }
  }
  if (n.has("fuse")) {
    const CfgNode f = n.child("fuse");
    std::vector<std::string> kinds;
    if (f.isScalar()) {
      // Every fusion that pays on the examples (bench/RESULTS.md); rope, measured slower there
      // (issue 27), only when listed. mlp fuses only chains whose rows it measured faster on.
      if (f.asBool()) kinds = {"linear", "attention", "qkv", "norm", "elementwise", "mlp"};
    } else {
      if (!f.isSequence()) f.fail("expected true, false or a list of linear, attention, qkv, rope, norm, elementwise, mlp");
      const std::vector<std::string> fusions = {"linear", "attention", "qkv", "rope", "norm", "elementwise", "mlp"};
      for (size_t i = 0; i < f.size(); ++i) {
        const std::string k = f.item(i).asString();
        if (std::find(fusions.begin(), fusions.end(), k) == fusions.end())
          f.item(i).fail("'" + k + "' is not a fusion" + suggestion(k, fusions, "fusions"));
        if (std::find(kinds.begin(), kinds.end(), k) != kinds.end()) f.item(i).fail("'" + k + "' is listed twice");
        if (k == "rope" && std::find(kinds.begin(), kinds.end(), "attention") == kinds.end())
          f.item(i).fail("rope folds into the attention nodes' projections: list attention before it");
        if (k == "qkv" && std::find(kinds.begin(), kinds.end(), "attention") == kinds.end())
          f.item(i).fail("qkv packs the attention nodes' projections: list attention before it");
        if (k == "mlp" && std::find(kinds.begin(), kinds.end(), "linear") == kinds.end())
          f.item(i).fail("mlp chains the linear layers fuse-linear makes: list linear before it");
        kinds.push_back(k);
      }
    }
    std::vector<std::string> fused;
    for (const std::string& k : kinds) fused.push_back("fuse-" + k);
    c.passes.insert(c.passes.begin(), fused.begin(), fused.end());
  }
}

Config parseRoot(YAML::Node root, std::shared_ptr<ConfigSource> src) {
  const CfgNode n(root, "", src);
  if (!root.IsMap()) n.fail("a config is a map with keys name, seed, device, precision, data, model, train, compiler");
  n.checkKeys({"name", "seed", "device", "precision", "data", "model", "train", "compiler"});
  Config c;
  c.file = src->file;
  c.where = ConfigLocator(n);
  c.name = n.getString("name", c.name);
  c.seed = static_cast<uint64_t>(n.getIntIn("seed", 0, 0, INT64_MAX));
  c.device = n.getChoice("device", c.device, {"auto", "cpu", "cuda"});
  const bool knownPrecision =
      parsePrecision(n.getChoice("precision", precisionName(c.precision), settingNames(kPrecisions, precisionName)), c.precision);
  assert(knownPrecision && "getChoice returns one of the precisions' names");
  (void)knownPrecision;
  parseData(n.child("data"), c.data);
  c.data.where = c.where;
  parseModel(n.child("model"), c.model);
  if (n.has("train")) parseTrain(n.child("train"), c.train);
  if (n.has("compiler")) parseCompiler(n.child("compiler"), c.compiler);
  return c;
}

std::string markText(const std::string& file, const YAML::Mark& m) {
  return m.is_null() ? file : file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// yaml-cpp accepts what a config must not hold: a key given twice (a lookup finds the first, so
// the second would be ignored in silence), and a map or list used as a key (its conversion to a
// string throws without a position). Checked over the whole tree, with key paths.
void checkTree(const CfgNode& n, int depth) {
  if (depth > 64) n.fail("nested more than 64 levels deep (an alias inside its own anchor?)");
  if (n.isSequence())
    for (size_t i = 0; i < n.size(); ++i) checkTree(n.item(i), depth + 1);
  if (!n.isMap()) return;
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : n.yaml()) {
    const std::string key = n.scalarKey(kv.first);
    const std::string path = n.path().empty() ? key : n.path() + "." + key;
    auto [it, fresh] = seen.emplace(key, kv.first.Mark());
    if (!fresh)
      n.with(kv.first, path)
          .fail("duplicate key '" + key + "': it is also at " + markText(n.source().file, it->second) +
                " (keep one of them)");
    checkTree(n.with(kv.second, path), depth + 1);
  }
}

YAML::Node loadYaml(const std::string& text, const std::string& file) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(markText(file, e.mark), "", "malformed YAML: " + e.msg);
  }
  if (docs.size() > 1)
    throw ConfigError(markText(file, docs[1].Mark()), "",
                      "a second YAML document (after '---'): a config is one document; remove the '---' and what follows, "
                      "or merge it into the first");
  return docs.empty() ? YAML::Node() : docs[0];
}

}  // namespace

Config parseConfig(const std::string& yamlText, const std::string& file, const std::vector<std::string>& overrides) {
  auto src = std::make_shared<ConfigSource>();
  src->file = file;
  YAML::Node root = loadYaml(yamlText, file);
  // Nothing but whitespace, comments or a null: the position is the file's start.
  if (!root || root.IsNull()) throw ConfigError(markText(file, YAML::Mark()), "", "the config is empty: it holds no keys");
  checkTree(CfgNode(root, "", src), 0);
  for (const std::string& o : overrides) {
    try {
      applyOverride(root, o, *src);
    } catch (const YAML::Exception& e) {
      throw ConfigError("--set " + o, "", "malformed value: " + e.msg);
    }
  }
  checkTree(CfgNode(root, "", src), 0);  // again: a --set value is YAML too
  try {
    return parseRoot(root, src);
  } catch (const YAML::Exception& e) {  // a yaml-cpp conversion the checks above did not foresee
    throw ConfigError(markText(file, e.mark), "", "cannot read this part of the config: " + e.msg);
  }
}

Config loadConfig(const std::string& file, const std::vector<std::string>& overrides) {
  if (file.empty()) throw UserError("--config: expected the path of a YAML file, got an empty string");
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    throw ConfigError(file, "", "is a directory; --config takes a YAML file");
  std::ifstream in(file);
  if (!in) throw ConfigError(file, "", "cannot read the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parseConfig(ss.str(), file, overrides);
}

}  // namespace pa
