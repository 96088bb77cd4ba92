// Shape inference: one function per op of ops.def, gathered into a table.
#include <algorithm>
#include <numeric>

#include "graph/elementwise_expr.h"
#include "common/errors.h"
#include "graph/graph.h"
#include "graph/node_attrs.h"
#include "common/mlp_limits.h"

namespace pa {

namespace {

using Types = llvm::SmallVector<TensorType, 2>;

const Shape& in(const Graph& g, const Node& n, int i) { return g.shape(n.inputs[i]); }
DType dt(const Graph& g, const Node& n) { return n.inputs.empty() ? DType::F32 : g.value(n.inputs[0]).type.dtype; }
Types one(Shape s, DType d) { return Types{TensorType{std::move(s), d}}; }

[[noreturn]] void fail(const Node& n, const std::string& msg) { throw ShapeError(n.name, msg); }

Shape shapeAttr(const Node& n) {
  std::vector<int64_t> s = n.attrs.get<attr::Shape>();
  for (int64_t d : s)
    if (d < 0) fail(n, std::string("attribute '") + attr::Shape::key + "' has a negative extent: " + shapeString(s));
  return Shape(s.begin(), s.end());
}

// The shape attribute when it is also a tensor's shape: no negative extent, at most kMaxElements.
Shape sizeAttr(const Node& n) {
  Shape s = shapeAttr(n);
  int64_t count;
  if (!checkedNumel(s, count))
    fail(n, std::string("attribute '") + attr::Shape::key + "' " + shapeString(s) + " holds more than 2^48 elements (" +
                elementCountString(s) + "); no machine holds a tensor that large");
  return s;
}

Types leaf(const Graph&, const Node& n) {
  if (!n.attrs.has<attr::Shape>()) fail(n, "needs a 'shape' attribute");
  return one(sizeAttr(n), DType::F32);
}

Types inferInput(const Graph& g, const Node& n) { return leaf(g, n); }
Types inferParam(const Graph& g, const Node& n) { return leaf(g, n); }
Types inferConstant(const Graph& g, const Node& n) {
  Types t = leaf(g, n);
  if (n.attrs.has<attr::Data>() && static_cast<int64_t>(n.attrs.get<attr::Data>().size()) != numel(t[0].shape))
    fail(n, "constant data holds " + std::to_string(n.attrs.get<attr::Data>().size()) + " values, shape " +
                shapeString(t[0].shape) + " needs " + std::to_string(numel(t[0].shape)));
  return t;
}

Types inferMatMul(const Graph& g, const Node& n) {
  const Shape& a = in(g, n, 0);
  const Shape& b = in(g, n, 1);
  if (a.size() < 2 || b.size() < 2)
    fail(n, "matmul needs inputs of rank >= 2, got " + shapeString(a) + " and " + shapeString(b));
  const bool ta = n.attrs.get<attr::TransposeA>(), tb = n.attrs.get<attr::TransposeB>();
  const int64_t m = ta ? a[a.size() - 1] : a[a.size() - 2];
  const int64_t ka = ta ? a[a.size() - 2] : a[a.size() - 1];
  const int64_t kb = tb ? b[b.size() - 1] : b[b.size() - 2];
  const int64_t nn = tb ? b[b.size() - 2] : b[b.size() - 1];
  if (ka != kb)
    fail(n, "matmul inner dimensions differ: " + shapeString(a) + (ta ? "ᵀ" : "") + " · " +
                shapeString(b) + (tb ? "ᵀ" : "") + " (" + std::to_string(ka) + " vs " + std::to_string(kb) + ")");
  llvm::ArrayRef<int64_t> batchA(a.data(), a.size() - 2), batchB(b.data(), b.size() - 2);
  if (!batchA.empty() && !batchB.empty() && batchA != batchB)
    fail(n, "matmul batch dimensions differ: " + shapeString(a) + " and " + shapeString(b) +
                " (batch dimensions must be equal, or one input must be a plain matrix)");
  llvm::ArrayRef<int64_t> batch = batchA.empty() ? batchB : batchA;
  Shape out(batch.begin(), batch.end());
  out.push_back(m);
  out.push_back(nn);
  return one(out, dt(g, n));
}

Types inferMatMulActGrad(const Graph& g, const Node& n) {
  Types t = inferMatMul(g, n);
  if (in(g, n, 2) != t[0].shape)
    fail(n, "matmul-act-grad: the activation input " + shapeString(in(g, n, 2)) + " must have the product's shape " +
                shapeString(t[0].shape));
  const std::string act = n.attrs.get<attr::GradActivation>();
  if (act != "relu" && act != "gelu") fail(n, "matmul-act-grad: activation must be relu or gelu, got '" + act + "'");
  return t;
}

// The weight-gradient product with its bias gradient: the summed operand is a plain matrix stored
// [K, L] (the layer's dY, rows × units), so the sums run over its rows, K of the product.
Types inferMatMulBiasGrad(const Graph& g, const Node& n) {
  Types t = inferMatMul(g, n);
  const std::string which = n.attrs.get<attr::BiasOperand>();
  if (which != "a" && which != "b") fail(n, "matmul-bias-grad: bias_operand must be a or b, got '" + which + "'");
  const bool a = which == "a";
  const Shape& s = in(g, n, a ? 0 : 1);
  if (g.shape(n.inputs[0]).size() != 2 || g.shape(n.inputs[1]).size() != 2)
    fail(n, "matmul-bias-grad multiplies plain matrices, got " + shapeString(in(g, n, 0)) + " and " + shapeString(in(g, n, 1)));
  if (a ? !n.attrs.get<attr::TransposeA>() : n.attrs.get<attr::TransposeB>())
    fail(n, std::string("matmul-bias-grad: the summed operand ") + (a ? "a" : "b") + " must be stored [K, L] (" +
                (a ? "transpose_a" : "no transpose_b") + ")");
  t.push_back(TensorType{Shape{s[1]}, dt(g, n)});
  return t;
}

// The loss and the prediction's gradient of one MSE: dy is the loss's incoming gradient.
Types inferMseLossGrad(const Graph& g, const Node& n) {
  if (in(g, n, 0) != in(g, n, 1))
    fail(n, "prediction " + shapeString(in(g, n, 0)) + " and target " + shapeString(in(g, n, 1)) + " differ");
  if (numel(in(g, n, 2)) != 1) fail(n, "mse-loss-grad: dy " + shapeString(in(g, n, 2)) + " must hold one element");
  return Types{TensorType{Shape{}, dt(g, n)}, TensorType{in(g, n, 0), dt(g, n)}};
}

Types binary(const Graph& g, const Node& n) {
  Shape out;
  if (!broadcastShapes(in(g, n, 0), in(g, n, 1), out))
    fail(n, "cannot broadcast " + shapeString(in(g, n, 0)) + " with " + shapeString(in(g, n, 1)));
  return one(out, dt(g, n));
}
Types inferAdd(const Graph& g, const Node& n) { return binary(g, n); }
Types inferSub(const Graph& g, const Node& n) { return binary(g, n); }
Types inferMul(const Graph& g, const Node& n) { return binary(g, n); }
Types inferDiv(const Graph& g, const Node& n) { return binary(g, n); }

Types unary(const Graph& g, const Node& n) { return one(in(g, n, 0), dt(g, n)); }
Types inferScale(const Graph& g, const Node& n) {
  if (!n.attrs.has<attr::ScaleFactor>()) fail(n, "scale needs a 'value' attribute");
  return unary(g, n);
}
Types inferCast(const Graph& g, const Node& n) {
  DType t;
  // Only the storage types the executors keep (README, "Ops"): f64 and f16 values would have no
  // kernel that reads them as such.
  const std::string name = n.attrs.get<attr::DType>();
  if (!dtypeFromName(name, t) || (t != DType::F32 && t != DType::BF16))
    fail(n, "cast needs a 'dtype' attribute: f32 or bf16" + (name.empty() ? std::string() : ", got '" + name + "'"));
  return one(in(g, n, 0), t);
}
Types inferRelu(const Graph& g, const Node& n) { return unary(g, n); }
Types inferGelu(const Graph& g, const Node& n) { return unary(g, n); }
Types inferTanh(const Graph& g, const Node& n) { return unary(g, n); }
Types inferSigmoid(const Graph& g, const Node& n) { return unary(g, n); }
Types inferExp(const Graph& g, const Node& n) { return unary(g, n); }
Types inferSilu(const Graph& g, const Node& n) { return unary(g, n); }
Types inferGeluTanh(const Graph& g, const Node& n) { return unary(g, n); }

// The normalised input [..., F] and a gain (and bias) of [F]; its row statistics are [...]:
// x's shape without the last axis.
Shape normRows(const Graph& g, const Node& n, int params) {
  const Shape& x = in(g, n, 0);
  if (x.empty()) fail(n, std::string(opName(n.op)) + " needs an input of rank >= 1, got a scalar");
  for (int i = 1; i <= params; ++i)
    if (in(g, n, i) != Shape{x.back()})
      fail(n, std::string(i == 1 ? "the gain " : "the bias ") + shapeString(in(g, n, i)) + " must be [" +
                  std::to_string(x.back()) + "], the last axis of the input " + shapeString(x));
  if (!(n.attrs.get<attr::Eps>() > 0.0)) fail(n, "eps must be > 0, got " + std::to_string(n.attrs.get<attr::Eps>()));
  return Shape(x.begin(), x.end() - 1);
}
Types normForward(const Graph& g, const Node& n, int params, int stats) {
  const Shape rows = normRows(g, n, params);
  Types t = one(in(g, n, 0), dt(g, n));
  for (int i = 0; i < stats; ++i) t.push_back(TensorType{rows, DType::F32});
  if (static_cast<int>(n.inputs.size()) == params + 2) {
    if (in(g, n, params + 1) != in(g, n, 0))
      fail(n, "the residual " + shapeString(in(g, n, params + 1)) + " must have the input's shape " + shapeString(in(g, n, 0)));
    t.push_back(TensorType{in(g, n, 0), dt(g, n)});
  }
  return t;
}
Types inferLayerNorm(const Graph& g, const Node& n) { return normForward(g, n, 2, 2); }
Types inferRmsNorm(const Graph& g, const Node& n) { return normForward(g, n, 1, 1); }

// Rope's [B, H, S, D] view of its input: the position axis and the feature axis by layout.
Types inferRope(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  const std::string layout = n.attrs.get<attr::Layout>();
  if (layout != "bhsd" && layout != "bshd") fail(n, "rope: layout must be bhsd or bshd, got '" + layout + "'");
  if (x.size() != 4) fail(n, "rope needs a [batch, heads, seq, head_dim] input (or [batch, seq, heads, head_dim] with layout bshd), got " + shapeString(x));
  const int64_t dims = n.attrs.get<attr::RopeDims>();
  if (dims < 0 || dims > x[3] || dims % 2 != 0)
    fail(n, "rope: dims must be even and at most the head dim " + std::to_string(x[3]) + " (0: all), got " + std::to_string(dims));
  if (dims == 0 && x[3] % 2 != 0) fail(n, "rope: the head dim " + std::to_string(x[3]) + " is odd; set dims to an even count");
  if (!(n.attrs.get<attr::RopeBase>() > 0.0)) fail(n, "rope: base must be > 0, got " + std::to_string(n.attrs.get<attr::RopeBase>()));
  const int64_t heads = n.attrs.get<attr::RopeHeads>(), h = layout == "bshd" ? x[2] : x[1];
  if (heads < 0 || heads > h) fail(n, "rope: heads must be 0 (all) to " + std::to_string(h) + ", got " + std::to_string(heads));
  return unary(g, n);
}

int axisOf(const Node& n, const Shape& s) {
  const int64_t axis = n.attrs.get<attr::Axis>();
  const int a = normaliseAxis(axis, s.size());
  if (a < 0) fail(n, "axis " + std::to_string(axis) + " is out of range for " + shapeString(s));
  return a;
}

Shape keepDimsAlong(const Shape& s, int axis) {
  Shape k = s;
  k[axis] = 1;
  return k;
}

Types inferSoftmax(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  const int axis = axisOf(n, x);
  if (n.inputs.size() == 2) {
    const Shape keep = keepDimsAlong(x, axis);
    Shape b;
    if (!broadcastShapes(in(g, n, 1), keep, b) || b != keep)
      fail(n, "sink logits " + shapeString(in(g, n, 1)) + " must broadcast to " + shapeString(keep));
  }
  return unary(g, n);
}

Types inferPermute(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  std::vector<int64_t> perm = n.attrs.get<attr::Perm>();
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(x.size());
  std::iota(iota.begin(), iota.end(), 0);
  if (sorted != iota) fail(n, "perm " + shapeString(perm) + " is not a permutation of the axes of " + shapeString(x));
  Shape out;
  for (int64_t p : perm) out.push_back(x[p]);
  return one(out, dt(g, n));
}

Types inferReshape(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  std::vector<int64_t> s = n.attrs.get<attr::Shape>();
  int wild = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (wild >= 0) fail(n, "reshape target " + shapeString(s) + " has more than one -1");
      wild = static_cast<int>(i);
    } else if (s[i] < 0) {
      fail(n, "reshape target " + shapeString(s) + " has a negative extent");
    } else if (!checkedMul(known, s[i], known)) {
      fail(n, "reshape target " + shapeString(s) + " holds more than 2^48 elements (" + elementCountString(s) +
                  "), the input " + shapeString(x) + " holds " + std::to_string(numel(x)));
    }
  }
  if (wild >= 0 && known > 0 && numel(x) % known == 0) s[wild] = numel(x) / known;
  if (wild >= 0 ? s[wild] == -1 || known * s[wild] != numel(x) : known != numel(x))
    fail(n, "cannot reshape " + shapeString(x) + " (" + std::to_string(numel(x)) + " elements) to " +
                shapeString(n.attrs.get<attr::Shape>()));
  return one(Shape(s.begin(), s.end()), dt(g, n));
}

