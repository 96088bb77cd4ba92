// Training loop over the CPU executor (the CUDA backend joins through the same steps).
#include "frontend/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "codegen/emit.h"
#include "codegen/kernel_cache.h"
#include "codegen/training_kernels.h"
#include "common/debug.h"
#include "frontend/datasets.h"
#include "frontend/interrupt.h"
#include "frontend/metrics.h"
#include "frontend/model_builder.h"
#include "frontend/rng.h"
#include "kernels/cpu/cpu_kernels.h"
#include "passes/autodiff.h"
#include "passes/pass_manager.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda/cublaslt.h"
#include "runtime/cuda_graph_runner.h"

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

struct Pipeline {
  std::vector<std::string> forward;   // on the forward graph, before autodiff
  std::vector<std::string> training;  // on the whole step, after autodiff
};

// The forward passes are the config's (compiler.fuse, then compiler.passes). After autodiff,
// the step is cleaned up: with linear fusion, the backward's matmul + activation-derivative
// pairs fuse (fuse-linear-grad); elementwise fusion again when it is enabled (the backward has
// chains of its own); CSE, DCE and the verifier.
Pipeline trainPipeline(const Config& cfg, bool noFuse) {
  Pipeline p;
  bool elementwise = false, linear = false;
  for (const std::string& name : cfg.compiler.passes) {
    const bool fusion = name.rfind("fuse-", 0) == 0;
    if (fusion && noFuse) continue;
    elementwise |= name == "fuse-elementwise";
    linear |= name == "fuse-linear";
    p.forward.push_back(name);
  }
  p.training = {"autodiff"};
  if (linear) p.training.push_back("fuse-linear-grad");
  if (elementwise) p.training.push_back("fuse-elementwise");
  p.training.insert(p.training.end(), {"cse", "dce"});
  // precision: bf16 lowers the finished graph (fused, differentiated, cleaned) to bf16 storage.
  if (cfg.precision == "bf16") p.training.push_back("lower-bf16");
  p.training.push_back("verify");
  return p;
}

// What the passes may assume of the targets: the precision's attention inputs.
PassTarget passTargetOf(const Config& cfg) {
  PassTarget t;
  t.attention16Bit = cfg.precision == "bf16";
  return t;
}

}  // namespace

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

BuiltModel compileValidationGraph(const Config& cfg, const TrainingGraph& tg, const std::vector<int64_t>& sampleX,
                                  const std::vector<int64_t>& sampleY, int64_t batch) {
  BuiltModel m = buildModel(cfg, sampleX, sampleY, batch);
  PipelineOptions popt;
  popt.target = passTargetOf(cfg);
  runPipeline(m.graph, tg.forwardPasses, popt);
  return m;
}

TrainingGraph compileTrainingGraph(const Config& cfg, const RunOptions& opt, const std::vector<int64_t>& sampleX,
                                   const std::vector<int64_t>& sampleY, int64_t batch) {
  TrainingGraph tg;
  tg.model = buildModel(cfg, sampleX, sampleY, batch);
  Graph& g = tg.model.graph;
  PipelineOptions popt;
  popt.dumpDir = opt.dumpGraphDir;
  popt.title = cfg.name;
  popt.target = passTargetOf(cfg);
  if (!opt.dumpGraphDir.empty()) dumpGraph(g, opt.dumpGraphDir, "00-frontend", cfg.name + " as lowered");
  const Pipeline pipeline = trainPipeline(cfg, opt.noFuse);
  tg.stats = runPipeline(g, pipeline.forward, popt);
  tg.forwardNodes = g.liveNodeCount();
  popt.firstDumpIndex = static_cast<int>(pipeline.forward.size());
  for (PassStats& s : runPipeline(g, pipeline.training, popt)) tg.stats.push_back(std::move(s));
  if (opt.testGraphHook) opt.testGraphHook(g);
  tg.forwardPasses = pipeline.forward;
  if (cfg.precision == "bf16") tg.forwardPasses.push_back("lower-bf16");
  return tg;
}

