// fuse-mlp: a chain of FusedLinear layers whose widths fit on chip becomes one FusedMlp node,
// which the CUDA backend runs as one forward kernel (every layer over a tile of rows kept in
// shared memory) and one backward kernel (activation, weight and bias gradients).
//
// Note on what a layer is. A FusedLinear with activation relu or none and a plain weight [K, N]
// (not transposed), K and N at most kMlpMaxWidth; with none, a Tanh or Sigmoid that is its output's
// only user joins the layer as its activation (fuse-linear leaves those apart). Layer i + 1 reads
// layer i's output, which has no other user and is no graph output: the chain never recomputes
// and never exposes a hidden value. A chain is at least two layers and at most kMlpMaxLayers
// (a longer one is cut and the rest starts a chain of its own).
//
// Note on where it pays. The node runs its products on FFMA, one tile of rows a block; the
// separate layers run theirs on the tensor cores. A chain is fused only where the rows a step
// runs through it are at most mlpMaxRows of its widest layer (common/mlp_limits.h: the measured
// crossovers, which depend on whether the layers' products would run on 16-bit tensor cores:
// PassTarget::operands16Bit); a chain over the limit is left to fuse-linear's layers, and a
// narrower chain further down it (rooted at a later layer) may still be fused.
//
// Note on precision bf16. The node computes in fp32 on the fp32 master weights under every
// precision, as under tf32: at these widths a step is latency-bound (the note in
// kernels/fused_mlp.cuh), so rounding operands to bf16 would lose accuracy and gain no time.
// lower-bf16 stores the values it writes for others (hidden outputs saved for a separate
// backward) in bf16 as it does every activation; fused-mlp-train keeps them on chip and writes
// only fp32 graph outputs, so a small MLP's bf16 step is its fp32 step.
#include <algorithm>

#include "common/mlp_limits.h"
#include "graph/node_attrs.h"
#include "passes/fusion.h"

namespace pa {

namespace {

struct Layer {
  std::vector<NodeId> nodes;  // the FusedLinear, then the absorbed activation node if any
  ValueId x = kNoValue, w = kNoValue, bias = kNoValue, out = kNoValue;
  MlpActivation act = MlpActivation::None;
};

bool fitsWidth(int64_t w) { return w >= 1 && w <= kMlpMaxWidth; }

// The FusedLinear `id` as a layer of a fused MLP (the note above); false when it is none.
bool asLayer(RewriteContext& ctx, NodeId id, Layer& out) {
  const Graph& g = ctx.graph();
  const Node& n = g.node(id);
  if (n.erased || n.op != OpKind::FusedLinear || n.attrs.get<attr::TransposeW>()) return false;
  const std::string act = n.attrs.get<attr::Activation>();
  if (act != "none" && act != "relu") return false;
  const Shape& w = g.shape(n.inputs[1]);
  if (w.size() != 2 || !fitsWidth(w[0]) || !fitsWidth(w[1])) return false;
  if (g.value(n.inputs[0]).type.dtype != DType::F32 || g.value(n.outputs[0]).type.dtype != DType::F32) return false;
  out = Layer{};
  out.nodes = {id};
  out.x = n.inputs[0];
  out.w = n.inputs[1];
  out.bias = n.inputs.size() == 3 ? n.inputs[2] : kNoValue;
  out.out = n.outputs[0];
  out.act = act == "relu" ? MlpActivation::Relu : MlpActivation::None;
  if (out.act == MlpActivation::None && ctx.hasSingleUse(out.out) && !ctx.isOutput(out.out)) {
    const Node& u = g.node(ctx.users(out.out)[0]);
    if (u.op == OpKind::Tanh || u.op == OpKind::Sigmoid) {
      out.act = u.op == OpKind::Tanh ? MlpActivation::Tanh : MlpActivation::Sigmoid;
      out.nodes.push_back(u.id);
      out.out = u.outputs[0];
    }
  }
  return true;
}

// The layer reading `v` when `v` has that one user and is no graph output; false otherwise.
bool nextLayer(RewriteContext& ctx, ValueId v, Layer& out) {
  if (!ctx.hasSingleUse(v) || ctx.isOutput(v)) return false;
  const NodeId u = ctx.users(v)[0];
  return asLayer(ctx, u, out) && out.x == v;
}

class FuseMlpPattern final : public RewritePattern {
public:
  FuseMlpPattern(const PassTarget& target, std::vector<std::string>* notes) : target_(target), notes_(notes) {}
  const char* name() const override { return "mlp"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    std::vector<Layer> chain(1);
    if (!asLayer(ctx, root, chain[0])) return false;
    Layer next;
    while (static_cast<int64_t>(chain.size()) < kMlpMaxLayers && nextLayer(ctx, chain.back().out, next)) chain.push_back(next);
    if (chain.size() < 2) return false;
    Graph& g = ctx.graph();
    const Shape& x = g.shape(chain[0].x);
    int64_t widest = x.empty() ? 1 : x.back(), rows = 1;
    for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
    for (const Layer& l : chain) widest = std::max(widest, g.shape(l.w)[1]);
    const int64_t maxRows = mlpMaxRows(widest, target_.operands16Bit);
    if (rows > maxRows) {
      noteLeftToLayers(ctx, root, rows, widest, maxRows);
      return false;
    }
    std::vector<ValueId> ins{chain[0].x};
    std::vector<MlpActivation> acts;
    std::vector<int64_t> biases;
    std::vector<NodeId> dead;
    for (const Layer& l : chain) {
      ins.push_back(l.w);
      if (l.bias != kNoValue) ins.push_back(l.bias);
      acts.push_back(l.act);
      biases.push_back(l.bias != kNoValue ? 1 : 0);
      dead.insert(dead.end(), l.nodes.begin(), l.nodes.end());
    }
    AttrMap a;
    a.set<attr::MlpActivations>(mlpActivationsString(acts));
    a.set<attr::MlpBiases>(biases);
    const ValueId y = g.add(OpKind::FusedMlp, ins, a);  // its origin and place: the root's (the rewrite driver)
    ctx.replace(chain.back().out, y, dead);
    return true;
  }

private:
  // A --verbose line for a chain left to its layers, once, at its head (a chain rooted at a later
  // layer of it is a part of it; the driver may see the head again once a narrower part fused).
  void noteLeftToLayers(RewriteContext& ctx, NodeId root, int64_t rows, int64_t widest, int64_t maxRows) {
    if (!notes_) return;
    const Graph& g = ctx.graph();
    const ValueId x = g.node(root).inputs[0];
    if (g.value(x).producer >= 0) {
      Layer before, self;
      if (asLayer(ctx, g.value(x).producer, before) && before.out == x && nextLayer(ctx, x, self)) return;
    }
    const std::string why = maxRows == 0 ? "under bf16 the layers' tensor-core GEMMs are as fast or faster at widths over " +
                                               std::to_string(kMlpNarrowWidth)
                                         : "the fused node pays up to " + std::to_string(maxRows) + " rows at that width";
    const Node& head = g.node(root);
    const std::string note = "mlp: the chain of linear layers from " + (head.origin.empty() ? "'" + head.name + "'" : head.origin) +
                             " (" + std::to_string(rows) + " rows, " + std::to_string(widest) +
                             " wide) left to its layers: " + why + " (common/mlp_limits.h)";
    if (std::find(notes_->begin(), notes_->end(), note) == notes_->end()) notes_->push_back(note);
  }

