// Facts derived from a verified node's attributes and shapes, shared by every backend and by
// autodiff, so each is written once (shape inference validates them first).
#pragma once

#include <algorithm>
#include <string>
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

// A fused-mlp or fused-mlp-grad node's layers (attributes `activations` and `biases`; widths from
// the weights). Every activation's derivative is a function of its output, so the backward reads
// the saved outputs: relu' = [y > 0], tanh' = 1 − y², sigmoid' = y(1 − y).
enum class MlpActivation { None, Relu, Tanh, Sigmoid };
inline const char* mlpActivationName(MlpActivation a) {
  switch (a) {
  case MlpActivation::None: return "none";
  case MlpActivation::Relu: return "relu";
  case MlpActivation::Tanh: return "tanh";
  case MlpActivation::Sigmoid: return "sigmoid";
  }
  return "none";
}
// Splits "relu,relu,none" into activations; false (with the offending name in `bad`) on an unknown one.
inline bool parseMlpActivations(const std::string& s, std::vector<MlpActivation>& out, std::string& bad) {
  out.clear();
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string name = s.substr(at, comma - at);
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    while (!name.empty() && name.back() == ' ') name.pop_back();
    if (name == "none") out.push_back(MlpActivation::None);
    else if (name == "relu") out.push_back(MlpActivation::Relu);
    else if (name == "tanh") out.push_back(MlpActivation::Tanh);
    else if (name == "sigmoid") out.push_back(MlpActivation::Sigmoid);
    else {
      bad = name;
      return false;
    }
    at = comma + 1;
  }
  return true;
}
inline std::string mlpActivationsString(const std::vector<MlpActivation>& acts) {
  std::string s;
  for (MlpActivation a : acts) s += (s.empty() ? "" : ",") + std::string(mlpActivationName(a));
  return s;
}

struct MlpLayer {
  int64_t in = 0, out = 0;  // K_i, N_i
  MlpActivation act = MlpActivation::None;
  bool bias = false;
  int weightInput = -1, biasInput = -1;  // forward and train nodes: the inputs holding w_i and b_i (-1: none)
  int weightGradOutput = -1, biasGradOutput = -1;  // gradient and train nodes: the outputs dw_i and db_i
};
struct MlpSpec {
  std::vector<MlpLayer> layers;
  int64_t rows = 0;         // x's elements over K0: the rows every layer runs
  bool inputGrad = false;   // gradient node: dx is output 0
};
// The layers of a verified fused-mlp, fused-mlp-grad or fused-mlp-train node.
inline MlpSpec mlpSpecOf(const Graph& g, const Node& n) {
  MlpSpec s;
  std::vector<MlpActivation> acts;
  std::string bad;
  parseMlpActivations(n.attrs.get<attr::MlpActivations>(), acts, bad);
  const std::vector<int64_t> biases = n.attrs.get<attr::MlpBiases>();
  const bool grad = n.op == OpKind::FusedMlpGrad, train = n.op == OpKind::FusedMlpTrain;
  const int layers = static_cast<int>(acts.size());
  s.inputGrad = grad && n.attrs.get<attr::InputGrad>();
  int input = train ? 3 : 1, output = s.inputGrad ? 1 : train ? 2 : 0;
  for (int i = 0; i < layers; ++i) {
    MlpLayer l;
    l.act = acts[static_cast<size_t>(i)];
    l.bias = biases.empty() || biases[static_cast<size_t>(i)] != 0;
    const ValueId w = grad ? n.inputs[static_cast<size_t>(layers + 2 + i)] : n.inputs[static_cast<size_t>(input)];
    l.in = g.shape(w)[0];
    l.out = g.shape(w)[1];
    if (!grad) {
      l.weightInput = input++;
      if (l.bias) l.biasInput = input++;
    }
    if (grad || train) {
      l.weightGradOutput = output++;
      if (l.bias) l.biasGradOutput = output++;
    }
    s.layers.push_back(l);
  }
  const Shape& x = g.shape(n.inputs[grad ? 1 : 0]);
  s.rows = x.back() ? numel(x) / x.back() : 0;
  return s;
}

}  // namespace pa