namespace {

// "GEMMs (compiler.gemm auto): 7 on cuBLASLt, 2 generated; 5 measured in 0.31 s, 4 from the
// autotune cache; generated tiles: 9 nodes tuned (4 from the cache), 3 off the shape's default",
// over the training and validation graphs.
std::string gemmSummary(const std::string& mode, const CudaGraphRunner& train, const CudaGraphRunner& eval) {
  CudaGraphRunner::GemmStats t = train.gemmStats();
  const CudaGraphRunner::GemmStats& e = eval.gemmStats();
  t.generated += e.generated, t.library += e.library, t.measured += e.measured, t.cached += e.cached;
  t.tuneSeconds += e.tuneSeconds;
  t.tilesMeasured += e.tilesMeasured, t.tilesCached += e.tilesCached, t.tilesChanged += e.tilesChanged;
  char buf[256];
  std::snprintf(buf, sizeof buf, "GEMMs (compiler.gemm %s): %d on cuBLASLt, %d generated", mode.c_str(), t.library,
                t.generated);
  std::string s = buf;
  if (t.measured + t.cached > 0) {
    std::snprintf(buf, sizeof buf, "; %d measured in %.2f s, %d from the autotune cache", t.measured, t.tuneSeconds,
                  t.cached);
    s += buf;
  } else if (mode != "generated" && !cuda::CublasLt::instance().available()) {
    s += " (cuBLASLt unavailable: " + cuda::CublasLt::instance().unavailableReason() + ")";
  }
  if (t.tilesMeasured + t.tilesCached > 0) {
    std::snprintf(buf, sizeof buf, "; generated tiles: %d nodes tuned (%d from the cache), %d off the shape's default",
                  t.tilesMeasured + t.tilesCached, t.tilesCached, t.tilesChanged);
    s += buf;
  }
  return s;
}

// --verbose: each pass's statistics, and its notes (e.g. what was left unfused and why).
void printPassStats(const std::vector<PassStats>& stats) {
  for (const PassStats& s : stats) {
    std::printf("  pass %-10s nodes %zu -> %zu", s.pass.c_str(), s.nodesBefore, s.nodesAfter);
    for (const auto& kv : s.counters) std::printf(", %s %lld", kv.first.c_str(), (long long)kv.second);
    std::printf("\n");
    for (const std::string& note : s.notes) std::printf("    %s\n", note.c_str());
  }
}

std::string humanCount(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// The order in which training samples are drawn: a seeded shuffle per epoch. Shared by the CPU
// and CUDA sessions so that both see the same batches.
class BatchOrder {
public:
  BatchOrder(int64_t count, uint64_t seed, bool shuffle)
      : order_(static_cast<size_t>(count)), cursor_(order_.size()), rng_(Rng::stream(seed, "data/batches")), shuffle_(shuffle) {
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
  // The sample indices of the next batch.
  const int64_t* next(int64_t batch) {
    if (cursor_ + static_cast<size_t>(batch) > order_.size()) {
      if (shuffle_)
        for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng_.below(i)]);
      cursor_ = 0;
    }
    const int64_t* b = order_.data() + cursor_;
    cursor_ += static_cast<size_t>(batch);
    return b;
  }

private:
  std::vector<int64_t> order_;
  size_t cursor_;
  Rng rng_;
  bool shuffle_;
};

// The config's data, checked against the batch size. Shared by both sessions.
DataSplit loadTrainingData(const Config& cfg) {
  namespace fs = std::filesystem;
  const std::string baseDir = fs::path(cfg.file).has_parent_path() ? fs::path(cfg.file).parent_path().string() : ".";
  DataSplit data = loadData(cfg.data, cfg.seed, baseDir);
  if (data.train.count >= cfg.train.batchSize) return data;
  const std::string batch = std::to_string(cfg.train.batchSize), train = std::to_string(data.train.count),
                    all = std::to_string(data.train.count + data.validation.count);
  if (cfg.where.isSet("train.batch_size") || cfg.where.location("train.batch_size").empty())
    cfg.where.fail("train.batch_size", batch + " is larger than the " + train + " training samples (" + all +
                                           " samples less data.validation's share)");
  // The batch size is its default: the mistake is in the key that made the samples too few.
  const std::string fewer = ", fewer than train.batch_size " + batch + " (its default; set it, or give more samples)";
  if (cfg.data.kind == "csv")
    cfg.where.fail("data.path", "the CSV file '" + cfg.data.path + "' holds " + all + " rows, " + train +
                                    " for training after data.validation's share" + fewer);
  if (cfg.where.isSet("data.samples"))
    cfg.where.fail("data.samples", all + " samples leave " + train + " for training after data.validation's share" + fewer);
  if (cfg.where.isSet("data.validation"))
    cfg.where.fail("data.validation", formatNumber(cfg.data.validation) + " of the " + all + " samples leaves " + train +
                                          " for training" + fewer);
  cfg.where.fail("", "data.samples and data.validation (both at their defaults) leave " + train +
                         " training samples" + fewer);
}

// A parameter's starting values: given by the caller (tests, --compare) or drawn from the seed.
std::vector<double> initialValues(const Graph& g, ValueId p, const Config& cfg, const RunOptions& opt) {
  const std::string& name = g.value(p).name;
  auto given = opt.initialParams.find(name);
  if (given == opt.initialParams.end())
    return initParam(name, g.shape(p), g.producer(p).attrs.getString("init", "xavier"), cfg.seed);
  if (static_cast<int64_t>(given->second.size()) != numel(g.shape(p)))
    throw UserError("initial value of parameter '" + name + "' has " + std::to_string(given->second.size()) +
                    " elements, expected " + std::to_string(numel(g.shape(p))));
  return given->second;
}

// Steps to train: --steps, else epochs, else train.steps.
int64_t stepsToTrain(const Config& cfg, const RunOptions& opt, int64_t trainSamples) {
  if (opt.steps >= 0) return opt.steps;
  if (cfg.train.epochs > 0) return cfg.train.epochs * (trainSamples / cfg.train.batchSize);
  return cfg.train.steps;
}

template <class T>
struct ParamState {
  std::string name;
  ValueId trainValue = kNoValue, evalValue = kNoValue, grad = kNoValue;
  std::vector<T> value, m, v;
};

// The CPU session: a training graph and a forward-only validation graph over shared parameters.
template <class T>
class CpuSession final : public Session {
public:
  CpuSession(const Config& cfg, const RunOptions& opt, const std::string& device);
  void enqueueStep(int64_t step) override { pending_.push_back(runStep(step)); }
  std::vector<double> takeLosses() override { return std::exchange(pending_, {}); }
  double validate() override;
  int64_t totalSteps() const override { return steps_; }
  TrainResult& result() override { return res_; }
  void setParams(const std::map<std::string, std::vector<double>>& values) override {
    for (ParamState<T>& p : params_) {
      auto it = values.find(p.name);
      if (it != values.end()) std::copy(it->second.begin(), it->second.end(), p.value.begin());
    }
  }
  std::map<std::string, std::vector<double>> gradients() const override {
    std::map<std::string, std::vector<double>> r;
    for (const ParamState<T>& p : params_) {
      const T* gp = exec_->data(p.grad);
      r[p.name] = std::vector<double>(gp, gp + p.value.size());
    }
    return r;
  }
  std::map<std::string, std::vector<double>> params() const override {
    std::map<std::string, std::vector<double>> r;
    for (const ParamState<T>& p : params_) r[p.name] = std::vector<double>(p.value.begin(), p.value.end());
    return r;
  }

private:
  double runStep(int64_t step);
  const Config cfg_;  // a copy: a session may outlive the config it was made from
  DataSplit data_;
  BuiltModel model_, evalModel_;
  std::vector<double> pending_;  // losses not yet taken
  std::unique_ptr<CpuExecutor<T>> exec_, evalExec_;
  std::vector<ParamState<T>> params_;
  int64_t steps_ = 0, evalBatch_ = 1;
  std::unique_ptr<BatchOrder> order_;
  cpu::AdamHyper hyper_;
  TrainResult res_;
};

template <class T>
CpuSession<T>::CpuSession(const Config& cfg, const RunOptions& opt, const std::string& device) : cfg_(cfg) {
  data_ = loadTrainingData(cfg);
  const TrainConfig& tc = cfg.train;
  const int64_t batch = tc.batchSize;

  TrainingGraph tg = compileTrainingGraph(cfg, opt, data_.train.xShape, data_.train.yShape, batch);
  model_ = std::move(tg.model);
  Graph& g = model_.graph;
  const size_t forwardNodes = tg.forwardNodes;
  const std::vector<PassStats>& stats = tg.stats;

  // The validation graph: the same model and passes, forward only.
  const int64_t nVal = data_.validation.count;
  evalBatch_ = std::min<int64_t>(batch, std::max<int64_t>(nVal, 1));
  evalModel_ = compileValidationGraph(cfg, tg, data_.train.xShape, data_.train.yShape, evalBatch_);

  if (!opt.dumpKernelsDir.empty()) {
    const int n = codegen::dumpKernels(g, opt.dumpKernelsDir);
    std::printf("wrote %d CUDA kernels of the training step to %s\n", n, opt.dumpKernelsDir.c_str());
  }
  exec_ = std::make_unique<CpuExecutor<T>>(g);
  evalExec_ = std::make_unique<CpuExecutor<T>>(evalModel_.graph);
  int64_t paramCount = 0;
  for (ValueId pv : g.params()) {
    ParamState<T> p;
    p.name = g.value(pv).name;
    p.trainValue = pv;
    p.evalValue = evalModel_.graph.findValue(p.name);
    p.grad = g.output(gradOutputName(p.name));
    const std::vector<double> init = initialValues(g, pv, cfg, opt);
    p.value.assign(init.begin(), init.end());
    p.m.assign(p.value.size(), T(0));
    p.v.assign(p.value.size(), T(0));
    paramCount += static_cast<int64_t>(p.value.size());
    params_.push_back(std::move(p));
  }
  for (ParamState<T>& p : params_) {
    exec_->bind(p.trainValue, p.value.data());
    if (p.evalValue != kNoValue) evalExec_->bind(p.evalValue, p.value.data());
  }

  steps_ = stepsToTrain(cfg, opt, data_.train.count);
  order_ = std::make_unique<BatchOrder>(data_.train.count, cfg.seed, cfg.data.shuffle);
  hyper_ = cpu::AdamHyper{tc.optimizer.lr, tc.optimizer.beta1, tc.optimizer.beta2, tc.optimizer.eps,
                          tc.optimizer.weightDecay};
  res_.device = device;
  res_.parameterCount = paramCount;
  res_.forwardNodes = forwardNodes;
  res_.trainNodes = g.liveNodeCount();
  res_.activationBytes = exec_->arenaBytes();
  res_.passes = stats;

  if (opt.printSummary) {
    std::printf("%s: %s parameters; graph %zu nodes forward, %zu with backward%s; device %s; precision %s\n",
                cfg.name.c_str(), humanCount(paramCount).c_str(), forwardNodes, g.liveNodeCount(),
                opt.noFuse ? " (unfused)" : "", device.c_str(), cfg.precision.c_str());
    std::printf("data %s; %lld train / %lld validation samples; batch %lld; %lld steps\n", data_.description.c_str(),
                (long long)data_.train.count, (long long)nVal, (long long)batch, (long long)steps_);
    if (opt.verbose) printPassStats(stats);
    std::fflush(stdout);
  }
}

template <class T>
double CpuSession<T>::validate() {
  const int64_t nVal = data_.validation.count;
  if (nVal == 0) return -1.0;
  const int64_t chunks = nVal / evalBatch_;  // the remainder (< one batch) is left out
  const int64_t xs = data_.validation.xSize(), ys = data_.validation.ySize();
  T* ex = evalExec_->data(evalModel_.x);
  T* ey = evalExec_->data(evalModel_.y);
  const ValueId loss = evalModel_.graph.output("loss");
  double acc = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* sx = data_.validation.x.data() + c * evalBatch_ * xs;
    const float* sy = data_.validation.y.data() + c * evalBatch_ * ys;
    std::copy(sx, sx + evalBatch_ * xs, ex);
    std::copy(sy, sy + evalBatch_ * ys, ey);
    evalExec_->run();
    acc += static_cast<double>(evalExec_->data(loss)[0]);
  }
  return acc / static_cast<double>(chunks);
}

