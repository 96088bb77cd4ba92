// The training loop: steps a session, reports progress, validation and metrics, stops on
// divergence or Ctrl-C, and prints the closing summary.
#include "frontend/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/debug.h"
#include "frontend/interrupt.h"
#include "frontend/metrics.h"

namespace pa {

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
