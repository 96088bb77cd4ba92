// Reverse-mode autodiff over the op table: one gradient rule per op of ops.def. Rules emit
// ordinary graph nodes, so the backward graph is fused, printed and executed like the forward.
#include "passes/autodiff.h"

#include <stdexcept>

#include "graph/elementwise_expr.h"
#include "graph/node_attrs.h"

namespace pa {

namespace {

struct GradCtx {
  Graph& g;
  const Node& n;
  ValueId dy;                       // gradient of the node's first output (kNoValue when only another output has one)
  llvm::SmallVector<ValueId, 4> dys; // gradient of each output, kNoValue when none
  const std::vector<char>& needs;   // needs[v]: v depends on a value we differentiate for
  llvm::SmallVector<ValueId, 4> dx; // result per input, kNoValue when none

  bool wants(int i) const { return needs[n.inputs[i]]; }
  ValueId in(int i) const { return n.inputs[i]; }
  ValueId out() const { return n.outputs[0]; }
  const Shape& shape(ValueId v) const { return g.shape(v); }

  ValueId op(OpKind k, llvm::ArrayRef<ValueId> ins, AttrMap a = {}) { return g.add(k, ins, std::move(a)); }
  ValueId scale(ValueId v, double f) {
    AttrMap a;
    a.set<attr::ScaleFactor>(f);
    return op(OpKind::Scale, {v}, a);
  }
  // Undoes numpy broadcasting: sums `v` down to `target` when their shapes differ.
  ValueId sumTo(ValueId v, const Shape& target) {
    if (shape(v) == target) return v;
    AttrMap a;
    a.set<attr::Shape>(std::vector<int64_t>(target.begin(), target.end()));
    return op(OpKind::SumTo, {v}, a);
  }
  ValueId reshape(ValueId v, const Shape& s) {
    if (shape(v) == s) return v;
    AttrMap a;
    a.set<attr::Shape>(std::vector<int64_t>(s.begin(), s.end()));
    return op(OpKind::Reshape, {v}, a);
  }
  ValueId matmul(ValueId a, ValueId b, bool ta, bool tb) {
    AttrMap at;
    at.set<attr::TransposeA>(ta);
    at.set<attr::TransposeB>(tb);
    return op(OpKind::MatMul, {a, b}, at);
  }
  void give(int i, ValueId v) { dx[i] = v; }
};

[[noreturn]] void noRule(GradCtx& c) {
  throw std::logic_error(std::string("autodiff: op '") + opName(c.n.op) + "' (node '" + c.n.name +
                         "') is backward-only; its own gradient is not supported");
}

void gradInput(GradCtx&) {}
void gradParam(GradCtx&) {}
void gradConstant(GradCtx&) {}

// Sums the leading (batch) axes of a batched matmul result down to a plain matrix.
ValueId sumBatch(GradCtx& c, ValueId v, const Shape& matrixShape) { return c.sumTo(v, matrixShape); }

void gradMatMul(GradCtx& c) {
  // With C = op(A)·op(B) and G = dC: d op(A) = G·op(B)ᵀ and d op(B) = op(A)ᵀ·G.
  const bool ta = c.n.attrs.get<attr::TransposeA>(), tb = c.n.attrs.get<attr::TransposeB>();
  const ValueId a = c.in(0), b = c.in(1), g = c.dy;
  const Shape sa = c.shape(a), sb = c.shape(b);
  if (c.wants(0)) {
    ValueId da = ta ? c.matmul(b, g, tb, true) : c.matmul(g, b, false, !tb);
    c.give(0, sumBatch(c, da, sa));
  }
  if (c.wants(1)) {
    ValueId db;
    if (sb.size() == 2 && sa.size() > 2 && !ta) {
      // A shared weight under a batched input: flatten the batch into rows, one GEMM.
      const int64_t k = sa.back();
      const ValueId a2 = c.reshape(a, Shape{numel(sa) / k, k});
      const ValueId g2 = c.reshape(g, Shape{numel(sa) / k, c.shape(g).back()});
      db = tb ? c.matmul(g2, a2, true, false) : c.matmul(a2, g2, true, false);
    } else {
      db = tb ? c.matmul(g, a, true, ta) : c.matmul(a, g, !ta, false);
    }
    c.give(1, sumBatch(c, db, sb));
  }
}

void gradAdd(GradCtx& c) {
  if (c.wants(0)) c.give(0, c.sumTo(c.dy, c.shape(c.in(0))));
  if (c.wants(1)) c.give(1, c.sumTo(c.dy, c.shape(c.in(1))));
}
void gradSub(GradCtx& c) {
  if (c.wants(0)) c.give(0, c.sumTo(c.dy, c.shape(c.in(0))));
  if (c.wants(1)) c.give(1, c.scale(c.sumTo(c.dy, c.shape(c.in(1))), -1.0));
}
void gradMul(GradCtx& c) {
  if (c.wants(0)) c.give(0, c.sumTo(c.op(OpKind::Mul, {c.dy, c.in(1)}), c.shape(c.in(0))));
  if (c.wants(1)) c.give(1, c.sumTo(c.op(OpKind::Mul, {c.dy, c.in(0)}), c.shape(c.in(1))));
}
void gradDiv(GradCtx& c) {
  if (c.wants(0)) c.give(0, c.sumTo(c.op(OpKind::Div, {c.dy, c.in(1)}), c.shape(c.in(0))));
  if (c.wants(1)) {
    // d(a/b)/db = -(a/b)/b, reusing the forward output.
    const ValueId t = c.op(OpKind::Div, {c.op(OpKind::Mul, {c.dy, c.out()}), c.in(1)});
    c.give(1, c.scale(c.sumTo(t, c.shape(c.in(1))), -1.0));
  }
}
void gradScale(GradCtx& c) { c.give(0, c.scale(c.dy, c.n.attrs.get<attr::ScaleFactor>())); }
void gradCast(GradCtx& c) {
  AttrMap a;
  a.set<attr::DType>(std::string(dtypeName(c.g.value(c.in(0)).type.dtype)));
  c.give(0, c.op(OpKind::Cast, {c.dy}, a));
}
void gradRelu(GradCtx& c) { c.give(0, c.op(OpKind::ReluGrad, {c.dy, c.in(0)})); }
void gradGelu(GradCtx& c) { c.give(0, c.op(OpKind::GeluGrad, {c.dy, c.in(0)})); }
void gradTanh(GradCtx& c) { c.give(0, c.op(OpKind::TanhGrad, {c.dy, c.out()})); }
void gradSigmoid(GradCtx& c) { c.give(0, c.op(OpKind::SigmoidGrad, {c.dy, c.out()})); }
void gradExp(GradCtx& c) { c.give(0, c.op(OpKind::Mul, {c.dy, c.out()})); }
void gradSilu(GradCtx& c) { c.give(0, c.op(OpKind::SiluGrad, {c.dy, c.in(0)})); }
void gradGeluTanh(GradCtx& c) { c.give(0, c.op(OpKind::GeluTanhGrad, {c.dy, c.in(0)})); }

// A norm's gradient node reads what was normalised (the sum, when the node also added a
// residual), the gain and the saved row statistics; the sum's own gradient (from its other uses)
// joins dx inside the node, and x and the residual both receive that dx.
void normGrad(GradCtx& c, OpKind gradOp, int params, int stats) {
  const bool fused = static_cast<int>(c.n.inputs.size()) == params + 2;
  const ValueId dsum = fused ? c.dys[static_cast<size_t>(1 + stats)] : kNoValue;
  if (c.dy == kNoValue) {  // only the sum is used on: the norm's output has no gradient
    if (dsum == kNoValue) return;
    c.give(0, dsum);
    c.give(params + 1, dsum);
    return;
  }
  llvm::SmallVector<ValueId, 6> ins{c.dy, fused ? c.n.outputs[static_cast<size_t>(1 + stats)] : c.in(0)};
  ins.push_back(c.in(1));  // the gain
  for (int i = 0; i < stats; ++i) ins.push_back(c.n.outputs[static_cast<size_t>(1 + i)]);
  if (dsum != kNoValue) ins.push_back(dsum);
  AttrMap a;
  a.set<attr::Eps>(c.n.attrs.get<attr::Eps>());
  const Node& grad = c.g.producer(c.op(gradOp, ins, a));
  if (c.wants(0)) c.give(0, grad.outputs[0]);
  if (fused && c.wants(params + 1)) c.give(params + 1, grad.outputs[0]);
  for (int i = 1; i <= params; ++i)
    if (c.wants(i)) c.give(i, grad.outputs[static_cast<size_t>(i)]);
}
void gradLayerNorm(GradCtx& c) { normGrad(c, OpKind::LayerNormGrad, 2, 2); }
void gradRmsNorm(GradCtx& c) { normGrad(c, OpKind::RmsNormGrad, 1, 1); }

void gradRope(GradCtx& c) {
  AttrMap a = c.n.attrs;
  a.set<attr::Inverse>(!c.n.attrs.get<attr::Inverse>());  // a rotation's transpose is its inverse
  c.give(0, c.op(OpKind::Rope, {c.dy}, a));
}

void gradSoftmax(GradCtx& c) {
  AttrMap a;
  a.set<attr::Axis>(c.n.attrs.get<attr::Axis>());
  if (c.wants(0)) c.give(0, c.op(OpKind::SoftmaxGrad, {c.dy, c.out()}, a));
  if (c.n.inputs.size() == 2 && c.wants(1))
    c.give(1, c.sumTo(c.op(OpKind::SoftmaxSinkGrad, {c.dy, c.out()}, a), c.shape(c.in(1))));
}

void gradPermute(GradCtx& c) {
  const std::vector<int64_t> perm = c.n.attrs.get<attr::Perm>();
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  AttrMap a;
  a.set<attr::Perm>(inv);
  c.give(0, c.op(OpKind::Permute, {c.dy}, a));
}
void gradReshape(GradCtx& c) { c.give(0, c.reshape(c.dy, c.shape(c.in(0)))); }
void gradBroadcastTo(GradCtx& c) { c.give(0, c.sumTo(c.dy, c.shape(c.in(0)))); }

// Gradient of a reduction: reshape to keep-dims form, broadcast back, scale for a mean.
void reductionGrad(GradCtx& c, bool mean) {
  const Shape& x = c.shape(c.in(0));
  const std::vector<bool> reduced = reducedAxes(c.n, x);
  Shape keep;
  int64_t count = 1;
  for (size_t d = 0; d < x.size(); ++d) {
    keep.push_back(reduced[d] ? 1 : x[d]);
    count *= reduced[d] ? x[d] : 1;
  }
  AttrMap a;
  a.set<attr::Shape>(std::vector<int64_t>(x.begin(), x.end()));
  ValueId g = c.op(OpKind::BroadcastTo, {c.reshape(c.dy, keep)}, a);
  if (mean) g = c.scale(g, count ? 1.0 / static_cast<double>(count) : 0.0);
  c.give(0, g);
}
void gradSum(GradCtx& c) { reductionGrad(c, false); }
void gradMean(GradCtx& c) { reductionGrad(c, true); }
void gradSumTo(GradCtx& c) {
  const Shape& x = c.shape(c.in(0));
  AttrMap a;
  a.set<attr::Shape>(std::vector<int64_t>(x.begin(), x.end()));
  c.give(0, c.op(OpKind::BroadcastTo, {c.dy}, a));
}

void gradAttentionMask(GradCtx& c) {
  AttrMap a = c.n.attrs;
  a.set<attr::Fill>(0.0);  // masked scores get no gradient
  c.give(0, c.op(OpKind::AttentionMask, {c.dy}, a));
}

void gradRepeatHeads(GradCtx& c) {
  const Shape& x = c.shape(c.in(0));
  const int axis = normaliseAxis(c.n.attrs.get<attr::RepeatAxis>(), x.size());
  const int64_t r = c.n.attrs.get<attr::Repeats>();
  Shape split;
  for (int d = 0; d < static_cast<int>(x.size()); ++d) {
    split.push_back(x[d]);
    if (d == axis) split.push_back(r);
  }
  AttrMap a;
  a.set<attr::Axes>(std::vector<int64_t>{axis + 1});
  c.give(0, c.op(OpKind::Sum, {c.reshape(c.dy, split)}, a));
}

void gradMseLoss(GradCtx& c) {
  const double n = static_cast<double>(numel(c.shape(c.in(0))));
  const ValueId diff = c.scale(c.op(OpKind::Sub, {c.in(0), c.in(1)}), n ? 2.0 / n : 0.0);
  const ValueId dp = c.op(OpKind::Mul, {diff, c.dy});
  if (c.wants(0)) c.give(0, dp);
  if (c.wants(1)) c.give(1, c.scale(dp, -1.0));
}

// FusedLinear (rope)'s inverse turn of `v` [..., S, N] (its transpose: the gradient), as a rope op
// over its heads: [rows / S, S, N / head_dim, head_dim], layout bshd, adjacent pairs.
ValueId inverseRopeOfRows(GradCtx& c, ValueId v) {
  const Shape& s = c.shape(v);
  const int64_t hd = c.n.attrs.get<attr::HeadDim>(), seq = s[s.size() - 2], units = s.back();
  const ValueId heads = c.reshape(v, Shape{numel(s) / (seq * units), seq, units / hd, hd});
  AttrMap a;
  a.set<attr::Layout>("bshd").set<attr::RopeBase>(c.n.attrs.get<attr::RopeBase>()).set<attr::RopeDims>(c.n.attrs.get<attr::RopeDims>());
  a.set<attr::Interleaved>(true).set<attr::Inverse>(true);
  return c.op(OpKind::Rope, {heads}, a);
}

void gradFusedLinear(GradCtx& c) {
  const std::string act = c.n.attrs.get<attr::Activation>();
  const bool tw = c.n.attrs.get<attr::TransposeW>();
  const ValueId x = c.in(0), w = c.in(1);
  // d pre-activation: ReLU's derivative reads the output (y > 0 exactly where pre > 0); GELU's
  // reads the pre-activation, which the node saved as its second output.
  ValueId dpre = c.dy;
  if (act == "relu") dpre = c.op(OpKind::ReluGrad, {c.dy, c.out()});
  else if (act == "gelu") dpre = c.op(OpKind::GeluGrad, {c.dy, c.n.outputs[1]});
  else if (act == "swiglu") dpre = c.op(OpKind::SwigluGrad, {c.dy, c.n.outputs[1]});  // both halves: one dX and one dW GEMM
  else if (act == "rope") dpre = c.reshape(inverseRopeOfRows(c, c.dy), c.shape(c.dy));  // nothing saved
  const int64_t k = c.shape(x).back(), units = c.shape(dpre).back();
  if (c.wants(0)) c.give(0, c.matmul(dpre, w, false, !tw));
  if (c.wants(1)) {
    const ValueId x2 = c.reshape(x, Shape{numel(c.shape(x)) / k, k});
    const ValueId d2 = c.reshape(dpre, Shape{numel(c.shape(dpre)) / units, units});
    c.give(1, tw ? c.matmul(d2, x2, true, false) : c.matmul(x2, d2, true, false));
  }
  if (c.n.inputs.size() == 3 && c.wants(2)) c.give(2, c.sumTo(dpre, c.shape(c.in(2))));
}

// FusedMlp: one FusedMlpGrad reading the saved hidden outputs (every activation's derivative is
// a function of its output) and writing dx (only when wanted), every dw and every db.
void gradFusedMlp(GradCtx& c) {
  for (size_t i = 1; i < c.dys.size(); ++i)
    if (c.dys[i] != kNoValue)
      throw std::logic_error("autodiff: fused-mlp node '" + c.n.name + "': its hidden outputs are saved for the backward, not used on");
  if (c.dy == kNoValue) return;
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const size_t layers = s.layers.size();
  llvm::SmallVector<ValueId, 8> ins{c.dy, c.in(0)};
  for (size_t i = 1; i < layers; ++i) ins.push_back(c.n.outputs[i]);
  ins.push_back(c.out());
  for (const MlpLayer& l : s.layers) ins.push_back(c.in(l.weightInput));
  AttrMap a;
  a.set<attr::MlpActivations>(c.n.attrs.get<attr::MlpActivations>());
  a.set<attr::MlpBiases>(c.n.attrs.get<attr::MlpBiases>());
  a.set<attr::InputGrad>(c.wants(0));
  const ValueId first = c.op(OpKind::FusedMlpGrad, ins, a);
  const Node& grad = c.g.producer(first);
  const MlpSpec gs = mlpSpecOf(c.g, grad);
  if (gs.inputGrad) c.give(0, grad.outputs[0]);
  for (size_t i = 0; i < layers; ++i) {
    const MlpLayer& f = s.layers[i];
    const MlpLayer& b = gs.layers[i];
    if (c.wants(f.weightInput)) c.give(f.weightInput, grad.outputs[static_cast<size_t>(b.weightGradOutput)]);
    if (f.bias && c.wants(f.biasInput)) c.give(f.biasInput, grad.outputs[static_cast<size_t>(b.biasGradOutput)]);
  }
}

void gradInterleave(GradCtx& c) {
  for (int i = 0; i < 2; ++i)
    if (c.wants(i)) c.give(i, c.op(OpKind::Deinterleave, {c.dy}, AttrMap().set<attr::Part>(i)));
}
void gradDeinterleave(GradCtx& c) {
  const ValueId zero = c.g.addConstant(0.0, c.shape(c.dy));
  const bool odd = c.n.attrs.get<attr::Part>() == 1;
  c.give(0, c.op(OpKind::Interleave, {odd ? zero : c.dy, odd ? c.dy : zero}));
}

void gradConcat(GradCtx& c) {
  int64_t start = 0;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) {
    const int64_t width = c.shape(c.in(static_cast<int>(i))).back();
    if (c.wants(static_cast<int>(i)))
      c.give(static_cast<int>(i), c.op(OpKind::Slice, {c.dy}, AttrMap().set<attr::Start>(start).set<attr::Length>(width)));
    start += width;
  }
}
void gradSlice(GradCtx& c) {
  // dy in its place along the last axis, zeros on either side.
  const Shape& x = c.shape(c.in(0));
  const int64_t start = c.n.attrs.get<attr::Start>(), end = start + c.n.attrs.get<attr::Length>();
  auto zeros = [&](int64_t width) {
    Shape s = x;
    s.back() = width;
    return c.g.addConstant(0.0, s);
  };
  llvm::SmallVector<ValueId, 3> parts;
  if (start > 0) parts.push_back(zeros(start));
  parts.push_back(c.dy);
  if (end < x.back()) parts.push_back(zeros(x.back() - end));
  c.give(0, parts.size() == 1 ? c.dy : c.op(OpKind::Concat, parts));
}

void gradFlashAttentionQkv(GradCtx& c) {
  llvm::SmallVector<ValueId, 5> ins{c.in(0), c.n.outputs[0], c.n.outputs[1], c.dy};
  if (c.n.inputs.size() == 2) ins.push_back(c.in(1));
  const ValueId first = c.op(OpKind::FlashAttentionQkvGrad, ins, c.n.attrs);
  const Node& grad = c.g.producer(first);
  for (size_t i = 0; i < c.n.inputs.size(); ++i)
    if (c.wants(static_cast<int>(i))) c.give(static_cast<int>(i), grad.outputs[i]);
}

void gradFlashAttention(GradCtx& c) {
  llvm::SmallVector<ValueId, 7> ins{c.in(0), c.in(1), c.in(2), c.n.outputs[0], c.n.outputs[1], c.dy};
  if (c.n.inputs.size() == 4) ins.push_back(c.in(3));
  const ValueId first = c.op(OpKind::FlashAttentionGrad, ins, c.n.attrs);
  const Node& grad = c.g.producer(first);
  for (size_t i = 0; i < c.n.inputs.size(); ++i)
    if (c.wants(static_cast<int>(i))) c.give(static_cast<int>(i), grad.outputs[i]);
}

void gradFusedElementwise(GradCtx& c);  // below: needs the backprop driver

void gradReluGrad(GradCtx& c) { noRule(c); }
void gradGeluGrad(GradCtx& c) { noRule(c); }
void gradMatMulActGrad(GradCtx& c) { noRule(c); }
void gradMatMulBiasGrad(GradCtx& c) { noRule(c); }
void gradMseLossGrad(GradCtx& c) { noRule(c); }
void gradTanhGrad(GradCtx& c) { noRule(c); }
void gradSigmoidGrad(GradCtx& c) { noRule(c); }
void gradSiluGrad(GradCtx& c) { noRule(c); }
void gradSwigluGrad(GradCtx& c) { noRule(c); }
void gradGeluTanhGrad(GradCtx& c) { noRule(c); }
void gradLayerNormGrad(GradCtx& c) { noRule(c); }
void gradRmsNormGrad(GradCtx& c) { noRule(c); }
void gradSoftmaxGrad(GradCtx& c) { noRule(c); }
void gradSoftmaxSinkGrad(GradCtx& c) { noRule(c); }
void gradFlashAttentionGrad(GradCtx& c) { noRule(c); }
void gradFusedMlpGrad(GradCtx& c) { noRule(c); }
void gradFusedMlpTrain(GradCtx& c) { noRule(c); }
void gradFlashAttentionQkvGrad(GradCtx& c) { noRule(c); }

using GradFn = void (*)(GradCtx&);
const GradFn kGrad[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) &grad##Name,
#include "graph/ops.def"
};