Types inferBroadcastTo(const Graph& g, const Node& n) {
  const Shape target = sizeAttr(n);
  Shape b;
  if (!broadcastShapes(in(g, n, 0), target, b) || b != target)
    fail(n, "cannot broadcast " + shapeString(in(g, n, 0)) + " to " + shapeString(target));
  return one(target, dt(g, n));
}

Types reduction(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  std::vector<int64_t> axes = n.attrs.get<attr::Axes>();
  std::vector<bool> reduce(x.size(), axes.empty());
  for (int64_t a : axes) {
    const int ax = normaliseAxis(a, x.size());
    if (ax < 0) fail(n, "axis " + std::to_string(a) + " is out of range for " + shapeString(x));
    reduce[ax] = true;
  }
  const bool keep = n.attrs.get<attr::KeepDims>();
  Shape out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!reduce[i]) out.push_back(x[i]);
    else if (keep) out.push_back(1);
  }
  return one(out, dt(g, n));
}
Types inferSum(const Graph& g, const Node& n) { return reduction(g, n); }
Types inferMean(const Graph& g, const Node& n) { return reduction(g, n); }

Types inferSumTo(const Graph& g, const Node& n) {
  const Shape target = sizeAttr(n);
  Shape b;
  if (!broadcastShapes(target, in(g, n, 0), b) || b != in(g, n, 0))
    fail(n, "cannot sum " + shapeString(in(g, n, 0)) + " down to " + shapeString(target));
  return one(target, dt(g, n));
}