template <class T>
double CpuSession<T>::runStep(int64_t step) {
  const TrainConfig& tc = cfg_.train;
  const int64_t batch = tc.batchSize;
  const int64_t xs = data_.train.xSize(), ys = data_.train.ySize();
  const int64_t* rows = order_->next(batch);
  T* xIn = exec_->data(model_.x);
  T* yIn = exec_->data(model_.y);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t s = rows[b];
    std::copy(data_.train.x.begin() + s * xs, data_.train.x.begin() + (s + 1) * xs, xIn + b * xs);
    std::copy(data_.train.y.begin() + s * ys, data_.train.y.begin() + (s + 1) * ys, yIn + b * ys);
  }
  exec_->run();
  const double loss = static_cast<double>(exec_->data(model_.graph.output("loss"))[0]);
  if (!std::isfinite(loss)) return loss;  // the caller reports divergence; parameters stay as they were
  double gradScale = 1.0;
  if (tc.optimizer.clipGradNorm > 0) {
    double sq = 0.0;
    for (const ParamState<T>& p : params_) {
      const T* gp = exec_->data(p.grad);
      for (size_t i = 0; i < p.value.size(); ++i) sq += static_cast<double>(gp[i]) * gp[i];
    }
    const double norm = std::sqrt(sq);
    if (norm > tc.optimizer.clipGradNorm) gradScale = tc.optimizer.clipGradNorm / norm;
  }
  hyper_.lr = scheduledLr(tc, step, steps_);
  for (ParamState<T>& p : params_)
    cpu::adamStep(p.value.data(), exec_->data(p.grad), p.m.data(), p.v.data(), static_cast<int64_t>(p.value.size()),
                  hyper_, step, gradScale);
  return loss;
}

