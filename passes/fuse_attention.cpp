// fuse-attention: softmax(Q·Kᵀ·scale + mask)·V becomes one FlashAttention node.
//
// Note on the spellings matched. Walking up from the Softmax (over the last axis):
//   mask   AttentionMask, or Add of a constant tensor of 0 / -inf whose pattern is recognised
//          (recogniseMask below; the recognised spec is checked by regenerating the whole mask);
//   scale  Scale, or Mul / Div by a one-element constant, on the scores (before or after the
//          mask; after the mask only a positive factor keeps -inf at -inf) or on Q;
//   QKᵀ    MatMul(Q, K, transpose_b) or MatMul(Q, Permute(K, [0, 1, 3, 2]));
//   GQA    RepeatHeads(axis 1) on K and V, absorbed as the head grouping;
//   sinks  Softmax's second input, when it is one logit per head.
// Every matched intermediate must have no other user; otherwise nothing changes. Negative
// cases: softmax over another axis, probabilities used elsewhere, a tensor (not constant) scale.
//
// A second pattern folds the layout: when Q, K and V are each Permute([0, 2, 1, 3]) of a
// [B, S, H, D] tensor (how a layer splits its projections into heads) and every user of the
// output is the same Permute back, the node reads and writes [B, S, H, D] itself (layout
// "bshd", strides on the GPU) and the permute copies go, in the forward and, through autodiff,
// in the backward.
#include <algorithm>
#include <cmath>
#include <optional>

#include "common/attention_mask.h"  // the mask predicate is semantics, shared by every path
#include "common/flash_attention_limits.h"
#include "passes/fusion.h"

namespace pa {

namespace {

// The single element of a one-element constant, if `v` is one.
std::optional<double> scalarConstant(const Graph& g, ValueId v) {
  const Node& n = g.producer(v);
  if (n.erased || n.op != OpKind::Constant || numel(g.shape(v)) != 1) return std::nullopt;
  if (n.attrs.has<attr::Data>()) return n.attrs.get<attr::Data>()[0];
  return n.attrs.get<attr::Value>();
}

// A Scale, or a Mul / Div by a one-element constant: its factor and its data operand.
std::optional<std::pair<double, ValueId>> constantScale(const Graph& g, const Node& n) {
  if (n.erased) return std::nullopt;
  if (n.op == OpKind::Scale) return std::make_pair(n.attrs.get<attr::ScaleFactor>(), n.inputs[0]);
  if (n.op == OpKind::Mul) {
    if (auto f = scalarConstant(g, n.inputs[1])) return std::make_pair(*f, n.inputs[0]);
    if (auto f = scalarConstant(g, n.inputs[0])) return std::make_pair(*f, n.inputs[1]);
  }
  if (n.op == OpKind::Div)
    if (auto f = scalarConstant(g, n.inputs[1])) return std::make_pair(1.0 / *f, n.inputs[0]);
  return std::nullopt;
}

// Finds mask attributes that reproduce `hidden` ([q, k], true = -inf) exactly, or fails.
bool recogniseMask(const std::vector<char>& hidden, int64_t q, int64_t k, AttrMap& out) {
  auto at = [&](int64_t i, int64_t j) { return hidden[static_cast<size_t>(i * k + j)] != 0; };
  for (int br = 0; br < 2; ++br) {
    AttentionMaskSpec m;
    m.alignBottomRight = br;
    auto diag = [&](int64_t i) { return br ? i + (k - q) : i; };
    bool causal = true;
    for (int64_t i = 0; i < q && causal; ++i)
      for (int64_t j = diag(i) + 1; j < k; ++j)
        if (j >= 0 && !at(i, j)) {
          causal = false;
          break;
        }
    m.causal = causal;
    // Candidate sink counts: none, or the leading run of visible keys in the last row.
    int64_t run = 0;
    while (run < k && !at(q - 1, run)) ++run;
    for (int64_t sinks : {int64_t{0}, run}) {
      m.sinks = static_cast<int>(sinks);
      int64_t left = -1, right = -1;
      for (int64_t i = 0; i < q; ++i) {
        int64_t lo = -1, hi = -1;
        for (int64_t j = sinks; j < k; ++j)
          if (!at(i, j)) {
            if (lo < 0) lo = j;
            hi = j;
          }
        if (lo < 0) continue;
        if (lo > 0) left = std::max(left, diag(i) - lo);
        if (!causal && hi < k - 1) right = std::max(right, hi - diag(i));
      }
      m.windowLeft = static_cast<int>(left);
      m.windowRight = static_cast<int>(right);
      bool same = true;
      for (int64_t i = 0; i < q && same; ++i)
        for (int64_t j = 0; j < k; ++j)
          if (keyVisible(m, i, j, q, k) == at(i, j)) {
            same = false;
            break;
          }
      if (same) {
        out.set<attr::Causal>(m.causal != 0);
        out.set<attr::Align>(std::string(br ? "bottom-right" : "top-left"));
        out.set<attr::WindowLeft>(int64_t{m.windowLeft});
        out.set<attr::WindowRight>(int64_t{m.windowRight});
        out.set<attr::Sinks>(int64_t{m.sinks});
        return true;
      }
    }
  }
  return false;
}

// A constant [.., q, k] mask (leading extents 1) of 0 and -inf, as mask attributes.
bool maskFromConstant(const Graph& g, ValueId c, int64_t q, int64_t k, AttrMap& out) {
  const Node& n = g.producer(c);
  const Shape& s = g.shape(c);
  if (n.erased || n.op != OpKind::Constant || s.size() < 2 || s[s.size() - 2] != q || s.back() != k) return false;
  if (numel(s) != q * k) return false;  // a different mask per batch or head is not one predicate
  std::vector<double> data = n.attrs.has<attr::Data>() ? n.attrs.get<attr::Data>()
                                                 : std::vector<double>(static_cast<size_t>(q * k), n.attrs.get<attr::Value>());
  std::vector<char> hidden(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == 0.0) hidden[i] = 0;
    else if (std::isinf(data[i]) && data[i] < 0) hidden[i] = 1;
    else return false;
  }
  return recogniseMask(hidden, q, k, out);
}

class FuseAttentionPattern final : public RewritePattern {
public:
  FuseAttentionPattern(const PassTarget& target, std::vector<std::string>* notes) : target_(target), notes_(notes) {}
  const char* name() const override { return "attention"; }

  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node sm = g.node(root);
    if (sm.op != OpKind::Softmax) return false;
    const Shape& ss = g.shape(sm.outputs[0]);
    if (ss.size() != 4 || normaliseAxis(sm.attrs.get<attr::Axis>(), 4) != 3) return false;
    const int64_t sq = ss[2], sk = ss[3];
    // P must feed exactly one MatMul(P, V).
    const ValueId p = sm.outputs[0];
    if (!ctx.hasSingleUse(p)) return false;
    const Node pv = g.node(ctx.users(p)[0]);
    if (pv.op != OpKind::MatMul || pv.inputs[0] != p || pv.inputs[1] == p || pv.attrs.get<attr::TransposeA>() ||
        pv.attrs.get<attr::TransposeB>())
      return false;
    std::vector<NodeId> dead{sm.id, pv.id};

