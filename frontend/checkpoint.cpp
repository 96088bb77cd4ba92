// Checkpoint folders: writing them whole, pruning, finding and reading them back, and matching
// weights files to a graph.
#include "frontend/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "common/hash.h"
#include "frontend/atomic_file.h"

namespace pa {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFormat = "pureattention-state";
constexpr const char* kStateFormatVersion = "1";
constexpr const char* kFolderPrefix = "step-";

std::string shapeText(const std::vector<int64_t>& s) { return safetensors::shapeText(s); }

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// The step of a folder named step-NNNNNNNN, or -1.
int64_t stepOfFolder(const std::string& name) {
  if (name.rfind(kFolderPrefix, 0) != 0 || name.size() == std::strlen(kFolderPrefix)) return -1;
  int64_t step = -1;
  return parseCount(name.substr(std::strlen(kFolderPrefix)), step) ? step : -1;
}

bool isCheckpointFolder(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / kModelFile, ec) && fs::is_regular_file(p / kStateFile, ec);
}

// Step checkpoints of `root`, highest step first.
std::vector<std::pair<int64_t, fs::path>> stepFolders(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> r;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = stepOfFolder(it->path().filename().string());
    if (step >= 0 && isCheckpointFolder(it->path())) r.emplace_back(step, it->path());
  }
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return r;
}

std::string jsonOfAdam(const AdamSettings& a) {
  return nlohmann::json{{"type", "adam"},           {"lr", a.lr},
                        {"beta1", a.beta1},         {"beta2", a.beta2},
                        {"eps", a.eps},             {"weight_decay", a.weightDecay},
                        {"clip_grad_norm", a.clipGradNorm}}
      .dump();
}

std::string jsonOfSchedule(const LrSchedule& s, int64_t total) {
  return nlohmann::json{{"kind", s.cosine ? "cosine" : "constant"}, {"lr", s.lr}, {"warmup_steps", s.warmupSteps},
                        {"total_steps", total}}
      .dump();
}

// A metadata value of a file, required.
const std::string& meta(const safetensors::File& f, const std::string& key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) throw safetensors::FormatError(f.name(), "metadata '" + key + "' is missing");
  return it->second;
}

int64_t metaInt(const safetensors::File& f, const std::string& key, int64_t lo) {
  const std::string& v = meta(f, key);
  int64_t n = -1;
  if (!parseCount(v, n) || n < lo)
    throw safetensors::FormatError(f.name(), "metadata '" + key + "' is '" + v + "', expected a whole number of at least " +
                                                 std::to_string(lo));
  return n;
}

}  // namespace

std::vector<int64_t> metadataShape(const safetensors::File& f, const std::string& key) {
  if (!f.metadata().count(key)) return {};
  const std::string& v = meta(f, key);
  nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
  std::vector<int64_t> s;
  bool ok = j.is_array();
  for (size_t i = 0; ok && i < j.size(); ++i) {
    ok = j[i].is_number_integer() && j[i].get<int64_t>() >= 1;
    if (ok) s.push_back(j[i].get<int64_t>());
  }
  if (!ok) throw safetensors::FormatError(f.name(), "metadata '" + key + "' is '" + v + "', expected a shape like [64, 1]");
  return s;
}

namespace {

// Settings from a JSON metadata value; missing or mistyped fields are a damaged file.
nlohmann::json metaJson(const safetensors::File& f, const std::string& key) {
  nlohmann::json j = nlohmann::json::parse(meta(f, key), nullptr, false);
  if (!j.is_object()) throw safetensors::FormatError(f.name(), "metadata '" + key + "' is not a JSON object");
  return j;
}

template <class T>
T field(const safetensors::File& f, const nlohmann::json& j, const std::string& key, const std::string& name) {
  auto it = j.find(name);
  if (it == j.end() || (std::is_same_v<T, std::string> ? !it->is_string() : !it->is_number()))
    throw safetensors::FormatError(f.name(), "metadata '" + key + "' lacks a valid '" + name + "'");
  return it->get<T>();
}

// A tensor of a state file, with the shape and a dtype of its kind.
const safetensors::TensorInfo& stateTensor(const safetensors::File& f, const std::string& name,
                                           const std::vector<int64_t>& shape) {
  const safetensors::TensorInfo* t = f.find(name);
  if (!t) throw safetensors::FormatError(f.name(), "tensor '" + name + "' is missing");
  if (t->shape != shape)
    throw safetensors::FormatError(f.name(), "tensor '" + name + "' is " + shapeText(t->shape) + ", expected " + shapeText(shape));
  return *t;
}

// YAML flattened to "a.b[2].c" -> scalar text, for comparing two resolved configs.
void flatten(const YAML::Node& n, const std::string& path, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) flatten(kv.second, path.empty() ? kv.first.as<std::string>() : path + "." + kv.first.as<std::string>(), out);
  } else if (n.IsSequence()) {
    bool scalars = true;
    for (const auto& item : n) scalars = scalars && item.IsScalar();
    if (scalars) {  // a list of numbers or names is one value: [0.9, 0.999]
      std::string s = "[";
      for (size_t i = 0; i < n.size(); ++i) s += (i ? ", " : "") + n[i].as<std::string>();
      out[path] = s + "]";
      return;
    }
    for (size_t i = 0; i < n.size(); ++i) flatten(n[i], path + "[" + std::to_string(i) + "]", out);
  } else if (n.IsScalar()) {
    out[path] = n.as<std::string>();
  } else {
    out[path] = "";
  }
}

}  // namespace