Types inferAttentionMask(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  if (x.size() < 2) fail(n, "attention-mask needs scores of rank >= 2 [..., q, k], got " + shapeString(x));
  const std::string align = n.attrs.get<attr::Align>();
  if (align != "top-left" && align != "bottom-right")
    fail(n, "align must be 'top-left' or 'bottom-right', got '" + align + "'");
  if (n.attrs.get<attr::WindowLeft>() < -1 || n.attrs.get<attr::WindowRight>() < -1)
    fail(n, "window offsets must be >= 0 (or -1 for unbounded)");
  if (n.attrs.get<attr::Sinks>() < 0) fail(n, "sinks must be >= 0");
  return unary(g, n);
}

Types inferRepeatHeads(const Graph& g, const Node& n) {
  Shape x = in(g, n, 0);
  const int64_t axisAttr = n.attrs.get<attr::RepeatAxis>();
  const int axis = normaliseAxis(axisAttr, x.size());
  if (axis < 0) fail(n, "axis " + std::to_string(axisAttr) + " is out of range for " + shapeString(x));
  const int64_t r = n.attrs.get<attr::Repeats>();
  if (r < 1) fail(n, "repeats must be >= 1, got " + std::to_string(r));
  int64_t count;
  if (!checkedMul(x[axis], r, x[axis]) || !checkedNumel(x, count))
    fail(n, "repeating axis " + std::to_string(axis) + " of " + shapeString(in(g, n, 0)) + " " + std::to_string(r) +
                " times gives more than 2^48 elements; no machine holds a tensor that large");
  return one(x, dt(g, n));
}

