// The CUDA session: the same graphs as the CPU's, run by CudaGraphRunner on one stream; the data
// lives on the device and batches are gathered there; one multi-tensor Adam kernel updates every
// parameter.
#include "runtime/cuda_session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <thread>
#include <utility>

#include "codegen/emit.h"
#include "codegen/flops.h"
#include "codegen/kernel_cache.h"
#include "codegen/training_kernels.h"
#include "common/debug.h"
#include "graph/node_attrs.h"
#include "kernels/cpu/cpu_kernels.h"
#include "passes/autodiff.h"
#include "runtime/batch_order.h"
#include "runtime/cuda/cublaslt.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/nccl.h"
#include "runtime/cuda_graph_runner.h"

namespace pa {

namespace {

// "GEMMs (compiler.gemm auto): 7 on cuBLASLt, 2 generated; 5 measured in 0.31 s, 4 from the
// autotune cache; generated tiles: 9 nodes tuned (4 from the cache), 3 off the shape's default",
// over the training and validation graphs.
std::string gemmSummary(GemmProvider mode, const CudaGraphRunner& train, const CudaGraphRunner& eval) {
  CudaGraphRunner::GemmStats t = train.gemmStats();
  const CudaGraphRunner::GemmStats& e = eval.gemmStats();
  t.generated += e.generated, t.library += e.library, t.measured += e.measured, t.cached += e.cached;
  t.tuneSeconds += e.tuneSeconds;
  t.tilesMeasured += e.tilesMeasured, t.tilesCached += e.tilesCached, t.tilesChanged += e.tilesChanged;
  char buf[256];
  std::snprintf(buf, sizeof buf, "GEMMs (compiler.gemm %s): %d on cuBLASLt, %d generated", gemmProviderName(mode),
                t.library, t.generated);
  std::string s = buf;
  if (t.measured + t.cached > 0) {
    std::snprintf(buf, sizeof buf, "; %d measured in %.2f s, %d from the autotune cache", t.measured, t.tuneSeconds,
                  t.cached);
    s += buf;
  } else if (mode != GemmProvider::Generated && !cuda::CublasLt::instance().available()) {
    s += " (cuBLASLt unavailable: " + cuda::CublasLt::instance().unavailableReason() + ")";
  }
  if (t.tilesMeasured + t.tilesCached > 0) {
    std::snprintf(buf, sizeof buf, "; generated tiles: %d nodes tuned (%d from the cache), %d off the shape's default",
                  t.tilesMeasured + t.tilesCached, t.tilesCached, t.tilesChanged);
    s += buf;
  }
  return s;
}

// Whether the step's Adam can run inside its fused-mlp-train node's kernel (the runner's
// adamInTrainNode): the node's inputs are every parameter of the step and nothing else reads one
// (no bf16 copy to refresh, no other gradient), and no clipping (the global norm needs every
// gradient before the first update) and no all-reduce (the update needs the ranks' mean) come
// between the gradients and Adam.
bool adamFitsTrainNode(const Graph& g, const SessionSpec& spec) {
  if (spec.adam.clipGradNorm > 0 || spec.nccl || !spec.adamInTrainNode || g.params().empty()) return false;
  NodeId train = -1;
  for (NodeId id : g.topoOrder())
    if (g.node(id).op == OpKind::FusedMlpTrain) {
      if (train >= 0) return false;
      train = id;
    }
  if (train < 0) return false;
  const std::vector<std::vector<NodeId>> users = g.users();
  const Node& n = g.node(train);
  for (ValueId p : g.params()) {
    for (NodeId u : users[static_cast<size_t>(p)])
      if (u != train) return false;
    const ValueId grad = g.output(gradOutputName(g.value(p).name));
    if (std::find(n.outputs.begin(), n.outputs.end(), grad) == n.outputs.end()) return false;
  }
  return static_cast<int>(n.inputs.size()) <= codegen::kAdamBindingSlots;
}

// Note on the step. Before each step the host writes the step's changing values (learning rate,
// bias corrections, loss slot, the batch's row indices) into a page-locked staging slot and
// queues one async copy of it into a fixed device block. The step itself (gather, the graph's
// kernels, clipping, Adam, recording the loss into a device ring) reads everything from fixed
// addresses, so after one eager warm-up step it is captured once as a CUDA graph and each later
// step is one graph launch. Losses are read back only when the trainer asks (a log line, the
// progress bar, the end), so the host never waits for the device in between; it waits only to
// reuse a staging slot whose copy has not run yet.
//
// Note on programmatic dependent launch. On sm_90+ (spec_.pdl, runtime/cuda/launch.h) every kernel
// of ours in the step (gather, the runner's, FlashAttention's, clipping, Adam, the loss record) is
// launched as a programmatic dependent and begins with pa::pdlBegin(), which waits for the grids
// before it and their memory (kernels/pdl.cuh). What else is in the stream stays correct: the
// staging copy and the loss read-back are copies, and a copy or event is never a programmatic
// predecessor; cuBLASLt's kernels are launched by it, plain to us, and the kernel of ours after
// one waits for it all the same; the first kernel after NCCL's all-reduce is launched plain
// (queueStepKernels says why); the session uses one stream. Profiling (printProfile) times nodes
// between events with every kernel plain.
class CudaSession final : public Session {
public:
  explicit CudaSession(SessionSpec spec);
  ~CudaSession() override;
  void enqueueStep(int64_t step) override;
  std::vector<double> takeLosses() override;
  bool asynchronous() const override { return true; }
  // The captured graph's node count once there is one (every node a kernel: the staging copy
  // stays outside it), else the launches queueStepKernels makes, the FlashAttention launcher's
  // as counted at the runner's last run.
  int launchesPerStep() const override {
    if (graph_.ready()) return static_cast<int>(graph_.nodeCount());
    const bool clip = spec_.adam.clipGradNorm > 0 && chunkCount_ > 0;
    return 1 + runner_->launchesPerRun() + (nccl_ ? 1 : 0) + (clip ? 2 : 0) +
           (runner_->takesAdam() ? 0 : 1);  // gather x and y; graph; all-reduce; clip; Adam and the loss (the loss alone without parameters)
  }
  bool replaysCudaGraph() const override { return graph_.ready(); }
  const DeviceSummary* deviceSummary() const override { return &summary_; }
  void printProfile(std::FILE* out, int top) override;
  double validate() override;
  int64_t totalSteps() const override { return spec_.steps; }
  TrainResult& result() override { return res_; }
  std::map<std::string, std::vector<double>> params() const override { return readAll(false); }
  std::map<std::string, std::vector<double>> gradients() const override { return readAll(true); }
  int64_t stepsTaken() const override { return restoredSteps_ + queued_; }
  TrainingState state() const override;
  void restore(const TrainingState& s) override;
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
  void allReduceGradients(cuda::CUstream s);  // the ranks' mean of every gradient and the loss, one NCCL launch
  void drainLosses();       // reads the ring for every queued step into ready_
  static cuda::Device& device() { return cudaDevice0(); }
  SessionSpec spec_;
  // Data parallel: the ranks' NCCL communicator (spec_.nccl), the step's all-reduce after the backward.
  // Declared before graph_ so that it is destroyed after it: NCCL (2.26 and later) will not free a
  // communicator while a CUDA graph that captured its collectives lives, and waits for ever.
  std::unique_ptr<cuda::NcclComm> nccl_;
  std::unique_ptr<cuda::Stream> stream_;
  std::unique_ptr<CudaGraphRunner> runner_, evalRunner_;
  std::unique_ptr<CudaModule> kernels_;
  cuda::CUfunction gather_ = nullptr, sumsq_ = nullptr, clipScale_ = nullptr, adam_ = nullptr, recordLoss_ = nullptr;
  cuda::LaunchMode launch_ = cuda::LaunchMode::Plain;  // of the training kernels, as the runner's
  cuda::DeviceBuffer trainX_, trainY_, valX_, valY_, stepBlock_, chunks_, partial_, clip_, lossRing_, m_, v_;
  cuda::PinnedBuffer staging_, lossHost_;
  std::vector<std::unique_ptr<cuda::Event>> slotDone_;
  cuda::CapturedGraph graph_;
  size_t stepBytes_ = 0;
  bool narrowRows_ = false;  // the step block's row indices are uint16 (codegen::kNarrowRowLimit)
  cuda::CUdeviceptr gatherXb_ = 0;  // where the gather writes x rounded to bf16 (the runner's gatheredCast), or 0
  bool gatherX_ = true;             // the gather writes x itself
  int64_t chunkCount_ = 0, queued_ = 0, drained_ = 0;
  std::vector<double> ready_;  // losses read back, not yet taken
  std::vector<Param> params_;
  std::unique_ptr<BatchOrder> order_;
  int64_t restoredSteps_ = 0;  // steps a restored state had taken, beyond this session's queued_
  bool useGraph_ = true;
  DeviceSummary summary_;
  TrainResult res_;
};

CudaSession::CudaSession(SessionSpec spec) : spec_(std::move(spec)) {
  const Graph& g = spec_.train.graph;
  const bool tf32 = spec_.precision == Precision::Tf32;
  const bool adamInNode = adamFitsTrainNode(g, spec_);
  // The training runner's options (the validation runner's differ in sharing its parameters and
  // keeping Adam out of its nodes).
  CudaRunnerOptions ropt;
  ropt.tf32 = tf32;
  ropt.deterministic = spec_.deterministic;
  ropt.gemm = spec_.gemm;
  ropt.mirrorParamCasts = true;  // bf16: Adam writes the weights' bf16 copies (no cast kernels in the step)
  ropt.mirrorPackedWeights = spec_.packedWeightCopies;  // and their packed copies (no concat / interleave kernels)
  // Adam reads the packed weights' gradients in place (no slice / deinterleave kernels); NCCL's
  // all-reduce needs every gradient whole.
  ropt.packedGradViews = spec_.packedGradViews && !spec_.nccl;
  ropt.pdl = spec_.pdl;
  ropt.flashPdl = spec_.flashPdl;
  ropt.sideStream = spec_.sideStream;
  ropt.sideStreamMaxFlops = spec_.sideStreamMaxGflop * 1e9;
  ropt.fp64Gemm = spec_.fp64Gemm;
  ropt.wgmmaEpilogue = spec_.stagedEpilogues ? codegen::WgmmaEpilogue::Auto : codegen::WgmmaEpilogue::Fragments;
  ropt.wgmmaTmaStores = spec_.tmaStores;
  ropt.adamInTrainNode = adamInNode;
  ropt.gatheredInput = spec_.castInGather ? spec_.train.x : kNoValue;  // bf16: the gather rounds x's rows (no cast kernel)
  if (!spec_.dumpKernelsDir.empty()) {  // what this device runs: TF32 and wgmma GEMMs where they apply
    const int n = codegen::dumpKernels(g, spec_.dumpKernelsDir, CudaGraphRunner::emitOptionsFor(device(), ropt));
    if (spec_.announceCompile) std::printf("wrote %d CUDA kernels of the training step to %s\n", n, spec_.dumpKernelsDir.c_str());
  }
  useGraph_ = spec_.cudaGraph && debugSwitches().cudaGraphs;
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  Clock::time_point t = Clock::now();
  device().makeCurrent();  // the primary context, before the stream that belongs to it
  stream_ = std::make_unique<cuda::Stream>(cuda::Stream::Priority::Greatest);  // over the runner's second stream
  summary_.contextSeconds = since(t);
  const codegen::KernelCacheStats before = codegen::KernelCache::instance().stats();
  // cuBLASLt's library (a few tenths of a second to load) and the step's own kernels (gather,
  // gradient clipping, Adam, the loss ring) get ready on a thread beside the runners.
  std::unique_ptr<CudaModule> stepKernels;
  std::exception_ptr besideError;
  std::thread beside([&] {
    try {
      device().makeCurrent();
      if (spec_.gemm != GemmProvider::Generated) cuda::CublasLt::instance();
      stepKernels = std::make_unique<CudaModule>(codegen::trainingKernelsSource(), device());
    } catch (...) {
      besideError = std::current_exception();
    }
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{beside};
  if (spec_.nccl) {
    // Every rank loads NCCL or fails alike; rank 0's id reaches the others through the host
    // communicator (MPI), then every rank joins the NCCL communicator on its device.
    const cuda::Nccl& lib = cuda::Nccl::instance();
    if (!lib.available())
      throw UserError("data-parallel training on the GPU needs NCCL: " + lib.unavailableReason() +
                      " (pip install nvidia-nccl-cu13, or PyTorch, ships it)");
    Communicator& host = *spec_.comm;
    cuda::NcclUniqueId id{};
    if (host.rank() == 0) id = lib.uniqueId();
    host.broadcast(&id, sizeof id, 0);
    nccl_ = std::make_unique<cuda::NcclComm>(id, host.size(), host.rank());
  }
  if (spec_.announceCompile) {
    std::printf("compiling the training step's kernels with NVRTC for %s ...\n", device().info().arch().c_str());
    std::fflush(stdout);
  }
  if (ropt.gemm == GemmProvider::Cublaslt && !cuda::CublasLt::instance().available())
    throw SessionSettingError("compiler.gemm",
                              "cublaslt, but cuBLASLt is unavailable: " + cuda::CublasLt::instance().unavailableReason());
  t = Clock::now();
  ropt.deferCompile = true;  // both runners' kernels in one pool
  runner_ = std::make_unique<CudaGraphRunner>(g, device(), ropt);
  ropt.shareParamsWith = runner_.get();
  ropt.adamInTrainNode = false;
  ropt.gatheredInput = kNoValue;  // (validation batches are copied, and cast in the graph)
  evalRunner_ = std::make_unique<CudaGraphRunner>(spec_.validation.graph, device(), ropt);
  CudaGraphRunner::compileTogether({runner_.get(), evalRunner_.get()});
  const double runnersSeconds = since(t);
  t = Clock::now();
  beside.join();
  if (besideError) std::rethrow_exception(besideError);
  kernels_ = std::move(stepKernels);
  const double trainingKernelsSeconds = since(t);
  const codegen::KernelCacheStats after = codegen::KernelCache::instance().stats();
  gather_ = kernels_->function("pa_gather_rows");
  // x rounded to bf16 by the gather where the runner left x's cast to it; x itself only where
  // something else in the step reads it.
  if (const ValueId xb = runner_->gatheredCast(); xb != kNoValue) {
    gatherXb_ = runner_->devicePtr(xb);
    gatherX_ = g.isOutput(spec_.train.x) || g.users()[static_cast<size_t>(spec_.train.x)].size() > 1;
  }
  sumsq_ = kernels_->function("pa_grad_sumsq");
  clipScale_ = kernels_->function("pa_clip_scale");
  adam_ = kernels_->function("pa_adam_multi");
  recordLoss_ = kernels_->function("pa_record_loss");
  launch_ = runner_->launchMode();

  lossRing_ = cuda::DeviceBuffer(kLossRing * sizeof(float));
  lossRing_.fill32(0);  // drainLosses copies the whole ring, slots not yet written too
  lossHost_ = cuda::PinnedBuffer(kLossRing * sizeof(float));

  int64_t paramCount = 0;
  std::vector<codegen::AdamChunk> chunks;
  t = Clock::now();
  for (ValueId pv : g.params()) {
    Param p;
    p.name = g.value(pv).name;
    p.value = pv;
    p.grad = g.output(gradOutputName(p.name));
    p.count = numel(g.shape(pv));
    const std::vector<double> init = spec_.initialValues(g, pv);
    const std::vector<float> f(init.begin(), init.end());
    runner_->upload(pv, f.data());
    const int64_t offset = runner_->paramOffset(pv);
    for (int64_t at = 0; at < p.count; at += codegen::kAdamChunkValues) {
      codegen::AdamChunk c;
      c.param = runner_->devicePtr(pv) + static_cast<uint64_t>(at) * sizeof(float);
      c.grad = runner_->devicePtr(p.grad) + static_cast<uint64_t>(at) * sizeof(float);
      c.state = offset + at;
      c.count = std::min(codegen::kAdamChunkValues, p.count - at);
      c.first = at;  // read by the packed places below
      if (const cuda::CUdeviceptr m = runner_->paramMirror(pv)) c.mirror = m + static_cast<uint64_t>(at) * sizeof(uint16_t);
      if (const CudaGraphRunner::PackedPlace place = runner_->packedMirror(pv); place.step) {
        c.mirror = place.base;
        c.mirrorCols = place.cols, c.mirrorRowStride = place.rowStride, c.mirrorStep = place.step, c.mirrorBytes = place.bytes;
      }
      if (const CudaGraphRunner::PackedPlace place = runner_->packedGrad(p.grad); place.step) {
        c.grad = place.base;
        c.gradCols = place.cols, c.gradRowStride = place.rowStride, c.gradStep = place.step;
      }
      chunks.push_back(c);
    }
    paramCount += p.count;
    params_.push_back(std::move(p));
  }
  summary_.paramSeconds = since(t);
  // The samples last: a generated dataset may still be being made beside the session.
  awaitSessionData(spec_);
  // The step block, once the training set's size is known (its indices' width).
  narrowRows_ = spec_.trainData.count <= codegen::kNarrowRowLimit;
  stepBytes_ = sizeof(codegen::StepHeader) + static_cast<size_t>(spec_.batchSize) * (narrowRows_ ? sizeof(uint16_t) : sizeof(int32_t));
  stepBlock_ = cuda::DeviceBuffer(stepBytes_);
  staging_ = cuda::PinnedBuffer(stepBytes_ * kStagingSlots);
  for (int i = 0; i < kStagingSlots; ++i) slotDone_.push_back(std::make_unique<cuda::Event>());
  auto toDevice = [](const std::vector<float>& host) {
    cuda::DeviceBuffer b(std::max<size_t>(host.size(), 1) * sizeof(float));
    b.upload(host.data(), host.size() * sizeof(float));
    return b;
  };
  t = Clock::now();
  trainX_ = toDevice(spec_.trainData.x);
  trainY_ = toDevice(spec_.trainData.y);
  valX_ = toDevice(spec_.validationData.x);
  valY_ = toDevice(spec_.validationData.y);
  summary_.dataSeconds = since(t);
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
  if (runner_->takesAdam()) {  // the train node's kernel steps every parameter (adamFitsTrainNode)
    codegen::AdamBinding b;
    const Node* train = nullptr;
    for (NodeId id : g.topoOrder())
      if (g.node(id).op == OpKind::FusedMlpTrain) train = &g.node(id);
    for (const Param& p : params_) {
      if (runner_->paramMirror(p.value) || runner_->packedMirror(p.value).step)
        throw std::logic_error("Adam in the train node: parameter '" + p.name + "' has a mirror");
      for (size_t i = 0; i < train->inputs.size(); ++i) {
        if (train->inputs[i] != p.value) continue;
        const uint64_t at = static_cast<uint64_t>(runner_->paramOffset(p.value)) * sizeof(float);
        b.param[i] = runner_->devicePtr(p.value);
        b.m[i] = m_.ptr() + at;
        b.v[i] = v_.ptr() + at;
      }
    }
    b.step = stepBlock_.ptr();
    b.ring = lossRing_.ptr();
    b.ringSize = kLossRing;
    b.beta1 = spec_.adam.beta1, b.beta2 = spec_.adam.beta2, b.eps = spec_.adam.eps;
    runner_->bindAdam(b);
  }

  if (nccl_) {
    // NCCL connects the ranks on a communicator's first collectives: the step's all-reduce runs
    // once here (on buffers every step overwrites before reading), so that cost is start-up's,
    // not the first step's.
    allReduceGradients(stream_->get());
    stream_->synchronize();
  }
  order_ = std::make_unique<BatchOrder>(spec_.trainData.count, spec_.seed, spec_.shuffle);
  res_.device = spec_.device + " (" + device().info().name + ")";
  if (nccl_) res_.device += ", NCCL " + cuda::Nccl::instance().version();
  res_.parameterCount = paramCount;
  res_.trainNodes = g.liveNodeCount();
  res_.stepFlops = codegen::modelFlops(g);
  res_.activationBytes = runner_->arenaBytes();
  res_.gemm = gemmSummary(spec_.gemm, *runner_, *evalRunner_);
  summary_.generatedKernels = runner_->generatedKernels() + evalRunner_->generatedKernels();
  summary_.distinctKernels = runner_->compiledKernels() + evalRunner_->compiledKernels();
  summary_.programs = runner_->programs() + evalRunner_->programs();
  summary_.compiled = static_cast<long long>(after.misses - before.misses);
  summary_.nvrtcSeconds = after.compileSeconds - before.compileSeconds;
  summary_.fromCache = static_cast<long long>(after.memoryHits + after.diskHits - before.memoryHits - before.diskHits);
  summary_.compileSeconds = runner_->compileSeconds() + evalRunner_->compileSeconds() + trainingKernelsSeconds;
  summary_.gemmChoiceSeconds = runner_->gemmStats().tuneSeconds + evalRunner_->gemmStats().tuneSeconds;
  summary_.planSeconds =
      std::max(0.0, runnersSeconds - runner_->compileSeconds() - evalRunner_->compileSeconds() - summary_.gemmChoiceSeconds);
  summary_.activationBytes = runner_->arenaBytes();
  summary_.paramAndAdamBytes = 3 * stateBytes;
  summary_.programmaticLaunch = launch_ == cuda::LaunchMode::Programmatic;
  summary_.sideStreamNodes = runner_->sideNodes();
  summary_.sideStreamForks = runner_->sideForks();
}

CudaSession::~CudaSession() {
  try {
    if (stream_) stream_->synchronize();
  } catch (...) {  // a failed device: nothing left to wait for
  }
}

// Adam's moments live in two blocks laid out as the parameter block (runner_->paramOffset).
TrainingState CudaSession::state() const {
  TrainingState s;
  s.step = stepsTaken();
  s.params = readAll(false);
  std::vector<float> m(m_.bytes() / sizeof(float)), v(v_.bytes() / sizeof(float));
  m_.download(m.data(), m_.bytes());
  v_.download(v.data(), v_.bytes());
  for (const Param& p : params_) {
    const size_t at = static_cast<size_t>(runner_->paramOffset(p.value)), n = static_cast<size_t>(p.count);
    s.adamM[p.name].assign(m.begin() + at, m.begin() + at + n);
    s.adamV[p.name].assign(v.begin() + at, v.begin() + at + n);
  }
  s.order = order_->state();
  return s;
}

void CudaSession::restore(const TrainingState& s) {
  const std::string why = order_->incompatibility(s.order);
  if (!why.empty()) throw UserError(why);
  stream_->synchronize();
  std::vector<float> m(m_.bytes() / sizeof(float), 0.0f), v(v_.bytes() / sizeof(float), 0.0f);
  for (const Param& p : params_) {
    const std::vector<double>& value = s.params.at(p.name);
    const std::vector<float> f(value.begin(), value.end());
    runner_->upload(p.value, f.data());
    const size_t at = static_cast<size_t>(runner_->paramOffset(p.value));
    const std::vector<double>& pm = s.adamM.at(p.name);
    const std::vector<double>& pv = s.adamV.at(p.name);
    std::copy(pm.begin(), pm.end(), m.begin() + at);
    std::copy(pv.begin(), pv.end(), v.begin() + at);
  }
  m_.upload(m.data(), m_.bytes());
  v_.upload(v.data(), v_.bytes());
  order_->restore(s.order);
  restoredSteps_ = s.step - queued_;
}

void CudaSession::allReduceGradients(cuda::CUstream s) {
  nccl_->groupStart();
  for (const Param& p : params_) nccl_->allReduceMean(runner_->devicePtr(p.grad), static_cast<size_t>(p.count), s);
  nccl_->allReduceMean(runner_->devicePtr(spec_.train.graph.output("loss")), 1, s);
  nccl_->groupEnd();
}

void CudaSession::queueStepKernels() {
  const cuda::CUstream s = stream_->get();
  const int64_t batch = spec_.batchSize;
  cuda::CUdeviceptr step = stepBlock_.ptr();
  {
    cuda::CUdeviceptr srcX = trainX_.ptr(), dstX = gatherX_ ? runner_->devicePtr(spec_.train.x) : 0, dstXb = gatherXb_;
    cuda::CUdeviceptr srcY = trainY_.ptr(), dstY = runner_->devicePtr(spec_.train.y);
    long long rowSizeX = spec_.trainData.xSize, rowSizeY = spec_.trainData.ySize, n = batch;
    int narrow = narrowRows_ ? 1 : 0;
    void* args[] = {&srcX, &dstX, &dstXb, &rowSizeX, &srcY, &dstY, &rowSizeY, &step, &n, &narrow};
    cuda::LaunchShape shape = CudaModule::shapeFor((std::max(rowSizeX, rowSizeY) * n + 3) / 4);  // four values a thread
    shape.grid[1] = 2;  // x's rows on blockIdx.y 0, y's on 1
    cuda::launchKernel(gather_, shape, s, args, launch_);
  }
  runner_->run(s);
  if (runner_->takesAdam()) return;  // the train node's kernel took the Adam step and recorded the loss
  if (nccl_) allReduceGradients(s);
  cuda::CUdeviceptr chunks = chunks_.ptr(), partial = partial_.ptr(), clip = 0;
  const unsigned blocks = static_cast<unsigned>(chunkCount_);
  cuda::LaunchShape perChunk, oneBlock;  // 256 threads: a block per Adam chunk, or one block
  perChunk.grid[0] = blocks;
  perChunk.block[0] = oneBlock.block[0] = 256;
  // The first kernel after NCCL's collectives, or after the runner joined its second stream
  // back, goes out plain: NCCL may join work of its own streams (or host nodes) back into ours,
  // and a programmatic edge is only ever asked for behind a single kernel of this stream. The
  // kernels after it are programmatic again.
  cuda::LaunchMode mode = nccl_ || runner_->joinsStreams() ? cuda::LaunchMode::Plain : launch_;
  auto launch = [&](cuda::CUfunction fn, const cuda::LaunchShape& shape, void** args) {
    cuda::launchKernel(fn, shape, s, args, mode);
    mode = launch_;
  };
  const AdamSettings& adam = spec_.adam;
  if (adam.clipGradNorm > 0 && blocks > 0) {
    clip = clip_.ptr();
    void* a1[] = {&chunks, &partial};
    launch(sumsq_, perChunk, a1);
    long long n = chunkCount_;
    double maxNorm = adam.clipGradNorm;
    void* a2[] = {&partial, &n, &maxNorm, &clip};
    launch(clipScale_, oneBlock, a2);
  }
  cuda::CUdeviceptr loss = runner_->devicePtr(spec_.train.graph.output("loss")), ring = lossRing_.ptr();
  long long ringSize = kLossRing;
  if (blocks > 0) {  // Adam records the loss too
    cuda::CUdeviceptr m = m_.ptr(), v = v_.ptr();
    double b1 = adam.beta1, b2 = adam.beta2, eps = adam.eps;
    void* a3[] = {&chunks, &m, &v, &step, &b1, &b2, &eps, &clip, &loss, &ring, &ringSize};
    launch(adam_, perChunk, a3);
  } else {
    void* a4[] = {&loss, &step, &ring, &ringSize};
    launch(recordLoss_, cuda::LaunchShape{}, a4);
  }
}

void CudaSession::enqueueStep(int64_t step) {
  if (queued_ - drained_ >= kLossRing) drainLosses();  // the ring would overwrite unread losses
  const int slot = static_cast<int>(queued_ % kStagingSlots);
  if (queued_ >= kStagingSlots) slotDone_[static_cast<size_t>(slot)]->synchronize();  // its last copy has run
  char* staging = static_cast<char*>(staging_.data()) + static_cast<size_t>(slot) * stepBytes_;
  const AdamSettings& adam = spec_.adam;
  codegen::StepHeader head;
  const cpu::AdamScalars scalars = cpu::adamScalars(spec_.schedule.at(step, spec_.steps), adam.beta1, adam.beta2, adam.weightDecay, step);
  head.lrOverC1 = scalars.lrOverC1;
  head.invSqrtC2 = scalars.invSqrtC2;
  head.decay = scalars.decay;
  head.lossSlot = queued_ % kLossRing;
  std::memcpy(staging, &head, sizeof head);
  const int64_t batch = spec_.batchSize;
  const int64_t global = spec_.globalBatch > 0 ? spec_.globalBatch : batch;
  const int64_t* all = order_->next(global);
  const int64_t* rows = all + (spec_.comm ? spec_.comm->rank() : 0) * batch;
  if (spec_.recordBatches) batchLog_.insert(batchLog_.end(), all, all + global);
  if (narrowRows_) {
    uint16_t* idx = reinterpret_cast<uint16_t*>(staging + sizeof head);
    for (int64_t i = 0; i < batch; ++i) idx[i] = static_cast<uint16_t>(rows[i]);
  } else {
    int32_t* idx = reinterpret_cast<int32_t*>(staging + sizeof head);
    for (int64_t i = 0; i < batch; ++i) idx[i] = static_cast<int32_t>(rows[i]);
  }
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
  // Timing runs the step's nodes again: where one of them takes Adam (and records the loss), the
  // queued steps' losses are read first and the state goes back after.
  if (runner_->takesAdam()) drainLosses();
  const std::unique_ptr<TrainingState> before = runner_->takesAdam() ? std::make_unique<TrainingState>(state()) : nullptr;
  const std::vector<CudaGraphRunner::NodeTime> nodes = runner_->profile(stream_->get());
  if (before) restore(*before);
  double total = 0;
  for (const auto& n : nodes) total += n.ms;
  std::fprintf(out, "profile of the training step's graph: %zu timed nodes, %.3f ms in total (median of 5, one by one)\n",
               nodes.size(), total);
  for (size_t i = 0; i < nodes.size() && static_cast<int>(i) < top; ++i)
    std::fprintf(out, "  %8.4f ms %5.1f%%  %s\n", nodes[i].ms, 100.0 * nodes[i].ms / std::max(total, 1e-12),
                 nodes[i].label.c_str());
  // Every node, summed by op (with a FusedLinear's activation), largest first.
  std::map<std::string, std::pair<int, double>> byOp;
  for (const auto& n : nodes) {
    const Node& node = spec_.train.graph.node(n.node);
    std::string key = opName(node.op);
    if (node.op == OpKind::FusedLinear) key += " (" + node.attrs.get<attr::Activation>() + ")";
    byOp[key].first += 1;
    byOp[key].second += n.ms;
  }
  std::vector<std::pair<std::string, std::pair<int, double>>> ops(byOp.begin(), byOp.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::fprintf(out, "by op (nodes, total ms, share):\n");
  for (const auto& [op, v] : ops)
    std::fprintf(out, "  %-32s %4d  %8.4f ms %5.1f%%\n", op.c_str(), v.first, v.second, 100.0 * v.second / std::max(total, 1e-12));
  const auto& choices = runner_->gemmChoices();
  if (!choices.empty()) {
    std::fprintf(out, "GEMM provider choices (compiler.gemm %s), ms per run measured at start:\n", gemmProviderName(spec_.gemm));
    for (const auto& c : choices) {
      if (c.cached) {
        std::fprintf(out, "  %-48s %s (from the autotune cache)\n", c.label.c_str(), c.library ? "cuBLASLt" : "generated");
        continue;
      }
      char pick[40] = "";
      if (c.pickMs >= 0) std::snprintf(pick, sizeof pick, " (default tiles %.4f)", c.pickMs);
      std::fprintf(out, "  %-48s generated %8.4f%s  cuBLASLt %8.4f  -> %s\n", c.label.c_str(), c.generatedMs, pick,
                   c.libraryMs, c.library ? (c.transposedB ? "cuBLASLt on B copied untransposed" : "cuBLASLt") : "generated");
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
  const Samples& val = spec_.validationData;
  if (val.count == 0) return -1.0;
  // The validation graph reads the training graph's parameters in place (shared buffers).
  const int64_t batch = spec_.validationBatch;
  const int64_t chunks = val.count / batch;
  const size_t xBytes = static_cast<size_t>(batch * val.xSize) * sizeof(float);
  const size_t yBytes = static_cast<size_t>(batch * val.ySize) * sizeof(float);
  const cuda::CUstream s = stream_->get();
  std::vector<float> losses(static_cast<size_t>(chunks));
  const SessionGraph& eval = spec_.validation;
  const ValueId loss = eval.graph.output("loss");
  for (int64_t c = 0; c < chunks; ++c) {
    PA_CU_CHECK(cuMemcpyDtoDAsync(evalRunner_->devicePtr(eval.x), valX_.ptr() + static_cast<size_t>(c) * xBytes, xBytes, s));
    PA_CU_CHECK(cuMemcpyDtoDAsync(evalRunner_->devicePtr(eval.y), valY_.ptr() + static_cast<size_t>(c) * yBytes, yBytes, s));
    evalRunner_->run(s);
    PA_CU_CHECK(cuMemcpyDtoHAsync(&losses[static_cast<size_t>(c)], evalRunner_->devicePtr(loss), sizeof(float), s));
  }
  stream_->synchronize();
  double acc = 0.0;
  for (float l : losses) acc += l;
  return acc / static_cast<double>(chunks);
}

}  // namespace

namespace {
int deviceOrdinal = 0;
}

void setCudaDeviceOrdinal(int ordinal) { deviceOrdinal = ordinal; }

cuda::Device& cudaDevice0() {
  static cuda::Device d([] {
    int count = 1;
    if (cuda::Driver::instance().available()) PA_CU_CHECK(cuDeviceGetCount(&count));
    return deviceOrdinal % std::max(count, 1);
  }());
  return d;
}

std::unique_ptr<Session> makeCudaSession(SessionSpec spec) { return std::make_unique<CudaSession>(std::move(spec)); }

}  // namespace pa
