// Pattern rewrites (MLIR's OpRewritePattern style): a pattern looks at one root node and either
// fails to match, changing nothing, or replaces the subgraph and reports success. One greedy
// driver applies a set of patterns until none matches or the iteration cap is reached.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace pa {

// What a pattern may ask of the graph while matching.
class RewriteContext {
public:
  explicit RewriteContext(Graph& g) : g_(g) { refresh(); }
  Graph& graph() { return g_; }
  // Live users of v; a graph output counts as a user too.
  size_t useCount(ValueId v) const { return users(v).size() + (isOutput(v) ? 1 : 0); }
  bool hasSingleUse(ValueId v) const { return useCount(v) == 1; }
  const std::vector<NodeId>& users(ValueId v) const;
  bool isOutput(ValueId v) const;
  // Producer of v when it is a live node of kind `op`; null otherwise.
  const Node* producerIf(ValueId v, OpKind op) const;
  // Replaces `from` with `to` everywhere and erases `dead` (nodes that must now be unused).
  // Updates the use lists in place: O(users touched), not O(graph), so a sweep of n rewrites
  // stays linear in the graph.
  void replace(ValueId from, ValueId to, const std::vector<NodeId>& dead);
  void refresh();

private:
  // Adds the nodes patterns appended since the last call to the use lists.
  void catchUp();
  Graph& g_;
  std::vector<std::vector<NodeId>> users_;
  size_t knownNodes_ = 0;  // nodes [0, knownNodes_) are in users_
};

class RewritePattern {
public:
  virtual ~RewritePattern() = default;
  virtual const char* name() const = 0;
  // Returns true after rewriting the subgraph rooted at `root`; false (and no change) otherwise.
  virtual bool matchAndRewrite(RewriteContext& ctx, NodeId root) = 0;
};

// Applies the patterns to every live node, in topological order, repeatedly until a sweep
// changes nothing or `maxSweeps` sweeps ran. Returns the number of rewrites.
int64_t applyPatternsGreedily(Graph& g, const std::vector<std::unique_ptr<RewritePattern>>& patterns, int maxSweeps = 8);

}  // namespace pa