// The CUDA session: the same graphs run by CudaGraphRunner on one stream; the data lives on the
// device and batches are gathered there; one multi-tensor Adam kernel updates every parameter.
//
// Note on the step. Before each step the host writes the step's changing values (learning rate,
// bias corrections, loss slot, the batch's row indices) into a page-locked staging slot and
// queues one async copy of it into a fixed device block. The step itself (gather, the graph's
// kernels, clipping, Adam, recording the loss into a device ring) reads everything from fixed
// addresses, so after one eager warm-up step it is captured once as a CUDA graph and each later
// step is one graph launch. Losses are read back only when the trainer asks (a log line, the
// progress bar, the end), so the host never waits for the device in between; it waits only to
// reuse a staging slot whose copy has not run yet.
class CudaSession final : public Session {
public:
  CudaSession(const Config& cfg, const RunOptions& opt, const std::string& device);
  ~CudaSession() override;
  void enqueueStep(int64_t step) override;
  std::vector<double> takeLosses() override;
  bool asynchronous() const override { return true; }
  // The captured graph's node count once there is one (every node a kernel: the staging copy
  // stays outside it), else the launches queueStepKernels makes, the FlashAttention launcher's
  // as counted at the runner's last run.
  int launchesPerStep() const override {
    if (graph_.ready()) return static_cast<int>(graph_.nodeCount());
    const bool clip = cfg_.train.optimizer.clipGradNorm > 0 && chunkCount_ > 0;
    return 2 + runner_->launchesPerRun() + (clip ? 2 : 0) + (chunkCount_ > 0 ? 1 : 0) + 1;  // gather x, y; graph; clip; Adam; loss
  }
  bool replaysCudaGraph() const override { return graph_.ready(); }
  void printProfile(std::FILE* out, int top) override;
  double validate() override;
  int64_t totalSteps() const override { return steps_; }
  TrainResult& result() override { return res_; }
  std::map<std::string, std::vector<double>> params() const override { return readAll(false); }
  std::map<std::string, std::vector<double>> gradients() const override { return readAll(true); }
  void setParams(const std::map<std::string, std::vector<double>>& values) override {
    stream_->synchronize();
    for (const Param& p : params_) {
      auto it = values.find(p.name);
      if (it == values.end()) continue;
      std::vector<float> f(it->second.begin(), it->second.end());
      runner_->upload(p.value, f.data());
    }
  }

private:
  static constexpr int kStagingSlots = 8;
  static constexpr int64_t kLossRing = 4096;
  struct Param {
    std::string name;
    ValueId value = kNoValue, grad = kNoValue;
    int64_t count = 0;
  };
  std::map<std::string, std::vector<double>> readAll(bool grads) const {
    stream_->synchronize();
    std::map<std::string, std::vector<double>> r;
    for (const Param& p : params_) {
      std::vector<float> f(static_cast<size_t>(p.count));
      runner_->download(grads ? p.grad : p.value, f.data());
      r[p.name] = std::vector<double>(f.begin(), f.end());
    }
    return r;
  }
  void queueStepKernels();  // everything after the staging copy; captured as the CUDA graph
  void drainLosses();       // reads the ring for every queued step into ready_
  static cuda::Device& device() {
    static cuda::Device d(0);
    return d;
  }
  const Config cfg_;  // a copy: a session may outlive the config it was made from
  DataSplit data_;
  BuiltModel model_, evalModel_;
  std::unique_ptr<cuda::Stream> stream_;
  std::unique_ptr<CudaGraphRunner> runner_, evalRunner_;
  std::unique_ptr<CudaModule> kernels_;
  cuda::CUfunction gather_ = nullptr, sumsq_ = nullptr, clipScale_ = nullptr, adam_ = nullptr, recordLoss_ = nullptr;
  cuda::DeviceBuffer trainX_, trainY_, valX_, valY_, stepBlock_, chunks_, partial_, clip_, lossRing_, m_, v_;
  cuda::PinnedBuffer staging_, lossHost_;
  std::vector<std::unique_ptr<cuda::Event>> slotDone_;
  cuda::CapturedGraph graph_;
  size_t stepBytes_ = 0;
  int64_t chunkCount_ = 0, queued_ = 0, drained_ = 0;
  std::vector<double> ready_;  // losses read back, not yet taken
  std::vector<Param> params_;
  std::unique_ptr<BatchOrder> order_;
  int64_t steps_ = 0, evalBatch_ = 1;
  bool useGraph_ = true;
  TrainResult res_;
};

