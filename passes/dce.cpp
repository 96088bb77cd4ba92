// Dead-code elimination: mark from the graph outputs backwards, erase the rest.
#include "passes/dce.h"

#include <vector>

namespace pa {

int64_t eliminateDeadCode(Graph& g) {
  std::vector<char> live(g.numValues(), 0);
  for (const auto& kv : g.outputs()) live[kv.second] = 1;
  const std::vector<NodeId> order = g.topoOrder();
  int64_t erased = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& n = g.node(*it);
    bool used = n.op == OpKind::Input || n.op == OpKind::Param;
    for (ValueId v : n.outputs) used |= live[v] != 0;
    if (!used) {
      n.erased = true;
      ++erased;
      continue;
    }
    for (ValueId v : n.inputs) live[v] = 1;
  }
  return erased;
}

}  // namespace pa