// Walks `order` backwards from the gradients in `grad` (indexed by ValueId, kNoValue where
// none), applying each node's rule and summing contributions; grows both vectors as rules add
// values.
void backprop(Graph& g, const std::vector<NodeId>& order, std::vector<ValueId>& grad, std::vector<char>& needs) {
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    // A copy, not a reference: rules read `n` while adding nodes (stable storage makes a
    // reference safe too, but a copy keeps the rules independent of that guarantee).
    const Node n = g.node(*it);
    if (opInfo(n.op).grad == GradKind::Leaf) continue;
    llvm::SmallVector<ValueId, 4> dys;
    bool any = false;
    for (ValueId v : n.outputs) {
      dys.push_back(needs[v] ? grad[v] : kNoValue);
      any |= dys.back() != kNoValue;
    }
    // A later output alone carries a gradient only where it is a value the model uses on (a fused
    // norm's sum); the others (log-sum-exp, saved pre-activations) are read by backward nodes
    // only, and a YAML node cannot name them (reserved ':' names).
    if (!any) continue;
    GradCtx c{g, n, dys[0], dys, needs, llvm::SmallVector<ValueId, 4>(n.inputs.size(), kNoValue)};
    kGrad[static_cast<int>(n.op)](c);
    grad.resize(g.numValues(), kNoValue);
    needs.resize(g.numValues(), 0);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId in = n.inputs[i];
      if (c.dx[i] == kNoValue) continue;
      grad[in] = grad[in] == kNoValue ? c.dx[i] : g.add(OpKind::Add, {grad[in], c.dx[i]});
      grad.resize(g.numValues(), kNoValue);
      needs.resize(g.numValues(), 0);
    }
  }
}