    // Walk up through the mask and the scale, in either order.
    ValueId x = sm.inputs[0];
    double scale = 1.0;
    bool maskSeen = false, scaleSeen = false, scaleAfterMask = false;
    AttrMap mask;
    for (int step = 0; step < 2; ++step) {
      if (!ctx.hasSingleUse(x)) break;
      const Node& n = g.producer(x);
      // Walking up, the op found first is the one applied last: a scale found before the mask
      // multiplies the masked scores.
      if (!maskSeen && (n.op == OpKind::AttentionMask || n.op == OpKind::Add)) scaleAfterMask = scaleSeen;
      if (!maskSeen && n.op == OpKind::AttentionMask) {
        mask = n.attrs;
        mask.erase("fill");
        if (n.attrs.has<attr::Fill>() && n.attrs.get<attr::Fill>() != -INFINITY) return false;
      } else if (!maskSeen && n.op == OpKind::Add) {
        const int side = scalarConstant(g, n.inputs[0]) || g.producer(n.inputs[0]).op == OpKind::Constant ? 0 : 1;
        if (!maskFromConstant(g, n.inputs[side], sq, sk, mask)) return false;
        x = n.inputs[1 - side];
        maskSeen = true;
        dead.push_back(n.id);
        continue;
      } else if (!scaleSeen && (n.op == OpKind::Scale || n.op == OpKind::Mul || n.op == OpKind::Div)) {
        const auto cs = constantScale(g, n);
        if (!cs) return false;  // a tensor scale: not an attention pattern we may fuse
        scale *= cs->first;
        scaleSeen = true;
        x = cs->second;
        dead.push_back(n.id);
        continue;
      } else {
        break;
      }
      maskSeen = true;
      dead.push_back(n.id);
      x = n.inputs[0];
    }
    if (scaleAfterMask && !(scale > 0)) return false;  // -inf · scale must stay -inf

