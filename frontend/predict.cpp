// `predict`: weights and a config to a forward graph, rows in, a CSV of predictions out.
#include "frontend/predict.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "frontend/checkpoint.h"
#include "frontend/atomic_file.h"
#include "frontend/datasets.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "passes/pipeline.h"
#include "runtime/cuda_session.h"
#include "runtime/predictor.h"

namespace pa {

namespace fs = std::filesystem;

namespace {

// The rows to predict: inputs, and targets when the input has them.
struct Rows {
  std::vector<float> x, y;
  int64_t count = 0;
  bool targets = false;
  std::vector<std::string> targetNames;  // the input file's, when it has them
};

std::string weightsFileOf(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return (fs::path(findCheckpoint(path, "--weights")) / kModelFile).string();
  if (!fs::exists(path, ec)) throw UserError("--weights " + path + ": no such file or folder");
  return path;
}

// The config: --config, else the one a checkpoint's weights hold.
Config configOf(const PredictOptions& opt, const safetensors::File& weights) {
  if (!opt.configPath.empty()) return loadConfig(opt.configPath, opt.sets);
  return configFromWeights(weights.metadata(), weights.name(), opt.sets, "--config: required");
}

Rows readInput(const std::string& path, int64_t features, int64_t targets) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError("--input " + path + ": is a folder; expected a CSV file");
  std::ifstream in(path);
  if (!in) throw UserError("--input " + path + ": cannot read the file");
  const CsvTable t = readCsvTable(in, path, true, " (--input)");
  if (t.empty) throw UserError("--input " + path + ": the file is empty");
  const int64_t cols = static_cast<int64_t>(t.header.size());
  Rows r;
  r.targets = cols == features + targets;
  if (cols != features && !r.targets)
    throw UserError(path + ":1:1: " + std::to_string(cols) + " columns; the model takes " + std::to_string(features) +
                    " input values a row: give " + std::to_string(features) + " columns (inputs), or " +
                    std::to_string(features + targets) + " (inputs, then the " + std::to_string(targets) +
                    " target values) for the MSE too (--input)");
  if (r.targets) r.targetNames.assign(t.header.begin() + features, t.header.end());
  r.count = static_cast<int64_t>(t.rows.size());
  for (const std::vector<double>& row : t.rows) {
    r.x.insert(r.x.end(), row.begin(), row.begin() + features);
    if (r.targets) r.y.insert(r.y.end(), row.begin() + features, row.end());
  }
  return r;
}

void append(Rows& r, const Dataset& d) {
  r.x.insert(r.x.end(), d.x.begin(), d.x.end());
  r.y.insert(r.y.end(), d.y.begin(), d.y.end());
  r.count += d.count;
  r.targets = true;
}

// The validation graph of a training run: the model and its forward passes, for `batch` rows.
BuiltModel predictionGraph(const Config& cfg, const std::vector<int64_t>& sampleX, const std::vector<int64_t>& sampleY,
                           int64_t batch) {
  BuiltModel m = buildModel(cfg, sampleX, sampleY, batch);
  PipelineOptions popt;
  popt.target = passTargetOf(cfg.precision);
  runPipeline(m.graph, trainPipeline(cfg.compiler.passes, cfg.precision, false).validation, popt);
  return m;
}

}  // namespace

namespace {

int64_t batchFor(const Config& cfg, int64_t batchOption, int64_t rows) {
  return std::max<int64_t>(1, std::min(batchOption > 0 ? batchOption : cfg.train.batchSize, rows));
}

std::unique_ptr<Predictor> makePredictor(const Config& cfg, const std::vector<int64_t>& sampleX,
                                         const std::vector<int64_t>& sampleY,
                                         const std::map<std::string, std::vector<double>>& params,
                                         const std::string& device, int64_t batch) {
  BuiltModel m = predictionGraph(cfg, sampleX, sampleY, batch);
  return device == "cuda" ? makeCudaPredictor(std::move(m.graph), m.x, m.y, cfg.precision, cfg.compiler.gemm, params)
                          : makeCpuPredictor(std::move(m.graph), m.x, m.y, cfg.precision, params);
}

int64_t numelOf(const std::vector<int64_t>& s) { return numel(Shape(s.begin(), s.end())); }

}  // namespace

std::vector<float> predictRows(const Config& cfg, const std::vector<int64_t>& sampleX, const std::vector<int64_t>& sampleY,
                               const std::map<std::string, std::vector<double>>& params, const std::string& device,
                               int64_t batchOption, const float* xs, const float* ys, int64_t rows) {
  const int64_t features = numelOf(sampleX), targets = numelOf(sampleY);
  const int64_t batch = batchFor(cfg, batchOption, rows);
  std::unique_ptr<Predictor> predictor = makePredictor(cfg, sampleX, sampleY, params, device, batch);
  // Whole batches; the last one is padded with zero rows whose predictions are dropped (rows
  // are independent: nothing in a model mixes the samples of a batch).
  std::vector<float> out(static_cast<size_t>(rows * targets));
  std::vector<float> x(static_cast<size_t>(batch * features)), y(static_cast<size_t>(batch * targets)),
      p(static_cast<size_t>(batch * targets));
  for (int64_t at = 0; at < rows; at += batch) {
    const int64_t n = std::min(batch, rows - at);
    std::fill(x.begin(), x.end(), 0.0f);
    std::fill(y.begin(), y.end(), 0.0f);
    std::copy_n(xs + at * features, n * features, x.begin());
    if (ys) std::copy_n(ys + at * targets, n * targets, y.begin());
    predictor->run(x.data(), y.data(), p.data());
    std::copy_n(p.begin(), n * targets, out.begin() + at * targets);
  }
  return out;
}

