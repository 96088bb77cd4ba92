// fold-rope (part of fuse-attention): a FlashAttention's Q and K, each
// [Permute([0, 2, 1, 3])] Rope(bshd) of Reshape([B, S, H·D] -> [B, S, H, D]) of x·W [+ b], become
// FusedLinear(x, W′ [, b′]) with activation rope: the projection's epilogue turns the pairs, so
// neither the unturned projection nor a separate rope pass over Q and K remains.
//
// Note on the pairing. The epilogue turns adjacent column pairs (2j, 2j+1), the rope op's
// interleaved pairing, which it then matches exactly (W′ = W). Half-split pairing (j, j + D/2)
// is matched through the scores instead: W′ and b′ reorder every head's columns to
// (0, D/2, 1, D/2 + 1, ...), for Q and K alike, so the turned Q′ and K′ are Q and K with the same
// permutation P of each head's features, and Q′·K′ᵀ = Q·P·Pᵀ·Kᵀ = Q·Kᵀ: the attention output and
// every gradient reaching W and b (through the reorder's own gradient) are unchanged. That holds
// only because the attention is Q's and K's sole reader and both sides move together, so the
// pattern is rooted at the attention node and rewrites both or neither; a half-split rope
// turning fewer than all D features is left alone (its reorder would not be a plain permute).
#include "passes/fusion.h"

namespace pa {

namespace {

// One side (Q or K) of the attention as the pattern needs it.
struct RopedProjection {
  LinearMap linear;
  NodeId rope = 0, reshape = 0;
  ValueId turned = kNoValue;  // the rope's output, which the fold replaces
  Shape heads;                // [B, S, H, D]
};

bool asRopedProjection(RewriteContext& ctx, ValueId v, bool bshd, RopedProjection& out) {
  const Graph& g = ctx.graph();
  if (!ctx.hasSingleUse(v)) return false;
  if (!bshd) {
    const Node* p = ctx.producerIf(v, OpKind::Permute);
    if (!p || p->attrs.get<attr::Perm>() != std::vector<int64_t>{0, 2, 1, 3}) return false;
    v = p->inputs[0];
    if (!ctx.hasSingleUse(v)) return false;
  }
  const Node* rope = ctx.producerIf(v, OpKind::Rope);
  if (!rope || rope->attrs.get<attr::Layout>() != "bshd" || rope->attrs.get<attr::Inverse>()) return false;
  const ValueId split = rope->inputs[0];
  const Node* reshape = ctx.producerIf(split, OpKind::Reshape);
  if (!reshape || !ctx.hasSingleUse(split)) return false;
  const Shape& flat = g.shape(reshape->inputs[0]);
  const Shape& heads = g.shape(split);
  if (flat.size() != 3 || heads.size() != 4 || flat[0] != heads[0] || flat[1] != heads[1] || flat[2] != heads[2] * heads[3])
    return false;
  if (!asLinearMap(ctx, reshape->inputs[0], out.linear)) return false;
  out.rope = rope->id;
  out.reshape = reshape->id;
  out.turned = v;
  out.heads = heads;
  return true;
}

ValueId reshaped(Graph& g, ValueId v, const Shape& s) {
  return g.add(OpKind::Reshape, {v}, AttrMap().set<attr::Shape>(std::vector<int64_t>(s.begin(), s.end())));
}

// `v` [..., H·D] with every head's columns reordered from (first half, second half) to pairs.
ValueId pairHalves(Graph& g, ValueId v, int64_t d) {
  Shape s = g.shape(v);
  const int64_t units = s.back();
  s.back() = units / d;
  s.push_back(2);
  s.push_back(d / 2);
  const ValueId split = reshaped(g, v, s);
  std::vector<int64_t> perm(s.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  const ValueId paired = g.add(OpKind::Permute, {split}, AttrMap().set<attr::Perm>(perm));
  return reshaped(g, paired, g.shape(v));
}

class FoldRopePattern final : public RewritePattern {
public:
  const char* name() const override { return "fold-rope"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node n = g.node(root);
    if (n.op != OpKind::FlashAttention) return false;
    const bool bshd = n.attrs.get<attr::Layout>() == "bshd";
    RopedProjection side[2];
    for (int i = 0; i < 2; ++i)
      if (!asRopedProjection(ctx, n.inputs[static_cast<size_t>(i)], bshd, side[i])) return false;
    const AttrMap& ra = g.node(side[0].rope).attrs;
    const AttrMap& rb = g.node(side[1].rope).attrs;
    if (ra.get<attr::RopeBase>() != rb.get<attr::RopeBase>() || ra.get<attr::RopeDims>() != rb.get<attr::RopeDims>() ||
        ra.get<attr::Interleaved>() != rb.get<attr::Interleaved>())
      return false;
    const int64_t d = side[0].heads[3];
    const bool interleaved = ra.get<attr::Interleaved>();
    if (!interleaved && ra.get<attr::RopeDims>() != 0 && ra.get<attr::RopeDims>() != d) return false;
    AttrMap a;
    a.set<attr::Activation>("rope").set<attr::RopeBase>(ra.get<attr::RopeBase>()).set<attr::RopeDims>(ra.get<attr::RopeDims>());
    a.set<attr::HeadDim>(d);
    for (const RopedProjection& s : side) {
      const LinearMap& l = s.linear;
      std::vector<ValueId> ins{l.x, interleaved ? l.w : pairHalves(g, l.w, d)};
      if (l.bias != kNoValue) ins.push_back(interleaved ? l.bias : pairHalves(g, l.bias, d));
      const ValueId fused = g.add(OpKind::FusedLinear, ins, a);
      const ValueId split = reshaped(g, fused, s.heads);
      ctx.replace(s.turned, split, {s.rope, s.reshape, l.node});
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFoldRopePattern() { return std::make_unique<FoldRopePattern>(); }

}  // namespace pa
