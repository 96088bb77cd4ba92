// From a config and the command line to a runtime session: the data, the compiled training and
// validation graphs, the initial parameters, the device; and the run's header.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "common/rng.h"
#include "frontend/checkpoint.h"
#include "frontend/datasets.h"
#include "frontend/distributed.h"
#include "frontend/model_builder.h"
#include "frontend/trainer.h"
#include "passes/pipeline.h"
#include "runtime/cpu_session.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/cuda_session.h"

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

// The config's data, checked against the batch size.
// Throws where the training split is smaller than a batch, naming the key that made it so.
void checkTrainingCount(const Config& cfg, int64_t trainCount, int64_t validationCount) {
  if (trainCount >= cfg.train.batchSize) return;
  const std::string batch = std::to_string(cfg.train.batchSize), train = std::to_string(trainCount),
                    all = std::to_string(trainCount + validationCount);
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

DataSplit loadTrainingData(const Config& cfg) {
  namespace fs = std::filesystem;
  const std::string baseDir = fs::path(cfg.file).has_parent_path() ? fs::path(cfg.file).parent_path().string() : ".";
  DataSplit data = loadData(cfg.data, cfg.seed, baseDir);
  checkTrainingCount(cfg, data.train.count, data.validation.count);
  return data;
}

// A parameter's starting values: given by the caller (tests, --compare) or drawn from the seed.
std::vector<double> initialValues(const Graph& g, ValueId p, uint64_t seed,
                                  const std::map<std::string, std::vector<double>>& givenValues) {
  const std::string& name = g.value(p).name;
  auto given = givenValues.find(name);
  if (given == givenValues.end())
    return initParam(name, g.shape(p), g.producer(p).attrs.get<attr::Init>(), seed);
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

LrSchedule lrScheduleOf(const TrainConfig& t) {
  LrSchedule s;
  s.lr = t.optimizer.lr;
  s.warmupSteps = t.warmupSteps;
  s.cosine = t.lrSchedule == "cosine";
  return s;
}

Samples samplesOf(Dataset&& d) {
  Samples s;
  s.xSize = d.xSize();
  s.ySize = d.ySize();
  s.count = d.count;
  s.x = std::move(d.x);
  s.y = std::move(d.y);
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

}  // namespace

std::string resolveDevice(const Config& cfg, const RunOptions& opt) {
  const std::string dev = opt.device.empty() ? cfg.device : opt.device;
  if (dev != "auto" && dev != "cpu" && dev != "cuda")
    throw UserError("--device " + dev + ": valid choices are auto, cpu, cuda");
  const cuda::Driver& driver = cuda::Driver::instance();
  // fp64 is the CPU's reference path; the GPU trains fp32, tf32 (TF32 tensor-core GEMMs and attention) and
  // bf16 (bf16 activations, fp32 master weights).
  bool gpuPrecision = true;
  std::string cpuNote;  // how the CPU runs the precision
  switch (cfg.precision) {
  case Precision::Fp32: break;
  case Precision::Fp64: gpuPrecision = false; break;
  case Precision::Tf32: cpuNote = ", tf32 runs as exact fp32 on the CPU"; break;
  case Precision::Bf16: cpuNote = ", bf16 storage emulated: fp32 arithmetic, each bf16 value rounded when stored"; break;
  }
  if (dev == "cuda") {
    if (!driver.available()) {
      if (!opt.device.empty()) throw UserError("--device cuda: no GPU to train on: " + driver.unavailableReason());
      cfg.where.fail("device", "cuda, but there is no GPU to train on: " + driver.unavailableReason() + " (use auto or cpu)");
    }
    if (!gpuPrecision)
      cfg.where.fail("precision", std::string(precisionName(cfg.precision)) +
                                      " is not implemented on the CUDA device (fp32, tf32 and bf16 are)");
    return "cuda";
  }
  if (dev == "auto" && driver.available() && gpuPrecision) return "cuda";
  std::string device = dev == "auto" ? "cpu (auto: " + (driver.available() ? std::string("this config needs the CPU") : driver.unavailableReason()) + ")" : "cpu";
  return device + cpuNote;
}

namespace {

// The run's header (README, "The `train` command"): the model, the device, what was compiled,
// the data; with --verbose, every pass's statistics.
void printHeader(const Config& cfg, const RunOptions& opt, Session& session, const std::string& dataDescription,
                 int64_t nTrain, int64_t nVal, int64_t batch) {
  const TrainResult& r = session.result();
  std::printf("%s: %s parameters; graph %zu nodes forward, %zu with backward%s; device %s; precision %s\n",
              cfg.name.c_str(), humanCount(r.parameterCount).c_str(), r.forwardNodes, r.trainNodes,
              opt.noFuse ? " (unfused)" : "", r.device.c_str(), precisionName(cfg.precision));
  if (const DeviceSummary* d = session.deviceSummary()) {
    std::printf("kernels: %d generated, %d distinct (%d NVRTC programs, %lld compiled in %.1f s of NVRTC time, %lld from "
                "the cache) in %.2f s; activations %s, parameters and Adam state %s on the device\n",
                d->generatedKernels, d->distinctKernels, d->programs, d->compiled, d->nvrtcSeconds, d->fromCache,
                d->compileSeconds, formatMiB(d->activationBytes).c_str(), formatMiB(d->paramAndAdamBytes).c_str());
    std::printf("%s\n", r.gemm.c_str());
  }
  std::printf("data %s; %lld train / %lld validation samples; batch %lld; %lld steps\n", dataDescription.c_str(),
              (long long)nTrain, (long long)nVal, (long long)batch, (long long)session.totalSteps());
  if (opt.verbose) printPassStats(r.passes);
  std::fflush(stdout);
}

}  // namespace

double scheduledLr(const TrainConfig& t, int64_t step, int64_t total) { return lrScheduleOf(t).at(step, total); }

BuiltModel compileValidationGraph(const Config& cfg, const TrainingGraph& tg, const std::vector<int64_t>& sampleX,
                                  const std::vector<int64_t>& sampleY, int64_t batch) {
  BuiltModel m = buildModel(cfg, sampleX, sampleY, batch);
  PipelineOptions popt;
  popt.target = passTargetOf(cfg.precision);
  runPipeline(m.graph, tg.validationPasses, popt);
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
  popt.target = passTargetOf(cfg.precision);
  if (!opt.dumpGraphDir.empty()) dumpGraph(g, opt.dumpGraphDir, "00-frontend", cfg.name + " as lowered");
  const TrainPipeline pipeline = trainPipeline(cfg.compiler.passes, cfg.precision, opt.noFuse, opt.biasGradInProduct);
  tg.stats = runPipeline(g, pipeline.forward, popt);
  tg.forwardNodes = g.liveNodeCount();
  popt.firstDumpIndex = static_cast<int>(pipeline.forward.size());
  for (PassStats& s : runPipeline(g, pipeline.training, popt)) tg.stats.push_back(std::move(s));
  if (opt.testGraphHook) opt.testGraphHook(g);
  tg.validationPasses = pipeline.validation;
  return tg;
}

// The start-up phase of waiting for a dataset made beside the session; its name tells how long
// making it took (the part of that not hidden behind the session is the phase's time).
std::string dataWaitPhase(double madeSeconds) {
  char name[96];
  std::snprintf(name, sizeof name, "waiting for the data (made beside the session in %.3f s)", madeSeconds);
  return name;
}

PreparedRun prepareRun(const Config& cfg, const RunOptions& opt) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point started = Clock::now();
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  // The files named on the command line are read first, so that a damaged or mistaken one fails
  // at once, before the data, the graph and the device's kernels.
  std::unique_ptr<Checkpoint> resume;
  if (opt.resumeState) resume = std::make_unique<Checkpoint>(*opt.resumeState);
  if (!opt.resumeFrom.empty()) {
    const std::string folder = findCheckpoint(opt.resumeFrom, "--resume");
    try {
      resume = std::make_unique<Checkpoint>(readCheckpoint(folder));
    } catch (const UserError& e) {
      throw UserError(std::string("--resume: ") + e.what());
    }
  }
  std::unique_ptr<safetensors::File> weights;
  if (!opt.initFrom.empty()) {
    try {
      weights = std::make_unique<safetensors::File>(safetensors::File::read(opt.initFrom));
    } catch (const UserError& e) {
      throw UserError(std::string("--init-from: ") + e.what());
    }
  }
  const std::string device = resolveDevice(cfg, opt);
  // Data parallel: train.batch_size is the global batch, split evenly over the ranks.
  const int ranks = opt.comm ? opt.comm->size() : 1;
  const int64_t batch = cfg.train.batchSize;
  if (batch % ranks != 0)
    cfg.where.fail("train.batch_size", std::to_string(batch) + " (the global batch) does not split evenly over " +
                                           std::to_string(ranks) + " ranks: use a multiple of " + std::to_string(ranks) +
                                           ", or launch a number of ranks that divides it");
  const int64_t rankBatch = batch / ranks;
  // A generated dataset (sine, function) of a run in one process is made on a thread beside the
  // graph passes and the session, which waits for it where it first needs the samples
  // (SessionSpec::awaitData: the GPU session after its context, kernels and plans); data read
  // from a file or given, and the data of several ranks (compared before the session), are made
  // here. A generated dataset's counts and shapes come from the config, checked as the data's.
  const std::optional<DataShape> beside = ranks == 1 ? generatedDataShape(cfg.data) : std::optional<DataShape>();
  DataSplit data;
  std::future<DataSplit> pending;
  double dataMadeSeconds = 0;
  if (beside) {
    checkTrainingCount(cfg, beside->trainCount, beside->validationCount);
    data.description = beside->description;
    for (Dataset* d : {&data.train, &data.validation}) {
      d->xShape = beside->xShape;
      d->yShape = beside->yShape;
    }
    data.train.count = beside->trainCount;
    data.validation.count = beside->validationCount;
    pending = std::async(std::launch::async, [&cfg, &dataMadeSeconds] {
      const Clock::time_point t = Clock::now();
      DataSplit d = loadTrainingData(cfg);
      dataMadeSeconds = std::chrono::duration<double>(Clock::now() - t).count();
      return d;
    });
  } else {
    data = loadTrainingData(cfg);
  }
  const Clock::time_point dataDone = Clock::now();
  TrainingGraph tg = compileTrainingGraph(cfg, opt, data.train.xShape, data.train.yShape, rankBatch);
  // The validation graph: the same model and passes, forward only.
  const int64_t nTrain = data.train.count, nVal = data.validation.count;
  const int64_t evalBatch = std::min<int64_t>(batch, std::max<int64_t>(nVal, 1));
  BuiltModel eval = compileValidationGraph(cfg, tg, data.train.xShape, data.train.yShape, evalBatch);
  const Clock::time_point graphsDone = Clock::now();

  PreparedRun run;
  const Graph& g = tg.model.graph;
  for (ValueId p : g.params()) run.shapes[g.value(p).name] = std::vector<int64_t>(g.shape(p).begin(), g.shape(p).end());
  std::map<std::string, std::vector<double>> given = opt.initialParams;
  std::string partialReport;
  if (weights) given = readWeights(*weights, g, opt.initFromPartial, &partialReport, "--init-from");
  if (resume) {
    const std::string diff = firstParameterDifference(g, resume->shapes);
    if (!diff.empty()) throw UserError("--resume " + resume->folder + ": the model differs from the checkpoint's: " + diff);
    const std::string why = BatchOrder(nTrain, cfg.seed, cfg.data.shuffle).incompatibility(resume->state.order);
    if (!why.empty())
      throw UserError("--resume " + resume->folder + ": cannot continue on this run's data: " + why + " (--init-from " +
                      resume->folder + "/" + kModelFile + " starts a new run from its weights)");
    given = resume->state.params;
  }

  SessionSpec spec;
  spec.initialValues = [seed = cfg.seed, given = std::move(given)](const Graph& graph, ValueId p) {
    return initialValues(graph, p, seed, given);
  };
  spec.train = SessionGraph{std::move(tg.model.graph), tg.model.x, tg.model.y};
  spec.validation = SessionGraph{std::move(eval.graph), eval.x, eval.y};
  spec.batchSize = rankBatch;
  spec.globalBatch = batch;
  spec.comm = opt.comm;
  const bool nccl = opt.comm && device == "cuda";
  spec.nccl = nccl;
  spec.validationBatch = evalBatch;
  spec.steps = stepsToTrain(cfg, opt, nTrain);
  spec.precision = cfg.precision;
  spec.gemm = cfg.compiler.gemm;
  spec.deterministic = cfg.compiler.deterministic;
  spec.cudaGraph = opt.cudaGraph;
  spec.pdl = opt.pdl;
  spec.flashPdl = opt.flashPdl;
  spec.sideStream = opt.sideStream;
  spec.sideStreamMaxGflop = opt.sideStreamMaxGflop;
  spec.adamInTrainNode = opt.adamInTrainNode;
  spec.fp64Gemm = opt.fp64Gemm;
  spec.stagedEpilogues = opt.stagedEpilogues;
  spec.tmaStores = opt.tmaStores;
  spec.castInGather = opt.castInGather;
  spec.packedWeightCopies = opt.packedWeightCopies;
  spec.packedGradViews = opt.packedGradViews;
  spec.seed = cfg.seed;
  spec.shuffle = cfg.data.shuffle;
  const OptimizerConfig& o = cfg.train.optimizer;
  spec.adam = AdamSettings{o.lr, o.beta1, o.beta2, o.eps, o.weightDecay, o.clipGradNorm};
  spec.schedule = lrScheduleOf(cfg.train);
  spec.device = device;
  spec.dumpKernelsDir = opt.dumpKernelsDir;
  spec.announceCompile = opt.printSummary && leadsRun(opt);
  spec.recordBatches = !opt.dumpBatchesPath.empty();

  RunRecord& rec = run.record;
  Config planned = cfg;  // as the run is planned: --steps sets its length
  if (opt.steps >= 0) {
    planned.train.steps = opt.steps;
    planned.train.epochs = 0;
  }
  rec.configYaml = resolvedConfigYaml(planned);
  std::error_code ec;
  rec.configFile = cfg.file.empty() ? "" : std::filesystem::absolute(cfg.file, ec).string();
  rec.precision = cfg.precision;
  rec.totalSteps = spec.steps;
  rec.batchSize = batch;
  rec.adam = spec.adam;
  rec.schedule = spec.schedule;
  rec.sampleX = data.train.xShape;
  rec.sampleY = data.train.yShape;
  rec.trainSamples = nTrain;
  // The samples into the spec, and what the record and a resumed run need of them. What a
  // checkpoint's fingerprint compares with is this data's, in the checkpoint's version.
  uint64_t resumeFingerprint = 0;
  double dataWaitSeconds = 0;
  auto takeData = [&](DataSplit&& d, SessionSpec& s) {
    s.trainData = samplesOf(std::move(d.train));
    s.validationData = samplesOf(std::move(d.validation));
    rec.dataFingerprint = dataFingerprint(s.trainData.x, s.trainData.y);
    resumeFingerprint = resume && resume->record.fingerprintVersion == 1 ? dataFingerprintV1(s.trainData.x, s.trainData.y)
                                                                        : rec.dataFingerprint;
    if (s.recordBatches) {
      run.trainData = s.trainData;
      run.validationData = s.validationData;
    }
  };
  if (beside) {
    spec.awaitData = [&](SessionSpec& s) {
      const Clock::time_point t = Clock::now();
      DataSplit d = pending.get();
      dataWaitSeconds = seconds(t, Clock::now());
      takeData(std::move(d), s);
    };
  } else {
    takeData(std::move(data), spec);
  }

  if (ranks > 1) {  // the ranks must read the same data (a data.path on each host)
    const std::vector<std::string> all = opt.comm->allGather(std::to_string(rec.dataFingerprint), rendezvousTimeout());
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0])
        throw UserError("rank " + std::to_string(r) + "'s training data differs from rank 0's (same config, other values): "
                        "every rank must read the same data");
  }

  std::unique_ptr<Session>& session = run.session;
  if (device == "cuda") {
    if (opt.comm) setCudaDeviceOrdinal(opt.comm->localRank());
    try {
      session = makeCudaSession(std::move(spec));
    } catch (const SessionSettingError& e) {
      cfg.where.fail(e.key(), e.message());
    }
  } else {
    session = makeCpuSession(std::move(spec));
  }
  if (pending.valid()) throw std::logic_error("the session never asked for the data made beside it");
  std::vector<std::string> warnings;
  if (resume) {
    session->restore(resume->state);  // its batch order was checked above, before compiling
    run.resumedFrom = resume->folder;
    // A checkpoint in memory (RunOptions::resumeState) has no folder.
    const std::string flag = resume->folder.empty() ? "the model's state: " : "--resume " + resume->folder + ": ";
    for (const std::string& d : configDifferences(resume->record.configYaml, rec.configYaml))
      warnings.push_back(flag + d);
    if (resume->record.dataFingerprint != resumeFingerprint)
      warnings.push_back(flag + "the training data differs from the checkpoint's (same sample count, other values)");
    if (resume->record.totalSteps != rec.totalSteps && (rec.schedule.cosine || resume->record.schedule.cosine))
      warnings.push_back(flag + "the run is " + std::to_string(rec.totalSteps) + " steps long, the checkpoint's " +
                         std::to_string(resume->record.totalSteps) +
                         ": the cosine schedule's learning rates from here on differ from the uninterrupted run's");
  }
  TrainResult& r = session->result();
  r.forwardNodes = tg.forwardNodes;
  r.passes = tg.stats;
  r.startup = {{beside ? "checks" : "checks and data", seconds(started, dataDone)},
               {"graphs and passes", seconds(dataDone, graphsDone)}};
  const double sessionSeconds = seconds(graphsDone, Clock::now());
  if (const DeviceSummary* d = session->deviceSummary()) {
    r.startup.push_back({"kernels (compiled or from the cache)", d->compileSeconds});
    r.startup.push_back({"GEMM choice measured", d->gemmChoiceSeconds});
    r.startup.push_back({"CUDA context", d->contextSeconds});
    r.startup.push_back({"step plans (kernels emitted, memory and library GEMMs planned)", d->planSeconds});
    if (beside) r.startup.push_back({dataWaitPhase(dataMadeSeconds), dataWaitSeconds});
    r.startup.push_back({"data upload", d->dataSeconds});
    r.startup.push_back({"parameters made and uploaded", d->paramSeconds});
    r.startup.push_back({"the rest of the device session",
                         std::max(0.0, sessionSeconds - d->compileSeconds - d->gemmChoiceSeconds - d->contextSeconds -
                                           d->planSeconds - dataWaitSeconds - d->dataSeconds - d->paramSeconds)});
  } else {
    if (beside) r.startup.push_back({dataWaitPhase(dataMadeSeconds), dataWaitSeconds});
    r.startup.push_back({"session", sessionSeconds - dataWaitSeconds});
  }
  if (opt.printSummary && leadsRun(opt)) {
    printHeader(cfg, opt, *session, data.description, nTrain, nVal, batch);
    if (opt.comm)
      std::printf("data parallel: %d rank%s (%s), %lld rows of each batch of %lld per rank; gradients all-reduced with %s\n",
                  ranks, ranks == 1 ? "" : "s", opt.comm->describe().c_str(), (long long)rankBatch, (long long)batch,
                  nccl ? "NCCL" : ranks == 1 ? "no other rank (one process)" : "MPI, summed in rank order");
    if (!partialReport.empty()) std::printf("%s\n", partialReport.c_str());
    if (resume)
      std::printf("resumed from %s at step %lld of %lld\n", resume->folder.c_str(), (long long)resume->state.step,
                  (long long)rec.totalSteps);
    std::fflush(stdout);
  }
  if (leadsRun(opt))
    for (const std::string& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  return run;
}

std::unique_ptr<Session> makeSession(const Config& cfg, const RunOptions& opt) { return prepareRun(cfg, opt).session; }

}  // namespace pa