uint64_t dataFingerprintV1(const std::vector<float>& x, const std::vector<float>& y) {
  uint64_t h = kFnvBasis;
  for (const std::vector<float>* v : {&x, &y})
    h = fnv1a(v->data(), v->size() * sizeof(float), h);
  return h;
}

uint64_t dataFingerprint(const std::vector<float>& x, const std::vector<float>& y) {
  constexpr size_t kChunk = size_t{1} << 20;
  uint64_t h = kFnvBasis;
  for (const std::vector<float>* v : {&x, &y}) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(v->data());
    const size_t bytes = v->size() * sizeof(float), chunks = (bytes + kChunk - 1) / kChunk;
    std::vector<uint64_t> part(chunks);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < static_cast<int64_t>(chunks); ++c) {
      const size_t at = static_cast<size_t>(c) * kChunk;
      part[static_cast<size_t>(c)] = fnv1a(p + at, std::min(kChunk, bytes - at));
    }
    const uint64_t length = bytes;
    h = fnv1a(&length, sizeof length, h);
    h = fnv1a(part.data(), part.size() * sizeof(uint64_t), h);
  }
  return h;
}

std::string checkpointFolderName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kFolderPrefix, static_cast<long long>(step));
  return buf;
}

std::string writeCheckpoint(const std::string& root, const TrainingState& state,
                            const std::map<std::string, std::vector<int64_t>>& shapes, const RunRecord& record, bool final) {
  using safetensors::Tensor;
  const safetensors::DType dtype = record.precision == Precision::Fp64 ? safetensors::DType::F64 : safetensors::DType::F32;
  std::vector<Tensor> model, st;
  for (const auto& [name, shape] : shapes) {
    model.push_back(Tensor::fromDoubles(name, dtype, shape, state.params.at(name)));
    st.push_back(Tensor::fromDoubles("exp_avg/" + name, dtype, shape, state.adamM.at(name)));
    st.push_back(Tensor::fromDoubles("exp_avg_sq/" + name, dtype, shape, state.adamV.at(name)));
  }
  st.push_back(Tensor::i64("data.order", {static_cast<int64_t>(state.order.order.size())}, state.order.order));
  st.push_back(Tensor::u64("data.rng", {4}, std::vector<uint64_t>(state.order.rng.begin(), state.order.rng.end())));
  auto shapeJson = [](const std::vector<int64_t>& s) { return nlohmann::json(s).dump(); };
  const safetensors::Metadata modelMeta = {
      {"format", "pureattention"},
      {"version", PA_VERSION},
      {"step", std::to_string(state.step)},
      {"precision", precisionName(record.precision)},
      {"input_shape", shapeJson(record.sampleX)},
      {"target_shape", shapeJson(record.sampleY)},
      {"config", record.configYaml},
      {"config_file", record.configFile},
      {"weight_layout", "a linear layer computes x @ weight + bias: weights are [in_features, out_features], "
                        "the transpose of torch.nn.Linear.weight"},
  };
  const safetensors::Metadata stateMeta = {
      {"format", kStateFormat},
      {"format_version", kStateFormatVersion},
      {"version", PA_VERSION},
      {"step", std::to_string(state.step)},
      {"total_steps", std::to_string(record.totalSteps)},
      {"final", final ? "true" : "false"},
      {"epoch", std::to_string(state.order.epoch)},
      {"cursor", std::to_string(state.order.cursor)},
      {"batch_size", std::to_string(record.batchSize)},
      {"train_samples", std::to_string(record.trainSamples)},
      {"data_fingerprint2", hex64(record.dataFingerprint)},
      {"optimizer", jsonOfAdam(record.adam)},
      {"schedule", jsonOfSchedule(record.schedule, record.totalSteps)},
      {"lr", nlohmann::json(record.schedule.at(std::max<int64_t>(state.step, 1), record.totalSteps)).dump()},
      {"precision", precisionName(record.precision)},
      {"config", record.configYaml},
  };

  const fs::path dir(root), target = dir / checkpointFolderName(state.step);
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = dir / (".tmp-" + checkpointFolderName(state.step) + "-" + pid);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(root + ": cannot create the checkpoint folder: " + ec.message());
  // Temporary folders of earlier saves that died (a kill, a full disk) hold nothing of value;
  // those of a process still running (another run saving here) are left to it.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind(".tmp-", 0) != 0 && n.rfind(".old-", 0) != 0) continue;
    int64_t owner = 0;
    const bool named = parseCount(n.substr(n.find_last_of('-') + 1), owner) && owner > 0 && owner <= INT32_MAX;
    const pid_t ownerPid = named ? static_cast<pid_t>(owner) : 0;
    if (ownerPid > 0 && ownerPid != ::getpid() && (::kill(ownerPid, 0) == 0 || errno == EPERM)) continue;
    fs::remove_all(it->path(), ec);
  }
  ec.clear();
  fs::create_directory(tmp, ec);
  if (ec) throw UserError(tmp.string() + ": cannot create: " + ec.message());
  try {
    safetensors::write((tmp / kModelFile).string(), model, modelMeta);
    safetensors::write((tmp / kStateFile).string(), st, stateMeta);
    syncFolder(tmp.string());
    // A checkpoint of the same step (a resumed run saving again) is moved aside first: rename
    // does not replace a non-empty folder.
    const fs::path old = dir / (".old-" + checkpointFolderName(state.step) + "-" + pid);
    const bool replacing = fs::exists(target, ec);
    if (replacing && std::rename(target.c_str(), old.c_str()) != 0)
      throw UserError(target.string() + ": cannot replace: " + std::strerror(errno));
    if (std::rename(tmp.c_str(), target.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      if (replacing) std::rename(old.c_str(), target.c_str());
      throw UserError(target.string() + ": cannot write: " + why);
    }
    syncFolder(dir.string());
    if (replacing) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return target.string();
}

std::vector<std::string> pruneCheckpoints(const std::string& root, int64_t keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  int64_t kept = 0;
  for (const auto& [step, path] : stepFolders(root)) {
    if (kept < keep) {
      ++kept;
      continue;
    }
    const safetensors::Metadata m = safetensors::readMetadata((path / kStateFile).string());
    auto f = m.find("final");
    if (f != m.end() && f->second == "true") continue;
    std::error_code ec;
    fs::remove_all(path, ec);
    if (!ec) removed.push_back(path.string());
  }
  return removed;
}

std::string findCheckpoint(const std::string& path, const std::string& flag) {
  const std::string what = flag + " " + path;
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) throw UserError(what + ": no such file or folder");
  if (fs::is_regular_file(p, ec)) {
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if ((p.filename() == kModelFile || p.filename() == kStateFile) && isCheckpointFolder(dir)) return dir.string();
    throw UserError(what + ": not a checkpoint: expected a checkpoint folder (step-NNNNNNNN, holding " +
                    std::string(kModelFile) + " and " + kStateFile + "), a file in one, or a folder of them");
  }
  if (isCheckpointFolder(p)) return p.string();
  const auto steps = stepFolders(p);
  if (steps.empty())
    throw UserError(what + ": no checkpoint in this folder (train --checkpoint-dir writes step-NNNNNNNN folders holding " +
                    std::string(kModelFile) + " and " + kStateFile + ")");
  return steps.front().second.string();
}

