// fuse-qkv: a FlashAttention whose Q, K and V are three projections of one input becomes one GEMM
// over the concatenated weights and one FlashAttentionQkv node reading the packed result.
//
// Note on the rewrite. Matched, per operand of a FlashAttention (either layout):
//   [Permute([0, 2, 1, 3]) (layout bhsd)] [Rope(bshd), Q and K alike] Reshape([B, S, H·D] -> [B, S, H, D])
//   of x·W [+ b] (a MatMul, a MatMul then Add of a bias, or a FusedLinear without activation),
// every intermediate used once, the same x for all three, the three projections of one kind,
// with biases on all three or on none. It becomes
//   qkv = Reshape(x·Concat(Wq, Wk, Wv) [+ Concat(bq, bk, bv)], [B, S, Hq + 2 Hk, D])
//   [qkv = Rope(qkv, heads: Hq + Hk)]      the turn of Q's and K's heads; V's pass unchanged
//   o, lse = FlashAttentionQkv(qkv [, sink logits], kv_heads: Hk)
// The Concat runs once a step on the weights (a weight-sized copy; the parameters keep their
// names, so checkpoints do not change), and its gradient, a Slice per weight, splits the one
// dW GEMM's result; the backward's dQ, dK and dV land in one packed gradient, so the three
// projections' backward is one dX GEMM and one dW GEMM. Q, K and V are never copied: the
// attention kernels read (and the backward writes) them as strided views of the packed buffer.
//
// Note on the targets. The GPU views are heads of a row of (Hq + 2 Hk)·D elements at offsets
// Hq·D and (Hq + Hk)·D; the kernels load 16 bytes at a time (cp.async), so every base and stride
// must be a multiple of 16 bytes, which a head dim that is a multiple of 8 gives for fp32 and
// bf16 alike. fuse-attention builds FlashAttention only at such head dims
// (common/flash_attention_limits.h); the pass checks it again, so it never builds a node a
// target cannot run. The CPU runs any shape.
//
// Note on rope. fuse-rope moves the turn into the Q and K projections' epilogues (FusedLinear
// with activation rope); such projections are no longer plain linear maps and this pass leaves
// them alone. Listed the other way round (qkv before rope), the packed node has no rope nodes
// of Q and K for fuse-rope to fold. Either order is valid; the one listed first wins.
#include "common/flash_attention_limits.h"
#include "passes/fusion.h"

