// The graph IR: nodes of primitive (later fused) ops over typed values, in SSA form.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include <llvm/ADT/ArrayRef.h>
#include <llvm/ADT/SmallVector.h>

#include "graph/attrs.h"
#include "graph/dtype.h"
#include "graph/op.h"
#include "graph/shape.h"

namespace pa {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;

struct TensorType {
  Shape shape;
  DType dtype = DType::F32;
};

struct Value {
  ValueId id = kNoValue;
  TensorType type;
  NodeId producer = -1;
  int outputIndex = 0;
  std::string name;
};

struct Node {
  NodeId id = -1;
  OpKind op = OpKind::Input;
  llvm::SmallVector<ValueId, 4> inputs;
  llvm::SmallVector<ValueId, 2> outputs;
  AttrMap attrs;
  std::string name;
  // Where the user wrote what this node stands for ("cfg.yaml:5:7: model.layers.0.linear.units
  // = 64"), for messages about it (a parameter or an activation that does not fit in memory).
  // The frontend sets it on the nodes it builds; rewrites give it to the nodes they create.
  // Empty on nodes autodiff adds: a message looks upstream for the nearest origin.
  std::string origin;
  bool erased = false;  // passes mark nodes dead; they stay in storage (ids are indices)
  // topoOrder's tie-break among ready nodes: its place in the program. -1: its id. A rewrite gives
  // the nodes it makes its root's place, so a node appended at the end runs where the nodes it
  // replaced ran, not after everything else (which would keep its inputs alive to the end).
  NodeId place = -1;
};

// Note on reference stability: nodes and values live in std::deques, whose push_back never moves
// an existing element, so a `const Node&`, `const Value&` or `const Shape&` taken from the graph
// stays valid while the graph grows (Graph::add). Gradient rules and rewrite patterns hold such
// references across the nodes they add; with a vector each add could reallocate under them.
// Nothing is ever removed from either deque (passes mark nodes `erased`), so ids stay indices.
class Graph {
public:
  // Adds a node, checks its attributes' types, infers its output types and checks that each
  // holds at most kMaxElements (throws ShapeError naming the node), and returns its first
  // output. `name` must be unique; an empty one is replaced by "<op>_<id>".
  ValueId add(OpKind op, llvm::ArrayRef<ValueId> inputs, AttrMap attrs = {}, std::string name = {});
  ValueId addInput(const std::string& name, llvm::ArrayRef<int64_t> shape);
  ValueId addParam(const std::string& name, llvm::ArrayRef<int64_t> shape, const std::string& init);
  ValueId addConstant(double value, llvm::ArrayRef<int64_t> shape, const std::string& name = {});

  const Value& value(ValueId v) const { return values_[v]; }
  const Node& node(NodeId n) const { return nodes_[n]; }
  Node& node(NodeId n) { return nodes_[n]; }
  const Node& producer(ValueId v) const { return nodes_[values_[v].producer]; }
  const Shape& shape(ValueId v) const { return values_[v].type.shape; }
  size_t numValues() const { return values_.size(); }
  size_t numNodes() const { return nodes_.size(); }
  const std::deque<Node>& nodes() const { return nodes_; }
  const std::deque<Value>& values() const { return values_; }

  // Named results of the graph ("prediction", "loss", gradient outputs "grad/<param>").
  void setOutput(const std::string& name, ValueId v);
  ValueId output(const std::string& name) const;
  bool hasOutput(const std::string& name) const { return outputs_.count(name) != 0; }
  const std::map<std::string, ValueId>& outputs() const { return outputs_; }

  // Live nodes in a topological order (inputs before users), stable in insertion order.
  std::vector<NodeId> topoOrder() const;
  // A node's place in the program (Node::place, else its id): topoOrder's tie-break, and what a
  // node made to stand for another takes from it.
  NodeId placeOf(NodeId id) const { return nodes_[id].place >= 0 ? nodes_[id].place : id; }
  std::vector<ValueId> params() const;  // values of live Param nodes, in insertion order
  std::vector<ValueId> inputs() const;  // values of live Input nodes
  ValueId findValue(const std::string& name) const;  // kNoValue when absent or erased
  // Users of every value (live nodes only), indexed by ValueId.
  std::vector<std::vector<NodeId>> users() const;
  // Replaces every use of `from` (node inputs and graph outputs) with `to`; scans every node.
  void replaceAllUses(ValueId from, ValueId to);
  // The same where the caller knows the nodes that read `from` (`users`, e.g. from users()):
  // only those nodes and the graph outputs naming `from` change, so a pass rewriting n times
  // does O(n) work rather than O(n × nodes).
  void replaceUses(ValueId from, ValueId to, llvm::ArrayRef<NodeId> users);
  // Whether `v` is a graph output (under any name).
  bool isOutput(ValueId v) const { return outputNames_.count(v) != 0; }
  size_t liveNodeCount() const;

  // Set by the lower-bf16 pass: each value's dtype is the type it is stored in, chosen per value
  // (bf16 activations, fp32 parameters, outputs and what the kernels keep in fp32), so it no
  // longer follows shape inference's rule (a node's first input's dtype) and the verifier stops
  // comparing the two.
  bool storageTypes() const { return storageTypes_; }
  void setStorageTypes() { storageTypes_ = true; }
  void setDtype(ValueId v, DType t) { values_[static_cast<size_t>(v)].type.dtype = t; }

private:
  bool storageTypes_ = false;
  std::string uniqueName(const std::string& base);
  std::deque<Value> values_;  // deques: see the note on reference stability above
  std::deque<Node> nodes_;
  std::map<std::string, ValueId> outputs_;
  std::map<ValueId, std::vector<std::string>> outputNames_;  // outputs_ inverted
  void renameOutputs(ValueId from, ValueId to);
  std::map<std::string, int> nameCount_;
  std::map<std::string, ValueId> names_;  // every value name ever given; names are never reused
};

// Output types of a node given its inputs; throws ShapeError. One entry per op (ops.def).
llvm::SmallVector<TensorType, 2> inferTypes(const Graph& g, const Node& n);

}  // namespace pa
