// Runs a graph on the CPU in float (training) or double (the reference), node by node.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace pa {

template <class T>
class CpuExecutor {
public:
  // Allocates a buffer for every value and fills constants. The graph must outlive the executor.
  explicit CpuExecutor(const Graph& g);

  // Makes value `v` read (and, for parameters, be updated) from external storage of
  // numel(shape) elements instead of its own buffer.
  void bind(ValueId v, T* data);
  T* data(ValueId v) { return ptr_[v]; }
  const T* data(ValueId v) const { return ptr_[v]; }
  // Executes every live node in topological order.
  void run();
  // Bytes of the buffers this executor owns (activations, gradients, constants).
  size_t ownedBytes() const;

private:
  const Graph& g_;
  std::vector<NodeId> order_;
  std::vector<std::vector<T>> storage_;
  std::vector<T*> ptr_;
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace pa
