// The trainer: builds the model, compiles the training graph, makes a session (runtime/session.h)
// and runs the training loop with its reports.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "frontend/checkpoint.h"
#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "frontend/progress.h"
#include "passes/pass_manager.h"
#include "runtime/communicator.h"
#include "runtime/session.h"

namespace pa {

// One step's metrics, as --metrics writes them; valLoss < 0 where no validation ran.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, valLoss = -1, lr = 0, ms = 0;
};

struct RunOptions {
  int64_t steps = -1;              // >= 0 overrides train.steps / epochs
  std::string device;              // overrides config.device when not empty
  std::string metricsPath;         // --metrics
  std::string dumpGraphDir;        // --dump-graph
  std::string dumpKernelsDir;      // --dump-kernels
  ProgressMode progress = ProgressMode::Auto;
  bool verbose = false;            // pass statistics
  bool noFuse = false;             // --no-fuse: leave the fusion passes out of the pipeline
  bool printSummary = true;        // the header and closing summary on stdout
  bool cudaGraph = true;           // GPU: replay the step as a CUDA graph (also off with PA_CUDA_GRAPH=0)
  // GPU: launch the step's kernels as programmatic dependents (PDL) where the device is sm_90+
  // and the driver CUDA 12.3+; false launches them plain (A/B benchmarks: gpu_train_bench --no-pdl).
  bool pdl = true;
  bool flashPdl = true;  // with pdl, the FlashAttention kernels too; false: those plain (gpu_train_bench --no-flash-pdl)
  // GPU: the backward's gradient leaves (weight-gradient products, their sums) on a second
  // stream beside the rest of the backward (CudaRunnerOptions::sideStream); false: one stream
  // (A/B benchmarks: gpu_train_bench --one-stream). The same results either way.
  bool sideStream = true;
  double sideStreamMaxGflop = codegen::kSecondStreamMaxFlops * 1e-9;  // A/B benchmarks: CudaRunnerOptions::sideStreamMaxFlops in GFLOP (0: any)
  // A layer's bias gradient summed inside its weight-gradient product (the `fuse-bias-grad` pass,
  // which `fuse-linear` brings into the training pipeline); false leaves the product and the sum
  // apart (A/B benchmarks: gpu_train_bench --bias-grad-apart). The same sums in another order.
  bool biasGradInProduct = true;
  // GPU: a step that is one fused-mlp-train node takes Adam in that kernel (SessionSpec); false
  // launches the Adam kernel after it (A/B benchmarks: gpu_train_bench --no-adam-in-node; tests).
  bool adamInTrainNode = true;
  // GPU, fp32: products on the FP64 tensor cores where the device runs FP64 at full rate
  // (codegen::Fp32Gemm); false runs the SIMT kernel (A/B benchmarks: gpu_train_bench --simt-gemm).
  bool fp64Gemm = true;
  // GPU, sm_90a: wgmma products whose epilogue reads or writes more than C run it on the staged
  // raw sums (codegen::WgmmaEpilogue Auto); false runs every epilogue on the fragments (A/B
  // benchmarks: gpu_train_bench --fragment-epilogues).
  bool stagedEpilogues = true;
  // GPU, sm_90a: wgmma products store C by TMA where its rows allow (codegen's
  // EmitOptions::wgmmaTmaStores); false: by their threads (A/B benchmarks: gpu_train_bench
  // --thread-stores).
  bool tmaStores = true;
  // GPU, precision bf16: the batch gather rounds x to bf16 itself, in place of the step's cast
  // kernel (SessionSpec::castInGather); false keeps the cast (A/B benchmarks: gpu_train_bench --cast-kernel).
  bool castInGather = true;
  // GPU: Adam writes the packed copies of fuse-qkv's and SwiGLU's weights (bf16 or fp32) and of
  // fuse-qkv's biases (SessionSpec);
  // false launches the packing kernels each step (A/B benchmarks: gpu_train_bench --no-packed-copies; tests).
  bool packedWeightCopies = true;
  // GPU: Adam reads the packed weights' gradients in place (SessionSpec); false launches the slice /
  // deinterleave kernels that unpack them each step (A/B benchmarks: gpu_train_bench --no-packed-grads; tests).
  bool packedGradViews = true;
  // `train`: Ctrl-C (SIGINT) or SIGTERM stops after the step in flight, with a summary
  // (TrainResult::interruptedBy); off for library callers, whose signals stay theirs.
  bool catchInterrupts = false;
  // Library callers (the Python module): every step's metrics as they are reported, and a check
  // between steps that stops training after the step in flight when it returns true.
  std::function<void(const StepMetrics&)> onStep;
  std::function<bool()> stopRequested;
  // Tests only: edits the finished training graph (e.g. injects a bug that --compare must catch).
  // compareFusedUnfused applies it to the fused graph alone.
  std::function<void(Graph&)> testGraphHook;
  // Initial parameter values by name (tests, golden runs); others are initialised from the seed.
  std::map<std::string, std::vector<double>> initialParams;
  // Keeping what is trained (README "Save, resume, predict").
  std::string initFrom;          // --init-from FILE: starting weights from a safetensors file
  bool initFromPartial = false;  // --init-from-partial: load the tensors that match, seed the rest
  std::string resumeFrom;        // --resume DIR|FILE: continue a checkpoint
  std::shared_ptr<const Checkpoint> resumeState;  // the same from a checkpoint in memory (library callers)
  std::string checkpointDir;     // --checkpoint-dir: overrides train.checkpoint.dir
  std::string dumpBatchesPath;   // --dump-batches FILE: the data and every step's rows, as safetensors
  // Data parallel (frontend/distributed.h): the ranks, null for one process. Every rank trains
  // its share of each batch; rank 0 alone prints, writes metrics, checkpoints and dumps.
  std::shared_ptr<Communicator> comm;
};

