// Graph verifier: every input defined by a live node before its user (no cycles, no dangling
// references), recorded types equal to re-inferred ones, outputs live.
#include "graph/verifier.h"

#include <vector>

#include "common/errors.h"

namespace pa {

void verifyGraph(const Graph& g) {
  std::vector<char> defined(g.numValues(), 0);
  const std::vector<NodeId> order = g.topoOrder();
  if (order.size() != g.liveNodeCount()) {
    std::vector<char> ordered(g.numNodes(), 0);
    for (NodeId id : order) ordered[id] = 1;
    for (const Node& n : g.nodes())
      if (!n.erased && !ordered[n.id]) throw ShapeError(n.name, "is on a cycle (it depends on its own output)");
  }
  for (NodeId id : order) {
    const Node& n = g.node(id);
    for (ValueId v : n.inputs) {
      if (v < 0 || v >= static_cast<ValueId>(g.numValues()))
        throw ShapeError(n.name, "input refers to a value that does not exist");
      if (!defined[v]) {
        const Node& p = g.producer(v);
        throw ShapeError(n.name, "input '" + g.value(v).name + "' " +
                                     (p.erased ? "comes from an erased node" : "is used before it is defined (cycle)"));
      }
    }
    llvm::SmallVector<TensorType, 2> types = inferTypes(g, n);
    if (types.size() != n.outputs.size()) throw ShapeError(n.name, "output count differs from the op's");
    for (size_t i = 0; i < types.size(); ++i) {
      const TensorType& have = g.value(n.outputs[i]).type;
      if (have.shape != types[i].shape)
        throw ShapeError(n.name, "recorded shape " + shapeString(have.shape) + " differs from inferred " +
                                     shapeString(types[i].shape));
      if (have.dtype != types[i].dtype && !g.storageTypes())
        throw ShapeError(n.name, std::string("recorded dtype ") + dtypeName(have.dtype) + " differs from inferred " +
                                     dtypeName(types[i].dtype));
      defined[n.outputs[i]] = 1;
    }
  }
  for (const auto& kv : g.outputs())
    if (!defined[kv.second]) throw ShapeError(kv.first, "graph output refers to a value no live node defines");
}

}  // namespace pa
