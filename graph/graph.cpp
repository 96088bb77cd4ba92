// Graph construction and queries.
#include "graph/graph.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <queue>
#include <stdexcept>

#include "common/errors.h"

namespace pa {

std::string Graph::uniqueName(const std::string& base) {
  int& count = nameCount_[base];
  std::string name = count == 0 ? base : base + "_" + std::to_string(count);
  ++count;
  while (names_.count(name)) name = base + "_" + std::to_string(count++);
  return name;
}

ValueId Graph::add(OpKind op, llvm::ArrayRef<ValueId> inputs, AttrMap attrs, std::string name) {
  const OpInfo& info = opInfo(op);
  if (static_cast<int>(inputs.size()) < info.minInputs ||
      static_cast<int>(inputs.size()) > info.maxInputs) {
    throw ShapeError(name.empty() ? info.name : name,
                     std::string("op '") + info.name + "' takes " + std::to_string(info.minInputs) +
                         (info.maxInputs != info.minInputs ? "-" + std::to_string(info.maxInputs) : "") +
                         " inputs, got " + std::to_string(inputs.size()));
  }
  for (ValueId v : inputs) {
    (void)v;  // only read by the assertion
    assert(v >= 0 && v < static_cast<ValueId>(values_.size()) && "dangling input");
  }
  Node n;
  n.id = static_cast<NodeId>(nodes_.size());
  n.op = op;
  n.inputs.assign(inputs.begin(), inputs.end());
  n.attrs = std::move(attrs);
  n.name = name.empty() ? uniqueName(info.name) : name;
  if (!name.empty()) {
    if (names_.count(name)) throw ShapeError(name, "a value of this name already exists");
    nameCount_[name]++;
  }
  for (const auto& kv : n.attrs.all()) {  // the getters shape inference calls assume these types
    AttrKind kind;
    if (attrKindOf(kv.first, kind) && !attrHolds(kind, kv.second))
      throw ShapeError(n.name, "attribute '" + kv.first + "' must be " + attrKindDescription(kind) + ", got " +
                                   attrString(kv.second));
  }
  llvm::SmallVector<TensorType, 2> types = inferTypes(*this, n);
  for (const TensorType& t : types) {
    int64_t elements;
    if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0; }))
      throw ShapeError(n.name, "output " + shapeString(t.shape) + " has a negative extent");
    if (t.shape.size() > static_cast<size_t>(kMaxRank))
      throw ShapeError(n.name, "output has " + std::to_string(t.shape.size()) + " dimensions; at most " +
                                   std::to_string(kMaxRank) + " are supported");
    if (!checkedNumel(t.shape, elements))
      throw ShapeError(n.name, "output " + shapeString(t.shape) + " holds more than 2^48 elements (" +
                                   elementCountString(t.shape) + "); no machine holds a tensor that large");
  }
  for (size_t i = 0; i < types.size(); ++i) {
    Value v;
    v.id = static_cast<ValueId>(values_.size());
    v.type = types[i];
    v.producer = n.id;
    v.outputIndex = static_cast<int>(i);
    v.name = i == 0 ? n.name : n.name + ":" + std::to_string(i);
    n.outputs.push_back(v.id);
    names_[v.name] = v.id;
    values_.push_back(std::move(v));
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs.front();
}

ValueId Graph::addInput(const std::string& name, llvm::ArrayRef<int64_t> shape) {
  AttrMap a;
  a.set<attr::Shape>(std::vector<int64_t>(shape.begin(), shape.end()));
  return add(OpKind::Input, {}, std::move(a), name);
}

ValueId Graph::addParam(const std::string& name, llvm::ArrayRef<int64_t> shape, const std::string& init) {
  AttrMap a;
  a.set<attr::Shape>(std::vector<int64_t>(shape.begin(), shape.end()));
  a.set<attr::Init>(init);
  return add(OpKind::Param, {}, std::move(a), name);
}