// Whether this process reports for the run: rank 0, or the only process.
inline bool leadsRun(const RunOptions& opt) { return !opt.comm || opt.comm->rank() == 0; }

// The training step's graph: the model lowered for `batch`, the forward passes, autodiff and
// the clean-up passes (README, "Passes"); dumps to opt.dumpGraphDir when set.
struct TrainingGraph {
  BuiltModel model;
  size_t forwardNodes = 0;
  std::vector<PassStats> stats;
  std::vector<std::string> validationPasses;  // the passes of the validation graph (passes/pipeline.h)
};
TrainingGraph compileTrainingGraph(const Config& cfg, const RunOptions& opt, const std::vector<int64_t>& sampleX,
                                   const std::vector<int64_t>& sampleY, int64_t batch);
// The validation graph for `batch`: the same model and the forward passes of `tg`, no backward.
BuiltModel compileValidationGraph(const Config& cfg, const TrainingGraph& tg, const std::vector<int64_t>& sampleX,
                                  const std::vector<int64_t>& sampleY, int64_t batch);

// The learning rate of `step` (from 1) of `total`: warm-up, then the configured schedule.
double scheduledLr(const TrainConfig& t, int64_t step, int64_t total);

// The device to run on: --device, else the config's; "cuda", or "cpu" with why and how the
// precision runs there (the run's header shows it). Throws UserError for cuda without a GPU.
std::string resolveDevice(const Config& cfg, const RunOptions& opt);

// A session ready to train, with what its checkpoints record.
struct PreparedRun {
  std::unique_ptr<Session> session;
  RunRecord record;
  std::map<std::string, std::vector<int64_t>> shapes;  // every parameter's shape, by name
  std::string resumedFrom;  // the checkpoint folder of --resume, else ""
  Samples trainData, validationData;  // with --dump-batches only (the session holds its own copy)
};

// Loads the data, builds and compiles the model, and makes the session for the device the
// config and --device choose (runtime/cpu_session.h, runtime/cuda_session.h); starts it from
// --init-from's weights or --resume's checkpoint, both read and checked against the graph
// before the device compiles anything. Throws UserError for configuration problems and for
// weights or checkpoints that do not fit.
PreparedRun prepareRun(const Config& cfg, const RunOptions& opt);
std::unique_ptr<Session> makeSession(const Config& cfg, const RunOptions& opt);

// Trains as configured. Throws UserError (exit 2) for configuration problems and
// std::runtime_error (exit 1) when training diverges (a NaN or infinite loss).
TrainResult train(const Config& cfg, const RunOptions& opt);
// The training loop of train() over a session prepareRun() made; `run` keeps the session, whose
// state() is then the trained one (the Python module keeps it).
TrainResult trainPrepared(const Config& cfg, const RunOptions& opt, PreparedRun& run);

}  // namespace pa