Checkpoint readCheckpoint(const std::string& folder) {
  const fs::path dir(folder);
  const safetensors::File model = safetensors::File::read((dir / kModelFile).string());
  const safetensors::File state = safetensors::File::read((dir / kStateFile).string());
  if (meta(state, "format") != kStateFormat)
    throw safetensors::FormatError(state.name(), "metadata 'format' is '" + meta(state, "format") + "', expected '" +
                                                     kStateFormat + "' (not a state file written by train)");
  if (meta(state, "format_version") != kStateFormatVersion)
    throw safetensors::FormatError(state.name(), "state format version " + meta(state, "format_version") +
                                                     " (written by version " + meta(state, "version") +
                                                     "); this build reads version " + kStateFormatVersion);
  Checkpoint c;
  c.folder = folder;
  c.version = meta(state, "version");
  c.final = meta(state, "final") == "true";
  TrainingState& s = c.state;
  s.step = metaInt(state, "step", 0);
  if (metaInt(model, "step", 0) != s.step)
    throw UserError(folder + ": " + kModelFile + " is of step " + meta(model, "step") + " and " + kStateFile + " of step " +
                    meta(state, "step") + " (the two files come from different checkpoints)");
  for (const safetensors::TensorInfo& t : model.tensors()) {
    if (!safetensors::isFloat(t.dtype))
      throw safetensors::FormatError(model.name(), "tensor '" + t.name + "' is " + safetensors::dtypeName(t.dtype) +
                                                       ", expected a floating-point parameter");
    c.shapes[t.name] = t.shape;
    s.params[t.name] = model.toDoubles(t);
    s.adamM[t.name] = state.toDoubles(stateTensor(state, "exp_avg/" + t.name, t.shape));
    s.adamV[t.name] = state.toDoubles(stateTensor(state, "exp_avg_sq/" + t.name, t.shape));
  }
  const size_t expected = 2 * model.tensors().size() + 2;
  if (state.tensors().size() != expected)
    for (const safetensors::TensorInfo& t : state.tensors()) {
      const bool moment = (t.name.rfind("exp_avg/", 0) == 0 && model.find(t.name.substr(8))) ||
                          (t.name.rfind("exp_avg_sq/", 0) == 0 && model.find(t.name.substr(11)));
      if (!moment && t.name != "data.order" && t.name != "data.rng")
        throw safetensors::FormatError(state.name(), "tensor '" + t.name + "' belongs to no parameter of " + kModelFile);
    }
  const safetensors::TensorInfo* order = state.find("data.order");
  if (!order || order->shape.size() != 1)
    throw safetensors::FormatError(state.name(), "tensor 'data.order' is missing or not one-dimensional");
  s.order.order = state.toInt64(*order);
  const std::vector<uint64_t> rng = state.toUint64(stateTensor(state, "data.rng", {4}));
  std::copy(rng.begin(), rng.end(), s.order.rng.begin());
  s.order.cursor = metaInt(state, "cursor", 0);
  s.order.epoch = metaInt(state, "epoch", 0);

  RunRecord& r = c.record;
  r.configYaml = meta(state, "config");
  r.configFile = meta(model, "config_file");
  if (!parsePrecision(meta(state, "precision"), r.precision))
    throw safetensors::FormatError(state.name(), "metadata 'precision' is '" + meta(state, "precision") + "'");
  r.totalSteps = metaInt(state, "total_steps", 0);
  r.batchSize = metaInt(state, "batch_size", 1);
  r.trainSamples = metaInt(state, "train_samples", 0);
  r.sampleX = metadataShape(model, "input_shape");
  r.sampleY = metadataShape(model, "target_shape");
  if (r.sampleX.empty() || r.sampleY.empty())
    throw safetensors::FormatError(model.name(), "metadata 'input_shape' or 'target_shape' is missing");
  // data_fingerprint2: dataFingerprint; data_fingerprint: dataFingerprintV1 (older checkpoints).
  r.fingerprintVersion = state.metadata().count("data_fingerprint2") ? 2 : 1;
  const std::string key = r.fingerprintVersion == 2 ? "data_fingerprint2" : "data_fingerprint";
  const std::string& fp = meta(state, key);
  char* end = nullptr;
  r.dataFingerprint = std::strtoull(fp.c_str(), &end, 16);
  if (fp.empty() || *end) throw safetensors::FormatError(state.name(), "metadata '" + key + "' is '" + fp + "'");
  const nlohmann::json adam = metaJson(state, "optimizer"), sched = metaJson(state, "schedule");
  r.adam = AdamSettings{field<double>(state, adam, "optimizer", "lr"),
                        field<double>(state, adam, "optimizer", "beta1"),
                        field<double>(state, adam, "optimizer", "beta2"),
                        field<double>(state, adam, "optimizer", "eps"),
                        field<double>(state, adam, "optimizer", "weight_decay"),
                        field<double>(state, adam, "optimizer", "clip_grad_norm")};
  r.schedule.lr = field<double>(state, sched, "schedule", "lr");
  r.schedule.warmupSteps = field<int64_t>(state, sched, "schedule", "warmup_steps");
  r.schedule.cosine = field<std::string>(state, sched, "schedule", "kind") == "cosine";
  return c;
}