namespace pa {

namespace {

// One projection x·W [+ b]: a FusedLinear without activation, a MatMul, or a MatMul then Add.
struct Projection {
  ValueId x = kNoValue, w = kNoValue, bias = kNoValue;
  bool fused = false;  // a FusedLinear
  std::vector<NodeId> nodes;
};

bool asProjection(RewriteContext& ctx, ValueId v, Projection& out) {
  const Graph& g = ctx.graph();
  if (!ctx.hasSingleUse(v)) return false;
  if (const Node* f = ctx.producerIf(v, OpKind::FusedLinear)) {
    if (f->attrs.get<attr::Activation>() != "none" || f->attrs.get<attr::TransposeW>() || g.shape(f->inputs[1]).size() != 2)
      return false;
    out = {f->inputs[0], f->inputs[1], f->inputs.size() == 3 ? f->inputs[2] : kNoValue, true, {f->id}};
    return true;
  }
  ValueId m = v, bias = kNoValue;
  std::vector<NodeId> nodes;
  if (const Node* add = ctx.producerIf(v, OpKind::Add)) {
    for (int side = 0; side < 2 && bias == kNoValue; ++side) {
      const ValueId mm = add->inputs[static_cast<size_t>(side)], b = add->inputs[static_cast<size_t>(1 - side)];
      const Shape& bs = g.shape(b);
      const Shape& ms = g.shape(mm);
      if (!ctx.producerIf(mm, OpKind::MatMul) || !ctx.hasSingleUse(mm) || bs.empty() || ms.empty() || bs.back() != ms.back() ||
          numel(bs) != bs.back())
        continue;
      m = mm;
      bias = b;
    }
    if (bias == kNoValue) return false;
    nodes.push_back(add->id);
  }
  const Node* mm = ctx.producerIf(m, OpKind::MatMul);
  if (!mm || mm->attrs.get<attr::TransposeA>() || mm->attrs.get<attr::TransposeB>() || g.shape(mm->inputs[1]).size() != 2)
    return false;
  nodes.push_back(mm->id);
  out = {mm->inputs[0], mm->inputs[1], bias, false, nodes};
  return true;
}

// One of Q, K, V as the attention reads it.
struct Operand {
  Projection proj;
  NodeId rope = 0;  // 0: none
  Shape heads;      // [B, S, H, D]
  std::vector<NodeId> nodes;  // the permute, rope and reshape
};

bool asOperand(RewriteContext& ctx, ValueId v, bool bhsd, bool mayRope, Operand& out) {
  const Graph& g = ctx.graph();
  if (!ctx.hasSingleUse(v)) return false;
  if (bhsd) {
    const Node* p = ctx.producerIf(v, OpKind::Permute);
    if (!p || p->attrs.get<attr::Perm>() != std::vector<int64_t>{0, 2, 1, 3} || !ctx.hasSingleUse(p->inputs[0])) return false;
    out.nodes.push_back(p->id);
    v = p->inputs[0];
  }
  if (const Node* r = ctx.producerIf(v, OpKind::Rope)) {
    if (!mayRope || r->attrs.get<attr::Layout>() != "bshd" || r->attrs.get<attr::Inverse>() || r->attrs.get<attr::RopeHeads>() != 0 ||
        !ctx.hasSingleUse(r->inputs[0]))
      return false;
    out.rope = r->id;
    out.nodes.push_back(r->id);
    v = r->inputs[0];
  }
  const Node* reshape = ctx.producerIf(v, OpKind::Reshape);
  if (!reshape) return false;
  const Shape& flat = g.shape(reshape->inputs[0]);
  out.heads = g.shape(v);
  const Shape& h = out.heads;
  if (flat.size() != 3 || h.size() != 4 || flat[0] != h[0] || flat[1] != h[1] || flat[2] != h[2] * h[3]) return false;
  out.nodes.push_back(reshape->id);
  return asProjection(ctx, reshape->inputs[0], out.proj);
}

bool sameRope(const AttrMap& a, const AttrMap& b) {
  return a.get<attr::RopeBase>() == b.get<attr::RopeBase>() && a.get<attr::RopeDims>() == b.get<attr::RopeDims>() &&
         a.get<attr::Interleaved>() == b.get<attr::Interleaved>();
}

class FuseQkvPattern final : public RewritePattern {
public:
  const char* name() const override { return "qkv"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node n = g.node(root);
    if (n.op != OpKind::FlashAttention || ctx.isOutput(n.outputs[0]) || ctx.isOutput(n.outputs[1])) return false;
    const bool bhsd = n.attrs.get<attr::Layout>() == "bhsd";
    Operand side[3];
    for (int i = 0; i < 3; ++i)
      if (!asOperand(ctx, n.inputs[static_cast<size_t>(i)], bhsd, i < 2, side[i])) return false;
    const Projection &q = side[0].proj, &k = side[1].proj, &v = side[2].proj;
    if (k.x != q.x || v.x != q.x || k.fused != q.fused || v.fused != q.fused) return false;
    if ((q.bias == kNoValue) != (k.bias == kNoValue) || (q.bias == kNoValue) != (v.bias == kNoValue)) return false;
    if ((side[0].rope == 0) != (side[1].rope == 0)) return false;
    const AttrMap* rope = side[0].rope ? &g.node(side[0].rope).attrs : nullptr;
    if (rope && !sameRope(*rope, g.node(side[1].rope).attrs)) return false;
    const Shape &hq = side[0].heads, &hk = side[1].heads;
    if (side[2].heads != hk || hq[0] != hk[0] || hq[1] != hk[1] || hq[3] != hk[3]) return false;
    const int64_t d = hq[3];
    if (!flashHeadDimRuns(d)) return false;  // 16-byte aligned views on the GPU: see the note on the targets

    std::vector<ValueId> ws, bs;
    for (const Operand& s : side) {
      ws.push_back(s.proj.w);
      if (s.proj.bias == kNoValue) continue;
      ValueId b = s.proj.bias;
      const int64_t units = g.shape(b).back();
      if (g.shape(b) != Shape{units}) b = g.add(OpKind::Reshape, {b}, AttrMap().set<attr::Shape>(std::vector<int64_t>{units}));
      bs.push_back(b);
    }
    const ValueId w = g.add(OpKind::Concat, ws);
    const ValueId bias = bs.empty() ? kNoValue : g.add(OpKind::Concat, bs);
    ValueId proj;
    if (q.fused) {
      std::vector<ValueId> ins{q.x, w};
      if (bias != kNoValue) ins.push_back(bias);
      proj = g.add(OpKind::FusedLinear, ins, AttrMap().set<attr::Activation>("none"));
    } else {
      proj = g.add(OpKind::MatMul, {q.x, w});
      if (bias != kNoValue) proj = g.add(OpKind::Add, {proj, bias});
    }
    const int64_t heads = hq[2] + 2 * hk[2];
    ValueId packed = g.add(OpKind::Reshape, {proj}, AttrMap().set<attr::Shape>(std::vector<int64_t>{hq[0], hq[1], heads, d}));
    if (rope) {
      AttrMap r = *rope;
      r.set<attr::RopeHeads>(hq[2] + hk[2]);
      packed = g.add(OpKind::Rope, {packed}, r);
    }
    std::vector<ValueId> ins{packed};
    if (n.inputs.size() == 4) ins.push_back(n.inputs[3]);
    AttrMap a = n.attrs;
    a.set<attr::KvHeads>(hk[2]);
    const ValueId o = g.add(OpKind::FlashAttentionQkv, ins, a);
    const ValueId lse = g.producer(o).outputs[1];
    std::vector<NodeId> dead{root};
    for (const Operand& s : side) {
      dead.insert(dead.end(), s.nodes.begin(), s.nodes.end());
      dead.insert(dead.end(), s.proj.nodes.begin(), s.proj.nodes.end());
    }
    ctx.replace(n.outputs[0], o, {});
    ctx.replace(n.outputs[1], lse, dead);
    return true;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFuseQkvPattern() { return std::make_unique<FuseQkvPattern>(); }

}  // namespace pa
