// Runs a graph on the CPU in float (training) or double (the reference), node by node.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/elementwise_expr.h"
#include "graph/graph.h"
#include "passes/memory_plan.h"

namespace pa {

// Physical memory of this machine in bytes (sysconf), what checkFitsMemory compares CPU graphs
// with; INT64_MAX where the system does not say.
int64_t hostMemoryBytes();

template <class T>
class CpuExecutor {
public:
  // Checks that the step fits this machine's memory (checkFitsMemory: the arena and each
  // parameter with its Adam moments, in T; throws UserError otherwise), then allocates a buffer
  // for every value and fills constants. The graph must outlive the executor.
  explicit CpuExecutor(const Graph& g);

  // Makes value `v` read (and, for parameters, be updated) from external storage of
  // numel(shape) elements instead of its own buffer.
  void bind(ValueId v, T* data);
  T* data(ValueId v) { return ptr_[v]; }
  const T* data(ValueId v) const { return ptr_[v]; }
  // Executes every live node in topological order.
  void run();
  // Bytes of the activation arena: the peak of simultaneously live intermediates, inputs,
  // constants and outputs under the memory plan (parameters are bound from outside).
  size_t arenaBytes() const { return arena_.size() * sizeof(T); }
  // Bytes one buffer per value would need (what the plan saves against).
  size_t naiveBytes() const { return naiveBytes_; }

private:
  const Graph& g_;
  std::vector<NodeId> order_;
  std::vector<T> arena_;
  std::vector<T*> ptr_;
  std::vector<Expr> exprs_;  // per node: the parsed expression of a FusedElementwise
  size_t naiveBytes_ = 0;
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace pa
