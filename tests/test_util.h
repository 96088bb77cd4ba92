// Shared helpers of the CPU test suites: random inputs, finite-difference gradient checks, files.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "passes/autodiff.h"
#include "runtime/cpu_executor.h"

namespace pa::test {

// The whole text of a file ("" when it cannot be read).
inline std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fills every parameter of `g` uniformly in [lo, hi] (per-parameter ranges override it).
inline std::map<ValueId, std::vector<double>> randomParams(const Graph& g, uint64_t seed,
                                                           const std::map<std::string, std::pair<double, double>>& ranges = {}) {
  std::mt19937_64 rng(seed);
  std::map<ValueId, std::vector<double>> vals;
  for (ValueId p : g.params()) {
    auto it = ranges.find(g.value(p).name);
    const double lo = it == ranges.end() ? -1.0 : it->second.first;
    const double hi = it == ranges.end() ? 1.0 : it->second.second;
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(static_cast<size_t>(numel(g.shape(p))));
    for (double& x : v) x = u(rng);
    vals[p] = v;
  }
  return vals;
}

struct GradCheckResult {
  double maxError = 0.0;  // max |analytic - numeric| / max(1, |numeric|)
  std::string where;
  bool anyNonFinite = false;
  int64_t checked = 0;
};

// Checks d loss / d param for every element of every parameter of `g` (whose output "loss" is a
// scalar) by central differences in float64. With h = 1e-6 the truncation error is O(h²) ~ 1e-12
// and the rounding error ~ 1e-16 · |loss| / h ~ 1e-10 for unit-scale losses, so analytic and
// numeric gradients agree to ~1e-8; callers assert 1e-6, far above that and far below any real
// mistake (a wrong rule is off by O(1)).
inline GradCheckResult gradCheck(Graph& g, const std::map<ValueId, std::vector<double>>& init,
                                 const std::function<void(CpuExecutor<double>&)>& setInputs = {}) {
  const std::vector<ValueId> params = g.params();
  appendBackward(g, g.output("loss"), params);
  CpuExecutor<double> ex(g);
  std::map<ValueId, std::vector<double>> vals = init;
  for (ValueId p : params) ex.bind(p, vals[p].data());
  if (setInputs) setInputs(ex);
  ex.run();
  const ValueId loss = g.output("loss");
  // Snapshot every analytic gradient first: the finite-difference runs below overwrite them.
  std::map<ValueId, std::vector<double>> analyticAll;
  for (ValueId p : params) {
    const ValueId gv = g.output(gradOutputName(g.value(p).name));
    analyticAll[p].assign(ex.data(gv), ex.data(gv) + vals[p].size());
  }
  GradCheckResult r;
  for (ValueId p : params) {
    const std::vector<double>& analytic = analyticAll[p];
    for (size_t i = 0; i < vals[p].size(); ++i) {
      const double h = 1e-6, x0 = vals[p][i];
      vals[p][i] = x0 + h;
      ex.run();
      const double up = ex.data(loss)[0];
      vals[p][i] = x0 - h;
      ex.run();
      const double down = ex.data(loss)[0];
      vals[p][i] = x0;
      const double numeric = (up - down) / (2 * h);
      if (!std::isfinite(analytic[i]) || !std::isfinite(numeric)) r.anyNonFinite = true;
      const double err = std::fabs(analytic[i] - numeric) / std::max(1.0, std::fabs(numeric));
      ++r.checked;
      if (err > r.maxError) {
        r.maxError = err;
        r.where = g.value(p).name + "[" + std::to_string(i) + "] analytic " + std::to_string(analytic[i]) +
                  " numeric " + std::to_string(numeric);
      }
    }
  }
  return r;
}

// loss = sum(out * w) with fixed random weights w, so every output element matters differently.
inline void addWeightedSumLoss(Graph& g, ValueId out) {
  const ValueId w = g.addInput("loss_weights", g.shape(out));
  AttrMap none;
  g.setOutput("loss", g.add(OpKind::Sum, {g.add(OpKind::Mul, {out, w})}, none, "loss"));
}

inline void fillRandom(double* p, int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < n; ++i) p[i] = u(rng);
}

}  // namespace pa::test