Types inferMseLoss(const Graph& g, const Node& n) {
  if (in(g, n, 0) != in(g, n, 1))
    fail(n, "prediction " + shapeString(in(g, n, 0)) + " and target " + shapeString(in(g, n, 1)) + " differ");
  return one(Shape{}, dt(g, n));
}

Types inferFusedLinear(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  const Shape& w = in(g, n, 1);
  const bool tw = n.attrs.get<attr::TransposeW>();
  if (x.empty() || w.size() != 2) fail(n, "fused-linear needs x [..., K] and a weight matrix, got " + shapeString(x) + " and " + shapeString(w));
  const int64_t k = tw ? w[1] : w[0], units = tw ? w[0] : w[1];
  if (x.back() != k) fail(n, "x " + shapeString(x) + " has " + std::to_string(x.back()) + " features, the weight " + shapeString(w) + " expects " + std::to_string(k));
  if (n.inputs.size() == 3 && in(g, n, 2) != Shape{units})
    fail(n, "bias " + shapeString(in(g, n, 2)) + " must be [" + std::to_string(units) + "]");
  const std::string act = n.attrs.get<attr::Activation>();
  if (act != "none" && act != "relu" && act != "gelu" && act != "swiglu" && act != "rope")
    fail(n, "activation must be none, relu, gelu, swiglu or rope, got '" + act + "'");
  if (act == "swiglu" && units % 2 != 0) fail(n, "swiglu pairs the weight's columns (gate, up), but it has " + std::to_string(units));
  if (act == "rope") {
    const int64_t hd = n.attrs.get<attr::HeadDim>(), dims = n.attrs.get<attr::RopeDims>();
    const double base = n.attrs.get<attr::RopeBase>();
    if (x.size() < 2) fail(n, "rope needs x [..., S, K] (the positions count along S), got " + shapeString(x));
    if (hd <= 0 || hd % 2 != 0 || units % hd != 0)
      fail(n, "rope's head_dim must be even, positive and divide the " + std::to_string(units) + " columns, got " + std::to_string(hd));
    if (dims < 0 || dims % 2 != 0 || dims > hd) fail(n, "rope's dims must be even and at most head_dim " + std::to_string(hd) + ", got " + std::to_string(dims));
    if (!(base > 0.0)) fail(n, "rope's base must be > 0, got " + std::to_string(base));
  }
  Shape out = x;
  out.back() = act == "swiglu" ? units / 2 : units;
  Types t = one(out, dt(g, n));
  out.back() = units;
  if (act == "gelu" || act == "swiglu") t.push_back(TensorType{out, dt(g, n)});  // the pre-activation, for the backward
  return t;
}