std::string firstParameterDifference(const Graph& g, const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::set<std::string> ours;
  for (ValueId p : g.params()) {
    const std::string& name = g.value(p).name;
    ours.insert(name);
    const std::vector<int64_t> shape(g.shape(p).begin(), g.shape(p).end());
    auto it = shapes.find(name);
    if (it == shapes.end())
      return "parameter '" + name + "' " + shapeText(shape) + " of this model is not in the checkpoint";
    if (it->second != shape)
      return "parameter '" + name + "' is " + shapeText(shape) + " in this model and " + shapeText(it->second) +
             " in the checkpoint";
  }
  for (const auto& [name, shape] : shapes)
    if (!ours.count(name)) return "the checkpoint holds parameter '" + name + "' " + shapeText(shape) + ", which this model lacks";
  return "";
}

std::vector<std::string> configDifferences(const std::string& checkpointYaml, const std::string& nowYaml) {
  std::map<std::string, std::string> then, now;
  try {
    flatten(YAML::Load(checkpointYaml), "", then);
    flatten(YAML::Load(nowYaml), "", now);
  } catch (const YAML::Exception& e) {
    return {"the checkpoint's config cannot be read (" + e.msg + ")"};
  }
  std::vector<std::string> r;
  // The model is judged by its parameters; the run's length by the schedule (the caller); the
  // rest of these keys do not change what a step computes.
  auto skip = [](const std::string& k) {
    for (const char* p : {"model.", "train.checkpoint.", "train.steps", "train.epochs", "train.log_every", "name"})
      if (k.rfind(p, 0) == 0) return true;
    return false;
  };
  for (const auto& [key, value] : now) {
    if (skip(key)) continue;
    auto it = then.find(key);
    if (it == then.end()) r.push_back(key + ": " + value + " now, not in the checkpoint's config");
    else if (it->second != value) r.push_back(key + ": " + it->second + " in the checkpoint, " + value + " now");
  }
  for (const auto& [key, value] : then)
    if (!skip(key) && !now.count(key)) r.push_back(key + ": " + value + " in the checkpoint, not set now");
  return r;
}

