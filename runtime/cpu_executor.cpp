// The CPU backend's op table: one function per op of ops.def, each translating a node's
// attributes and shapes into a call of a kernels/cpu function.
#include "runtime/cpu_executor.h"

#include <cassert>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"

namespace pa {

namespace {

template <class T>
struct Ctx {
  const Graph& g;
  std::vector<T*>& ptr;
  const Node& n;
  const T* in(int i) const { return ptr[n.inputs[i]]; }
  T* out(int i = 0) const { return ptr[n.outputs[i]]; }
  const Shape& inShape(int i) const { return g.shape(n.inputs[i]); }
  const Shape& outShape(int i = 0) const { return g.shape(n.outputs[i]); }
  int64_t outCount() const { return numel(outShape()); }
};

// A view of `src` (shape) broadcast to the extents of `dst` (numpy alignment from the right).
cpu::Strided broadcastView(const Shape& src, const Shape& dst) {
  cpu::Strided v;
  v.rank = static_cast<int>(dst.size());
  assert(v.rank <= cpu::kMaxRank && "rank too large for the CPU kernels");
  const Shape st = contiguousStrides(src);
  const size_t off = dst.size() - src.size();
  for (size_t d = 0; d < dst.size(); ++d) {
    v.extent[d] = dst[d];
    v.stride[d] = d < off || src[d - off] == 1 ? 0 : st[d - off];
  }
  return v;
}

template <class T> void execInput(Ctx<T>&) {}
template <class T> void execParam(Ctx<T>&) {}
template <class T> void execConstant(Ctx<T>&) {}  // filled once when the executor is built

template <class T>
void execMatMul(Ctx<T>& c) {
  const Shape& a = c.inShape(0);
  const Shape& b = c.inShape(1);
  const bool ta = c.n.attrs.getBool("transpose_a", false), tb = c.n.attrs.getBool("transpose_b", false);
  const int64_t m = ta ? a[a.size() - 1] : a[a.size() - 2];
  const int64_t k = ta ? a[a.size() - 2] : a[a.size() - 1];
  const int64_t n = tb ? b[b.size() - 2] : b[b.size() - 1];
  const int64_t batchA = numel(llvm::ArrayRef<int64_t>(a.data(), a.size() - 2));
  const int64_t batchB = numel(llvm::ArrayRef<int64_t>(b.data(), b.size() - 2));
  const int64_t batch = std::max(batchA, batchB);
  cpu::matmul(c.in(0), c.in(1), c.out(), batch, a.size() > 2, b.size() > 2, m, n, k, ta, tb);
}

template <class T>
void binary(Ctx<T>& c, cpu::BinaryOp op) {
  cpu::binary(op, c.in(0), broadcastView(c.inShape(0), c.outShape()), c.in(1),
              broadcastView(c.inShape(1), c.outShape()), c.out());
}
template <class T> void execAdd(Ctx<T>& c) { binary(c, cpu::BinaryOp::Add); }
template <class T> void execSub(Ctx<T>& c) { binary(c, cpu::BinaryOp::Sub); }
template <class T> void execMul(Ctx<T>& c) { binary(c, cpu::BinaryOp::Mul); }
template <class T> void execDiv(Ctx<T>& c) { binary(c, cpu::BinaryOp::Div); }

template <class T> void execScale(Ctx<T>& c) { cpu::scale(c.in(0), c.out(), c.outCount(), c.n.attrs.getFloat("value", 1.0)); }
template <class T> void execRelu(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Relu, c.in(0), c.out(), c.outCount()); }
template <class T> void execGelu(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Gelu, c.in(0), c.out(), c.outCount()); }
template <class T> void execTanh(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Tanh, c.in(0), c.out(), c.outCount()); }
template <class T> void execSigmoid(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Sigmoid, c.in(0), c.out(), c.outCount()); }
template <class T> void execExp(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Exp, c.in(0), c.out(), c.outCount()); }