// A fused elementwise node is differentiated by emitting its expression again as primitive
// nodes (recomputing the cheap intermediates) and running their rules; a later
// fuse-elementwise pass may fuse the result.
void gradFusedElementwise(GradCtx& c) {
  Graph& g = c.g;
  const Expr e = parseExpr(c.n.attrs.get<attr::Expr>());
  const NodeId firstNew = static_cast<NodeId>(g.numNodes());
  std::vector<ValueId> val(e.nodes.size(), kNoValue);
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const ExprNode& x = e.nodes[i];
    if (x.op == OpKind::Input) {
      val[i] = c.in(x.input);
      continue;
    }
    AttrMap a;
    if (x.op == OpKind::Scale) a.set<attr::ScaleFactor>(x.value);
    if (x.op == OpKind::BroadcastTo) {
      const Shape& out = c.shape(c.out());
      a.set<attr::Shape>(std::vector<int64_t>(out.begin(), out.end()));
    }
    llvm::SmallVector<ValueId, 2> args;
    for (int arg : x.args) args.push_back(val[static_cast<size_t>(arg)]);
    val[i] = g.add(x.op, args, a);
  }
  ValueId result = val.back();
  const Shape& out = c.shape(c.out());
  if (g.shape(result) != out) {
    AttrMap a;
    a.set<attr::Shape>(std::vector<int64_t>(out.begin(), out.end()));
    result = g.add(OpKind::BroadcastTo, {result}, a);
  }
  std::vector<NodeId> order;
  for (NodeId id = firstNew; id < static_cast<NodeId>(g.numNodes()); ++id) order.push_back(id);
  std::vector<ValueId> grad(g.numValues(), kNoValue);
  std::vector<char> needs(g.numValues(), 0);
  for (int i = 0; i < static_cast<int>(c.n.inputs.size()); ++i) needs[c.in(i)] = c.wants(i);
  for (NodeId id : order) {  // a recomputed value needs a gradient when an input that does feeds it
    bool any = false;
    for (ValueId v : g.node(id).inputs) any |= needs[v] != 0;
    for (ValueId v : g.node(id).outputs) needs[v] = any;
  }
  grad[result] = c.dy;
  backprop(g, order, grad, needs);
  for (int i = 0; i < static_cast<int>(c.n.inputs.size()); ++i)
    if (c.wants(i) && grad[c.in(i)] != kNoValue) c.give(i, grad[c.in(i)]);
}

}  // namespace

