// Fused against unfused, step by step.
#include "frontend/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "frontend/progress.h"

namespace pa {

double compareTolerance(const Config& cfg) {
  switch (cfg.precision) {
  case Precision::Fp64: return 1e-10;
  case Precision::Bf16: return std::ldexp(1.0, -8);
  case Precision::Fp32:
  case Precision::Tf32: return 1e-5;
  }
  return 1e-5;
}

namespace {

double relDiff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

using Gradients = std::map<std::string, std::vector<double>>;

// Whether the model has a ReLU, whose derivative jumps at 0 (see the bf16 note in compare.h).
bool hasRelu(const Config& cfg) {
  for (const auto& l : cfg.model.layers)
    if (l->hasRelu()) return true;
  for (const ExplicitNode& n : cfg.model.nodes)
    if (n.op == "relu" || n.op == "fused-linear" || n.op == "fused-mlp" || n.op == "fused-elementwise") return true;  // may hold one
  return false;
}

// The median (the upper one of an even count); 0 for none.
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double largestElement(const Gradients& g) {
  double largest = 0;
  for (const auto& kv : g)
    for (double x : kv.second) largest = std::max(largest, std::fabs(x));
  return largest;
}

// ‖a − ref‖₂ / ‖ref‖₂ over every parameter together (‖a − ref‖₂ where ref is all zero).
double normDiff(const Gradients& a, const Gradients& ref) {
  double num = 0, den = 0;
  for (const auto& kv : ref) {
    const std::vector<double>& x = a.at(kv.first);
    for (size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - kv.second[i]) * (x[i] - kv.second[i]);
      den += kv.second[i] * kv.second[i];
    }
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// max |a − ref| / max(max |ref|, 1% of the model's largest gradient) for one parameter.
double gradDiff(const std::vector<double>& a, const std::vector<double>& ref, double largest) {
  double diff = 0, own = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - ref[i]));
    own = std::max(own, std::fabs(ref[i]));
  }
  const double d = diff / std::max({own, 1e-2 * largest, 1e-30});
  return std::isfinite(d) ? d : INFINITY;
}


}  // namespace

