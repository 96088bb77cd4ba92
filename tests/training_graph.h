// The training graph of an example config, built as the trainer builds it (no training), for the
// codegen tests.
#pragma once

#include <string>
#include <vector>

#include "frontend/config.h"
#include "frontend/datasets.h"
#include "frontend/trainer.h"
#include "graph/node_attrs.h"
#include "passes/pass_manager.h"

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

// A fused MLP's training step as fuse-mlp-train leaves it: FusedMlp over input x [rows, widths[0]]
// (layer i's activation and bias from `acts` / `biases`), MseLoss against input target, the
// backward, then fuse-loss and fuse-mlp-train; y is also the graph output "prediction".
inline Graph mlpTrainGraph(int64_t rows, const std::vector<int64_t>& widths, const std::vector<MlpActivation>& acts,
                           const std::vector<int64_t>& biases) {
  Graph g;
  std::vector<ValueId> ins{g.addInput("x", Shape{rows, widths[0]})};
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    ins.push_back(g.addParam("w" + std::to_string(i + 1), Shape{widths[i], widths[i + 1]}, "xavier"));
    if (biases[i]) ins.push_back(g.addParam("b" + std::to_string(i + 1), Shape{widths[i + 1]}, "xavier"));
  }
  const ValueId y = g.add(OpKind::FusedMlp, ins, AttrMap().set<attr::MlpActivations>(mlpActivationsString(acts)).set<attr::MlpBiases>(biases));
  g.setOutput("prediction", y);
  g.setOutput("loss", g.add(OpKind::MseLoss, {y, g.addInput("target", Shape{rows, widths.back()})}));
  runPipeline(g, {"autodiff", "fuse-loss", "fuse-mlp-train", "dce"}, PipelineOptions{});
  return g;
}

}  // namespace pa::test