std::string gradOutputName(const std::string& param) { return "grad/" + param; }

NodeId unpackingOfParamGradient(const Graph& g, ValueId param, const std::vector<std::vector<NodeId>>& users) {
  const auto out = g.outputs().find(gradOutputName(g.value(param).name));
  if (out == g.outputs().end()) return -1;
  const ValueId grad = out->second;
  if (!users[static_cast<size_t>(grad)].empty()) return -1;
  const Node& n = g.producer(grad);
  if ((n.op != OpKind::Slice && n.op != OpKind::Deinterleave) || g.value(grad).type.dtype != DType::F32 ||
      g.value(n.inputs[0]).type.dtype != DType::F32 || g.producer(n.inputs[0]).op == OpKind::Param ||
      numel(g.shape(grad)) == 0)
    return -1;
  return n.id;
}

std::map<ValueId, ValueId> appendBackward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt) {
  if (!g.shape(loss).empty() && numel(g.shape(loss)) != 1)
    throw std::logic_error("autodiff: the loss must be a scalar, got " + shapeString(g.shape(loss)));
  const std::vector<NodeId> order = g.topoOrder();

  // needs[v]: v depends on something in wrt, so gradients must flow through it.
  std::vector<char> needs(g.numValues(), 0);
  for (ValueId v : wrt) needs[v] = 1;
  for (NodeId id : order) {
    const Node& n = g.node(id);
    bool any = false;
    for (ValueId v : n.inputs) any |= needs[v] != 0;
    if (any)
      for (ValueId v : n.outputs) needs[v] = 1;
  }

  std::vector<ValueId> grad(g.numValues(), kNoValue);
  grad[loss] = g.addConstant(1.0, g.shape(loss), "grad_seed");
  grad.resize(g.numValues(), kNoValue);
  needs.resize(g.numValues(), 0);
  backprop(g, order, grad, needs);

  std::map<ValueId, ValueId> result;
  for (ValueId v : wrt) {
    ValueId gv = grad[v];
    if (gv == kNoValue) gv = g.addConstant(0.0, g.shape(v), "zero_grad/" + g.value(v).name);
    result[v] = gv;
    g.setOutput(gradOutputName(g.value(v).name), gv);
  }
  return result;
}

}  // namespace pa