// fused-mlp(-grad): the activations and bias flags, checked against the layer count.
std::vector<MlpActivation> mlpLayersOf(const Node& n, std::vector<bool>& bias) {
  std::vector<MlpActivation> acts;
  std::string bad;
  if (!parseMlpActivations(n.attrs.get<attr::MlpActivations>(), acts, bad))
    fail(n, "activations: '" + bad + "' is not one of none, relu, tanh, sigmoid (a comma-separated list, one per layer)");
  if (static_cast<int64_t>(acts.size()) > kMlpMaxLayers)
    fail(n, "has " + std::to_string(acts.size()) + " layers; a fused-mlp holds at most " + std::to_string(kMlpMaxLayers));
  const std::vector<int64_t> b = n.attrs.get<attr::MlpBiases>();
  if (!b.empty() && b.size() != acts.size())
    fail(n, "biases lists " + std::to_string(b.size()) + " layers, activations " + std::to_string(acts.size()));
  bias.assign(acts.size(), true);
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] != 0 && b[i] != 1) fail(n, "biases holds 0 or 1 per layer, got " + std::to_string(b[i]));
    bias[i] = b[i] == 1;
  }
  return acts;
}

// A layer's weight [K, N]: a matrix whose K is `k` and whose widths fit the fused kernels.
int64_t mlpWeightUnits(const Graph& g, const Node& n, int input, size_t layer, int64_t k) {
  const Shape& w = in(g, n, input);
  const std::string which = "layer " + std::to_string(layer + 1) + "'s weight ";
  if (w.size() != 2) fail(n, which + shapeString(w) + " must be a matrix [K, N]");
  if (w[0] != k) fail(n, which + shapeString(w) + " expects " + std::to_string(w[0]) + " inputs, the layer gets " + std::to_string(k));
  if (w[1] < 1 || w[0] < 1 || w[0] > kMlpMaxWidth || w[1] > kMlpMaxWidth)
    fail(n, which + shapeString(w) + ": a fused-mlp's widths are 1 to " + std::to_string(kMlpMaxWidth) +
                " (the GPU kernel keeps a layer's weights in shared memory)");
  return w[1];
}

// A fused-mlp's or fused-mlp-train's layers: `leading` inputs (named in `names`), then per layer a
// weight and, where `bias` says so, a bias; x (input 0) [..., K₀]. Returns each layer's N_i.
std::vector<int64_t> mlpLayerWidths(const Graph& g, const Node& n, const std::vector<bool>& bias, int leading, const char* names) {
  size_t want = static_cast<size_t>(leading);
  for (bool b : bias) want += b ? 2 : 1;
  if (n.inputs.size() != want)
    fail(n, std::string("takes ") + names + " and, per layer, a weight and a bias where biases says so: " + std::to_string(want) +
                " inputs, got " + std::to_string(n.inputs.size()));
  const Shape& x = in(g, n, 0);
  if (x.empty()) fail(n, "x must be [..., K], got a scalar");
  std::vector<int64_t> widths;
  int64_t k = x.back();
  int input = leading;
  for (size_t i = 0; i < bias.size(); ++i) {
    const int64_t units = mlpWeightUnits(g, n, input++, i, k);
    if (bias[i]) {
      if (in(g, n, input) != Shape{units})
        fail(n, "layer " + std::to_string(i + 1) + "'s bias " + shapeString(in(g, n, input)) + " must be [" + std::to_string(units) + "]");
      ++input;
    }
    widths.push_back(units);
    k = units;
  }
  return widths;
}

Types inferFusedMlp(const Graph& g, const Node& n) {
  std::vector<bool> bias;
  const std::vector<MlpActivation> acts = mlpLayersOf(n, bias);
  if (acts.empty()) fail(n, "needs at least one layer (attribute activations)");
  const std::vector<int64_t> widths = mlpLayerWidths(g, n, bias, 1, "x");
  const Shape& x = in(g, n, 0);
  const Shape rows(x.begin(), x.end() - 1);
  Types hidden;
  Shape out;
  for (size_t i = 0; i < widths.size(); ++i) {
    out = rows;
    out.push_back(widths[i]);
    if (i + 1 < widths.size()) hidden.push_back(TensorType{out, dt(g, n)});
  }
  Types t = one(out, dt(g, n));
  t.append(hidden.begin(), hidden.end());
  return t;
}

Types inferFusedMlpGrad(const Graph& g, const Node& n) {
  std::vector<bool> bias;
  const std::vector<MlpActivation> acts = mlpLayersOf(n, bias);
  const size_t layers = acts.size();
  if (layers == 0 || n.inputs.size() != 2 * layers + 2)
    fail(n, "takes dy, x, the " + std::to_string(layers ? layers - 1 : 0) + " saved hidden outputs, y and the " +
                std::to_string(layers) + " weights: " + std::to_string(2 * layers + 2) + " inputs, got " + std::to_string(n.inputs.size()));
  const Shape& x = in(g, n, 1);
  if (x.empty()) fail(n, "x must be [..., K], got a scalar");
  const Shape rows(x.begin(), x.end() - 1);
  Types t;
  if (n.attrs.get<attr::InputGrad>()) t.push_back(TensorType{x, dt(g, n)});
  int64_t k = x.back();
  for (size_t i = 0; i < layers; ++i) {
    const int64_t units = mlpWeightUnits(g, n, static_cast<int>(layers + 2 + i), i, k);
    Shape h = rows;
    h.push_back(units);
    if (in(g, n, static_cast<int>(2 + i)) != h)
      fail(n, "layer " + std::to_string(i + 1) + "'s saved output " + shapeString(in(g, n, static_cast<int>(2 + i))) + " must be " + shapeString(h));
    if (i + 1 == layers && in(g, n, 0) != h) fail(n, "dy " + shapeString(in(g, n, 0)) + " must be " + shapeString(h));
    t.push_back(TensorType{Shape{k, units}, dt(g, n)});
    if (bias[i]) t.push_back(TensorType{Shape{units}, dt(g, n)});
    k = units;
  }
  return t;
}

