// Lowers a config's model (layer sugar or explicit nodes) to a graph of primitive ops.
#pragma once

#include <cstdint>
#include <vector>

#include "frontend/config.h"
#include "graph/graph.h"

namespace pa {

struct BuiltModel {
  Graph graph;        // outputs "prediction" and "loss"
  ValueId x = kNoValue, y = kNoValue;  // inputs "input" [batch, ...] and "target" [batch, ...]
};

// `sampleX`/`sampleY` are one data sample's shapes; the graph's inputs get `batch` in front.
// model.input (when given) must hold as many elements as a sample, which is reshaped to it;
// the prediction must hold as many elements per sample as the target.
// Throws ConfigError or ShapeError naming the layer or node.
BuiltModel buildModel(const Config& cfg, const std::vector<int64_t>& sampleX, const std::vector<int64_t>& sampleY,
                      int64_t batch);

}  // namespace pa