  PassTarget target_;
  std::vector<std::string>* notes_;
};

// fuse-mlp-train (after autodiff and fuse-loss): a FusedMlp, the MseLossGrad of its output y and
// the FusedMlpGrad they feed become one FusedMlpTrain, which the CUDA backend runs as one kernel
// (a tile's forward, loss gradient and backward back to back, the hidden outputs never leaving
// shared memory). Only where nothing else reads what the node keeps inside: the hidden outputs
// go to the gradient node alone, y to the loss, the gradient node and graph outputs (the node
// still writes y), d y to the gradient node; the gradient node computes no dx; and every
// layer's weights and biases fit in shared memory at once (common/mlp_limits.h).
class FuseMlpTrainPattern final : public RewritePattern {
public:
  const char* name() const override { return "mlp-train"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node grad = g.node(root);
    if (grad.erased || grad.op != OpKind::FusedMlpGrad || grad.attrs.get<attr::InputGrad>()) return false;
    const ValueId dy = grad.inputs[0];
    const Node mse = g.producer(dy);
    if (mse.op != OpKind::MseLossGrad || mse.outputs[1] != dy || !ctx.hasSingleUse(dy)) return false;
    const ValueId y = mse.inputs[0];
    const Node fwd = g.producer(y);
    if (fwd.op != OpKind::FusedMlp || fwd.outputs[0] != y) return false;
    if (fwd.attrs.get<attr::MlpActivations>() != grad.attrs.get<attr::MlpActivations>() ||
        fwd.attrs.get<attr::MlpBiases>() != grad.attrs.get<attr::MlpBiases>())
      return false;
    const MlpSpec s = mlpSpecOf(g, fwd);
    const size_t layers = s.layers.size();
    if (grad.inputs[1] != fwd.inputs[0] || grad.inputs[layers + 1] != y) return false;
    int64_t floats = 0;
    for (size_t i = 0; i < layers; ++i) {
      const MlpLayer& l = s.layers[i];
      if (grad.inputs[layers + 2 + i] != fwd.inputs[static_cast<size_t>(l.weightInput)]) return false;
      if (i + 1 < layers) {
        const ValueId h = fwd.outputs[i + 1];
        if (grad.inputs[2 + i] != h || !ctx.hasSingleUse(h)) return false;
      }
      floats += mlpTrainLayerFloats(l.in, l.out, l.bias);
    }
    if (floats > kMlpTrainMaxFloats) return false;
    for (NodeId u : ctx.users(y))
      if (u != root && u != mse.id) return false;
    std::vector<ValueId> ins{fwd.inputs[0], mse.inputs[1], mse.inputs[2]};
    ins.insert(ins.end(), fwd.inputs.begin() + 1, fwd.inputs.end());
    AttrMap a;
    a.set<attr::MlpActivations>(fwd.attrs.get<attr::MlpActivations>());
    a.set<attr::MlpBiases>(fwd.attrs.get<attr::MlpBiases>());
    const Node& train = g.producer(g.add(OpKind::FusedMlpTrain, ins, a));
    const std::vector<ValueId> outs(train.outputs.begin(), train.outputs.end());
    ctx.replace(mse.outputs[0], outs[0], {});
    ctx.replace(y, outs[1], {});
    for (size_t j = 0; j < grad.outputs.size(); ++j)
      ctx.replace(grad.outputs[j], outs[2 + j], j + 1 == grad.outputs.size() ? std::vector<NodeId>{root, mse.id, fwd.id} : std::vector<NodeId>{});
    return true;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFuseMlpTrainPattern() { return std::make_unique<FuseMlpTrainPattern>(); }

std::unique_ptr<RewritePattern> makeFuseMlpPattern(const PassTarget& target, std::vector<std::string>* notes) {
  return std::make_unique<FuseMlpPattern>(target, notes);
}

}  // namespace pa
