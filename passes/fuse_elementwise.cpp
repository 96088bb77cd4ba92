// fuse-elementwise: a connected group of elementwise and broadcast ops becomes one
// FusedElementwise node that evaluates the group's expression in one pass over the output.
//
// Note on grouping. Roots are taken from the end of the graph backwards; a group grows upward
// through producers that are expression ops (by fusion kind: elementwise or broadcast, reading
// no element indices) whose only use is inside the group and which are not graph outputs.
// Every member's result broadcasts to the root's shape (these ops only ever widen shapes), and
// an elementwise op commutes with broadcasting, so evaluating each member at the root's shape
// over inputs broadcast to it gives the same values.
#include <algorithm>
#include <map>
#include <set>

#include "graph/elementwise_expr.h"
#include "passes/fusion.h"

namespace pa {

namespace {

struct GroupBuilder {
  const Graph& g;
  const std::set<NodeId>& members;
  std::vector<ValueId> inputs;
  Expr expr;

  int leaf(ValueId v) {
    auto it = std::find(inputs.begin(), inputs.end(), v);
    ExprNode n;
    n.input = static_cast<int>(it - inputs.begin());
    if (it == inputs.end()) inputs.push_back(v);
    expr.nodes.push_back(n);
    return static_cast<int>(expr.nodes.size()) - 1;
  }
  int build(ValueId v) {
    const Node& p = g.producer(v);
    if (!members.count(p.id)) return leaf(v);
    ExprNode n;
    n.op = p.op;
    n.value = p.op == OpKind::Scale ? p.attrs.get<attr::ScaleFactor>() : 0.0;
    for (ValueId in : p.inputs) n.args.push_back(build(in));
    expr.nodes.push_back(n);
    return static_cast<int>(expr.nodes.size()) - 1;
  }
};

}  // namespace

int64_t fuseElementwise(Graph& g, int64_t& absorbed) {
  // Kept up to date as groups fuse (a fused node reads its inputs), so each replacement edits
  // only the nodes reading the value: linear in the graph, not quadratic.
  std::vector<std::vector<NodeId>> users = g.users();
  std::set<ValueId> outputs;
  for (const auto& kv : g.outputs()) outputs.insert(kv.second);
  const std::vector<NodeId> order = g.topoOrder();
  std::vector<char> taken(g.numNodes(), 0);
  int64_t fused = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeId root = *it;
    if (taken[root] || !isExprOp(g.node(root).op)) continue;
    std::set<NodeId> members{root};
    std::vector<NodeId> work{root};
    while (!work.empty()) {
      const Node& m = g.node(work.back());
      work.pop_back();
      for (ValueId v : m.inputs) {
        const Node& p = g.producer(v);
        if (p.erased || taken[p.id] || members.count(p.id) || !isExprOp(p.op) || p.outputs.size() != 1) continue;
        if (users[v].size() != 1 || outputs.count(v)) continue;
        members.insert(p.id);
        work.push_back(p.id);
      }
    }
    if (members.size() < 2) continue;
    const Node rootNode = g.node(root);
    GroupBuilder b{g, members, {}, {}};
    b.build(rootNode.outputs[0]);
    const Shape& out = g.shape(rootNode.outputs[0]);
    AttrMap a;
    a.set<attr::Expr>(exprToString(b.expr));
    a.set<attr::Shape>(std::vector<int64_t>(out.begin(), out.end()));
    const ValueId f = g.add(OpKind::FusedElementwise, b.inputs, a);
    g.node(g.value(f).producer).origin = rootNode.origin;
    g.node(g.value(f).producer).place = g.placeOf(root);  // runs where the chain's root ran
    users.resize(g.numValues());
    for (ValueId in : b.inputs) users[static_cast<size_t>(in)].push_back(g.value(f).producer);
    g.replaceUses(rootNode.outputs[0], f, users[static_cast<size_t>(rootNode.outputs[0])]);
    users[static_cast<size_t>(f)] = users[static_cast<size_t>(rootNode.outputs[0])];
    for (NodeId id : members) {
      g.node(id).erased = true;
      taken[id] = 1;
    }
    taken.resize(g.numNodes(), 1);
    absorbed += static_cast<int64_t>(members.size());
    ++fused;
  }
  return fused;
}

int64_t eliminateCommonSubexpressions(Graph& g) {
  // A duplicate's readers come after it in topological order and are original nodes, so the
  // use lists taken here stay right while duplicates are replaced one by one.
  const std::vector<std::vector<NodeId>> users = g.users();
  std::map<std::string, NodeId> seen;
  int64_t removed = 0;
  for (NodeId id : g.topoOrder()) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Input || n.op == OpKind::Param) continue;
    std::string key = opName(n.op);
    for (ValueId v : n.inputs) key += " %" + std::to_string(v);
    for (const auto& kv : n.attrs.all()) key += " " + kv.first + "=" + attrString(kv.second);
    if (n.op == OpKind::Constant) key += " " + shapeString(g.shape(n.outputs[0]));
    auto it = seen.find(key);
    if (it == seen.end()) {
      seen.emplace(std::move(key), id);
      continue;
    }
    const Node& keep = g.node(it->second);
    for (size_t i = 0; i < n.outputs.size(); ++i)
      g.replaceUses(n.outputs[i], keep.outputs[i], users[static_cast<size_t>(n.outputs[i])]);
    g.node(id).erased = true;
    ++removed;
  }
  return removed;
}

}  // namespace pa