    // Q·Kᵀ.
    if (!ctx.hasSingleUse(x)) return false;
    const Node& qk = g.producer(x);
    if (qk.erased || qk.op != OpKind::MatMul || qk.attrs.get<attr::TransposeA>()) return false;
    ValueId q = qk.inputs[0], k = qk.inputs[1];
    dead.push_back(qk.id);
    if (!qk.attrs.get<attr::TransposeB>()) {
      const Node& t = g.producer(k);
      if (t.erased || t.op != OpKind::Permute || t.attrs.get<attr::Perm>() != std::vector<int64_t>{0, 1, 3, 2} ||
          !ctx.hasSingleUse(k))
        return false;
      dead.push_back(t.id);
      k = t.inputs[0];
    }
    // A constant scale applied to Q beforehand.
    if (!scaleSeen && ctx.hasSingleUse(q)) {
      if (const auto cs = constantScale(g, g.producer(q))) {
        scale *= cs->first;
        dead.push_back(g.producer(q).id);
        q = cs->second;
      }
    }
    ValueId v = pv.inputs[1];
    // Grouped-query heads: absorb matching RepeatHeads on K and V.
    const Node* rk = ctx.producerIf(k, OpKind::RepeatHeads);
    const Node* rv = ctx.producerIf(v, OpKind::RepeatHeads);
    if (rk && rv && ctx.hasSingleUse(k) && ctx.hasSingleUse(v) && normaliseAxis(rk->attrs.get<attr::RepeatAxis>(), 4) == 1 &&
        normaliseAxis(rv->attrs.get<attr::RepeatAxis>(), 4) == 1 &&
        rk->attrs.get<attr::Repeats>() == rv->attrs.get<attr::Repeats>()) {
      dead.push_back(rk->id);
      dead.push_back(rv->id);
      k = rk->inputs[0];
      v = rv->inputs[0];
    }
    const Shape qs = g.shape(q), ks = g.shape(k);
    if (qs.size() != 4 || ks.size() != 4 || g.shape(v) != ks || ks[1] == 0 || qs[1] % ks[1] != 0) return false;
    // Every target must run the node: the CPU runs any shape, the CUDA kernels these.
    const std::string cannot = flashCudaCannotRun(qs[0], qs[1], qs[3], !target_.operands16Bit);
    if (!cannot.empty()) {
      const std::string note =
          "attention at '" + sm.name + "' left unfused: the CUDA FlashAttention kernels cannot run it (" +
          cannot + ")";
      if (notes_ && std::find(notes_->begin(), notes_->end(), note) == notes_->end()) notes_->push_back(note);
      return false;
    }

    // Sink logits: one per head, in any broadcastable layout.
    ValueId sink = kNoValue;
    if (sm.inputs.size() == 2) {
      Shape s = g.shape(sm.inputs[1]);
      while (s.size() < 4) s.insert(s.begin(), 1);
      if (s[0] != 1 || s[2] != 1 || s[3] != 1 || s[1] != qs[1]) return false;
      sink = sm.inputs[1];
      if (g.shape(sink) != Shape{qs[1]}) {
        AttrMap r;
        r.set<attr::Shape>(std::vector<int64_t>{qs[1]});
        sink = g.add(OpKind::Reshape, {sink}, r);
      }
    }

    AttrMap a = mask;
    a.set<attr::AttnScale>(scale);
    std::vector<ValueId> ins{q, k, v};
    if (sink != kNoValue) ins.push_back(sink);
    const ValueId o = g.add(OpKind::FlashAttention, ins, a);
    ctx.replace(pv.outputs[0], o, dead);
    return true;
  }

private:
  PassTarget target_;
  std::vector<std::string>* notes_;
};

class FoldAttentionLayoutPattern : public RewritePattern {
public:
  const char* name() const override { return "fold-attention-layout"; }

  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node& n = g.node(root);
    if (n.op != OpKind::FlashAttention || n.attrs.get<attr::Layout>() != "bhsd") return false;
    auto swapsSeqAndHeads = [](const Node& p) {
      return p.op == OpKind::Permute && p.attrs.get<attr::Perm>() == std::vector<int64_t>{0, 2, 1, 3};
    };
    std::vector<ValueId> ins;
    for (int i = 0; i < 3; ++i) {
      const Node* p = ctx.producerIf(n.inputs[static_cast<size_t>(i)], OpKind::Permute);
      if (!p || !swapsSeqAndHeads(*p)) return false;
      ins.push_back(p->inputs[0]);
    }
    const ValueId o = n.outputs[0];
    if (ctx.isOutput(o) || ctx.users(o).empty()) return false;
    for (NodeId u : ctx.users(o))
      if (!swapsSeqAndHeads(g.node(u))) return false;
    if (n.inputs.size() == 4) ins.push_back(n.inputs[3]);
    AttrMap a = n.attrs;
    a.set<attr::Layout>("bshd");
    const NodeId old = root;
    const std::vector<ValueId> oldIns(n.inputs.begin(), n.inputs.end());
    const ValueId oldLse = n.outputs[1];
    const std::vector<NodeId> outPermutes = ctx.users(o);
    const ValueId newO = g.add(OpKind::FlashAttention, ins, a);
    const ValueId newLse = g.producer(newO).outputs[1];
    for (NodeId u : outPermutes) ctx.replace(g.node(u).outputs[0], newO, {u});
    std::vector<NodeId> dead{old};
    for (int i = 0; i < 3; ++i) {  // the input permutes, unless something else reads them
      const ValueId v = oldIns[static_cast<size_t>(i)];
      const NodeId p = g.producer(v).id;
      if (ctx.useCount(v) == 1 && std::find(dead.begin(), dead.end(), p) == dead.end()) dead.push_back(p);
    }
    ctx.replace(oldLse, newLse, dead);
    return true;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFuseAttentionPattern(const PassTarget& target, std::vector<std::string>* notes) {
  return std::make_unique<FuseAttentionPattern>(target, notes);
}
std::unique_ptr<RewritePattern> makeFoldAttentionLayoutPattern() { return std::make_unique<FoldAttentionLayoutPattern>(); }

}  // namespace pa