CudaSession::CudaSession(const Config& cfg, const RunOptions& opt, const std::string& deviceName) : cfg_(cfg) {
  data_ = loadTrainingData(cfg);
  const int64_t batch = cfg.train.batchSize;
  TrainingGraph tg = compileTrainingGraph(cfg, opt, data_.train.xShape, data_.train.yShape, batch);
  model_ = std::move(tg.model);
  const int64_t nVal = data_.validation.count;
  evalBatch_ = std::min<int64_t>(batch, std::max<int64_t>(nVal, 1));
  evalModel_ = compileValidationGraph(cfg, tg, data_.train.xShape, data_.train.yShape, evalBatch_);
  if (!opt.dumpKernelsDir.empty()) {  // what this device runs: TF32 and wgmma GEMMs where they apply
    const int n =
        codegen::dumpKernels(model_.graph, opt.dumpKernelsDir, CudaGraphRunner::emitOptionsFor(device(), cfg.precision == "tf32"));
    std::printf("wrote %d CUDA kernels of the training step to %s\n", n, opt.dumpKernelsDir.c_str());
  }
  useGraph_ = opt.cudaGraph && debugSwitches().cudaGraphs;
  device().makeCurrent();  // the primary context, before the stream that belongs to it
  stream_ = std::make_unique<cuda::Stream>();
  if (opt.printSummary) {  // compiling takes seconds on a cold cache: say what is happening
    std::printf("compiling the training step's kernels with NVRTC for %s ...\n", device().info().arch().c_str());
    std::fflush(stdout);
  }
  const codegen::KernelCacheStats before = codegen::KernelCache::instance().stats();
  CudaRunnerOptions ropt;
  ropt.tf32 = cfg.precision == "tf32";
  ropt.deterministic = cfg.compiler.deterministic;
  ropt.gemm = cfg.compiler.gemm == "generated" ? GemmProvider::Generated
              : cfg.compiler.gemm == "cublaslt" ? GemmProvider::Cublaslt
                                                 : GemmProvider::Auto;
  if (ropt.gemm == GemmProvider::Cublaslt && !cuda::CublasLt::instance().available())
    cfg.where.fail("compiler.gemm", "cublaslt, but cuBLASLt is unavailable: " + cuda::CublasLt::instance().unavailableReason());
  runner_ = std::make_unique<CudaGraphRunner>(model_.graph, device(), ropt);
  ropt.shareParamsWith = runner_.get();
  evalRunner_ = std::make_unique<CudaGraphRunner>(evalModel_.graph, device(), ropt);
  kernels_ = std::make_unique<CudaModule>(codegen::trainingKernelsSource(), device());
  const codegen::KernelCacheStats after = codegen::KernelCache::instance().stats();
  gather_ = kernels_->function("pa_gather_rows");
  sumsq_ = kernels_->function("pa_grad_sumsq");
  clipScale_ = kernels_->function("pa_clip_scale");
  adam_ = kernels_->function("pa_adam_multi");
  recordLoss_ = kernels_->function("pa_record_loss");

  auto toDevice = [](const std::vector<float>& host) {
    cuda::DeviceBuffer b(std::max<size_t>(host.size(), 1) * sizeof(float));
    b.upload(host.data(), host.size() * sizeof(float));
    return b;
  };
  trainX_ = toDevice(data_.train.x);
  trainY_ = toDevice(data_.train.y);
  valX_ = toDevice(data_.validation.x);
  valY_ = toDevice(data_.validation.y);
  stepBytes_ = sizeof(codegen::StepHeader) + static_cast<size_t>(batch) * sizeof(int32_t);
  stepBlock_ = cuda::DeviceBuffer(stepBytes_);
  staging_ = cuda::PinnedBuffer(stepBytes_ * kStagingSlots);
  for (int i = 0; i < kStagingSlots; ++i) slotDone_.push_back(std::make_unique<cuda::Event>());
  lossRing_ = cuda::DeviceBuffer(kLossRing * sizeof(float));
  lossHost_ = cuda::PinnedBuffer(kLossRing * sizeof(float));

  const Graph& g = model_.graph;
  int64_t paramCount = 0;
  std::vector<codegen::AdamChunk> chunks;
  for (ValueId pv : g.params()) {
    Param p;
    p.name = g.value(pv).name;
    p.value = pv;
    p.grad = g.output(gradOutputName(p.name));
    p.count = numel(g.shape(pv));
    const std::vector<double> init = initialValues(g, pv, cfg, opt);
    const std::vector<float> f(init.begin(), init.end());
    runner_->upload(pv, f.data());
    const int64_t offset = runner_->paramOffset(pv);
    for (int64_t at = 0; at < p.count; at += codegen::kAdamChunkValues) {
      codegen::AdamChunk c;
      c.param = runner_->devicePtr(pv) + static_cast<uint64_t>(at) * sizeof(float);
      c.grad = runner_->devicePtr(p.grad) + static_cast<uint64_t>(at) * sizeof(float);
      c.state = offset + at;
      c.count = std::min(codegen::kAdamChunkValues, p.count - at);
      chunks.push_back(c);
    }
    paramCount += p.count;
    params_.push_back(std::move(p));
  }
  chunkCount_ = static_cast<int64_t>(chunks.size());
  chunks_ = cuda::DeviceBuffer(std::max<size_t>(chunks.size(), 1) * sizeof(codegen::AdamChunk));
  chunks_.upload(chunks.data(), chunks.size() * sizeof(codegen::AdamChunk));
  partial_ = cuda::DeviceBuffer(std::max<size_t>(chunks.size(), 1) * sizeof(double));
  clip_ = cuda::DeviceBuffer(2 * sizeof(double));
  const size_t stateBytes = static_cast<size_t>(std::max<int64_t>(runner_->paramBlockFloats(), 1)) * sizeof(float);
  m_ = cuda::DeviceBuffer(stateBytes);
  v_ = cuda::DeviceBuffer(stateBytes);
  m_.fill32(0);
  v_.fill32(0);

  steps_ = stepsToTrain(cfg, opt, data_.train.count);
  order_ = std::make_unique<BatchOrder>(data_.train.count, cfg.seed, cfg.data.shuffle);
  res_.device = deviceName + " (" + device().info().name + ")";
  res_.parameterCount = paramCount;
  res_.forwardNodes = tg.forwardNodes;
  res_.trainNodes = g.liveNodeCount();
  res_.activationBytes = runner_->arenaBytes();
  res_.gemm = gemmSummary(cfg.compiler.gemm, *runner_, *evalRunner_);
  res_.passes = tg.stats;
  if (opt.printSummary) {
    std::printf("%s: %s parameters; graph %zu nodes forward, %zu with backward%s; device %s; precision %s\n",
                cfg.name.c_str(), humanCount(paramCount).c_str(), tg.forwardNodes, g.liveNodeCount(),
                opt.noFuse ? " (unfused)" : "", res_.device.c_str(), cfg.precision.c_str());
    std::printf("kernels: %d generated (%d + %d NVRTC programs, %lld compiled, %lld from the cache) in %.2f s; "
                "activations %s, parameters and Adam state %s on the device\n",
                runner_->generatedKernels() + evalRunner_->generatedKernels(), runner_->programs(), evalRunner_->programs(),
                (long long)(after.misses - before.misses),
                (long long)(after.memoryHits + after.diskHits - before.memoryHits - before.diskHits),
                runner_->compileSeconds() + evalRunner_->compileSeconds(), formatMiB(runner_->arenaBytes()).c_str(),
                formatMiB(3 * stateBytes).c_str());
    std::printf("%s\n", res_.gemm.c_str());
    std::printf("data %s; %lld train / %lld validation samples; batch %lld; %lld steps\n", data_.description.c_str(),
                (long long)data_.train.count, (long long)nVal, (long long)batch, (long long)steps_);
    if (opt.verbose) printPassStats(tg.stats);
    std::fflush(stdout);
  }
}

