// fuse-norm: Add(a, b) -> LayerNorm | RmsNorm becomes one norm node with a residual input,
// which writes the sum (for the residual stream's other users) beside the normalised rows: one
// read of a and b and one write of the sum, where the pair read the sum back. Its gradient
// node adds the sum's other gradient into dx (passes/autodiff.cpp, normGrad), so the backward
// is one node too.
//
// Note on what matches: a pre-norm transformer's `x + block(x)` followed by the next block's
// norm. The Add must not broadcast (the sum is a full row of each input); its result may have
// other users (the next residual add) or be a graph output, which then read the node's sum.
#include "passes/fusion.h"

namespace pa {

namespace {

class FuseNormPattern final : public RewritePattern {
public:
  const char* name() const override { return "norm"; }
  bool matchAndRewrite(RewriteContext& ctx, NodeId root) override {
    Graph& g = ctx.graph();
    const Node norm = g.node(root);
    const bool layer = norm.op == OpKind::LayerNorm;
    if (!layer && norm.op != OpKind::RmsNorm) return false;
    const size_t params = layer ? 2 : 1;
    if (norm.inputs.size() != params + 1) return false;  // already fused
    const Node* add = ctx.producerIf(norm.inputs[0], OpKind::Add);
    if (!add) return false;
    const Shape& s = g.shape(add->outputs[0]);
    if (g.shape(add->inputs[0]) != s || g.shape(add->inputs[1]) != s) return false;
    std::vector<ValueId> ins{add->inputs[0]};
    for (size_t i = 1; i <= params; ++i) ins.push_back(norm.inputs[i]);
    ins.push_back(add->inputs[1]);
    const ValueId y = g.add(norm.op, ins, norm.attrs);
    const Node fused = g.node(g.value(y).producer);
    const ValueId sum = add->outputs[0];
    const NodeId addId = add->id;
    for (size_t i = 0; i < norm.outputs.size(); ++i) ctx.replace(norm.outputs[i], fused.outputs[i], {});
    ctx.replace(sum, fused.outputs[norm.outputs.size()], {root, addId});
    return true;
  }
};

}  // namespace

std::unique_ptr<RewritePattern> makeFuseNormPattern() { return std::make_unique<FuseNormPattern>(); }

}  // namespace pa