CompareResult compareFusedUnfused(const Config& cfg, const RunOptions& optIn, std::FILE* out) {
  RunOptions opt = optIn;
  opt.printSummary = false;
  opt.progress = ProgressMode::Quiet;
  opt.noFuse = false;
  std::unique_ptr<Session> fused = makeSession(cfg, opt);
  opt.initialParams = fused->params();  // the very same starting point, whatever the init
  opt.noFuse = true;
  opt.dumpGraphDir.clear();
  opt.testGraphHook = nullptr;
  std::unique_ptr<Session> lockstep = makeSession(cfg, opt);
  std::unique_ptr<Session> free = makeSession(cfg, opt);
  CompareResult r;
  r.tolerance = compareTolerance(cfg);
  r.againstFp32 = cfg.precision == Precision::Bf16;
  std::unique_ptr<Session> reference;  // bf16: the unfused graph in fp32, in lockstep
  if (r.againstFp32) {
    Config refCfg = cfg;  // the session keeps its own copy
    refCfg.precision = Precision::Fp32;
    reference = makeSession(refCfg, opt);
  }

  const int64_t steps = fused->totalSteps();
  if (r.againstFp32)
    std::fprintf(out,
                 "%s: fused against unfused, %lld steps; bf16: each against the unfused graph in fp32, the fused error "
                 "at most twice the unfused one or %.1e\n",
                 cfg.name.c_str(), (long long)steps, r.tolerance);
  else
    std::fprintf(out, "%s: fused against unfused, %lld steps, tolerance %.0e relative\n", cfg.name.c_str(),
                 (long long)steps, r.tolerance);
  std::fprintf(out, "%8s  %14s  %14s  %10s  %10s  %14s  %10s\n", "step", "loss fused", "loss unfused", "loss diff",
               "grad diff", "free unfused", "free diff");
  double tFused = 0, tUnfused = 0;
  std::vector<double> lossRatios, gradRatios;  // bf16: per step, fused error / its allowance
  for (int64_t step = 1; step <= steps; ++step) {
    lockstep->setParams(fused->params());
    if (reference) reference->setParams(fused->params());
    auto t0 = std::chrono::steady_clock::now();
    const double lf = fused->step(step);
    auto t1 = std::chrono::steady_clock::now();
    const double lu = lockstep->step(step);
    auto t2 = std::chrono::steady_clock::now();
    const double lfree = free->step(step);
    if (reference) {
      const double lref = reference->step(step);
      const double eF = relDiff(lf, lref), eU = relDiff(lu, lref);
      lossRatios.push_back(std::isfinite(eF) ? eF / std::max(2.0 * eU, r.tolerance) : INFINITY);
    }
    tFused += std::chrono::duration<double>(t1 - t0).count();
    tUnfused += std::chrono::duration<double>(t2 - t1).count();
    fused->result().losses.push_back(lf);
    free->result().losses.push_back(lfree);
    const double d = relDiff(lf, lu), dFree = relDiff(lf, lfree);
    r.maxLossRelDiff = std::max(r.maxLossRelDiff, std::isfinite(d) ? d : INFINITY);
    r.maxFreeLossRelDiff = std::max(r.maxFreeLossRelDiff, std::isfinite(dFree) ? dFree : INFINITY);
    const auto gf = fused->gradients(), gu = lockstep->gradients();
    const double largest = largestElement(gu);  // the model's largest gradient element, for the floor below
    if (reference) {
      const Gradients gr = reference->gradients();
      const double largestRef = largestElement(gr);
      if (step == 1)
        for (const auto& kv : gr)
          r.gradErrVsFp32[kv.first] = {gradDiff(gf.at(kv.first), kv.second, largestRef),
                                       gradDiff(gu.at(kv.first), kv.second, largestRef)};
      const double eF = normDiff(gf, gr), eU = normDiff(gu, gr);
      if (step == 1) r.gradErrFp32 = {eF, eU};
      gradRatios.push_back(std::isfinite(eF) ? eF / std::max(2.0 * eU, r.tolerance) : INFINITY);
    }
    // Per step: ‖g_fused − g_unfused‖₂ / ‖g_unfused‖₂ over all parameters together. Per
    // parameter it is ill-conditioned: a bias whose gradient is a near-cancelling sum, or a
    // ReLU input within rounding distance of 0, turns rounding noise into large ratios.
    if (step == 1)
      for (const auto& kv : gu) r.gradRelDiff[kv.first] = gradDiff(gf.at(kv.first), kv.second, largest);
    const double gradStep = normDiff(gf, gu);
    r.maxGradRelDiff = std::max(r.maxGradRelDiff, gradStep);
    if (step == 1 || step % cfg.train.logEvery == 0 || step == steps)
      std::fprintf(out, "%8lld  %14.8e  %14.8e  %10.2e  %10.2e  %14.8e  %10.2e\n", (long long)step, lf, lu, d, gradStep,
                   lfree, dFree);
  }
  std::fprintf(out, "gradients at step 1 (max |fused - unfused| / max(max |unfused|, 1%% of the largest gradient)):\n");
  for (const auto& kv : r.gradRelDiff) {
    std::fprintf(out, "  %-28s %10.2e", kv.first.c_str(), kv.second);
    if (r.againstFp32) {
      const auto& e = r.gradErrVsFp32.at(kv.first);
      std::fprintf(out, "   against fp32: fused %.2e, unfused %.2e", e.first, e.second);
    }
    std::fprintf(out, "\n");
  }
  r.fused = fused->result();
  r.unfused = free->result();
  r.fused.secondsPerStep = steps ? tFused / static_cast<double>(steps) : 0;
  r.unfused.secondsPerStep = steps ? tUnfused / static_cast<double>(steps) : 0;
  std::string timing = "lockstep loop";
  if (fused->asynchronous()) {
    // On the GPU the lockstep loop waits for every step and copies parameters between the
    // sessions, so its times say little. Time a free-running burst of each instead (the steps
    // continue both trainings; nothing is compared after this point).
    constexpr int64_t kBurst = 50;
    auto burst = [&](Session& s) {
      s.takeLosses();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 1; i <= kBurst; ++i) s.enqueueStep(steps + i);
      s.takeLosses();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kBurst;
    };
    r.fused.secondsPerStep = burst(*fused);
    r.unfused.secondsPerStep = burst(*free);
    timing = std::to_string(kBurst) + " free-running steps";
  }
  std::fprintf(out, "passes of the fused training graph:\n");
  for (const PassStats& ps : r.fused.passes) {
    std::fprintf(out, "  %-18s nodes %4zu -> %4zu", ps.pass.c_str(), ps.nodesBefore, ps.nodesAfter);
    for (const auto& kv : ps.counters) std::fprintf(out, ", %s %lld", kv.first.c_str(), (long long)kv.second);
    std::fprintf(out, "\n");
    for (const std::string& note : ps.notes) std::fprintf(out, "    %s\n", note.c_str());
  }
  std::fprintf(out, "%-28s %16s %16s\n", "", "fused", "unfused");
  std::fprintf(out, "%-28s %16.3f %16.3f   (%s)\n", "time per step (ms)", r.fused.secondsPerStep * 1e3,
               r.unfused.secondsPerStep * 1e3, timing.c_str());
  auto rate = [&](double seconds) { return seconds > 0 ? r.fused.stepFlops / seconds * 1e-12 : 0.0; };
  std::fprintf(out, "%-28s %16.4g %16.4g   (model FLOPs of the fused graph, %.3f GFLOP a step, over each time)\n",
               "model TFLOP/s", rate(r.fused.secondsPerStep), rate(r.unfused.secondsPerStep), r.fused.stepFlops * 1e-9);
  if (fused->launchesPerStep() > 0)
    std::fprintf(out, "%-28s %16d %16d   (%s)\n", "kernel launches per step", fused->launchesPerStep(), free->launchesPerStep(),
                 fused->replaysCudaGraph() ? "each step replays one CUDA graph" : "launched one by one");
  std::fprintf(out, "%-28s %16zu %16zu\n", "nodes per step", r.fused.trainNodes, r.unfused.trainNodes);
  std::fprintf(out, "%-28s %16s %16s\n", "peak activation memory", formatMiB(r.fused.activationBytes).c_str(),
               formatMiB(r.unfused.activationBytes).c_str());
  double firstGrad = 0;
  for (const auto& kv : r.gradRelDiff) firstGrad = std::max(firstGrad, std::isfinite(kv.second) ? kv.second : INFINITY);
  if (r.againstFp32) {
    r.lossErrRatio = median(lossRatios);
    r.gradErrRatio = median(gradRatios);
    r.gradientsGated = !hasRelu(cfg);
    r.agree = r.lossErrRatio <= 1.0 && (!r.gradientsGated || r.gradErrRatio <= 1.0);
    std::fprintf(out,
                 "%s: against the fp32 graph, the fused error is %.2f of its allowance in the losses and %.2f in the "
                 "gradients%s (medians over the steps; 1 = twice the unfused bf16 error, or %.1e; at step 1 ‖Δg‖/‖g‖ "
                 "fused %.2e, unfused %.2e); fused against unfused: loss %.2e, gradients %.2e at step 1, free-running "
                 "loss %.2e\n",
                 r.agree ? "agree" : "DISAGREE", r.lossErrRatio, r.gradErrRatio,
                 r.gradientsGated ? "" : " (for information: the model has ReLUs, see README)", r.tolerance,
                 r.gradErrFp32.first,
                 r.gradErrFp32.second, r.maxLossRelDiff, firstGrad, r.maxFreeLossRelDiff);
    return r;
  }
  r.agree = r.maxLossRelDiff <= r.tolerance && firstGrad <= r.tolerance;
  std::fprintf(out,
               "%s: largest loss difference %.2e over %lld steps, largest gradient difference %.2e at step 1 "
               "(tolerance %.0e); for information: gradients over all steps %.2e, free-running loss %.2e\n",
               r.agree ? "agree" : "DISAGREE", r.maxLossRelDiff, (long long)steps, firstGrad, r.tolerance, r.maxGradRelDiff,
               r.maxFreeLossRelDiff);
  return r;
}

}  // namespace pa
