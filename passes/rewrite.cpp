// The greedy rewrite driver.
#include "passes/rewrite.h"

#include <cassert>

namespace pa {

bool RewriteContext::isOutput(ValueId v) const {
  for (const auto& kv : g_.outputs())
    if (kv.second == v) return true;
  return false;
}

const Node* RewriteContext::producerIf(ValueId v, OpKind op) const {
  const Node& n = g_.producer(v);
  return !n.erased && n.op == op ? &n : nullptr;
}

void RewriteContext::replace(ValueId from, ValueId to, const std::vector<NodeId>& dead) {
  g_.replaceAllUses(from, to);
  for (NodeId id : dead) g_.node(id).erased = true;
  refresh();
  for (NodeId id : dead) {
    (void)id;
    for (ValueId v : g_.node(id).outputs) {
      (void)v;
      assert(useCount(v) == 0 && "a rewrite erased a node whose value is still used");
    }
  }
}

void RewriteContext::refresh() { users_ = g_.users(); }

int64_t applyPatternsGreedily(Graph& g, const std::vector<std::unique_ptr<RewritePattern>>& patterns, int maxSweeps) {
  int64_t rewrites = 0;
  for (int sweep = 0; sweep < maxSweeps; ++sweep) {
    RewriteContext ctx(g);
    bool changed = false;
    for (NodeId id : g.topoOrder()) {
      if (g.node(id).erased) continue;
      for (const auto& p : patterns) {
        if (p->matchAndRewrite(ctx, id)) {
          ++rewrites;
          changed = true;
          break;
        }
      }
    }
    if (!changed) break;
  }
  return rewrites;
}

}  // namespace pa