// fused-mlp-train: fused-mlp's inputs after x, target and dy; the loss, y, then fused-mlp-grad's
// weight and bias gradients.
Types inferFusedMlpTrain(const Graph& g, const Node& n) {
  std::vector<bool> bias;
  const std::vector<MlpActivation> acts = mlpLayersOf(n, bias);
  if (acts.empty()) fail(n, "needs at least one layer (attribute activations)");
  const std::vector<int64_t> widths = mlpLayerWidths(g, n, bias, 3, "x, target, dy");
  if (numel(in(g, n, 2)) != 1) fail(n, "dy " + shapeString(in(g, n, 2)) + " must hold one element");
  const Shape& x = in(g, n, 0);
  Types grads;
  int64_t floats = 0, k = x.back();
  for (size_t i = 0; i < widths.size(); ++i) {
    floats += mlpTrainLayerFloats(k, widths[i], bias[i]);
    grads.push_back(TensorType{Shape{k, widths[i]}, dt(g, n)});
    if (bias[i]) grads.push_back(TensorType{Shape{widths[i]}, dt(g, n)});
    k = widths[i];
  }
  if (floats > kMlpTrainMaxFloats)
    fail(n, "its weights and biases take " + std::to_string(floats) + " floats of shared memory; a fused-mlp-train holds at most " +
                std::to_string(kMlpTrainMaxFloats) + " (the GPU kernel keeps every layer's on chip at once)");
  Shape y(x.begin(), x.end() - 1);
  y.push_back(k);
  if (in(g, n, 1) != y) fail(n, "target " + shapeString(in(g, n, 1)) + " must be y's shape " + shapeString(y));
  Types t{TensorType{Shape{}, dt(g, n)}, TensorType{y, dt(g, n)}};
  t.append(grads.begin(), grads.end());
  return t;
}

Types inferInterleave(const Graph& g, const Node& n) {
  const Shape& a = in(g, n, 0);
  if (a.empty() || in(g, n, 1) != a)
    fail(n, "interleave needs two inputs of one shape [..., N], got " + shapeString(a) + " and " + shapeString(in(g, n, 1)));
  Shape out = a;
  out.back() *= 2;
  return one(out, dt(g, n));
}
Types inferDeinterleave(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  if (x.empty() || x.back() % 2 != 0) fail(n, "deinterleave needs an even last axis, got " + shapeString(x));
  const int64_t part = n.attrs.get<attr::Part>();
  if (part != 0 && part != 1) fail(n, "part must be 0 or 1, got " + std::to_string(part));
  Shape out = x;
  out.back() /= 2;
  return one(out, dt(g, n));
}
Types inferConcat(const Graph& g, const Node& n) {
  Shape out = in(g, n, 0);
  if (out.empty()) fail(n, "concat needs inputs of rank >= 1");
  out.back() = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = in(g, n, static_cast<int>(i));
    if (s.size() != out.size() || !std::equal(s.begin(), s.end() - 1, out.begin()))
      fail(n, "concat's inputs must agree on every axis but the last, got " + shapeString(in(g, n, 0)) + " and " + shapeString(s));
    out.back() += s.back();
  }
  return one(out, dt(g, n));
}
Types inferSlice(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  const int64_t start = n.attrs.get<attr::Start>(), length = n.attrs.get<attr::Length>();
  if (x.empty() || start < 0 || length < 1 || start + length > x.back())
    fail(n, "slice [" + std::to_string(start) + ", " + std::to_string(start + length) + ") is not inside the last axis of " + shapeString(x));
  Shape out = x;
  out.back() = length;
  return one(out, dt(g, n));
}
Types inferSwigluGrad(const Graph& g, const Node& n) {
  const Shape& dy = in(g, n, 0);
  Shape pre = dy;
  if (!dy.empty()) pre.back() *= 2;
  if (dy.empty() || in(g, n, 1) != pre)
    fail(n, "swiglu-grad needs dy [..., N] and the pre-activations [..., 2N], got " + shapeString(dy) + " and " + shapeString(in(g, n, 1)));
  return one(pre, dt(g, n));
}

// The [B, H, S, D] view of a flash operand laid out as the node's `layout` says ("bhsd", or
// "bshd": [B, S, H, D], the projections' own layout, read with strides).
Shape flashLogical(const Node& n, Shape s) {
  if (s.size() == 4 && n.attrs.get<attr::Layout>() == "bshd") std::swap(s[1], s[2]);
  return s;
}