cuda::DeviceBuffer predictRowsOnDevice(const Config& cfg, const std::vector<int64_t>& sampleX,
                                       const std::vector<int64_t>& sampleY,
                                       const std::map<std::string, std::vector<double>>& params, int64_t batchOption,
                                       cuda::CUdeviceptr x, int64_t rows) {
  const size_t inBytes = static_cast<size_t>(rows * numelOf(sampleX)) * sizeof(float);
  const size_t outBytes = static_cast<size_t>(rows * numelOf(sampleY)) * sizeof(float);
  const int ordinal = predictDeviceOrdinal();
  if (rows == 0) return cuda::DeviceBuffer();
  const std::string problem = cuda::deviceRangeProblem(x, inBytes, ordinal);
  if (!problem.empty()) throw UserError("predict: x cannot be read on CUDA device " + std::to_string(ordinal) + ": " + problem);
  std::unique_ptr<Predictor> predictor =
      makePredictor(cfg, sampleX, sampleY, params, "cuda", batchFor(cfg, batchOption, rows));
  cuda::DeviceBuffer out(outBytes);
  predictor->runOnDevice(x, out.ptr(), rows);
  return out;
}

int predictDeviceOrdinal() {
  cuda::Device& device = cudaDevice0();
  device.makeCurrent();
  return device.info().ordinal;
}

PredictResult predict(const PredictOptions& opt) {
  if (opt.input.empty() == opt.split.empty())
    throw UserError("give --input FILE.csv or --split validation|train|all (one of them)");
  if (!opt.split.empty() && opt.split != "validation" && opt.split != "train" && opt.split != "all")
    throw UserError("--split " + opt.split + ": valid choices are validation, train, all");
  if (opt.output.empty()) throw UserError("--output: required: the CSV file to write");
  const std::string weightsFile = weightsFileOf(opt.weights);
  std::unique_ptr<safetensors::File> weights;
  try {
    weights = std::make_unique<safetensors::File>(safetensors::File::read(weightsFile));
  } catch (const UserError& e) {
    throw UserError(std::string("--weights: ") + e.what());
  }
  const Config cfg = configOf(opt, *weights);
  const std::string baseDir = fs::path(cfg.file).has_parent_path() ? fs::path(cfg.file).parent_path().string() : ".";

  std::vector<int64_t> sampleX = metadataShape(*weights, "input_shape"), sampleY = metadataShape(*weights, "target_shape");
  Rows rows;
  if (!opt.split.empty() || sampleX.empty() || sampleY.empty()) {
    const DataSplit data = loadData(cfg.data, cfg.seed, baseDir);
    sampleX = data.train.xShape;
    sampleY = data.train.yShape;
    if (opt.split == "validation" || opt.split == "all") append(rows, data.validation);
    if (opt.split == "train" || opt.split == "all") append(rows, data.train);
    if (!opt.split.empty() && rows.count == 0)
      throw UserError("--split " + opt.split + ": the config's data has no " + opt.split + " rows (data.validation is 0)");
  }
  const int64_t features = numel(Shape(sampleX.begin(), sampleX.end())), targets = numel(Shape(sampleY.begin(), sampleY.end()));
  if (!opt.input.empty()) rows = readInput(opt.input, features, targets);
  std::vector<std::string> names = rows.targetNames;
  if (names.empty() && cfg.data.kind == "csv" && static_cast<int64_t>(cfg.data.targets.size()) == targets) names = cfg.data.targets;
  for (int64_t i = static_cast<int64_t>(names.size()); i < targets; ++i) names.push_back("y" + std::to_string(i));

  // The weights are read against the prediction graph (any batch: parameters do not depend on it).
  const std::map<std::string, std::vector<double>> params =
      readWeights(*weights, predictionGraph(cfg, sampleX, sampleY, 1).graph, false, nullptr, "--weights");
  RunOptions ropt;
  ropt.device = opt.device;
  PredictResult result;
  result.device = resolveDevice(cfg, ropt);
  const std::vector<float> out = predictRows(cfg, sampleX, sampleY, params, result.device, opt.batch, rows.x.data(),
                                             rows.targets ? rows.y.data() : nullptr, rows.count);
  result.rows = rows.count;
  if (rows.targets) {
    double sq = 0;
    for (size_t i = 0; i < out.size(); ++i) sq += (static_cast<double>(out[i]) - rows.y[i]) * (static_cast<double>(out[i]) - rows.y[i]);
    result.mse = out.empty() ? 0.0 : sq / static_cast<double>(out.size());
  }

  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? "," : "") + names[i];
  text += "\n";
  char buf[32];
  for (int64_t r = 0; r < rows.count; ++r) {
    for (int64_t t = 0; t < targets; ++t) {
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(out[static_cast<size_t>(r * targets + t)]));
      text += (t ? "," : "") + std::string(buf);
    }
    text += "\n";
  }
  try {
    writeFileAtomically(opt.output, text);
  } catch (const UserError& e) {
    throw UserError(std::string("--output: ") + e.what());
  }
  return result;
}

}  // namespace pa
