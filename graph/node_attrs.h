// Facts derived from a verified node's attributes and shapes, shared by every backend and by
// autodiff, so each is written once (shape inference validates them first).
#pragma once

#include <vector>

#include "graph/graph.h"
#include "common/attention_mask.h"  // the mask predicate is IR semantics, shared by every path

namespace pa {

// A tensor seen as [outer, len, inner] around one axis (softmax and its gradients).
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
inline AxisSplit splitAroundAxis(const Shape& s, int64_t axisAttr) {
  const int axis = normaliseAxis(axisAttr, s.size());
  AxisSplit r;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) r.outer *= s[static_cast<size_t>(d)];
    else if (d == axis) r.len = s[static_cast<size_t>(d)];
    else r.inner *= s[static_cast<size_t>(d)];
  }
  return r;
}

// Which axes of `x` a Sum or Mean node reduces (`axes` empty: all of them).
inline std::vector<bool> reducedAxes(const Node& n, const Shape& x) {
  const std::vector<int64_t> axes = n.attrs.get<attr::Axes>();
  std::vector<bool> r(x.size(), axes.empty());
  for (int64_t a : axes) r[static_cast<size_t>(normaliseAxis(a, x.size()))] = true;
  return r;
}

// Which axes of `x` a SumTo to `target` (numpy alignment from the right) reduces.
inline std::vector<bool> sumToReducedAxes(const Shape& x, const Shape& target) {
  const size_t off = x.size() - target.size();
  std::vector<bool> r(x.size());
  for (size_t d = 0; d < x.size(); ++d) r[d] = d < off || (target[d - off] == 1 && x[d] != 1);
  return r;
}

// The mask of an attention-mask, flash-attention or flash-attention-grad node.
inline AttentionMaskSpec maskSpecOf(const AttrMap& a) {
  AttentionMaskSpec m;
  m.causal = a.get<attr::Causal>();
  m.alignBottomRight = a.get<attr::Align>() == "bottom-right";
  m.windowLeft = static_cast<int>(a.get<attr::WindowLeft>());
  m.windowRight = static_cast<int>(a.get<attr::WindowRight>());
  m.sinks = static_cast<int>(a.get<attr::Sinks>());
  return m;
}

}  // namespace pa
