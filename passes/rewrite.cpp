// The greedy rewrite driver.
#include "passes/rewrite.h"

#include <algorithm>
#include <cassert>

namespace pa {

bool RewriteContext::isOutput(ValueId v) const { return g_.isOutput(v); }

const std::vector<NodeId>& RewriteContext::users(ValueId v) const {
  static const std::vector<NodeId> kNone;
  return static_cast<size_t>(v) < users_.size() ? users_[static_cast<size_t>(v)] : kNone;
}

const Node* RewriteContext::producerIf(ValueId v, OpKind op) const {
  const Node& n = g_.producer(v);
  return !n.erased && n.op == op ? &n : nullptr;
}

void RewriteContext::catchUp() {
  users_.resize(g_.numValues());
  for (; knownNodes_ < g_.numNodes(); ++knownNodes_) {
    const Node& n = g_.node(static_cast<NodeId>(knownNodes_));
    if (n.erased) continue;
    for (ValueId v : n.inputs) {
      std::vector<NodeId>& u = users_[static_cast<size_t>(v)];
      if (std::find(u.begin(), u.end(), n.id) == u.end()) u.push_back(n.id);
    }
  }
}

void RewriteContext::replace(ValueId from, ValueId to, const std::vector<NodeId>& dead) {
  catchUp();
  if (from != to) {
    std::vector<NodeId> moved = std::move(users_[static_cast<size_t>(from)]);
    users_[static_cast<size_t>(from)].clear();
    g_.replaceUses(from, to, moved);
    std::vector<NodeId>& into = users_[static_cast<size_t>(to)];
    for (NodeId u : moved) {  // kept sorted by id, as users() lists them
      auto at = std::lower_bound(into.begin(), into.end(), u);
      if (at == into.end() || *at != u) into.insert(at, u);
    }
  }
  for (NodeId id : dead) {
    Node& n = g_.node(id);
    n.erased = true;
    for (ValueId v : n.inputs) {
      std::vector<NodeId>& u = users_[static_cast<size_t>(v)];
      u.erase(std::remove(u.begin(), u.end(), id), u.end());
    }
  }
#ifndef NDEBUG
  for (NodeId id : dead)
    for (ValueId v : g_.node(id).outputs)
      assert(useCount(v) == 0 && "a rewrite erased a node whose value is still used");
#endif
}

void RewriteContext::refresh() {
  users_ = g_.users();
  knownNodes_ = g_.numNodes();
}

int64_t applyPatternsGreedily(Graph& g, const std::vector<std::unique_ptr<RewritePattern>>& patterns, int maxSweeps) {
  int64_t rewrites = 0;
  for (int sweep = 0; sweep < maxSweeps; ++sweep) {
    RewriteContext ctx(g);
    bool changed = false;
    for (NodeId id : g.topoOrder()) {
      if (g.node(id).erased) continue;
      const size_t firstNew = g.numNodes();
      for (const auto& p : patterns) {
        if (p->matchAndRewrite(ctx, id)) {
          // The nodes a rewrite makes stand for what the user wrote at the root (an erased
          // node stays in storage, so the root's origin is still there to read).
          // They also take the root's place in the program (Node::place).
          const NodeId rootPlace = g.placeOf(id);
          for (size_t n = firstNew; n < g.numNodes(); ++n) {
            Node& made = g.node(static_cast<NodeId>(n));
            if (made.origin.empty()) made.origin = g.node(id).origin;
            made.place = rootPlace;
          }
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