CudaSession::~CudaSession() {
  try {
    if (stream_) stream_->synchronize();
  } catch (...) {  // a failed device: nothing left to wait for
  }
}

void CudaSession::queueStepKernels() {
  const cuda::CUstream s = stream_->get();
  const int64_t batch = cfg_.train.batchSize;
  cuda::CUdeviceptr step = stepBlock_.ptr();
  for (int which = 0; which < 2; ++which) {
    cuda::CUdeviceptr src = which ? trainY_.ptr() : trainX_.ptr();
    cuda::CUdeviceptr dst = runner_->devicePtr(which ? model_.y : model_.x);
    long long rowSize = which ? data_.train.ySize() : data_.train.xSize(), n = batch;
    void* args[] = {&src, &step, &dst, &rowSize, &n};
    CudaModule::launch(gather_, rowSize * n, args, s);
  }
  runner_->run(s);
  cuda::CUdeviceptr chunks = chunks_.ptr(), partial = partial_.ptr(), clip = 0;
  const unsigned blocks = static_cast<unsigned>(chunkCount_);
  if (cfg_.train.optimizer.clipGradNorm > 0 && blocks > 0) {
    clip = clip_.ptr();
    void* a1[] = {&chunks, &partial};
    PA_CU_CHECK(cuLaunchKernel(sumsq_, blocks, 1, 1, 256, 1, 1, 0, s, a1, nullptr));
    long long n = chunkCount_;
    double maxNorm = cfg_.train.optimizer.clipGradNorm;
    void* a2[] = {&partial, &n, &maxNorm, &clip};
    PA_CU_CHECK(cuLaunchKernel(clipScale_, 1, 1, 1, 256, 1, 1, 0, s, a2, nullptr));
  }
  if (blocks > 0) {
    cuda::CUdeviceptr m = m_.ptr(), v = v_.ptr();
    double b1 = cfg_.train.optimizer.beta1, b2 = cfg_.train.optimizer.beta2, eps = cfg_.train.optimizer.eps;
    void* a3[] = {&chunks, &m, &v, &step, &b1, &b2, &eps, &clip};
    PA_CU_CHECK(cuLaunchKernel(adam_, blocks, 1, 1, 256, 1, 1, 0, s, a3, nullptr));
  }
  cuda::CUdeviceptr loss = runner_->devicePtr(model_.graph.output("loss")), ring = lossRing_.ptr();
  long long ringSize = kLossRing;
  void* a4[] = {&loss, &step, &ring, &ringSize};
  PA_CU_CHECK(cuLaunchKernel(recordLoss_, 1, 1, 1, 1, 1, 1, 0, s, a4, nullptr));
}

void CudaSession::enqueueStep(int64_t step) {
  if (queued_ - drained_ >= kLossRing) drainLosses();  // the ring would overwrite unread losses
  const int slot = static_cast<int>(queued_ % kStagingSlots);
  if (queued_ >= kStagingSlots) slotDone_[static_cast<size_t>(slot)]->synchronize();  // its last copy has run
  char* staging = static_cast<char*>(staging_.data()) + static_cast<size_t>(slot) * stepBytes_;
  const OptimizerConfig& opt = cfg_.train.optimizer;
  codegen::StepHeader head;
  head.lr = scheduledLr(cfg_.train, step, steps_);
  head.c1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
  head.c2 = 1.0 - std::pow(opt.beta2, static_cast<double>(step));
  head.decay = 1.0 - head.lr * opt.weightDecay;
  head.lossSlot = queued_ % kLossRing;
  std::memcpy(staging, &head, sizeof head);
  const int64_t batch = cfg_.train.batchSize;
  const int64_t* rows = order_->next(batch);
  int32_t* idx = reinterpret_cast<int32_t*>(staging + sizeof head);
  for (int64_t i = 0; i < batch; ++i) idx[i] = static_cast<int32_t>(rows[i]);
  PA_CU_CHECK(cuMemcpyHtoDAsync(stepBlock_.ptr(), staging, stepBytes_, stream_->get()));
  if (graph_.ready()) {
    graph_.launch(*stream_);
  } else if (useGraph_ && queued_ >= 1) {  // step 1 ran eagerly: lazy module loads are done
    graph_.capture(*stream_, [&] { queueStepKernels(); });
    graph_.launch(*stream_);
  } else {
    queueStepKernels();
  }
  slotDone_[static_cast<size_t>(slot)]->record(stream_->get());
  ++queued_;
}

