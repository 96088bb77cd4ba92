// Layer kinds of model.layers: each parses its own keys, lowers itself to primitive ops and
// prints its resolved config; the registry maps a kind's name to its parser.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "frontend/config_node.h"
#include "graph/graph.h"

namespace pa {

// What every layer's lowering shares: parameters named under the layer ("layers.<i>.<what>"),
// and the linear map (attention's projections are linear maps too).
struct LayerLowering {
  Graph& g;
  std::string prefix;  // "layers.<i>"

  ValueId param(const std::string& what, Shape shape, const std::string& init);
  // x [..., in] -> [..., units]; activation relu | gelu | tanh | sigmoid | none.
  ValueId linear(ValueId x, int64_t units, const std::string& activation, bool bias, const std::string& what);
  // [B, S, heads*hd] -> [B, heads, S, hd]
  ValueId splitHeads(ValueId v, int64_t heads, int64_t hd);
};

class Layer {
public:
  virtual ~Layer() = default;
  // Adds the layer's nodes after `x` and returns its output. Throws ConfigError naming the
  // layer's keys; a ShapeError is named at the layer by the caller.
  virtual ValueId lower(LayerLowering& L, ValueId x) const = 0;
  // The resolved config, every default filled in, as YAML: "linear: {units: 64, ...}".
  virtual std::string resolved() const = 0;
  // The key that names the layer's size in messages ("linear.units = 64"), and the key a
  // prediction of the wrong shape is blamed on ("linear.units"); both default to the kind.
  virtual std::string origin() const { return kind; }
  virtual std::string predictionKey() const { return kind; }
  // Whether the layer holds a ReLU, whose derivative jumps at 0 (--compare's bf16 tolerance).
  virtual bool hasRelu() const { return false; }

  std::string kind;            // the registry's name: linear, attention
  std::string path, location;  // "model.layers[2]" and its file:line:col, for messages
};

// Parses a kind's map (the value under its name); fails with the key's location.
using LayerParser = std::unique_ptr<Layer> (*)(const CfgNode& body);
struct LayerKind {
  const char* name;
  LayerParser parse;
};

// Every layer kind, in the order messages list them; a name registered twice is a logic_error.
const std::vector<LayerKind>& layerKinds();
// Parses one item of model.layers: a map with one key, the kind's name.
std::shared_ptr<const Layer> parseLayer(const CfgNode& item);

}  // namespace pa
