// Shape inference: one function per op of ops.def, gathered into a table.
#include <algorithm>
#include <numeric>

#include "graph/errors.h"
#include "graph/graph.h"

namespace pa {

namespace {

using Types = llvm::SmallVector<TensorType, 2>;

const Shape& in(const Graph& g, const Node& n, int i) { return g.shape(n.inputs[i]); }
DType dt(const Graph& g, const Node& n) { return n.inputs.empty() ? DType::F32 : g.value(n.inputs[0]).type.dtype; }
Types one(Shape s, DType d) { return Types{TensorType{std::move(s), d}}; }

[[noreturn]] void fail(const Node& n, const std::string& msg) { throw ShapeError(n.name, msg); }

Shape shapeAttr(const Node& n, const char* key) {
  std::vector<int64_t> s = n.attrs.getInts(key);
  for (int64_t d : s)
    if (d < 0) fail(n, std::string("attribute '") + key + "' has a negative extent: " + shapeString(s));
  return Shape(s.begin(), s.end());
}

Types leaf(const Graph&, const Node& n) {
  if (!n.attrs.has("shape")) fail(n, "needs a 'shape' attribute");
  return one(shapeAttr(n, "shape"), DType::F32);
}

Types inferInput(const Graph& g, const Node& n) { return leaf(g, n); }
Types inferParam(const Graph& g, const Node& n) { return leaf(g, n); }
Types inferConstant(const Graph& g, const Node& n) { return leaf(g, n); }

Types inferMatMul(const Graph& g, const Node& n) {
  const Shape& a = in(g, n, 0);
  const Shape& b = in(g, n, 1);
  if (a.size() < 2 || b.size() < 2)
    fail(n, "matmul needs inputs of rank >= 2, got " + shapeString(a) + " and " + shapeString(b));
  const bool ta = n.attrs.getBool("transpose_a", false), tb = n.attrs.getBool("transpose_b", false);
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
  if (!n.attrs.has("value")) fail(n, "scale needs a 'value' attribute");
  return unary(g, n);
}
Types inferRelu(const Graph& g, const Node& n) { return unary(g, n); }
Types inferGelu(const Graph& g, const Node& n) { return unary(g, n); }
Types inferTanh(const Graph& g, const Node& n) { return unary(g, n); }
Types inferSigmoid(const Graph& g, const Node& n) { return unary(g, n); }
Types inferExp(const Graph& g, const Node& n) { return unary(g, n); }

int axisOf(const Node& n, const Shape& s) {
  const int64_t axis = n.attrs.getInt("axis", -1);
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
  std::vector<int64_t> perm = n.attrs.getInts("perm");
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
  std::vector<int64_t> s = n.attrs.getInts("shape");
  int wild = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (wild >= 0) fail(n, "reshape target " + shapeString(s) + " has more than one -1");
      wild = static_cast<int>(i);
    } else if (s[i] < 0) {
      fail(n, "reshape target " + shapeString(s) + " has a negative extent");
    } else {
      known *= s[i];
    }
  }
  if (wild >= 0 && known > 0 && numel(x) % known == 0) s[wild] = numel(x) / known;
  if (numel(s) != numel(x))
    fail(n, "cannot reshape " + shapeString(x) + " (" + std::to_string(numel(x)) + " elements) to " +
                shapeString(n.attrs.getInts("shape")));
  return one(Shape(s.begin(), s.end()), dt(g, n));
}

Types inferBroadcastTo(const Graph& g, const Node& n) {
  const Shape target = shapeAttr(n, "shape");
  Shape b;
  if (!broadcastShapes(in(g, n, 0), target, b) || b != target)
    fail(n, "cannot broadcast " + shapeString(in(g, n, 0)) + " to " + shapeString(target));
  return one(target, dt(g, n));
}

Types reduction(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  std::vector<int64_t> axes = n.attrs.getInts("axes");
  std::vector<bool> reduce(x.size(), axes.empty());
  for (int64_t a : axes) {
    const int ax = normaliseAxis(a, x.size());
    if (ax < 0) fail(n, "axis " + std::to_string(a) + " is out of range for " + shapeString(x));
    reduce[ax] = true;
  }
  const bool keep = n.attrs.getBool("keepdims", false);
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
  const Shape target = shapeAttr(n, "shape");
  Shape b;
  if (!broadcastShapes(target, in(g, n, 0), b) || b != in(g, n, 0))
    fail(n, "cannot sum " + shapeString(in(g, n, 0)) + " down to " + shapeString(target));
  return one(target, dt(g, n));
}

Types inferAttentionMask(const Graph& g, const Node& n) {
  const Shape& x = in(g, n, 0);
  if (x.size() < 2) fail(n, "attention-mask needs scores of rank >= 2 [..., q, k], got " + shapeString(x));
  const std::string align = n.attrs.getString("align", "top-left");
  if (align != "top-left" && align != "bottom-right")
    fail(n, "align must be 'top-left' or 'bottom-right', got '" + align + "'");
  if (n.attrs.getInt("window_left", -1) < -1 || n.attrs.getInt("window_right", -1) < -1)
    fail(n, "window offsets must be >= 0 (or -1 for unbounded)");
  if (n.attrs.getInt("sinks", 0) < 0) fail(n, "sinks must be >= 0");
  return unary(g, n);
}

Types inferRepeatHeads(const Graph& g, const Node& n) {
  Shape x = in(g, n, 0);
  const int64_t axisAttr = n.attrs.getInt("axis", 1);
  const int axis = normaliseAxis(axisAttr, x.size());
  if (axis < 0) fail(n, "axis " + std::to_string(axisAttr) + " is out of range for " + shapeString(x));
  const int64_t r = n.attrs.getInt("repeats", 1);
  if (r < 1) fail(n, "repeats must be >= 1, got " + std::to_string(r));
  x[axis] *= r;
  return one(x, dt(g, n));
}

Types inferMseLoss(const Graph& g, const Node& n) {
  if (in(g, n, 0) != in(g, n, 1))
    fail(n, "prediction " + shapeString(in(g, n, 0)) + " and target " + shapeString(in(g, n, 1)) + " differ");
  return one(Shape{}, dt(g, n));
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
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs) &infer##Name,
#include "graph/ops.def"
};

}  // namespace

llvm::SmallVector<TensorType, 2> inferTypes(const Graph& g, const Node& n) {
  return kInfer[static_cast<int>(n.op)](g, n);
}

}  // namespace pa
