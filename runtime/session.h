// A training session: a compiled training step with its data, parameters and optimizer state,
// on one device (CPU or CUDA), and the runtime-level description the frontend fills to make one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codegen/flops.h"
#include "common/errors.h"
#include "common/settings.h"
#include "graph/graph.h"
#include "passes/pass_manager.h"
#include "runtime/batch_order.h"
#include "runtime/communicator.h"

namespace pa {

struct TrainResult {
  std::vector<double> losses;                          // training loss of every step this run took
  int64_t firstStep = 1;                               // the step of losses[0] (> 1 when resumed)
  std::vector<std::pair<int64_t, double>> validation;  // (step, validation loss)
  double finalValidation = -1;                         // -1 without a validation split
  double secondsPerStep = 0;
  int64_t parameterCount = 0;
  size_t forwardNodes = 0, trainNodes = 0;  // live nodes: forward graph, whole training step
  size_t activationBytes = 0;               // peak activation memory of the step (memory plan)
  double stepFlops = 0;                     // model FLOPs of one training step (codegen/flops.h)
  // Start-up phases in order, (what, seconds): filled by the frontend and the training loop,
  // printed by --verbose once the first steps are queued.
  std::vector<std::pair<std::string, double>> startup;
  std::vector<PassStats> passes;            // statistics of every pass the training graph went through
  int interruptedBy = 0;  // the signal that stopped training early (catchInterrupts), else 0
  std::string device;
  std::string gemm;  // GPU: who runs the GEMMs ("GEMMs (compiler.gemm auto): 7 on cuBLASLt, 2 generated; ...")
  std::map<std::string, std::vector<double>> finalParams;
  std::string checkpoint;  // the folder of the last checkpoint written, else ""
};

// A setting the session cannot honour on this machine (compiler.gemm: cublaslt without
// cuBLASLt): names the config key, so that the frontend can locate it in the file.
class SessionSettingError : public UserError {
public:
  SessionSettingError(const std::string& key, const std::string& message)
      : UserError(key + ": " + message), key_(key), message_(message) {}
  const std::string& key() const { return key_; }
  const std::string& message() const { return message_; }

private:
  std::string key_, message_;
};

// Adam (AdamW with weight decay > 0), with optional clipping of the global gradient norm.
struct AdamSettings {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
  double clipGradNorm = 0.0;  // 0: off
};

// The learning rate over the run: a linear warm-up, then constant or cosine decay to 0.
struct LrSchedule {
  double lr = 1e-3;
  int64_t warmupSteps = 0;
  bool cosine = false;
  // The rate of `step` (from 1) of `total`.
  double at(int64_t step, int64_t total) const;
};

// A graph a session runs: inputs "input" [batch, ...] (x) and "target" [batch, ...] (y), output "loss".
struct SessionGraph {
  Graph graph;
  ValueId x = kNoValue, y = kNoValue;
};

// Samples, row-major: `count` rows of xSize input and ySize target values.
struct Samples {
  std::vector<float> x, y;
  int64_t count = 0, xSize = 0, ySize = 0;
};

// What a session holds beyond its compiled graphs: everything a checkpoint saves so that a
// resumed run continues bit for bit (frontend/checkpoint.h). Values are the session's own
// (float, or double for precision fp64), widened to double without rounding.
struct TrainingState {
  int64_t step = 0;  // steps taken: the trainer's step and Adam's bias-correction count
  std::map<std::string, std::vector<double>> params, adamM, adamV;  // by parameter name
  BatchOrder::State order;
};

// Everything a session needs, filled by the frontend from the config and the command line.
struct SessionSpec {
  SessionGraph train;        // forward, backward and the gradients "grad/<param>" for batchSize
  SessionGraph validation;   // forward only, for validationBatch; reads the training parameters
  int64_t batchSize = 1, validationBatch = 1;
  int64_t steps = 0;         // steps to train
  Samples trainData, validationData;
  // Samples still being made beside the session (a generated dataset, on another thread): when
  // set, the session calls it once, before it first reads trainData or validationData, and it
  // fills them; it throws what making the data throws.
  std::function<void(SessionSpec&)> awaitData;
  // A parameter's starting values (numel of its shape); called once per parameter while the
  // session is made, after the executor has checked that the step fits in memory.
  std::function<std::vector<double>(const Graph& g, ValueId param)> initialValues;
  Precision precision = Precision::Fp32;
  GemmProvider gemm = GemmProvider::Auto;
  bool deterministic = false;    // GPU: no kernel with atomics
  bool cudaGraph = true;         // GPU: replay the step as a CUDA graph
  // GPU: launch the step's own kernels as programmatic dependents on sm_90+ (runtime/cuda/launch.h),
  // so each may start while the one before it finishes; the same results either way.
  bool pdl = true;
  bool flashPdl = true;  // with pdl, the FlashAttention kernels too (CudaRunnerOptions::flashPdl)
  // GPU: the backward's gradient leaves on the runner's second stream (CudaRunnerOptions::sideStream).
  bool sideStream = true;
  double sideStreamMaxGflop = codegen::kSecondStreamMaxFlops * 1e-9;  // CudaRunnerOptions::sideStreamMaxFlops, in GFLOP
  // GPU: where the step is one fused-mlp-train node (and no clipping, one process), its kernel
  // takes the Adam step too, with no Adam kernel after it; the same results either way (A/B
  // benchmarks and tests turn it off).
  bool adamInTrainNode = true;
  // GPU, fp32: generated GEMMs on the FP64 tensor cores where the device runs FP64 at full rate;
  // false: the SIMT kernel (A/B benchmarks).
  bool fp64Gemm = true;
  // GPU, sm_90a: CudaRunnerOptions::wgmmaEpilogue Auto; false: Fragments (A/B benchmarks).
  bool stagedEpilogues = true;
  // GPU, sm_90a: CudaRunnerOptions::wgmmaTmaStores (A/B benchmarks).
  bool tmaStores = true;
  // GPU, precision bf16: the batch gather rounds x's rows to bf16 where the step's first work on x
  // is its cast (CudaRunnerOptions::gatheredInput); false: the cast kernel runs (A/B benchmarks).
  bool castInGather = true;
  // GPU: Adam also writes the packed copies (bf16 or fp32) of weights that fuse-qkv and SwiGLU pack
  // into one GEMM operand, and of fuse-qkv's biases, and the step launches no packing kernel
  // (CudaRunnerOptions::mirrorPackedWeights); the same results either way (A/B benchmarks and tests
  // turn it off).
  bool packedWeightCopies = true;
  // GPU: Adam (and clipping's norm) reads the gradients of fuse-qkv's and SwiGLU's packed weights
  // in place in the packed gradient, and the step launches no slice or deinterleave of them
  // (CudaRunnerOptions::packedGradViews; not with NCCL); the same results either way (A/B
  // benchmarks and tests turn it off).
  bool packedGradViews = true;
  uint64_t seed = 0;             // the batch order's stream
  bool shuffle = true;           // shuffle the training samples every epoch
  AdamSettings adam;
  LrSchedule schedule;
  std::string device;            // how the run names the device ("cpu (auto: ...)", "cuda")
  std::string dumpKernelsDir;    // --dump-kernels: write the step's CUDA kernels here
  bool announceCompile = false;  // say that compiling starts (GPU: seconds on a cold cache) and where kernels were dumped
  bool recordBatches = false;    // --dump-batches: keep the rows of every step (Session::recordedBatches)
  // Data parallel (README "Data-parallel training"): the ranks, or null for a run of one process.
  // Every rank draws the same global batches of globalBatch rows and trains rows
  // [rank * batchSize, (rank + 1) * batchSize) of each; the step's gradients and loss are
  // averaged over the ranks before the optimizer, so every rank applies the same update.
  std::shared_ptr<Communicator> comm;
  int64_t globalBatch = 0;       // 0: batchSize (one rank)
  // GPU: all-reduce on the device with NCCL (inside the captured step), even with one rank.
  bool nccl = false;
};

// Calls spec.awaitData once, if set: the samples are in trainData and validationData after it.
inline void awaitSessionData(SessionSpec& spec) {
  if (!spec.awaitData) return;
  const std::function<void(SessionSpec&)> await = std::move(spec.awaitData);
  spec.awaitData = nullptr;
  await(spec);
}

// What a GPU session compiled and placed at start, for the run's header.
struct DeviceSummary {
  int generatedKernels = 0, programs = 0;  // NVRTC programs of the training and validation runners
  int distinctKernels = 0;  // of the generated ones: sources that differ beyond their names (each compiled once)
  long long compiled = 0, fromCache = 0;  // kernel cache: compiled now, found in memory or on disk
  double compileSeconds = 0;     // the compile phase's wall time: both runners' kernels, FlashAttention's, and the wait for the step's own (compiled beside them)
  double nvrtcSeconds = 0;       // NVRTC's time on the programs compiled, summed over the threads
  double gemmChoiceSeconds = 0;  // measuring GEMM tiles and providers (not what the autotune cache answered)
  double contextSeconds = 0;     // the device's context and the session's stream
  double dataSeconds = 0;        // uploading the training and validation samples
  double paramSeconds = 0;       // initial parameter values made and uploaded
  double planSeconds = 0;        // the step graphs' runners, less compiling and GEMM measuring: kernels
                                 // emitted, memory planned and allocated, library GEMMs planned
  size_t activationBytes = 0, paramAndAdamBytes = 0;
  bool programmaticLaunch = false;  // the step's kernels go out as programmatic dependents (PDL)
  int sideStreamNodes = 0;          // nodes the step queues on the runner's second stream (CudaRunnerOptions::sideStream)
  int sideStreamForks = 0;          // places where the second stream waits for the step's stream
};

// A compiled model with its data, parameters and optimizer state, ready to take steps.
class Session {
public:
  virtual ~Session() = default;
  // Queues one training step (next batch, forward, backward, Adam). `step` counts from 1 and
  // sets the learning-rate schedule and Adam's bias correction. The CPU runs it at once; the GPU
  // queues it and returns, so the host runs ahead of the device.
  virtual void enqueueStep(int64_t step) = 0;
  // The losses of the steps queued since the last call, in order; waits for them. On the CPU a
  // step whose loss is not finite leaves the parameters as they were; on the GPU the steps after
  // it may already be queued (the caller stops at the first non-finite loss either way).
  virtual std::vector<double> takeLosses() = 0;
  // One step, waiting for its loss.
  double step(int64_t s) {
    enqueueStep(s);
    return takeLosses().back();
  }
  // True when enqueueStep returns before the step has run (the GPU).
  virtual bool asynchronous() const { return false; }
  // Kernel launches per step and whether the step replays as one CUDA graph (GPU only).
  virtual int launchesPerStep() const { return 0; }
  virtual bool replaysCudaGraph() const { return false; }
  // What was compiled and placed on the device at start (GPU only; null on the CPU).
  virtual const DeviceSummary* deviceSummary() const { return nullptr; }
  // Times every node of the training step on the device (median of 5 runs) and prints the
  // `top` slowest with their share of the step (GPU only; PA_PROFILE=1 does it after training).
  virtual void printProfile(std::FILE* /*out*/, int /*top*/) {}
  // Mean validation loss over whole batches of the validation split; -1 without one.
  virtual double validate() = 0;
  virtual int64_t totalSteps() const = 0;
  // The session's static facts (device, parameters, nodes, memory, GEMMs) filled; the graphs'
  // compiler adds forwardNodes and passes, the training loop the losses.
  virtual TrainResult& result() = 0;
  virtual std::map<std::string, std::vector<double>> params() const = 0;
  // Overwrites parameter values by name (the optimizer state is kept).
  virtual void setParams(const std::map<std::string, std::vector<double>>& values) = 0;
  // Gradients of the last step, by parameter name (before clipping).
  virtual std::map<std::string, std::vector<double>> gradients() const = 0;
  // Steps queued so far, counting those of a restored state: the next step is stepsTaken() + 1.
  virtual int64_t stepsTaken() const = 0;
  // The parameters, Adam's moments, the step count and the batch order after the queued steps
  // (waits for them).
  virtual TrainingState state() const = 0;
  // Continues from `s` (a state() of a session of the same graphs). The caller has checked that
  // `s` names every parameter with its size; throws UserError when the batch order does not fit
  // this session's data (BatchOrder::incompatibility).
  virtual void restore(const TrainingState& s) = 0;
  // With SessionSpec::recordBatches, the training rows of every step queued by this session, in
  // order (the global batch's entries a step, every rank's); else empty.
  const std::vector<int64_t>& recordedBatches() const { return batchLog_; }

protected:
  std::vector<int64_t> batchLog_;
};

}  // namespace pa
