// The trainer: builds the model, compiles the training graph, runs Adam on MSE and reports.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/model_builder.h"
#include "frontend/progress.h"
#include "passes/pass_manager.h"

namespace pa {

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
  // `train`: Ctrl-C (SIGINT) or SIGTERM stops after the step in flight, with a summary
  // (TrainResult::interruptedBy); off for library callers, whose signals stay theirs.
  bool catchInterrupts = false;
  // Tests only: edits the finished training graph (e.g. injects a bug that --compare must catch).
  // compareFusedUnfused applies it to the fused graph alone.
  std::function<void(Graph&)> testGraphHook;
  // Initial parameter values by name (tests, golden runs); others are initialised from the seed.
  std::map<std::string, std::vector<double>> initialParams;
};

struct TrainResult {
  std::vector<double> losses;                          // training loss of every step
  std::vector<std::pair<int64_t, double>> validation;  // (step, validation loss)
  double finalValidation = -1;                         // -1 without a validation split
  double secondsPerStep = 0;
  int64_t parameterCount = 0;
  size_t forwardNodes = 0, trainNodes = 0;  // live nodes: forward graph, whole training step
  size_t activationBytes = 0;               // peak activation memory of the step (memory plan)
  std::vector<PassStats> passes;            // statistics of every pass the training graph went through
  int interruptedBy = 0;  // the signal that stopped training early (catchInterrupts), else 0
  std::string device;
  std::string gemm;  // GPU: who runs the GEMMs ("GEMMs (compiler.gemm auto): 7 on cuBLASLt, 2 generated; ...")
  std::map<std::string, std::vector<double>> finalParams;
};

// The training step's graph: the model lowered for `batch`, the forward passes, autodiff and
// the clean-up passes (README, "Passes"); dumps to opt.dumpGraphDir when set.
struct TrainingGraph {
  BuiltModel model;
  size_t forwardNodes = 0;
  std::vector<PassStats> stats;
  std::vector<std::string> forwardPasses;  // also run on the validation graph
};
TrainingGraph compileTrainingGraph(const Config& cfg, const RunOptions& opt, const std::vector<int64_t>& sampleX,
                                   const std::vector<int64_t>& sampleY, int64_t batch);
// The validation graph for `batch`: the same model and the forward passes of `tg`, no backward.
BuiltModel compileValidationGraph(const Config& cfg, const TrainingGraph& tg, const std::vector<int64_t>& sampleX,
                                  const std::vector<int64_t>& sampleY, int64_t batch);

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
  // Times every node of the training step on the device (median of 5 runs) and prints the
  // `top` slowest with their share of the step (GPU only; PA_PROFILE=1 does it after training).
  virtual void printProfile(std::FILE* /*out*/, int /*top*/) {}
  // Mean validation loss over whole batches of the validation split; -1 without one.
  virtual double validate() = 0;
  virtual int64_t totalSteps() const = 0;
  virtual TrainResult& result() = 0;  // static facts filled; losses appended by train()
  virtual std::map<std::string, std::vector<double>> params() const = 0;
  // Overwrites parameter values by name (the optimizer state is kept).
  virtual void setParams(const std::map<std::string, std::vector<double>>& values) = 0;
  // Gradients of the last step, by parameter name (before clipping).
  virtual std::map<std::string, std::vector<double>> gradients() const = 0;
};

// The learning rate of `step` (from 1) of `total`: warm-up, then the configured schedule.
double scheduledLr(const TrainConfig& t, int64_t step, int64_t total);

// Loads the data, builds and compiles the model. Throws UserError for configuration problems.
std::unique_ptr<Session> makeSession(const Config& cfg, const RunOptions& opt);

// Trains as configured. Throws UserError (exit 2) for configuration problems and
// std::runtime_error (exit 1) when training diverges (a NaN or infinite loss).
TrainResult train(const Config& cfg, const RunOptions& opt);

}  // namespace pa