void CudaSession::printProfile(std::FILE* out, int top) {
  stream_->synchronize();
  const std::vector<CudaGraphRunner::NodeTime> nodes = runner_->profile(stream_->get());
  double total = 0;
  for (const auto& n : nodes) total += n.ms;
  std::fprintf(out, "profile of the training step's graph: %zu timed nodes, %.3f ms in total (median of 5, one by one)\n",
               nodes.size(), total);
  for (size_t i = 0; i < nodes.size() && static_cast<int>(i) < top; ++i)
    std::fprintf(out, "  %8.4f ms %5.1f%%  %s\n", nodes[i].ms, 100.0 * nodes[i].ms / std::max(total, 1e-12),
                 nodes[i].label.c_str());
  const auto& choices = runner_->gemmChoices();
  if (!choices.empty()) {
    std::fprintf(out, "GEMM provider choices (compiler.gemm %s), ms per run measured at start:\n", cfg_.compiler.gemm.c_str());
    for (const auto& c : choices) {
      if (c.cached) {
        std::fprintf(out, "  %-48s %s (from the autotune cache)\n", c.label.c_str(), c.library ? "cuBLASLt" : "generated");
        continue;
      }
      std::fprintf(out, "  %-48s generated %8.4f  cuBLASLt %8.4f  -> %s\n", c.label.c_str(), c.generatedMs, c.libraryMs,
                   c.library ? (c.transposedB ? "cuBLASLt on B copied untransposed" : "cuBLASLt") : "generated");
    }
  }
}

void CudaSession::drainLosses() {
  if (queued_ == drained_) return;
  PA_CU_CHECK(cuMemcpyDtoHAsync(lossHost_.data(), lossRing_.ptr(), kLossRing * sizeof(float), stream_->get()));
  stream_->synchronize();
  const float* host = static_cast<const float*>(lossHost_.data());
  for (; drained_ < queued_; ++drained_) ready_.push_back(host[drained_ % kLossRing]);
}

std::vector<double> CudaSession::takeLosses() {
  drainLosses();
  return std::exchange(ready_, {});
}

double CudaSession::validate() {
  const int64_t nVal = data_.validation.count;
  if (nVal == 0) return -1.0;
  // The validation graph reads the training graph's parameters in place (shared buffers).
  const int64_t chunks = nVal / evalBatch_;
  const size_t xBytes = static_cast<size_t>(evalBatch_ * data_.validation.xSize()) * sizeof(float);
  const size_t yBytes = static_cast<size_t>(evalBatch_ * data_.validation.ySize()) * sizeof(float);
  const cuda::CUstream s = stream_->get();
  std::vector<float> losses(static_cast<size_t>(chunks));
  const ValueId loss = evalModel_.graph.output("loss");
  for (int64_t c = 0; c < chunks; ++c) {
    PA_CU_CHECK(cuMemcpyDtoDAsync(evalRunner_->devicePtr(evalModel_.x), valX_.ptr() + static_cast<size_t>(c) * xBytes, xBytes, s));
    PA_CU_CHECK(cuMemcpyDtoDAsync(evalRunner_->devicePtr(evalModel_.y), valY_.ptr() + static_cast<size_t>(c) * yBytes, yBytes, s));
    evalRunner_->run(s);
    PA_CU_CHECK(cuMemcpyDtoHAsync(&losses[static_cast<size_t>(c)], evalRunner_->devicePtr(loss), sizeof(float), s));
  }
  stream_->synchronize();
  double acc = 0.0;
  for (float l : losses) acc += l;
  return acc / static_cast<double>(chunks);
}

std::string resolveDevice(const Config& cfg, const RunOptions& opt) {
  const std::string dev = opt.device.empty() ? cfg.device : opt.device;
  if (dev != "auto" && dev != "cpu" && dev != "cuda")
    throw UserError("--device " + dev + ": valid choices are auto, cpu, cuda");
  const cuda::Driver& driver = cuda::Driver::instance();
  // fp64 is the CPU's reference path; the GPU trains fp32, tf32 (TF32 tensor-core GEMMs and attention) and
  // bf16 (bf16 activations, fp32 master weights).
  const bool gpuPrecision = cfg.precision == "fp32" || cfg.precision == "tf32" || cfg.precision == "bf16";
  if (dev == "cuda") {
    if (!driver.available()) {
      if (!opt.device.empty()) throw UserError("--device cuda: no GPU to train on: " + driver.unavailableReason());
      cfg.where.fail("device", "cuda, but there is no GPU to train on: " + driver.unavailableReason() + " (use auto or cpu)");
    }
    if (!gpuPrecision)
      cfg.where.fail("precision", cfg.precision + " is not implemented on the CUDA device (fp32, tf32 and bf16 are)");
    return "cuda";
  }
  if (dev == "auto" && driver.available() && gpuPrecision) return "cuda";
  std::string device = dev == "auto" ? "cpu (auto: " + (driver.available() ? std::string("this config needs the CPU") : driver.unavailableReason()) + ")" : "cpu";
  if (cfg.precision == "tf32") device += ", tf32 runs as exact fp32 on the CPU";
  if (cfg.precision == "bf16") device += ", bf16 storage emulated: fp32 arithmetic, each bf16 value rounded when stored";
  return device;
}

}  // namespace