// [outer, len, inner] around the node's axis.
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisSplit splitAt(const Shape& s, int64_t axisAttr) {
  const int axis = normaliseAxis(axisAttr, s.size());
  AxisSplit r;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) r.outer *= s[d];
    else if (d == axis) r.len = s[d];
    else r.inner *= s[d];
  }
  return r;
}

template <class T>
void execSoftmax(Ctx<T>& c) {
  const AxisSplit s = splitAt(c.inShape(0), c.n.attrs.getInt("axis", -1));
  std::vector<T> sink;
  if (c.n.inputs.size() == 2) {
    Shape keep = c.inShape(0);
    keep[normaliseAxis(c.n.attrs.getInt("axis", -1), keep.size())] = 1;
    sink.resize(static_cast<size_t>(numel(keep)));
    cpu::gather(c.in(1), broadcastView(c.inShape(1), keep), sink.data());
  }
  cpu::softmax(c.in(0), sink.empty() ? nullptr : sink.data(), c.out(), s.outer, s.len, s.inner);
}

template <class T>
void execPermute(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const Shape st = contiguousStrides(x);
  const std::vector<int64_t> perm = c.n.attrs.getInts("perm");
  cpu::Strided v;
  v.rank = static_cast<int>(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) {
    v.extent[d] = x[perm[d]];
    v.stride[d] = st[perm[d]];
  }
  cpu::gather(c.in(0), v, c.out());
}

template <class T>
void execReshape(Ctx<T>& c) {
  std::copy(c.in(0), c.in(0) + c.outCount(), c.out());
}

template <class T>
void execBroadcastTo(Ctx<T>& c) {
  cpu::gather(c.in(0), broadcastView(c.inShape(0), c.outShape()), c.out());
}

// Sums the input into an output whose kept axes match; `reduced[d]` marks summed axes.
template <class T>
void reduceAxes(Ctx<T>& c, const std::vector<bool>& reduced, double factor) {
  const Shape& x = c.inShape(0);
  Shape kept;
  for (size_t d = 0; d < x.size(); ++d) kept.push_back(reduced[d] ? 1 : x[d]);
  const Shape keptStrides = contiguousStrides(kept);
  cpu::Strided v;
  v.rank = static_cast<int>(x.size());
  for (size_t d = 0; d < x.size(); ++d) {
    v.extent[d] = x[d];
    v.stride[d] = reduced[d] ? 0 : keptStrides[d];
  }
  cpu::reduceSum(c.in(0), v, c.out(), numel(kept), factor);
}

template <class T>
void reduction(Ctx<T>& c, bool mean) {
  const Shape& x = c.inShape(0);
  const std::vector<int64_t> axes = c.n.attrs.getInts("axes");
  std::vector<bool> reduced(x.size(), axes.empty());
  for (int64_t a : axes) reduced[normaliseAxis(a, x.size())] = true;
  int64_t count = 1;
  for (size_t d = 0; d < x.size(); ++d) count *= reduced[d] ? x[d] : 1;
  reduceAxes(c, reduced, mean && count ? 1.0 / static_cast<double>(count) : 1.0);
}
template <class T> void execSum(Ctx<T>& c) { reduction(c, false); }
template <class T> void execMean(Ctx<T>& c) { reduction(c, true); }

template <class T>
void execSumTo(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const Shape& target = c.outShape();
  const size_t off = x.size() - target.size();
  std::vector<bool> reduced(x.size());
  for (size_t d = 0; d < x.size(); ++d) reduced[d] = d < off || (target[d - off] == 1 && x[d] != 1);
  reduceAxes(c, reduced, 1.0);
}

AttentionMaskSpec maskSpec(const AttrMap& a) {
  AttentionMaskSpec m;
  m.causal = a.getBool("causal", false);
  m.alignBottomRight = a.getString("align", "top-left") == "bottom-right";
  m.windowLeft = static_cast<int>(a.getInt("window_left", -1));
  m.windowRight = static_cast<int>(a.getInt("window_right", -1));
  m.sinks = static_cast<int>(a.getInt("sinks", 0));
  return m;
}

