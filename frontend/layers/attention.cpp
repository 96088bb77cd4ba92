// The `attention` layer: projections, reshapes to [batch, heads, seq, head_dim] (rotary
// positions on Q and K as [batch, seq, heads, head_dim], before the permute), MatMul(Q, Kᵀ),
// Scale, AttentionMask, Softmax (with optional sink logits), MatMul(P, V), the output projection,
// and the block's norms and residual Add; fuse-attention finds it again.
#include <cmath>

#include "common/errors.h"
#include "frontend/layers/layer.h"

namespace pa {

namespace {

class AttentionLayer : public Layer {
public:
  int64_t heads = 1, kvHeads = 0, headDim = 0;  // kvHeads 0: = heads; headDim 0: width / heads
  bool causal = false;
  std::string align = "top-left";
  int64_t windowLeft = -1, windowRight = -1;  // -1: unbounded
  int64_t sinks = 0;
  bool sinkLogits = false;
  bool bias = true;
  bool rope = false;
  double ropeBase = 10000.0;
  int64_t ropeDims = 0;  // 0: the whole head
  bool ropeInterleaved = false;
  BlockOptions block;

  ValueId lower(LayerLowering& L, ValueId x) const override;
  ValueId attend(LayerLowering& L, ValueId x) const;
  // Valid YAML that parses back to this layer: an unbounded window side and a head_dim derived
  // from the width (known only when the layer is lowered) are left out.
  std::string resolved() const override {
    auto b = [](bool v) { return v ? "true" : "false"; };
    std::string window;
    if (windowLeft >= 0) window += "left: " + std::to_string(windowLeft);
    if (windowRight >= 0) window += (window.empty() ? "" : ", ") + std::string("right: ") + std::to_string(windowRight);
    return "attention: {heads: " + std::to_string(heads) + ", kv_heads: " + std::to_string(kvHeads) +
           (headDim ? ", head_dim: " + std::to_string(headDim) : std::string()) + ", causal: " + b(causal) +
           ", align: " + align + ", window: {" + window + "}, sinks: " + std::to_string(sinks) +
           ", sink_logits: " + b(sinkLogits) + ", bias: " + b(bias) +
           (rope ? ", rope: {base: " + exactNumber(ropeBase) + ", dims: " + std::to_string(ropeDims) +
                       ", interleaved: " + b(ropeInterleaved) + "}"
                 : std::string()) +
           printBlockOptions(block) + "}";
  }
};

ValueId AttentionLayer::lower(LayerLowering& L, ValueId x) const {
  const Shape xs = L.g.shape(x);
  if (xs.size() != 3)
    throw ConfigError(location, path + ".attention", "needs a sequence input [seq, features] per sample, got " +
                                                         shapeString(Shape(xs.begin() + 1, xs.end())) +
                                                         " (set model.input, e.g. [64, 1])");
  return L.block(x, block, [&](ValueId h) { return attend(L, h); });
}

ValueId AttentionLayer::attend(LayerLowering& L, ValueId x) const {
  Graph& g = L.g;
  const Shape xs = g.shape(x);
  const int64_t width = xs[2], seq = xs[1], batch = xs[0];
  if (headDim == 0 && width % heads != 0)
    throw ConfigError(location, path + ".attention.heads", std::to_string(heads) + " heads do not divide the width " +
                                                               std::to_string(width) + " (set head_dim, or change heads)");
  const int64_t hd = headDim ? headDim : width / heads;
  const int64_t hq = heads, hk = kvHeads;
  if (rope && (ropeDims ? ropeDims : hd) % 2 != 0)
    throw ConfigError(location, path + ".attention.rope.dims", "rotary positions turn pairs of features, but the head dim " +
                                                                   std::to_string(hd) + " is odd (set rope.dims to an even count)");
  if (rope && ropeDims > hd)
    throw ConfigError(location, path + ".attention.rope.dims", std::to_string(ropeDims) + " exceeds the head dim " + std::to_string(hd));
  // [B, S, heads*hd] -> [B, S, heads, hd] (rotated, for q and k) -> [B, heads, S, hd]
  auto split = [&](ValueId v, int64_t h, bool rotate) {
    ValueId r = g.add(OpKind::Reshape, {v}, AttrMap().set<attr::Shape>({batch, seq, h, hd}));
    if (rotate)
      r = g.add(OpKind::Rope, {r},
                AttrMap().set<attr::Layout>("bshd").set<attr::RopeBase>(ropeBase).set<attr::RopeDims>(ropeDims)
                    .set<attr::Interleaved>(ropeInterleaved));
    return g.add(OpKind::Permute, {r}, AttrMap().set<attr::Perm>({0, 2, 1, 3}));
  };
  ValueId q = split(L.linear(x, hq * hd, "none", bias, "q_"), hq, rope);
  ValueId k = split(L.linear(x, hk * hd, "none", bias, "k_"), hk, rope);
  ValueId v = split(L.linear(x, hk * hd, "none", bias, "v_"), hk, false);
  if (hk != hq) {
    const AttrMap rep = AttrMap().set<attr::RepeatAxis>(1).set<attr::Repeats>(hq / hk);
    k = g.add(OpKind::RepeatHeads, {k}, rep);
    v = g.add(OpKind::RepeatHeads, {v}, rep);
  }
  ValueId s = g.add(OpKind::MatMul, {q, k}, AttrMap().set<attr::TransposeB>(true));
  s = g.add(OpKind::Scale, {s}, AttrMap().set<attr::ScaleFactor>(1.0 / std::sqrt(static_cast<double>(hd))));
  if (causal || windowLeft >= 0 || windowRight >= 0) {
    s = g.add(OpKind::AttentionMask, {s},
              AttrMap()
                  .set<attr::Causal>(causal)
                  .set<attr::Align>(align)
                  .set<attr::WindowLeft>(windowLeft)
                  .set<attr::WindowRight>(windowRight)
                  .set<attr::Sinks>(sinks));
  }
  ValueId p;
  if (sinkLogits) {
    // One learnable logit per head joins every row's softmax denominator (gpt-oss sinks).
    ValueId sink = L.param("sink_logits", {hq}, "zeros");
    sink = g.add(OpKind::Reshape, {sink}, AttrMap().set<attr::Shape>({hq, 1, 1}));
    p = g.add(OpKind::Softmax, {s, sink}, AttrMap().set<attr::Axis>(-1));
  } else {
    p = g.add(OpKind::Softmax, {s}, AttrMap().set<attr::Axis>(-1));
  }
  ValueId o = g.add(OpKind::MatMul, {p, v});
  o = g.add(OpKind::Permute, {o}, AttrMap().set<attr::Perm>({0, 2, 1, 3}));
  o = g.add(OpKind::Reshape, {o}, AttrMap().set<attr::Shape>({batch, seq, hq * hd}));
  return L.linear(o, width, "none", bias, "o_");
}

}  // namespace

std::unique_ptr<Layer> parseAttentionLayer(const CfgNode& n) {
  auto l = std::make_unique<AttentionLayer>();
  n.checkKeys({"heads", "kv_heads", "head_dim", "causal", "align", "window", "sinks", "sink_logits", "bias", "rope", "residual",
               "pre_norm", "post_norm"});
  l->heads = n.getIntIn("heads", l->heads, 1, 4096);
  l->kvHeads = n.getIntIn("kv_heads", l->heads, 1, 4096);
  if (l->heads % l->kvHeads != 0)
    n.child("kv_heads").fail("kv_heads (" + std::to_string(l->kvHeads) + ") must divide heads (" +
                             std::to_string(l->heads) + ")");
  l->headDim = n.getIntIn("head_dim", 0, 1, 1 << 16);
  l->causal = n.getBool("causal", l->causal);
  l->align = n.getChoice("align", l->align, {"top-left", "bottom-right"});
  if (n.has("window")) {
    const CfgNode w = n.child("window");
    if (w.isScalar()) {
      // A single number is a causal-style look-back: `window: 16` == {left: 16}.
      l->windowLeft = w.asInt();
      if (l->windowLeft < 0) w.fail("must be >= 0 (a window is an inclusive offset), got " + std::to_string(l->windowLeft));
    } else {
      if (!w.isMap()) w.fail("expected a number L or a map {left: L, right: R}, got " + std::string(w.isSequence() ? "a list" : "nothing"));
      w.checkKeys({"left", "right"});
      l->windowLeft = w.getInt("left", -1);
      l->windowRight = w.getInt("right", -1);
      if (w.has("left") && l->windowLeft < 0) w.child("left").fail("must be >= 0, got " + std::to_string(l->windowLeft));
      if (w.has("right") && l->windowRight < 0) w.child("right").fail("must be >= 0, got " + std::to_string(l->windowRight));
    }
  }
  if (n.has("sinks") && n.child("sinks").asInt() < 0)
    n.child("sinks").fail("must be >= 0, got " + std::to_string(n.child("sinks").asInt()));
  l->sinks = n.getInt("sinks", 0);
  l->sinkLogits = n.getBool("sink_logits", l->sinkLogits);
  l->bias = n.getBool("bias", l->bias);
  if (n.has("rope")) {
    const CfgNode r = n.child("rope");
    if (r.isScalar()) {
      l->rope = r.asBool();  // `rope: true`: every default
    } else {
      if (!r.isMap()) r.fail("expected true, false or a map {base: 10000, dims: 0, interleaved: false}");
      r.checkKeys({"base", "dims", "interleaved"});
      l->rope = true;
      l->ropeBase = r.getPositive("base", l->ropeBase, 1e12);
      l->ropeDims = r.getIntIn("dims", 0, 0, 1 << 16);
      if (l->ropeDims % 2 != 0) r.child("dims").fail("must be even (features turn in pairs), got " + std::to_string(l->ropeDims));
      l->ropeInterleaved = r.getBool("interleaved", false);
    }
  }
  l->block = parseBlockOptions(n);
  return l;
}

}  // namespace pa