// Checks the q, k, v [B, H, S, D] layout shared by the flash ops and returns Hq / Hk.
int64_t flashShapes(const Graph& g, const Node& n) {
  const std::string layout = n.attrs.get<attr::Layout>();
  if (layout != "bhsd" && layout != "bshd") fail(n, "layout must be 'bhsd' or 'bshd', got '" + layout + "'");
  const Shape q = flashLogical(n, in(g, n, 0));
  const Shape k = flashLogical(n, in(g, n, 1));
  const Shape v = flashLogical(n, in(g, n, 2));
  if (q.size() != 4 || k.size() != 4 || v.size() != 4)
    fail(n, "flash attention needs q, k, v of rank 4 [batch, heads, seq, head_dim], got " + shapeString(q) + ", " +
                shapeString(k) + ", " + shapeString(v));
  if (k != v) fail(n, "k " + shapeString(k) + " and v " + shapeString(v) + " differ");
  if (q[0] != k[0] || q[3] != k[3])
    fail(n, "q " + shapeString(q) + " and k " + shapeString(k) + " differ in batch or head_dim");
  if (k[1] == 0 || q[1] % k[1] != 0)
    fail(n, "query heads (" + std::to_string(q[1]) + ") must be a multiple of key/value heads (" + std::to_string(k[1]) + ")");
  if (n.attrs.get<attr::WindowLeft>() < -1 || n.attrs.get<attr::WindowRight>() < -1 || n.attrs.get<attr::Sinks>() < 0)
    fail(n, "window offsets must be >= -1 and sinks >= 0");
  const std::string align = n.attrs.get<attr::Align>();
  if (align != "top-left" && align != "bottom-right") fail(n, "align must be 'top-left' or 'bottom-right'");
  return q[1] / k[1];
}

Types inferFlashAttention(const Graph& g, const Node& n) {
  flashShapes(g, n);
  const Shape q = flashLogical(n, in(g, n, 0));
  if (n.inputs.size() == 4 && in(g, n, 3) != Shape{q[1]})
    fail(n, "sink logits " + shapeString(in(g, n, 3)) + " must be [" + std::to_string(q[1]) + "] (one per query head)");
  Types t = one(in(g, n, 0), dt(g, n));  // o in q's layout
  t.push_back(TensorType{Shape{q[0], q[1], q[2]}, dt(g, n)});
  return t;
}

Types inferFlashAttentionGrad(const Graph& g, const Node& n) {
  flashShapes(g, n);
  const Shape& q = in(g, n, 0);
  if (in(g, n, 3) != q || in(g, n, 5) != q) fail(n, "o and do must have q's shape " + shapeString(q));
  const Shape lq = flashLogical(n, q);
  if (in(g, n, 4) != Shape{lq[0], lq[1], lq[2]}) fail(n, "lse must be [batch, heads, seq]");
  Types t;
  for (int i = 0; i < 3; ++i) t.push_back(TensorType{in(g, n, i), dt(g, n)});
  if (n.inputs.size() == 7) t.push_back(TensorType{in(g, n, 6), dt(g, n)});
  return t;
}

// The packed operand [B, S, Hq + 2 Hk, D] of the qkv flash ops: returns [B, Hq, S, D] (o's
// logical shape) after checking the heads, the mask attributes and the layout.
Shape flashQkvShapes(const Graph& g, const Node& n) {
  const std::string layout = n.attrs.get<attr::Layout>();
  if (layout != "bhsd" && layout != "bshd") fail(n, "layout must be 'bhsd' or 'bshd', got '" + layout + "'");
  const Shape& x = in(g, n, 0);
  const int64_t hk = n.attrs.get<attr::KvHeads>();
  if (x.size() != 4) fail(n, "qkv must be [batch, seq, heads + 2 kv_heads, head_dim], got " + shapeString(x));
  const int64_t hq = x[2] - 2 * hk;
  if (hk < 1 || hq < 1 || hq % hk != 0)
    fail(n, "qkv " + shapeString(x) + " has " + std::to_string(x[2]) + " heads, not heads + 2 kv_heads with kv_heads " +
                std::to_string(hk) + " dividing heads");
  if (n.attrs.get<attr::WindowLeft>() < -1 || n.attrs.get<attr::WindowRight>() < -1 || n.attrs.get<attr::Sinks>() < 0)
    fail(n, "window offsets must be >= -1 and sinks >= 0");
  const std::string align = n.attrs.get<attr::Align>();
  if (align != "top-left" && align != "bottom-right") fail(n, "align must be 'top-left' or 'bottom-right'");
  return Shape{x[0], hq, x[1], x[3]};
}
Shape flashQkvOutShape(const Node& n, const Shape& logical) {
  if (n.attrs.get<attr::Layout>() == "bshd") return Shape{logical[0], logical[2], logical[1], logical[3]};
  return logical;
}

Types inferFlashAttentionQkv(const Graph& g, const Node& n) {
  const Shape q = flashQkvShapes(g, n);
  if (n.inputs.size() == 2 && in(g, n, 1) != Shape{q[1]})
    fail(n, "sink logits " + shapeString(in(g, n, 1)) + " must be [" + std::to_string(q[1]) + "] (one per query head)");
  Types t = one(flashQkvOutShape(n, q), dt(g, n));
  t.push_back(TensorType{Shape{q[0], q[1], q[2]}, dt(g, n)});
  return t;
}

