// The trainer: builds the model, compiles the training graph, runs Adam on MSE and reports.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/progress.h"

namespace pa {

struct RunOptions {
  int64_t steps = -1;              // >= 0 overrides train.steps / epochs
  std::string device;              // overrides config.device when not empty
  std::string metricsPath;         // --metrics
  std::string dumpGraphDir;        // --dump-graph
  ProgressMode progress = ProgressMode::Auto;
  bool verbose = false;            // pass statistics
  bool printSummary = true;        // the header and closing summary on stdout
  // Initial parameter values by name (tests, golden runs); others are initialised from the seed.
  std::map<std::string, std::vector<double>> initialParams;
};

struct TrainResult {
  std::vector<double> losses;                          // training loss of every step
  std::vector<std::pair<int64_t, double>> validation;  // (step, validation loss)
  double finalValidation = -1;                         // -1 without a validation split
  double secondsPerStep = 0;
  int64_t parameterCount = 0;
  size_t forwardNodes = 0, trainNodes = 0;
  std::string device;
  std::map<std::string, std::vector<double>> finalParams;
};

// Trains as configured. Throws UserError (exit 2) for configuration problems and
// std::runtime_error (exit 1) when training diverges (a NaN or infinite loss).
TrainResult train(const Config& cfg, const RunOptions& opt);

}  // namespace pa
