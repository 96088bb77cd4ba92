// The layer registry (an explicit list: a static library drops self-registering objects that
// nothing references) and the lowering helpers the kinds share.
#include "frontend/layers/layer.h"

#include <stdexcept>

namespace pa {

// One parser per file of frontend/layers/.
std::unique_ptr<Layer> parseLinearLayer(const CfgNode& body);
std::unique_ptr<Layer> parseAttentionLayer(const CfgNode& body);
std::unique_ptr<Layer> parseMlpLayer(const CfgNode& body);
std::unique_ptr<Layer> parseNormLayer(const CfgNode& body);
std::unique_ptr<Layer> parsePositionLayer(const CfgNode& body);
std::unique_ptr<Layer> parseRepeatLayer(const CfgNode& body);

const std::vector<LayerKind>& layerKinds() {
  static const std::vector<LayerKind> kinds = [] {
    const std::vector<LayerKind> r = {{"linear", &parseLinearLayer}, {"attention", &parseAttentionLayer},
                                      {"mlp", &parseMlpLayer},       {"norm", &parseNormLayer},
                                      {"position", &parsePositionLayer}, {"repeat", &parseRepeatLayer}};
    for (size_t i = 0; i < r.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (std::string(r[i].name) == r[j].name) throw std::logic_error(std::string("layer kind registered twice: ") + r[i].name);
    return r;
  }();
  return kinds;
}

std::shared_ptr<const Layer> parseLayer(const CfgNode& item) {
  std::vector<std::string> names;
  for (const LayerKind& k : layerKinds()) names.push_back(k.name);
  if (!item.isMap() || item.size() != 1) {
    std::string choices;  // "linear or attention", "a, b or c"
    for (size_t i = 0; i < names.size(); ++i)
      choices += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    item.fail("a layer is a map with one key: " + choices);
  }
  const std::string type = item.keys().front();
  for (const LayerKind& k : layerKinds()) {
    if (type != k.name) continue;
    std::unique_ptr<Layer> l = k.parse(item.child(type));
    l->kind = type;
    l->path = item.path();
    l->location = item.location();
    return l;
  }
  item.at(item.yaml().begin()->first).fail("unknown layer '" + type + "'" + suggestion(type, names, "layers"));
}

ValueId LayerLowering::param(const std::string& what, Shape shape, const std::string& init) {
  return g.addParam(prefix + "." + what, shape, init);
}

ValueId LayerLowering::linear(ValueId x, int64_t units, const std::string& activation, bool bias, const std::string& what) {
  const int64_t in = g.shape(x).back();
  const std::string init = activation == "relu" ? "he" : "xavier";
  ValueId h = g.add(OpKind::MatMul, {x, param(what + "weight", {in, units}, init)});
  if (bias) h = g.add(OpKind::Add, {h, param(what + "bias", {units}, "zeros")});
  if (activation == "relu") h = g.add(OpKind::Relu, {h});
  else if (activation == "gelu") h = g.add(OpKind::Gelu, {h});
  else if (activation == "gelu_tanh") h = g.add(OpKind::GeluTanh, {h});
  else if (activation == "silu") h = g.add(OpKind::Silu, {h});
  else if (activation == "tanh") h = g.add(OpKind::Tanh, {h});
  else if (activation == "sigmoid") h = g.add(OpKind::Sigmoid, {h});
  return h;
}

ValueId LayerLowering::norm(ValueId x, const NormSpec& spec, const std::string& what) {
  const int64_t f = g.shape(x).back();
  const AttrMap a = AttrMap().set<attr::Eps>(spec.eps);
  const ValueId gain = param(what + "gain", {f}, "ones");
  if (spec.kind == "rms") return g.add(OpKind::RmsNorm, {x, gain}, a);
  return g.add(OpKind::LayerNorm, {x, gain, param(what + "bias", {f}, "zeros")}, a);
}

NormSpec parseNormSpec(const CfgNode& n) {
  NormSpec s;
  if (n.isScalar()) {
    s.kind = n.asString();
    if (s.kind != "layer" && s.kind != "rms") n.fail("expected layer or rms (or a map {kind: layer|rms, eps: 1e-5}), got '" + s.kind + "'");
    return s;
  }
  if (!n.isMap()) n.fail("expected layer, rms or a map {kind: layer|rms, eps: 1e-5}");
  n.checkKeys({"kind", "eps"});
  if (!n.has("kind")) n.fail("missing required key 'kind' (layer or rms)");
  s.kind = n.getChoice("kind", "", {"layer", "rms"});
  s.eps = n.getPositive("eps", s.eps, 1.0);
  return s;
}

std::string printNorm(const NormSpec& n) { return "{kind: " + n.kind + ", eps: " + exactNumber(n.eps) + "}"; }

BlockOptions parseBlockOptions(const CfgNode& n) {
  BlockOptions b;
  b.residual = n.getBool("residual", false);
  if (n.has("pre_norm")) b.preNorm = parseNormSpec(n.child("pre_norm"));
  if (n.has("post_norm")) b.postNorm = parseNormSpec(n.child("post_norm"));
  if (b.preNorm.on() && b.postNorm.on())
    n.child("post_norm").fail("a layer takes pre_norm or post_norm, not both (use a norm layer for the other)");
  return b;
}

std::string printBlockOptions(const BlockOptions& b) {
  std::string s = std::string(", residual: ") + (b.residual ? "true" : "false");
  if (b.preNorm.on()) s += ", pre_norm: " + printNorm(b.preNorm);
  if (b.postNorm.on()) s += ", post_norm: " + printNorm(b.postNorm);
  return s;
}


}  // namespace pa
