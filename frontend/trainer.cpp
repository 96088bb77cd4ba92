// Training loop over the CPU executor (the CUDA backend joins through the same steps).
#include "frontend/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "frontend/datasets.h"
#include "frontend/metrics.h"
#include "frontend/model_builder.h"
#include "frontend/rng.h"
#include "kernels/cpu/cpu_kernels.h"
#include "passes/autodiff.h"
#include "passes/pass_manager.h"
#include "runtime/cpu_executor.h"

namespace pa {

namespace {

// He (normal, std sqrt(2 / fan_in)) for layers followed by ReLU, Xavier (uniform,
// ±sqrt(6 / (fan_in + fan_out))) otherwise, zeros for biases; the first axis of a weight is its
// fan-in. Each parameter draws from its own stream, so adding a layer leaves the others alone.
std::vector<double> initParam(const std::string& name, const Shape& shape, const std::string& init, uint64_t seed) {
  const int64_t n = numel(shape);
  std::vector<double> v(static_cast<size_t>(n), 0.0);
  if (init == "zeros") return v;
  if (init == "ones") return std::vector<double>(static_cast<size_t>(n), 1.0);
  Rng rng = Rng::stream(seed, "param/" + name);
  const int64_t fanIn = shape.empty() ? 1 : shape[0];
  const int64_t fanOut = shape.size() < 2 ? 1 : n / fanIn;
  if (init == "he") {
    const double sd = std::sqrt(2.0 / static_cast<double>(fanIn));
    for (double& x : v) x = sd * rng.normal();
  } else if (init == "normal") {
    for (double& x : v) x = 0.02 * rng.normal();
  } else {  // xavier
    const double a = std::sqrt(6.0 / static_cast<double>(fanIn + fanOut));
    for (double& x : v) x = rng.uniform(-a, a);
  }
  return v;
}

double scheduledLr(const TrainConfig& t, int64_t step, int64_t total) {
  const double base = t.optimizer.lr;
  if (t.warmupSteps > 0 && step <= t.warmupSteps) return base * static_cast<double>(step) / static_cast<double>(t.warmupSteps);
  if (t.lrSchedule == "cosine") {
    const double span = static_cast<double>(std::max<int64_t>(1, total - t.warmupSteps));
    const double prog = std::min(1.0, static_cast<double>(step - t.warmupSteps) / span);
    return base * 0.5 * (1.0 + std::cos(3.141592653589793 * prog));
  }
  return base;
}

std::vector<std::string> trainPipeline(const Config& cfg) {
  std::vector<std::string> p;
  for (const std::string& name : cfg.compiler.passes) {
    // Fusion passes arrive with the fusion work; until then a config that asks for them
    // trains the primitive graph, which computes the same function.
    if (name.rfind("fuse-", 0) == 0 && !PassRegistry::builtin().find(name)) continue;
    p.push_back(name);
  }
  return p;
}

std::string humanCount(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

template <class T>
struct ParamState {
  std::string name;
  ValueId trainValue = kNoValue, evalValue = kNoValue, grad = kNoValue;
  std::vector<T> value, m, v;
};

template <class T>
TrainResult trainWith(const Config& cfg, const RunOptions& opt, const std::string& device) {
  namespace fs = std::filesystem;
  const std::string baseDir = fs::path(cfg.file).has_parent_path() ? fs::path(cfg.file).parent_path().string() : ".";
  DataSplit data = loadData(cfg.data, cfg.seed, baseDir);
  const TrainConfig& tc = cfg.train;
  const int64_t batch = tc.batchSize;
  if (data.train.count < batch)
    throw UserError("train.batch_size " + std::to_string(batch) + " is larger than the " +
                    std::to_string(data.train.count) + " training samples");

  // The training graph: forward, the configured passes, autodiff, clean-up.
  BuiltModel model = buildModel(cfg, data.train.xShape, data.train.yShape, batch);
  Graph& g = model.graph;
  PipelineOptions popt;
  popt.dumpDir = opt.dumpGraphDir;
  popt.title = cfg.name;
  if (!opt.dumpGraphDir.empty()) dumpGraph(g, opt.dumpGraphDir, "00-frontend", cfg.name + " as lowered");
  std::vector<std::string> pipeline = trainPipeline(cfg);
  std::vector<PassStats> stats = runPipeline(g, pipeline, popt);
  const size_t forwardNodes = g.liveNodeCount();
  popt.firstDumpIndex = static_cast<int>(pipeline.size());
  for (PassStats& s : runPipeline(g, {"autodiff", "dce", "verify"}, popt)) stats.push_back(std::move(s));

  // The validation graph: the same model and passes, forward only.
  const int64_t nVal = data.validation.count;
  const int64_t evalBatch = std::min<int64_t>(batch, std::max<int64_t>(nVal, 1));
  BuiltModel evalModel = buildModel(cfg, data.train.xShape, data.train.yShape, evalBatch);
  runPipeline(evalModel.graph, pipeline, PipelineOptions{});

  CpuExecutor<T> exec(g);
  CpuExecutor<T> evalExec(evalModel.graph);
  std::vector<ParamState<T>> params;
  int64_t paramCount = 0;
  for (ValueId pv : g.params()) {
    ParamState<T> p;
    p.name = g.value(pv).name;
    p.trainValue = pv;
    p.evalValue = evalModel.graph.findValue(p.name);
    p.grad = g.output(gradOutputName(p.name));
    const Node& node = g.producer(pv);
    std::vector<double> init;
    auto given = opt.initialParams.find(p.name);
    if (given != opt.initialParams.end()) {
      if (static_cast<int64_t>(given->second.size()) != numel(g.shape(pv)))
        throw UserError("initial value of parameter '" + p.name + "' has " + std::to_string(given->second.size()) +
                        " elements, expected " + std::to_string(numel(g.shape(pv))));
      init = given->second;
    } else {
      init = initParam(p.name, g.shape(pv), node.attrs.getString("init", "xavier"), cfg.seed);
    }
    p.value.assign(init.begin(), init.end());
    p.m.assign(p.value.size(), T(0));
    p.v.assign(p.value.size(), T(0));
    paramCount += static_cast<int64_t>(p.value.size());
    params.push_back(std::move(p));
  }
  for (ParamState<T>& p : params) {
    exec.bind(p.trainValue, p.value.data());
    if (p.evalValue != kNoValue) evalExec.bind(p.evalValue, p.value.data());
  }

  int64_t steps = tc.steps;
  if (tc.epochs > 0) steps = tc.epochs * (data.train.count / batch);
  if (opt.steps >= 0) steps = opt.steps;

  if (opt.printSummary) {
    std::printf("%s: %s parameters; graph %zu nodes forward, %zu with backward; device %s; precision %s\n",
                cfg.name.c_str(), humanCount(paramCount).c_str(), forwardNodes, g.liveNodeCount(), device.c_str(),
                cfg.precision.c_str());
    std::printf("data %s; %lld train / %lld validation samples; batch %lld; %lld steps\n", data.description.c_str(),
                (long long)data.train.count, (long long)nVal, (long long)batch, (long long)steps);
    if (opt.verbose)
      for (const PassStats& s : stats) {
        std::printf("  pass %-10s nodes %zu -> %zu", s.pass.c_str(), s.nodesBefore, s.nodesAfter);
        for (const auto& kv : s.counters) std::printf(", %s %lld", kv.first.c_str(), (long long)kv.second);
        std::printf("\n");
      }
    std::fflush(stdout);
  }

  const int64_t xs = data.train.xSize(), ys = data.train.ySize();
  T* xIn = exec.data(model.x);
  T* yIn = exec.data(model.y);
  auto validate = [&]() -> double {
    if (nVal == 0) return -1.0;
    const int64_t chunks = nVal / evalBatch;  // the remainder (< one batch) is left out
    double acc = 0.0;
    T* ex = evalExec.data(evalModel.x);
    T* ey = evalExec.data(evalModel.y);
    const ValueId loss = evalModel.graph.output("loss");
    for (int64_t c = 0; c < chunks; ++c) {
      const float* sx = data.validation.x.data() + c * evalBatch * xs;
      const float* sy = data.validation.y.data() + c * evalBatch * ys;
      std::copy(sx, sx + evalBatch * xs, ex);
      std::copy(sy, sy + evalBatch * ys, ey);
      evalExec.run();
      acc += static_cast<double>(evalExec.data(loss)[0]);
    }
    return acc / static_cast<double>(chunks);
  };

  std::unique_ptr<MetricsWriter> metrics;
  if (!opt.metricsPath.empty()) metrics = std::make_unique<MetricsWriter>(opt.metricsPath);
  Progress progress(steps, tc.logEvery, opt.progress);
  TrainResult res;
  res.device = device;
  res.parameterCount = paramCount;
  res.forwardNodes = forwardNodes;
  res.trainNodes = g.liveNodeCount();
  const ValueId lossValue = g.output("loss");
  std::vector<int64_t> order(static_cast<size_t>(data.train.count));
  std::iota(order.begin(), order.end(), 0);
  Rng shuffle = Rng::stream(cfg.seed, "data/batches");
  size_t cursor = order.size();  // forces a shuffle before the first batch
  cpu::AdamHyper hyper{tc.optimizer.lr, tc.optimizer.beta1, tc.optimizer.beta2, tc.optimizer.eps, tc.optimizer.weightDecay};
  double lastVal = -1.0, stepSeconds = 0.0;

  for (int64_t step = 1; step <= steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    if (cursor + static_cast<size_t>(batch) > order.size()) {
      if (cfg.data.shuffle)
        for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[shuffle.below(i)]);
      cursor = 0;
    }
    for (int64_t b = 0; b < batch; ++b, ++cursor) {
      const int64_t s = order[cursor];
      std::copy(data.train.x.begin() + s * xs, data.train.x.begin() + (s + 1) * xs, xIn + b * xs);
      std::copy(data.train.y.begin() + s * ys, data.train.y.begin() + (s + 1) * ys, yIn + b * ys);
    }
    exec.run();
    const double loss = static_cast<double>(exec.data(lossValue)[0]);
    if (!std::isfinite(loss)) {
      progress.finish();
      throw std::runtime_error("training diverged: the loss is " + std::to_string(loss) + " at step " +
                               std::to_string(step) + " (try a lower train.optimizer.lr or clip_grad_norm)");
    }
    double gradScale = 1.0;
    if (tc.optimizer.clipGradNorm > 0) {
      double sq = 0.0;
      for (const ParamState<T>& p : params) {
        const T* gp = exec.data(p.grad);
        for (size_t i = 0; i < p.value.size(); ++i) sq += static_cast<double>(gp[i]) * gp[i];
      }
      const double norm = std::sqrt(sq);
      if (norm > tc.optimizer.clipGradNorm) gradScale = tc.optimizer.clipGradNorm / norm;
    }
    hyper.lr = scheduledLr(tc, step, steps);
    for (ParamState<T>& p : params)
      cpu::adamStep(p.value.data(), exec.data(p.grad), p.m.data(), p.v.data(), static_cast<int64_t>(p.value.size()),
                    hyper, step, gradScale);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    stepSeconds += ms / 1000.0;
    res.losses.push_back(loss);
    double val = -1.0;
    if (step % tc.logEvery == 0 || step == steps) {
      val = validate();
      if (val >= 0) res.validation.emplace_back(step, val);
      lastVal = val;
    }
    progress.step(step, loss, lastVal, hyper.lr);
    if (metrics) metrics->write(step, loss, val, hyper.lr, ms);
  }
  progress.finish();
  if (steps == 0) lastVal = validate();
  res.finalValidation = lastVal;
  res.secondsPerStep = steps ? stepSeconds / static_cast<double>(steps) : 0.0;
  for (const ParamState<T>& p : params) res.finalParams[p.name] = std::vector<double>(p.value.begin(), p.value.end());
  if (opt.printSummary) {
    std::printf("done: %lld steps in %s (%.3f ms/step)", (long long)steps, formatDuration(progress.elapsedSeconds()).c_str(),
                res.secondsPerStep * 1e3);
    if (!res.losses.empty()) std::printf("; final loss %.6e", res.losses.back());
    if (lastVal >= 0) std::printf("; validation MSE %.6e", lastVal);
    std::printf("\n");
  }
  return res;
}

}  // namespace

TrainResult train(const Config& cfg, const RunOptions& opt) {
  const std::string dev = opt.device.empty() ? cfg.device : opt.device;
  if (dev != "auto" && dev != "cpu" && dev != "cuda")
    throw UserError("--device " + dev + ": valid choices are auto, cpu, cuda");
  if (dev == "cuda")
    throw UserError("device 'cuda' was asked for, but this build has no CUDA backend yet; use --device cpu or auto");
  std::string device = dev == "auto" ? "cpu (auto: no CUDA backend in this build)" : "cpu";
  if (cfg.precision == "bf16")
    throw UserError(cfg.file + ": precision: bf16 needs the CUDA backend; the CPU backend runs fp32 or fp64");
  if (cfg.precision == "fp64") return trainWith<double>(cfg, opt, device);
  if (cfg.precision == "tf32") device += ", tf32 runs as exact fp32 on the CPU";
  return trainWith<float>(cfg, opt, device);
}

}  // namespace pa
