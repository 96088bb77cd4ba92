// Helpers of the pass tests (CPU and GPU): counting ops, applying one rewrite pattern.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "graph/graph.h"
#include "graph/verifier.h"
#include "passes/dce.h"
#include "passes/rewrite.h"

namespace pa::test {

// How many live nodes of each op the graph has.
inline std::map<OpKind, int> countOps(const Graph& g) {
  std::map<OpKind, int> c;
  for (NodeId id : g.topoOrder()) c[g.node(id).op]++;
  return c;
}

// Applies one pattern greedily, then DCE and the verifier; returns the rewrites made.
inline int64_t applyOne(Graph& g, std::unique_ptr<RewritePattern> p) {
  std::vector<std::unique_ptr<RewritePattern>> ps;
  ps.push_back(std::move(p));
  const int64_t n = applyPatternsGreedily(g, ps);
  eliminateDeadCode(g);
  verifyGraph(g);
  return n;
}

}  // namespace pa::test