Types inferFlashAttentionQkvGrad(const Graph& g, const Node& n) {
  const Shape q = flashQkvShapes(g, n);
  const Shape o = flashQkvOutShape(n, q);
  if (in(g, n, 1) != o || in(g, n, 3) != o) fail(n, "o and do must be " + shapeString(o));
  if (in(g, n, 2) != Shape{q[0], q[1], q[2]}) fail(n, "lse must be [batch, heads, seq]");
  if (n.inputs.size() == 5 && in(g, n, 4) != Shape{q[1]})
    fail(n, "sink logits " + shapeString(in(g, n, 4)) + " must be [" + std::to_string(q[1]) + "] (one per query head)");
  Types t = one(in(g, n, 0), dt(g, n));
  if (n.inputs.size() == 5) t.push_back(TensorType{in(g, n, 4), dt(g, n)});
  return t;
}

Types inferFusedElementwise(const Graph& g, const Node& n) {
  const Shape out = sizeAttr(n);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    Shape b;
    if (!broadcastShapes(in(g, n, static_cast<int>(i)), out, b) || b != out)
      fail(n, "input " + std::to_string(i) + " " + shapeString(in(g, n, static_cast<int>(i))) + " does not broadcast to " + shapeString(out));
  }
  try {
    const Expr e = parseExpr(n.attrs.get<attr::Expr>());
    for (const ExprNode& x : e.nodes)
      if (x.op == OpKind::Input && (x.input < 0 || x.input >= static_cast<int>(n.inputs.size())))
        fail(n, "expression reads $" + std::to_string(x.input) + " but the node has " + std::to_string(n.inputs.size()) + " inputs");
  } catch (const std::invalid_argument& e) {
    fail(n, e.what());
  }
  return one(out, dt(g, n));
}

Types sameAsBoth(const Graph& g, const Node& n) {
  if (in(g, n, 0) != in(g, n, 1))
    fail(n, "gradient " + shapeString(in(g, n, 0)) + " and saved value " + shapeString(in(g, n, 1)) + " differ");
  return unary(g, n);
}
Types inferReluGrad(const Graph& g, const Node& n) { return sameAsBoth(g, n); }
Types inferGeluGrad(const Graph& g, const Node& n) { return sameAsBoth(g, n); }
Types inferTanhGrad(const Graph& g, const Node& n) { return sameAsBoth(g, n); }
Types inferSigmoidGrad(const Graph& g, const Node& n) { return sameAsBoth(g, n); }
Types inferSiluGrad(const Graph& g, const Node& n) { return sameAsBoth(g, n); }
Types inferGeluTanhGrad(const Graph& g, const Node& n) { return sameAsBoth(g, n); }

// (dy, x, gain, stats..[, d sum]) -> (dx, d gain[, d bias]).
Types normBackward(const Graph& g, const Node& n, int stats, bool bias) {
  const Shape& dy = in(g, n, 0);
  const Shape& x = in(g, n, 1);
  if (dy != x) fail(n, "gradient " + shapeString(dy) + " and saved input " + shapeString(x) + " differ");
  if (x.empty()) fail(n, "needs an input of rank >= 1");
  if (in(g, n, 2) != Shape{x.back()}) fail(n, "the gain " + shapeString(in(g, n, 2)) + " must be [" + std::to_string(x.back()) + "]");
  const Shape rows(x.begin(), x.end() - 1);
  for (int i = 0; i < stats; ++i)
    if (in(g, n, 3 + i) != rows) fail(n, "row statistics " + shapeString(in(g, n, 3 + i)) + " must be " + shapeString(rows));
  if (static_cast<int>(n.inputs.size()) == 4 + stats && in(g, n, 3 + stats) != x)
    fail(n, "the sum's gradient " + shapeString(in(g, n, 3 + stats)) + " must have the input's shape " + shapeString(x));
  Types t = one(x, dt(g, n));
  t.push_back(TensorType{Shape{x.back()}, dt(g, n)});
  if (bias) t.push_back(TensorType{Shape{x.back()}, dt(g, n)});
  return t;
}
Types inferLayerNormGrad(const Graph& g, const Node& n) { return normBackward(g, n, 2, true); }
Types inferRmsNormGrad(const Graph& g, const Node& n) { return normBackward(g, n, 1, false); }

Types inferSoftmaxGrad(const Graph& g, const Node& n) {
  axisOf(n, in(g, n, 0));
  return sameAsBoth(g, n);
}
Types inferSoftmaxSinkGrad(const Graph& g, const Node& n) {
  sameAsBoth(g, n);
  return one(keepDimsAlong(in(g, n, 0), axisOf(n, in(g, n, 0))), dt(g, n));
}

using InferFn = Types (*)(const Graph&, const Node&);
const InferFn kInfer[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) &infer##Name,
#include "graph/ops.def"
};

}  // namespace

llvm::SmallVector<TensorType, 2> inferTypes(const Graph& g, const Node& n) {
  return kInfer[static_cast<int>(n.op)](g, n);
}

}  // namespace pa
