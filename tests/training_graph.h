// The training graph of an example config, built as the trainer builds it (no training), for the
// codegen tests.
#pragma once

#include <string>

#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/trainer.h"

namespace pa::test {

// The training graph of a config, built as the trainer builds it (no training).
inline Graph trainingGraph(const std::string& name, bool noFuse, const std::string& precision = "fp32") {
  const Config cfg =
      loadConfig(std::string(PA_SOURCE_DIR) + "/configs/" + name + ".yaml", {"data.samples=64", "precision=" + precision});
  DataSplit data = loadData(cfg.data, cfg.seed, std::string(PA_SOURCE_DIR) + "/configs");
  RunOptions opt;
  opt.noFuse = noFuse;
  return compileTrainingGraph(cfg, opt, data.train.xShape, data.train.yShape, cfg.train.batchSize).model.graph;
}

}  // namespace pa::test