std::unique_ptr<Session> makeSession(const Config& cfg, const RunOptions& opt) {
  const std::string device = resolveDevice(cfg, opt);
  if (device == "cuda") return std::make_unique<CudaSession>(cfg, opt, device);
  if (cfg.precision == "fp64") return std::make_unique<CpuSession<double>>(cfg, opt, device);
  return std::make_unique<CpuSession<float>>(cfg, opt, device);
}

TrainResult train(const Config& cfg, const RunOptions& opt) {
  std::unique_ptr<Session> session = makeSession(cfg, opt);
  std::unique_ptr<InterruptGuard> interrupts;
  if (opt.catchInterrupts) interrupts = std::make_unique<InterruptGuard>();
  int64_t steps = session->totalSteps();
  const int64_t plannedSteps = steps;
  const int64_t logEvery = cfg.train.logEvery;
  std::unique_ptr<MetricsWriter> metrics;
  if (!opt.metricsPath.empty()) metrics = std::make_unique<MetricsWriter>(opt.metricsPath);
  Progress progress(steps, logEvery, opt.progress);
  TrainResult& res = session->result();
  double lastVal = -1.0, stepSeconds = 0.0;
  // Losses come back in batches from an asynchronous (GPU) session: at every log step, at the
  // end, and every quarter second for the progress bar (a synchronous session reports every
  // step). The steps of a batch are reported with the batch's mean wall time; validation is
  // outside the timing.
  using Clock = std::chrono::steady_clock;
  Clock::time_point since = Clock::now();
  int64_t reported = 0;
  // Reports every step taken so far, except the last one when `holdLast` (the caller reports it
  // with its validation loss); returns the batch's mean milliseconds per step.
  auto collect = [&](bool holdLast) {
    const std::vector<double> losses = session->takeLosses();
    const Clock::time_point now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - since).count();
    since = now;
    stepSeconds += seconds;
    const double ms = 1e3 * seconds / static_cast<double>(std::max<size_t>(losses.size(), 1));
    for (size_t i = 0; i < losses.size(); ++i) {
      const int64_t step = ++reported;
      if (!std::isfinite(losses[i])) {
        progress.finish();
        throw std::runtime_error("training diverged: the loss is " + std::to_string(losses[i]) + " at step " +
                                 std::to_string(step) + " (try a lower train.optimizer.lr or clip_grad_norm)");
      }
      res.losses.push_back(losses[i]);
      if (holdLast && i + 1 == losses.size()) break;
      const double lr = scheduledLr(cfg.train, step, steps);
      progress.step(step, losses[i], lastVal, lr);
      if (metrics) metrics->write(step, losses[i], -1.0, lr, ms);
    }
    return ms;
  };
  // At every log step, the last, and an interrupted run's end: takes the losses so far, validates,
  // and reports step `at` with its validation loss (unless a synchronous session reported it
  // already: an interrupted CPU run).
  auto logStep = [&](int64_t at) {
    const size_t before = res.losses.size();
    const double ms = collect(true);
    lastVal = session->validate();
    if (!std::isfinite(lastVal)) {  // NaN compares false with everything: never let it pass as "no validation"
      progress.finish();
      throw std::runtime_error("training diverged: the validation loss is " + std::to_string(lastVal) + " at step " +
                               std::to_string(at) + " (try a lower train.optimizer.lr or clip_grad_norm)");
    }
    if (lastVal >= 0) res.validation.emplace_back(at, lastVal);
    if (res.losses.size() > before) {
      const double lr = scheduledLr(cfg.train, at, plannedSteps);
      progress.step(at, res.losses.back(), lastVal, lr);
      if (metrics) metrics->write(at, res.losses.back(), lastVal, lr, ms);
    }
    since = Clock::now();
  };
  for (int64_t step = 1; step <= steps; ++step) {
    if (interrupts && interrupts->interrupted()) {  // the steps queued so far finish; the last is the end
      steps = step - 1;
      if (steps > 0) logStep(steps);
      break;
    }
    session->enqueueStep(step);
    if (step % logEvery == 0 || step == steps) logStep(step);
    else if (!session->asynchronous() || Clock::now() - since > std::chrono::milliseconds(250)) collect(false);
  }
  progress.finish();
  if (debugSwitches().profile) session->printProfile(stderr, 40);
  if (steps == 0) lastVal = session->validate();
  if (!std::isfinite(lastVal))
    throw std::runtime_error("the validation loss of the initial weights is " + std::to_string(lastVal));
  res.finalValidation = lastVal;
  res.secondsPerStep = steps ? stepSeconds / static_cast<double>(steps) : 0.0;
  res.finalParams = session->params();
  if (interrupts && interrupts->interrupted()) res.interruptedBy = interrupts->signal();
  if (opt.printSummary) {
    if (res.interruptedBy)
      std::printf("interrupted (%s) after step %lld of %lld\n", res.interruptedBy == SIGINT ? "Ctrl-C" : "SIGTERM",
                  (long long)steps, (long long)plannedSteps);
    std::printf("done: %lld steps in %s (%.3f ms/step)", (long long)steps, formatDuration(progress.elapsedSeconds()).c_str(),
                res.secondsPerStep * 1e3);
    if (!res.losses.empty()) std::printf("; final loss %.6e", res.losses.back());
    if (lastVal >= 0) std::printf("; validation MSE %.6e", lastVal);
    std::printf("\n");
    if (session->launchesPerStep() > 0)
      std::printf("GPU step: %d kernel launches, %s\n", session->launchesPerStep(),
                  session->replaysCudaGraph() ? "replayed as one CUDA graph" : "launched one by one (PA_CUDA_GRAPH=0)");
  }
  return res;
}

}  // namespace pa
