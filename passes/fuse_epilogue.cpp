// Backward epilogue fusions, after autodiff: the MSE loss with its gradient (fuse-loss), and a
// weight-gradient GEMM with the bias gradient of the same layer (fuse-bias-grad).
#include <unordered_set>

#include "graph/node_attrs.h"
#include "passes/fusion.h"

namespace pa {

namespace {

// Whether `from` can reach `v` through producers (v depends on from).
bool dependsOn(const Graph& g, ValueId v, ValueId from) {
  std::vector<ValueId> todo{v};
  std::unordered_set<ValueId> seen;
  while (!todo.empty()) {
    const ValueId x = todo.back();
    todo.pop_back();
    if (x == from) return true;
    if (!seen.insert(x).second) continue;
    for (ValueId in : g.producer(x).inputs) todo.push_back(in);
  }
  return false;
}

// The user of `v` when it has exactly one (and is no graph output) and that user is of kind `op`.
const Node* soleUser(RewriteContext& ctx, ValueId v, OpKind op) {
  if (!ctx.hasSingleUse(v) || ctx.users(v).empty()) return nullptr;
  const Node& u = ctx.graph().node(ctx.users(v)[0]);
  return u.op == op ? &u : nullptr;
}

// MseLoss(p, t) and its gradient, Mul(Scale(Sub(p, t), 2/N), dy) as autodiff writes it (the Sub
// and Scale used once), become one MseLossGrad(p, t, dy) writing the loss and d p: one kernel
// reads p and t once for both. dy must not depend on the loss (the fused node computes the two
// together); in a training step it is the constant seed. The gradient of t, Scale(d p, -1), stays
// as it was.
class FuseLossGradPattern final : public RewritePattern {
public:
  const char* name() const override { return "loss-grad"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node loss = g.node(root);
    if (loss.op != OpKind::MseLoss) return false;
    const ValueId p = loss.inputs[0], t = loss.inputs[1];
    const double count = static_cast<double>(numel(g.shape(p)));
    for (NodeId subId : ctx.users(p)) {
      const Node& sub = g.node(subId);
      if (sub.op != OpKind::Sub || sub.inputs[0] != p || sub.inputs[1] != t) continue;
      const Node* scale = soleUser(ctx, sub.outputs[0], OpKind::Scale);
      if (!scale || scale->attrs.get<attr::ScaleFactor>() != (count ? 2.0 / count : 0.0)) continue;
      const Node* mul = soleUser(ctx, scale->outputs[0], OpKind::Mul);
      if (!mul || mul->inputs[0] == mul->inputs[1]) continue;
      const ValueId dy = mul->inputs[0] == scale->outputs[0] ? mul->inputs[1] : mul->inputs[0];
      if (numel(g.shape(dy)) != 1 || g.shape(mul->outputs[0]) != g.shape(p) || dependsOn(g, dy, loss.outputs[0])) continue;
      const NodeId scaleId = scale->id, mulId = mul->id;
      const ValueId lossOut = loss.outputs[0], gradOut = mul->outputs[0];
      const Node& fused = g.producer(g.add(OpKind::MseLossGrad, {p, t, dy}));
      const ValueId fusedLoss = fused.outputs[0], fusedGrad = fused.outputs[1];
      ctx.replace(lossOut, fusedLoss, {});
      ctx.replace(gradOut, fusedGrad, {root, subId, scaleId, mulId});
      return true;
    }
    return false;
  }
};

// A layer's weight gradient X2ᵀ·D2 (or D2ᵀ·X2 for a transposed weight) and its bias gradient
// SumTo(D, [N]), D2 being D or D reshaped to [rows, N], become one MatMulBiasGrad whose second
// output is the bias gradient: the sums over the product's K of D2, the operand it already reads.
class FuseBiasGradPattern final : public RewritePattern {
public:
  const char* name() const override { return "bias-grad"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node sum = g.node(root);
    if (sum.op != OpKind::SumTo) return false;
    const ValueId d = sum.inputs[0];
    const Shape& ds = g.shape(d);
    const Shape& bias = g.shape(sum.outputs[0]);
    if (ds.size() < 2 || bias.size() != 1 || bias[0] != ds.back()) return false;
    const int64_t units = ds.back(), rows = numel(ds) / std::max<int64_t>(units, 1);
    // The candidates for D2: D itself when it is a matrix, and its reshapes to [rows, N].
    std::vector<ValueId> d2s;
    if (ds.size() == 2) d2s.push_back(d);
    for (NodeId u : ctx.users(d)) {
      const Node& r = g.node(u);
      if (r.op == OpKind::Reshape && g.shape(r.outputs[0]) == Shape{rows, units}) d2s.push_back(r.outputs[0]);
    }
    for (ValueId d2 : d2s) {
      for (NodeId u : ctx.users(d2)) {
        const Node& mm = g.node(u);
        if (mm.op != OpKind::MatMul || !mm.attrs.get<attr::TransposeA>() || mm.inputs[0] == mm.inputs[1]) continue;
        if (g.shape(mm.inputs[0]).size() != 2 || g.shape(mm.inputs[1]).size() != 2) continue;
        // Bᵀ-free: D2 as B [K, N] (X2ᵀ·D2), or as the transposed A (D2ᵀ·X2).
        const bool ofB = mm.inputs[1] == d2 && !mm.attrs.get<attr::TransposeB>();
        const bool ofA = mm.inputs[0] == d2;
        if (!ofB && !ofA) continue;
        AttrMap a;
        a.set<attr::TransposeA>(true).set<attr::TransposeB>(mm.attrs.get<attr::TransposeB>());
        a.set<attr::BiasOperand>(std::string(ofB ? "b" : "a"));
        const NodeId mmId = mm.id;
        const ValueId product = mm.outputs[0], sumOut = sum.outputs[0];
        const Node& fused = g.producer(g.add(OpKind::MatMulBiasGrad, {mm.inputs[0], mm.inputs[1]}, a));
        const ValueId fusedProduct = fused.outputs[0], fusedSum = fused.outputs[1];
        ctx.replace(product, fusedProduct, {});
        ctx.replace(sumOut, fusedSum, {root, mmId});
        return true;
      }
    }
    return false;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFuseLossGradPattern() { return std::make_unique<FuseLossGradPattern>(); }
std::unique_ptr<RewritePattern> makeFuseBiasGradPattern() { return std::make_unique<FuseBiasGradPattern>(); }

}  // namespace pa