ValueId Graph::addConstant(double value, llvm::ArrayRef<int64_t> shape, const std::string& name) {
  AttrMap a;
  a.set<attr::Shape>(std::vector<int64_t>(shape.begin(), shape.end()));
  a.set<attr::Value>(value);
  return add(OpKind::Constant, {}, std::move(a), name);
}

ValueId Graph::output(const std::string& name) const {
  auto it = outputs_.find(name);
  if (it == outputs_.end()) throw std::logic_error("graph has no output named '" + name + "'");
  return it->second;
}

std::vector<NodeId> Graph::topoOrder() const {
  // Kahn's algorithm taking the ready node of the lowest place first (Node::place, else its id):
  // insertion order wherever it is already topological (frontend graphs), and fused nodes, which
  // passes append at the end, run at their root's place or, without one, move up to where their
  // users need them. Deterministic. Nodes on a cycle are left out (the
  // verifier then reports their users).
  std::vector<int> pending(nodes_.size(), 0);
  std::vector<std::vector<NodeId>> consumers(nodes_.size());
  for (const Node& n : nodes_) {
    if (n.erased) continue;
    for (ValueId v : n.inputs) {
      const NodeId p = values_[v].producer;
      if (nodes_[p].erased) continue;
      ++pending[n.id];
      consumers[p].push_back(n.id);
    }
  }
  using Key = std::pair<NodeId, NodeId>;  // (place, id)
  auto key = [&](NodeId id) { return Key{placeOf(id), id}; };
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  for (const Node& n : nodes_)
    if (!n.erased && pending[n.id] == 0) ready.push(key(n.id));
  std::vector<NodeId> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    const NodeId id = ready.top().second;
    ready.pop();
    order.push_back(id);
    for (NodeId c : consumers[id])
      if (--pending[c] == 0) ready.push(key(c));
  }
  return order;
}

std::vector<ValueId> Graph::params() const {
  std::vector<ValueId> r;
  for (const Node& n : nodes_)
    if (!n.erased && n.op == OpKind::Param) r.push_back(n.outputs[0]);
  return r;
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> r;
  for (const Node& n : nodes_)
    if (!n.erased && n.op == OpKind::Input) r.push_back(n.outputs[0]);
  return r;
}

ValueId Graph::findValue(const std::string& name) const {
  auto it = names_.find(name);
  if (it == names_.end() || nodes_[values_[it->second].producer].erased) return kNoValue;
  return it->second;
}

std::vector<std::vector<NodeId>> Graph::users() const {
  std::vector<std::vector<NodeId>> u(values_.size());
  for (const Node& n : nodes_) {
    if (n.erased) continue;
    for (ValueId v : n.inputs) u[v].push_back(n.id);
  }
  return u;
}

void Graph::setOutput(const std::string& name, ValueId v) {
  auto it = outputs_.find(name);
  if (it != outputs_.end()) {
    std::vector<std::string>& names = outputNames_[it->second];
    names.erase(std::find(names.begin(), names.end(), name));
    if (names.empty()) outputNames_.erase(it->second);
  }
  outputs_[name] = v;
  outputNames_[v].push_back(name);
}

void Graph::renameOutputs(ValueId from, ValueId to) {
  auto it = outputNames_.find(from);
  if (it == outputNames_.end() || from == to) return;
  const std::vector<std::string> names = std::move(it->second);
  outputNames_.erase(it);
  for (const std::string& name : names) {
    outputs_[name] = to;
    outputNames_[to].push_back(name);
  }
}

void Graph::replaceAllUses(ValueId from, ValueId to) {
  for (Node& n : nodes_)
    for (ValueId& v : n.inputs)
      if (v == from) v = to;
  renameOutputs(from, to);
}

void Graph::replaceUses(ValueId from, ValueId to, llvm::ArrayRef<NodeId> users) {
  for (NodeId id : users)
    for (ValueId& v : nodes_[id].inputs)
      if (v == from) v = to;
  renameOutputs(from, to);
}

size_t Graph::liveNodeCount() const {
  size_t c = 0;
  for (const Node& n : nodes_) c += !n.erased;
  return c;
}

}  // namespace pa