template <class T>
void execAttentionMask(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const int64_t q = x[x.size() - 2], k = x[x.size() - 1];
  cpu::attentionMask(c.in(0), c.out(), numel(x) / std::max<int64_t>(q * k, 1), q, k, maskSpec(c.n.attrs),
                     c.n.attrs.getFloat("fill", -std::numeric_limits<double>::infinity()));
}

template <class T>
void execRepeatHeads(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const int axis = normaliseAxis(c.n.attrs.getInt("axis", 1), x.size());
  const int64_t r = c.n.attrs.getInt("repeats", 1);
  // Output axis of extent H*r read as [H, r] with stride 0 on the repeat: head h uses h / r.
  const Shape st = contiguousStrides(x);
  cpu::Strided v;
  v.rank = static_cast<int>(x.size()) + 1;
  int d2 = 0;
  for (int d = 0; d < static_cast<int>(x.size()); ++d) {
    v.extent[d2] = x[d];
    v.stride[d2++] = st[d];
    if (d == axis) {
      v.extent[d2] = r;
      v.stride[d2++] = 0;
    }
  }
  cpu::gather(c.in(0), v, c.out());
}

template <class T>
void execMseLoss(Ctx<T>& c) {
  c.out()[0] = static_cast<T>(cpu::mse(c.in(0), c.in(1), numel(c.inShape(0))));
}

template <class T> void execReluGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Relu, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execGeluGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Gelu, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execTanhGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Tanh, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execSigmoidGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Sigmoid, c.in(0), c.in(1), c.out(), c.outCount()); }

template <class T>
void execSoftmaxGrad(Ctx<T>& c) {
  const AxisSplit s = splitAt(c.inShape(0), c.n.attrs.getInt("axis", -1));
  cpu::softmaxGrad(c.in(0), c.in(1), c.out(), s.outer, s.len, s.inner);
}

template <class T>
void execSoftmaxSinkGrad(Ctx<T>& c) {
  const AxisSplit s = splitAt(c.inShape(0), c.n.attrs.getInt("axis", -1));
  cpu::softmaxSinkGrad(c.in(0), c.in(1), c.out(), s.outer, s.len, s.inner);
}

template <class T>
using ExecFn = void (*)(Ctx<T>&);

template <class T>
const ExecFn<T> kExec[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs) &exec##Name<T>,
#include "graph/ops.def"
};

}  // namespace

template <class T>
CpuExecutor<T>::CpuExecutor(const Graph& g) : g_(g), order_(g.topoOrder()) {
  storage_.resize(g.numValues());
  ptr_.assign(g.numValues(), nullptr);
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    for (ValueId v : n.outputs) {
      storage_[v].assign(static_cast<size_t>(numel(g.shape(v))), T(0));
      ptr_[v] = storage_[v].data();
    }
    if (n.op == OpKind::Constant)
      cpu::fill(ptr_[n.outputs[0]], numel(g.shape(n.outputs[0])), n.attrs.getFloat("value", 0.0));
  }
}

template <class T>
void CpuExecutor<T>::bind(ValueId v, T* data) {
  storage_[v].clear();
  storage_[v].shrink_to_fit();
  ptr_[v] = data;
}

template <class T>
void CpuExecutor<T>::run() {
  for (NodeId id : order_) {
    Ctx<T> c{g_, ptr_, g_.node(id)};
    kExec<T>[static_cast<int>(c.n.op)](c);
  }
}

template <class T>
size_t CpuExecutor<T>::ownedBytes() const {
  size_t b = 0;
  for (const auto& s : storage_) b += s.size() * sizeof(T);
  return b;
}

template class CpuExecutor<float>;
template class CpuExecutor<double>;

}  // namespace pa
