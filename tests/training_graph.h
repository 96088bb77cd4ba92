// The training graph of an example config, built as the trainer builds it (no training), for the
// codegen tests.
#pragma once

#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/trainer.h"

namespace pa::test {

// The training graph of a config, built as the trainer builds it (no training).
inline Graph trainingGraph(const std::string& name, bool noFuse, const std::string& precision = "fp32",
                           std::vector<std::string> sets = {}) {
  sets.insert(sets.begin(), {"data.samples=64", "precision=" + precision});
  const Config cfg = loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml", sets);
  DataSplit data = loadData(cfg.data, cfg.seed, std::string(PA_SOURCE_DIR) + "/configs");
  RunOptions opt;
  opt.noFuse = noFuse;
  return compileTrainingGraph(cfg, opt, data.train.xShape, data.train.yShape, cfg.train.batchSize).model.graph;
}

}  // namespace pa::test