Config configFromWeights(const safetensors::Metadata& metadata, const std::string& file,
                         const std::vector<std::string>& overrides, const std::string& flag) {
  auto it = metadata.find("config");
  if (it == metadata.end())
    throw UserError(flag + ": " + file + " holds no config (the weights files of train's checkpoints do); give --config");
  Config cfg = parseConfig(it->second, file + " (its config)", overrides);
  auto origin = metadata.find("config_file");
  cfg.file = origin == metadata.end() ? "" : origin->second;
  return cfg;
}

std::map<std::string, std::vector<double>> readWeights(const safetensors::File& file, const Graph& g, bool partial,
                                                       std::string* report, const std::string& flag) {
  std::map<std::string, std::vector<double>> values;
  std::vector<std::string> problems;
  std::set<std::string> ours;
  for (ValueId p : g.params()) {
    const std::string& name = g.value(p).name;
    ours.insert(name);
    const std::vector<int64_t> shape(g.shape(p).begin(), g.shape(p).end());
    const safetensors::TensorInfo* t = file.find(name);
    if (!t) {
      problems.push_back("missing: '" + name + "', expected " + shapeText(shape) + " (a floating-point dtype)");
    } else if (t->shape != shape || !safetensors::isFloat(t->dtype)) {
      problems.push_back("mismatched: '" + name + "', expected " + shapeText(shape) + " (a floating-point dtype), found " +
                         shapeText(t->shape) + " " + safetensors::dtypeName(t->dtype));
    } else {
      values[name] = file.toDoubles(*t);
    }
  }
  for (const safetensors::TensorInfo& t : file.tensors())
    if (!ours.count(t.name))
      problems.push_back("extra: '" + t.name + "' " + shapeText(t.shape) + " " + safetensors::dtypeName(t.dtype) +
                         " (no parameter of this model has that name)");
  if (problems.empty()) return values;
  std::string list;
  for (const std::string& p : problems) list += "\n  " + p;
  if (!partial)
    throw UserError(flag + " " + file.name() + ": " + std::to_string(problems.size()) + " tensor(s) do not match this model's " +
                    std::to_string(ours.size()) + " parameters (" + std::to_string(values.size()) +
                    " match; --init-from-partial loads those and leaves the rest to the seed):" + list);
  if (report)
    *report = flag + " " + file.name() + ": loaded " + std::to_string(values.size()) + " of " + std::to_string(ours.size()) +
              " parameters; the others start from the seed, and extra tensors are ignored:" + list;
  return values;
}

}  // namespace pa
