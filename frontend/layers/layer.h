// Layer kinds of model.layers: each parses its own keys, lowers itself to primitive ops and
// prints its resolved config; the registry maps a kind's name to its parser.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "frontend/config_node.h"
#include "graph/graph.h"

namespace pa {

// A normalisation over the last axis: `kind` layer | rms, or empty for none.
struct NormSpec {
  std::string kind;
  double eps = 1e-5;
  bool on() const { return !kind.empty(); }
};
// `rms`, `layer`, or a map {kind: layer|rms, eps: 1e-5}.
NormSpec parseNormSpec(const CfgNode& n);
// "{kind: rms, eps: 1e-05}": valid YAML that parses back to the same spec.
std::string printNorm(const NormSpec& n);

// The options every residual block shares (attention, mlp, linear): a norm before the body,
// the residual add, a norm after it.
struct BlockOptions {
  NormSpec preNorm, postNorm;
  bool residual = false;
};
// Parses pre_norm, post_norm and residual (the caller lists them in checkKeys).
BlockOptions parseBlockOptions(const CfgNode& n);
// ", residual: true, pre_norm: {...}" (norms only when set).
std::string printBlockOptions(const BlockOptions& b);

// What every layer's lowering shares: parameters named under the layer ("layers.<i>.<what>"),
// and the linear map (attention's projections are linear maps too).
struct LayerLowering {
  Graph& g;
  std::string prefix;     // "layers.<i>", or "blocks.<r>.<key>" inside a repeat
  bool inRepeat = false;  // a repeat nested in a repeat names its parameters under the prefix

  ValueId param(const std::string& what, Shape shape, const std::string& init);
  // x [..., in] -> [..., units]; activation relu | gelu | gelu_tanh | silu | tanh | sigmoid | none.
  ValueId linear(ValueId x, int64_t units, const std::string& activation, bool bias, const std::string& what);
  // LayerNorm or RmsNorm over the last axis; parameters <what>gain (ones) and <what>bias (zeros).
  ValueId norm(ValueId x, const NormSpec& spec, const std::string& what);
  // pre norm -> body -> residual add (x + body) -> post norm; the norms' parameters are norm_*.
  template <class Body>
  ValueId block(ValueId x, const BlockOptions& b, Body body) {
    ValueId h = b.preNorm.on() ? norm(x, b.preNorm, "norm_") : x;
    h = body(h);
    if (b.residual) h = g.add(OpKind::Add, {x, h});
    return b.postNorm.on() ? norm(h, b.postNorm, "norm_") : h;
  }
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
