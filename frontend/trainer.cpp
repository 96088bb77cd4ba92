// The training loop: steps a session, reports progress, validation and metrics, saves
// checkpoints, stops on divergence or Ctrl-C, and prints the closing summary.
#include "frontend/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/debug.h"
#include "frontend/distributed.h"
#include "frontend/interrupt.h"
#include "frontend/metrics.h"

namespace pa {

namespace {

// --verbose's start-up line: "start-up 0.84 s: checks and data 0.10 s, ...".
std::string startupLine(const std::vector<std::pair<std::string, double>>& phases) {
  double total = 0;
  std::string parts;
  for (const auto& [what, s] : phases) {
    total += s;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s%s %.3f s", parts.empty() ? "" : ", ", what.c_str(), s);
    parts += buf;
  }
  char head[64];
  std::snprintf(head, sizeof head, "start-up %.3f s: ", total);
  return head + parts;
}

// --dump-batches: the run's data split and the training rows of every step it took, so that
// another program (a PyTorch mirror, a NumPy check) can feed the very same batches.
void dumpBatches(const std::string& path, const PreparedRun& run, int64_t firstStep) {
  using safetensors::Tensor;
  auto withCount = [](int64_t n, const std::vector<int64_t>& sample) {
    std::vector<int64_t> s{n};
    s.insert(s.end(), sample.begin(), sample.end());
    return s;
  };
  const RunRecord& r = run.record;
  const std::vector<int64_t>& rows = run.session->recordedBatches();
  const int64_t steps = static_cast<int64_t>(rows.size()) / std::max<int64_t>(r.batchSize, 1);
  const std::vector<Tensor> tensors = {
      Tensor::f32("train.x", withCount(run.trainData.count, r.sampleX), run.trainData.x),
      Tensor::f32("train.y", withCount(run.trainData.count, r.sampleY), run.trainData.y),
      Tensor::f32("validation.x", withCount(run.validationData.count, r.sampleX), run.validationData.x),
      Tensor::f32("validation.y", withCount(run.validationData.count, r.sampleY), run.validationData.y),
      Tensor::i64("batches", {steps, r.batchSize}, rows),
  };
  try {
    safetensors::write(path, tensors, {{"first_step", std::to_string(firstStep)}, {"config", r.configYaml}});
  } catch (const UserError& e) {
    throw UserError(std::string("--dump-batches: ") + e.what());
  }
}

}  // namespace

TrainResult train(const Config& cfg, const RunOptions& opt) {
  PreparedRun run = prepareRun(cfg, opt);
  return trainPrepared(cfg, opt, run);
}

TrainResult trainPrepared(const Config& cfg, const RunOptions& opt, PreparedRun& run) {
  Session* session = run.session.get();
  // --checkpoint-dir, else train.checkpoint.dir, else a resumed run saves beside its checkpoint.
  std::string checkpointDir = opt.checkpointDir.empty() ? cfg.train.checkpoint.dir : opt.checkpointDir;
  if (checkpointDir.empty() && !run.resumedFrom.empty()) {
    const std::filesystem::path from(run.resumedFrom);
    checkpointDir = from.has_parent_path() ? from.parent_path().string() : ".";
  }
  // Data parallel: the other ranks hold the same state and write nothing.
  const bool lead = leadsRun(opt);
  Communicator* comm = opt.comm && opt.comm->size() > 1 ? opt.comm.get() : nullptr;
  if (!lead) checkpointDir.clear();
  const bool printSummary = opt.printSummary && lead;
  const CheckpointConfig& ckpt = cfg.train.checkpoint;
  std::unique_ptr<InterruptGuard> interrupts;
  if (opt.catchInterrupts) interrupts = std::make_unique<InterruptGuard>();
  const int64_t done = session->stepsTaken();  // > 0 when resumed
  int64_t steps = session->totalSteps();       // the last step
  const int64_t plannedSteps = steps;
  const int64_t logEvery = cfg.train.logEvery;
  std::unique_ptr<MetricsWriter> metrics;
  if (!opt.metricsPath.empty() && lead)
    metrics = std::make_unique<MetricsWriter>(opt.metricsPath, run.resumedFrom.empty() ? -1 : done);
  Progress progress(steps, logEvery, lead ? opt.progress : ProgressMode::Quiet, stderr, done);
  TrainResult& res = session->result();
  res.firstStep = done + 1;
  double lastVal = -1.0, stepSeconds = 0.0;
  // Losses come back in batches from an asynchronous (GPU) session: at every log step, at the
  // end, and every quarter second for the progress bar (a synchronous session reports every
  // step). The steps of a batch are reported with the batch's mean wall time; validation is
  // outside the timing.
  using Clock = std::chrono::steady_clock;
  Clock::time_point since = Clock::now();
  int64_t reported = done;
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
      if (opt.onStep) opt.onStep(StepMetrics{step, losses[i], -1.0, lr, ms});
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
      if (opt.onStep) opt.onStep(StepMetrics{at, res.losses.back(), lastVal, lr, ms});
    }
    since = Clock::now();
  };
  // Saves the state after the steps queued so far, whose losses the caller has checked (a
  // diverged step is never saved), then prunes the folder; outside the step timing.
  std::string lastCheckpoint;
  auto save = [&](bool final) {
    const Clock::time_point start = Clock::now();
    lastCheckpoint = writeCheckpoint(checkpointDir, session->state(), run.shapes, run.record, final);
    pruneCheckpoints(checkpointDir, ckpt.keep);
    progress.note("checkpoint " + lastCheckpoint);
    since += Clock::now() - start;
  };
  for (int64_t step = done + 1; step <= steps; ++step) {
    // Ctrl-C, or a library caller's stop: the steps queued so far finish; the last is the end.
    if ((interrupts && interrupts->interrupted()) || (opt.stopRequested && opt.stopRequested())) {
      steps = step - 1;
      if (steps > done) logStep(steps);
      break;
    }
    if (step <= done + 2) {
      // Start-up: the first step runs eagerly, the second captures the CUDA graph (GPU).
      const Clock::time_point start = Clock::now();
      session->enqueueStep(step);
      const bool gpu = session->asynchronous();
      res.startup.push_back({step == done + 1 ? (gpu ? "first step queued (runs eagerly)" : "first step")
                                              : (gpu ? "second step queued (captures the CUDA graph)" : "second step"),
                             std::chrono::duration<double>(Clock::now() - start).count()});
      if (opt.verbose && lead && (step == done + 2 || step == steps)) {
        if (opt.progress == ProgressMode::Quiet) std::printf("%s\n", startupLine(res.startup).c_str());
        else progress.note(startupLine(res.startup));
      }
    } else {
      session->enqueueStep(step);
    }
    if (comm && debugSwitches().checkReplicas) checkReplicasAgree(*comm, session->params(), "after step " + std::to_string(step));
    const bool log = step % logEvery == 0 || step == steps;
    if (log) logStep(step);
    else if (!session->asynchronous() || Clock::now() - since > std::chrono::milliseconds(250)) collect(false);
    if (!checkpointDir.empty() && ckpt.every > 0 && step % ckpt.every == 0 && step != steps) {
      if (!log) collect(false);
      save(false);
    }
  }
  progress.finish();
  if (debugSwitches().profile) session->printProfile(stderr, 40);
  if (steps == done) lastVal = session->validate();
  if (!std::isfinite(lastVal))
    throw std::runtime_error("the validation loss of the initial weights is " + std::to_string(lastVal));
  if (interrupts && interrupts->interrupted()) res.interruptedBy = interrupts->signal();
  // Every run that has a checkpoint folder ends with a checkpoint; only one that took all its
  // steps is final (pruning keeps final checkpoints).
  if (!checkpointDir.empty()) save(!res.interruptedBy);
  if (!opt.dumpBatchesPath.empty() && lead) dumpBatches(opt.dumpBatchesPath, run, done + 1);
  if (comm) checkReplicasAgree(*comm, session->params(), "at the end (step " + std::to_string(steps) + ")");
  const int64_t taken = steps - done;
  res.finalValidation = lastVal;
  res.secondsPerStep = taken ? stepSeconds / static_cast<double>(taken) : 0.0;
  res.finalParams = session->params();
  res.checkpoint = lastCheckpoint;
  if (printSummary) {
    if (res.interruptedBy)
      std::printf("interrupted (%s) after step %lld of %lld\n", res.interruptedBy == SIGINT ? "Ctrl-C" : "SIGTERM",
                  (long long)steps, (long long)plannedSteps);
    if (done > 0 && taken == 0 && !res.interruptedBy)
      std::printf("nothing to train: the checkpoint is at step %lld and the run has %lld steps (raise train.steps or "
                  "--steps to go on)\n",
                  (long long)done, (long long)plannedSteps);
    std::printf("done: %lld steps in %s (%.3f ms/step)", (long long)taken, formatDuration(progress.elapsedSeconds()).c_str(),
                res.secondsPerStep * 1e3);
    if (done > 0) std::printf(", steps %lld-%lld", (long long)done + 1, (long long)steps);
    if (!res.losses.empty()) std::printf("; final loss %.6e", res.losses.back());
    if (lastVal >= 0) std::printf("; validation MSE %.6e", lastVal);
    std::printf("\n");
    if (!lastCheckpoint.empty())
      std::printf("checkpoint: %s (continue with --resume %s)\n", lastCheckpoint.c_str(), checkpointDir.c_str());
    if (comm)
      std::printf("data parallel: parameters identical on all %d ranks at the end%s\n", comm->size(),
                  debugSwitches().checkReplicas ? " and after every step" : "");
    if (session->launchesPerStep() > 0) {
      const DeviceSummary* d = session->deviceSummary();
      std::printf("GPU step: %d kernel launches, %s%s\n", session->launchesPerStep(),
                  session->replaysCudaGraph() ? "replayed as one CUDA graph" : "launched one by one (PA_CUDA_GRAPH=0)",
                  d && d->programmaticLaunch ? ", as programmatic dependent launches (PDL)" : "");
    }
  }
  return res;
}

}  // namespace pa
