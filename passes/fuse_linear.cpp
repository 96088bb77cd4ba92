// fuse-linear: MatMul(x, W) -> Add(bias) -> ReLU | GELU becomes one FusedLinear node, and a
// SwiGLU's two projections one FusedLinear over their interleaved weights.
//
// Note on shared intermediates: the chain stops at the first value with another user (or that
// is a graph output), and a MatMul whose own output is shared is not fused at all. Recomputing
// a shared GEMM would cost a second matmul to save one elementwise pass, which is never
// cheaper, so this pass never recomputes. A chain cut after the Add still fuses MatMul + bias.
#include "passes/fusion.h"

namespace pa {

namespace {

// The bias operand of an Add over the matmul result `m` ([..., N]): a value of N elements
// whose shape is [N] or [1, ..., 1, N] and no longer than m's, so broadcasting adds it to
// every row. Returns kNoValue when `other` is no such bias.
ValueId asBias(const Graph& g, ValueId other, ValueId m) {
  const Shape& b = g.shape(other);
  const Shape& ms = g.shape(m);
  if (b.empty() || b.back() != ms.back() || b.size() > ms.size()) return kNoValue;
  for (size_t i = 0; i + 1 < b.size(); ++i)
    if (b[i] != 1) return kNoValue;
  return other;
}

class FuseLinearPattern final : public RewritePattern {
public:
  const char* name() const override { return "linear"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node mm = g.node(root);
    if (mm.op != OpKind::MatMul || mm.attrs.get<attr::TransposeA>()) return false;
    if (g.shape(mm.inputs[1]).size() != 2) return false;  // a batched right side is no layer weight
    std::vector<NodeId> chain{mm.id};
    ValueId cur = mm.outputs[0], bias = kNoValue;
    std::string act = "none";
    if (ctx.hasSingleUse(cur)) {
      const Node& u = g.node(ctx.users(cur)[0]);
      if (u.op == OpKind::Add) {
        const ValueId other = u.inputs[0] == cur ? u.inputs[1] : u.inputs[0];
        if (u.inputs[0] != u.inputs[1]) bias = asBias(g, other, cur);
        if (bias != kNoValue) {
          chain.push_back(u.id);
          cur = u.outputs[0];
        }
      }
    }
    if (ctx.hasSingleUse(cur)) {
      const Node& u = g.node(ctx.users(cur)[0]);
      if (u.op == OpKind::Relu || u.op == OpKind::Gelu) {
        act = u.op == OpKind::Relu ? "relu" : "gelu";
        chain.push_back(u.id);
        cur = u.outputs[0];
      }
    }
    if (chain.size() == 1) return false;  // a bare matmul is not a linear layer
    const int64_t units = g.shape(mm.outputs[0]).back();
    std::vector<ValueId> ins{mm.inputs[0], mm.inputs[1]};
    if (bias != kNoValue) {
      if (g.shape(bias) != Shape{units}) {
        AttrMap r;
        r.set<attr::Shape>(std::vector<int64_t>{units});
        bias = g.add(OpKind::Reshape, {bias}, r);
      }
      ins.push_back(bias);
    }
    AttrMap a;
    a.set<attr::Activation>(act);
    if (mm.attrs.get<attr::TransposeB>()) a.set<attr::TransposeW>(true);
    const ValueId fused = g.add(OpKind::FusedLinear, ins, a);
    ctx.replace(cur, fused, chain);
    return true;
  }
};

}  // namespace

bool asLinearMap(RewriteContext& ctx, ValueId v, LinearMap& out) {
  const Graph& g = ctx.graph();
  if (!ctx.hasSingleUse(v)) return false;
  if (const Node* f = ctx.producerIf(v, OpKind::FusedLinear)) {
    if (f->attrs.get<attr::Activation>() != "none" || f->attrs.get<attr::TransposeW>()) return false;
    out = {f->inputs[0], f->inputs[1], f->inputs.size() == 3 ? f->inputs[2] : kNoValue, f->id};
    return true;
  }
  if (const Node* m = ctx.producerIf(v, OpKind::MatMul)) {
    if (m->attrs.get<attr::TransposeA>() || m->attrs.get<attr::TransposeB>() || g.shape(m->inputs[1]).size() != 2) return false;
    out = {m->inputs[0], m->inputs[1], kNoValue, m->id};
    return true;
  }
  return false;
}

namespace {

// SwiGLU: Mul(Silu(x·Wg [+ bg]), x·Wu [+ bu]) becomes one FusedLinear (activation swiglu) over
// the weights interleaved column by column (gate, up), so both projections are one GEMM, and so
// are their dX and dW products in the backward.
class FuseSwigluPattern final : public RewritePattern {
public:
  const char* name() const override { return "swiglu"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node mul = g.node(root);
    if (mul.op != OpKind::Mul || mul.inputs[0] == mul.inputs[1]) return false;
    for (int gateSide = 0; gateSide < 2; ++gateSide) {
      const Node* silu = ctx.producerIf(mul.inputs[static_cast<size_t>(gateSide)], OpKind::Silu);
      if (!silu || !ctx.hasSingleUse(silu->outputs[0])) continue;
      LinearMap gate, up;
      if (!asLinearMap(ctx, silu->inputs[0], gate) || !asLinearMap(ctx, mul.inputs[static_cast<size_t>(1 - gateSide)], up)) continue;
      if (gate.x != up.x || g.shape(gate.w) != g.shape(up.w) || (gate.bias == kNoValue) != (up.bias == kNoValue)) continue;
      if (g.shape(mul.outputs[0]) != g.shape(silu->outputs[0])) continue;  // no broadcasting in the product
      if (gate.bias != kNoValue && g.shape(gate.bias) != g.shape(up.bias)) continue;
      std::vector<ValueId> ins{gate.x, g.add(OpKind::Interleave, {gate.w, up.w})};
      if (gate.bias != kNoValue) ins.push_back(g.add(OpKind::Interleave, {gate.bias, up.bias}));
      const ValueId fused = g.add(OpKind::FusedLinear, ins, AttrMap().set<attr::Activation>("swiglu"));
      const NodeId siluId = silu->id;
      ctx.replace(mul.outputs[0], fused, {root, siluId, gate.node, up.node});
      return true;
    }
    return false;
  }
};

// After autodiff: a layer's incoming gradient is a MatMul (the next layer's dX), and the first
// thing done with it is the activation's derivative, ReluGrad(dy, x) or GeluGrad(dy, x). The
// pair becomes one MatMulActGrad, the derivative applied as the GEMM's epilogue, which saves a
// pass over the gradient (a read and a write of it, and a read of x, per layer).
class FuseLinearGradPattern final : public RewritePattern {
public:
  const char* name() const override { return "linear-grad"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node r = g.node(root);
    if (r.op != OpKind::ReluGrad && r.op != OpKind::GeluGrad) return false;
    const ValueId dy = r.inputs[0];
    const Node* mm = ctx.producerIf(dy, OpKind::MatMul);
    if (!mm || !ctx.hasSingleUse(dy) || ctx.isOutput(dy) || r.inputs[1] == dy) return false;
    if (g.shape(r.inputs[1]) != g.shape(dy)) return false;  // the epilogue reads x at the product's index
    AttrMap a;
    a.set<attr::GradActivation>(std::string(r.op == OpKind::ReluGrad ? "relu" : "gelu"));
    a.set<attr::TransposeA>(mm->attrs.get<attr::TransposeA>());
    a.set<attr::TransposeB>(mm->attrs.get<attr::TransposeB>());
    const std::vector<NodeId> dead{root, mm->id};
    const ValueId fused = g.add(OpKind::MatMulActGrad, {mm->inputs[0], mm->inputs[1], r.inputs[1]}, a);
    ctx.replace(r.outputs[0], fused, dead);
    return true;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFuseLinearPattern() { return std::make_unique<FuseLinearPattern>(); }
std::unique_ptr<RewritePattern> makeFuseLinearGradPattern() { return std::make_unique<FuseLinearGradPattern>(); }
std::unique_ptr<RewritePattern> makeFuseSwigluPattern() { return std::make_unique<FuseSwigluPattern>(); }

}  // namespace pa
