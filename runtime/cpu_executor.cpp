// The CPU backend's op table: one function per op of ops.def, each translating a node's
// attributes and shapes into a call of a kernels/cpu function.
#include "runtime/cpu_executor.h"

#include <cassert>
#include <cmath>
#include <deque>
#include <limits>

#include <unistd.h>

#include "graph/elementwise_expr.h"
#include "graph/node_attrs.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/flash_attention_cpu.h"

namespace pa {

namespace {

template <class T>
struct Ctx {
  const Graph& g;
  std::vector<T*>& ptr;
  const Node& n;
  const Expr* expr;  // FusedElementwise only
  const T* in(int i) const { return ptr[n.inputs[i]]; }
  T* out(int i = 0) const { return ptr[n.outputs[i]]; }
  const Shape& inShape(int i) const { return g.shape(n.inputs[i]); }
  const Shape& outShape(int i = 0) const { return g.shape(n.outputs[i]); }
  int64_t outCount() const { return numel(outShape()); }
};

static_assert(cpu::kMaxRank >= kMaxRank, "the CPU kernels' views must hold every rank a graph may have");

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
  const bool ta = getAttr<attr::TransposeA>(c.n.attrs), tb = getAttr<attr::TransposeB>(c.n.attrs);
  const int64_t m = ta ? a[a.size() - 1] : a[a.size() - 2];
  const int64_t k = ta ? a[a.size() - 2] : a[a.size() - 1];
  const int64_t n = tb ? b[b.size() - 2] : b[b.size() - 1];
  const int64_t batchA = numel(llvm::ArrayRef<int64_t>(a.data(), a.size() - 2));
  const int64_t batchB = numel(llvm::ArrayRef<int64_t>(b.data(), b.size() - 2));
  const int64_t batch = std::max(batchA, batchB);
  cpu::matmul(c.in(0), c.in(1), c.out(), batch, a.size() > 2, b.size() > 2, m, n, k, ta, tb);
}

// The product, then the activation's derivative in place (ReluGrad/GeluGrad's formula).
template <class T>
void execMatMulActGrad(Ctx<T>& c) {
  execMatMul(c);
  const cpu::UnaryGradOp op = getAttr<attr::GradActivation>(c.n.attrs) == "gelu" ? cpu::UnaryGradOp::Gelu : cpu::UnaryGradOp::Relu;
  cpu::unaryGrad(op, c.out(), c.in(2), c.out(), c.outCount());
}

// The product, then the sums over K of the summed operand, stored [K, L], in the order of the
// SumTo it replaces (row by row, in double), so the result equals the unfused graph's.
template <class T>
void execMatMulBiasGrad(Ctx<T>& c) {
  execMatMul(c);
  const Shape& s = c.inShape(getAttr<attr::BiasOperand>(c.n.attrs) == "a" ? 0 : 1);
  cpu::Strided v;
  v.rank = 2;
  v.extent[0] = s[0], v.extent[1] = s[1];
  v.stride[0] = 0, v.stride[1] = 1;
  cpu::reduceSum(c.in(getAttr<attr::BiasOperand>(c.n.attrs) == "a" ? 0 : 1), v, c.out(1), s[1], 1.0);
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

template <class T> void execScale(Ctx<T>& c) { cpu::scale(c.in(0), c.out(), c.outCount(), getAttr<attr::ScaleFactor>(c.n.attrs)); }
// The values pass unchanged; run() rounds the output to its dtype (bf16).
template <class T> void execCast(Ctx<T>& c) { std::copy(c.in(0), c.in(0) + c.outCount(), c.out()); }
template <class T> void execRelu(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Relu, c.in(0), c.out(), c.outCount()); }
template <class T> void execGelu(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Gelu, c.in(0), c.out(), c.outCount()); }
template <class T> void execTanh(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Tanh, c.in(0), c.out(), c.outCount()); }
template <class T> void execSigmoid(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Sigmoid, c.in(0), c.out(), c.outCount()); }
template <class T> void execExp(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Exp, c.in(0), c.out(), c.outCount()); }
template <class T> void execSilu(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::Silu, c.in(0), c.out(), c.outCount()); }
template <class T> void execGeluTanh(Ctx<T>& c) { cpu::unary(cpu::UnaryOp::GeluTanh, c.in(0), c.out(), c.outCount()); }

// Rows and features of a norm's input [..., F].
template <class T> std::pair<int64_t, int64_t> normRows(Ctx<T>& c) {
  const int64_t f = c.inShape(0).back();
  return {f ? c.outCount() / f : 0, f};
}
// A fused norm's x + residual, written to its sum output and returned as what is normalised.
// Stored in bf16 (lower-bf16), the sum is rounded before it is normalised, as the CUDA kernel
// does and as an Add node followed by the norm would.
template <class T>
const T* residualSum(Ctx<T>& c, int residualInput, int sumOutput) {
  const T* x = c.in(0);
  const T* r = c.in(residualInput);
  T* s = c.out(sumOutput);
  const int64_t n = c.outCount();
  for (int64_t i = 0; i < n; ++i) s[i] = x[i] + r[i];
  if (c.g.value(c.n.outputs[static_cast<size_t>(sumOutput)]).type.dtype == DType::BF16)
    for (int64_t i = 0; i < n; ++i) s[i] = static_cast<T>(roundToBf16(static_cast<float>(s[i])));
  return s;
}
template <class T>
void execLayerNorm(Ctx<T>& c) {
  const auto [rows, f] = normRows(c);
  const T* x = c.n.inputs.size() == 4 ? residualSum(c, 3, 3) : c.in(0);
  cpu::norm(x, c.in(1), c.in(2), c.out(0), c.out(1), c.out(2), rows, f, getAttr<attr::Eps>(c.n.attrs));
}
template <class T>
void execRmsNorm(Ctx<T>& c) {
  const auto [rows, f] = normRows(c);
  const T* x = c.n.inputs.size() == 3 ? residualSum(c, 2, 2) : c.in(0);
  cpu::norm(x, c.in(1), static_cast<const T*>(nullptr), c.out(0), static_cast<T*>(nullptr), c.out(1), rows, f,
            getAttr<attr::Eps>(c.n.attrs));
}
template <class T>
void execRope(Ctx<T>& c) {
  const Shape& s = c.inShape(0);
  const bool bshd = getAttr<attr::Layout>(c.n.attrs) == "bshd";
  const int64_t dims = getAttr<attr::RopeDims>(c.n.attrs);
  cpu::rope(c.in(0), c.out(), s[0], bshd ? s[2] : s[1], bshd ? s[1] : s[2], s[3], bshd, dims ? dims : s[3],
            getAttr<attr::RopeBase>(c.n.attrs), getAttr<attr::Interleaved>(c.n.attrs), getAttr<attr::Inverse>(c.n.attrs),
            getAttr<attr::RopeHeads>(c.n.attrs));
}

template <class T>
void execSoftmax(Ctx<T>& c) {
  const AxisSplit s = splitAroundAxis(c.inShape(0), getAttr<attr::Axis>(c.n.attrs));
  std::vector<T> sink;
  if (c.n.inputs.size() == 2) {
    Shape keep = c.inShape(0);
    keep[normaliseAxis(getAttr<attr::Axis>(c.n.attrs), keep.size())] = 1;
    sink.resize(static_cast<size_t>(numel(keep)));
    cpu::gather(c.in(1), broadcastView(c.inShape(1), keep), sink.data());
  }
  cpu::softmax(c.in(0), sink.empty() ? nullptr : sink.data(), c.out(), s.outer, s.len, s.inner);
}

template <class T>
void execPermute(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const Shape st = contiguousStrides(x);
  const std::vector<int64_t> perm = getAttr<attr::Perm>(c.n.attrs);
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
  const std::vector<bool> reduced = reducedAxes(c.n, x);
  int64_t count = 1;
  for (size_t d = 0; d < x.size(); ++d) count *= reduced[d] ? x[d] : 1;
  reduceAxes(c, reduced, mean && count ? 1.0 / static_cast<double>(count) : 1.0);
}
template <class T> void execSum(Ctx<T>& c) { reduction(c, false); }
template <class T> void execMean(Ctx<T>& c) { reduction(c, true); }

template <class T>
void execSumTo(Ctx<T>& c) {
  reduceAxes(c, sumToReducedAxes(c.inShape(0), c.outShape()), 1.0);
}

template <class T>
void execAttentionMask(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const int64_t q = x[x.size() - 2], k = x[x.size() - 1];
  cpu::attentionMask(c.in(0), c.out(), numel(x) / std::max<int64_t>(q * k, 1), q, k, maskSpecOf(c.n.attrs),
                     getAttr<attr::Fill>(c.n.attrs));
}

template <class T>
void execRepeatHeads(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const int axis = normaliseAxis(getAttr<attr::RepeatAxis>(c.n.attrs), x.size());
  const int64_t r = getAttr<attr::Repeats>(c.n.attrs);
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

// The loss as MseLoss computes it, and the gradient as autodiff's Sub, Scale, Mul do: each step
// in T, in that order, so the fused node equals the graph it replaces.
template <class T>
void execMseLossGrad(Ctx<T>& c) {
  const int64_t n = numel(c.inShape(0));
  c.out(0)[0] = static_cast<T>(cpu::mse(c.in(0), c.in(1), n));
  const T f = static_cast<T>(n ? 2.0 / static_cast<double>(n) : 0.0), dy = c.in(2)[0];
  const T* p = c.in(0);
  const T* t = c.in(1);
  T* d = c.out(1);
  for (int64_t i = 0; i < n; ++i) {
    const T diff = p[i] - t[i];
    const T scaled = diff * f;
    d[i] = scaled * dy;
  }
}

template <class T>
void execFusedLinear(Ctx<T>& c) {
  const Shape& x = c.inShape(0);
  const Shape& w = c.inShape(1);
  const bool tw = getAttr<attr::TransposeW>(c.n.attrs);
  const int64_t k = x.back(), n = tw ? w[0] : w[1], rows = numel(x) / std::max<int64_t>(k, 1);
  const std::string act = getAttr<attr::Activation>(c.n.attrs);
  if (act == "swiglu") {  // the pre-activations (gate, up pairs) into out1, then out0 from them
    cpu::matmul(c.in(0), c.in(1), c.out(1), 1, false, false, rows, n, k, false, tw);
    cpu::biasActivation(c.out(1), c.n.inputs.size() == 3 ? c.in(2) : nullptr, static_cast<T*>(nullptr), rows, n, cpu::Activation::None);
    cpu::swiglu(c.out(1), c.out(0), rows * (n / 2));
    return;
  }
  cpu::matmul(c.in(0), c.in(1), c.out(), 1, false, false, rows, n, k, false, tw);
  if (act == "rope") {  // x·w + b, then the turn in place (a pair is read before it is written)
    cpu::biasActivation(c.out(), c.n.inputs.size() == 3 ? c.in(2) : nullptr, static_cast<T*>(nullptr), rows, n, cpu::Activation::None);
    const int64_t seq = x[x.size() - 2], hd = getAttr<attr::HeadDim>(c.n.attrs);
    const int64_t dims = getAttr<attr::RopeDims>(c.n.attrs);
    cpu::rope(c.out(), c.out(), seq ? rows / seq : 0, n / hd, seq, hd, true, dims ? dims : hd, getAttr<attr::RopeBase>(c.n.attrs), true, false);
    return;
  }
  const cpu::Activation a = act == "relu" ? cpu::Activation::Relu : act == "gelu" ? cpu::Activation::Gelu : cpu::Activation::None;
  cpu::biasActivation(c.out(), c.n.inputs.size() == 3 ? c.in(2) : nullptr, a == cpu::Activation::Gelu ? c.out(1) : nullptr,
                      rows, n, a);
}

// fused-mlp: each layer as FusedLinear then the activation node would compute it (the same
// kernels in the same order, so the float64 result equals the unfused graph's); the hidden
// outputs are written as the next layer reads them (a bf16 output is rounded after the node, as
// the CUDA kernel, which keeps the layer's input on chip, stores it).
template <class T>
void mlpActivate(MlpActivation a, T* y, int64_t count) {
  switch (a) {
  case MlpActivation::None: break;
  case MlpActivation::Relu: cpu::unary(cpu::UnaryOp::Relu, y, y, count); break;
  case MlpActivation::Tanh: cpu::unary(cpu::UnaryOp::Tanh, y, y, count); break;
  case MlpActivation::Sigmoid: cpu::unary(cpu::UnaryOp::Sigmoid, y, y, count); break;
  }
}
// dz = dh ⊙ act'(h) from the activation's output h (in place allowed).
template <class T>
void mlpActivationGrad(MlpActivation a, const T* dh, const T* h, T* dz, int64_t count) {
  switch (a) {
  case MlpActivation::None: std::copy(dh, dh + count, dz); break;
  case MlpActivation::Relu: cpu::unaryGrad(cpu::UnaryGradOp::Relu, dh, h, dz, count); break;
  case MlpActivation::Tanh: cpu::unaryGrad(cpu::UnaryGradOp::Tanh, dh, h, dz, count); break;
  case MlpActivation::Sigmoid: cpu::unaryGrad(cpu::UnaryGradOp::Sigmoid, dh, h, dz, count); break;
  }
}

// The forward of a fused MLP: h_(i+1) = act_i(h_i·w_i + b_i) with h_0 = x, into out[i] (the last
// is y); weights and biases as `weight(i)`, `bias(i)` give them.
template <class T, class W, class B>
void mlpForward(const MlpSpec& s, const T* x, W weight, B bias, const std::vector<T*>& out) {
  const T* h = x;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const MlpLayer& l = s.layers[i];
    cpu::matmul(h, weight(i), out[i], 1, false, false, s.rows, l.out, l.in, false, false);
    cpu::biasActivation(out[i], l.bias ? bias(i) : nullptr, static_cast<T*>(nullptr), s.rows, l.out,
                        l.act == MlpActivation::Relu ? cpu::Activation::Relu : cpu::Activation::None);
    if (l.act != MlpActivation::Relu) mlpActivate(l.act, out[i], s.rows * l.out);
    h = out[i];
  }
}

template <class T>
void execFusedMlp(Ctx<T>& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const size_t layers = s.layers.size();
  std::vector<T*> out;
  for (size_t i = 0; i < layers; ++i) out.push_back(i + 1 == layers ? c.out(0) : c.out(static_cast<int>(i + 1)));
  mlpForward(s, c.in(0), [&](size_t i) { return c.in(s.layers[i].weightInput); },
             [&](size_t i) { return c.in(s.layers[i].biasInput); }, out);
}

// The backward of a fused MLP from the last layer down: dz_i = dh_i ⊙ act_i'(h_i), dw_i =
// h_(i-1)ᵀ·dz_i, db_i = Σ_rows dz_i (double accumulation, SumTo's kernel), dh_(i-1) = dz_i·w_iᵀ.
// `h(i)` is layer i's input (h(layers) its output y), dw(i) / db(i) the gradients' outputs, dx
// dx's (null: not wanted).
template <class T, class H, class W, class G, class D>
void mlpBackward(const MlpSpec& s, const T* dy, H h, W weight, G dw, D db, T* dx) {
  const int layers = static_cast<int>(s.layers.size());
  std::vector<T> dz(static_cast<size_t>(s.rows * s.layers.back().out)), dh;
  mlpActivationGrad(s.layers.back().act, dy, h(layers), dz.data(), s.rows * s.layers.back().out);
  for (int i = layers - 1; i >= 0; --i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const T* hPrev = h(i);
    cpu::matmul(hPrev, dz.data(), dw(i), 1, false, false, l.in, l.out, s.rows, true, false);
    if (l.bias) {
      cpu::Strided v;
      v.rank = 2;
      v.extent[0] = s.rows;
      v.extent[1] = l.out;
      v.stride[0] = 0;
      v.stride[1] = 1;
      cpu::reduceSum(dz.data(), v, db(i), l.out, 1.0);
    }
    if (i == 0 && !dx) break;
    T* target = i == 0 ? dx : nullptr;
    if (!target) {
      dh.resize(static_cast<size_t>(s.rows * l.in));
      target = dh.data();
    }
    cpu::matmul(dz.data(), weight(i), target, 1, false, false, s.rows, l.in, l.out, false, true);
    if (i == 0) break;
    dz.resize(static_cast<size_t>(s.rows * l.in));
    mlpActivationGrad(s.layers[static_cast<size_t>(i - 1)].act, dh.data(), hPrev, dz.data(), s.rows * l.in);
  }
}

template <class T>
void execFusedMlpGrad(Ctx<T>& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const int layers = static_cast<int>(s.layers.size());
  mlpBackward(
      s, c.in(0), [&](int i) { return c.in(1 + i); }, [&](int i) { return c.in(layers + 2 + i); },
      [&](int i) { return c.out(s.layers[static_cast<size_t>(i)].weightGradOutput); },
      [&](int i) { return c.out(s.layers[static_cast<size_t>(i)].biasGradOutput); }, s.inputGrad ? c.out(0) : nullptr);
}

// fused-mlp-train: fused-mlp, then mse-loss-grad of its output, then fused-mlp-grad, each as its
// node computes it (so the float64 results equal the three nodes').
template <class T>
void execFusedMlpTrain(Ctx<T>& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const size_t layers = s.layers.size();
  std::vector<std::vector<T>> hidden(layers - 1);
  std::vector<T*> out;
  for (size_t i = 0; i + 1 < layers; ++i) {
    hidden[i].resize(static_cast<size_t>(s.rows * s.layers[i].out));
    out.push_back(hidden[i].data());
  }
  T* y = c.out(1);
  out.push_back(y);
  mlpForward(s, c.in(0), [&](size_t i) { return c.in(s.layers[i].weightInput); },
             [&](size_t i) { return c.in(s.layers[i].biasInput); }, out);
  const int64_t n = s.rows * s.layers.back().out;
  c.out(0)[0] = static_cast<T>(cpu::mse(y, c.in(1), n));
  const T f = static_cast<T>(n ? 2.0 / static_cast<double>(n) : 0.0), seed = c.in(2)[0];
  std::vector<T> dy(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    const T diff = y[e] - c.in(1)[e];
    const T scaled = diff * f;
    dy[static_cast<size_t>(e)] = scaled * seed;
  }
  mlpBackward(
      s, dy.data(), [&](int i) { return i == 0 ? c.in(0) : out[static_cast<size_t>(i - 1)]; },
      [&](int i) { return c.in(s.layers[static_cast<size_t>(i)].weightInput); },
      [&](int i) { return c.out(s.layers[static_cast<size_t>(i)].weightGradOutput); },
      [&](int i) { return c.out(s.layers[static_cast<size_t>(i)].biasGradOutput); }, static_cast<T*>(nullptr));
}

template <class T>
void execInterleave(Ctx<T>& c) { cpu::interleave(c.in(0), c.in(1), c.out(), numel(c.inShape(0))); }
template <class T>
void execDeinterleave(Ctx<T>& c) { cpu::deinterleave(c.in(0), c.out(), c.outCount(), static_cast<int>(getAttr<attr::Part>(c.n.attrs))); }
template <class T>
void execConcat(Ctx<T>& c) {
  std::vector<const T*> parts;
  std::vector<int64_t> widths;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) {
    parts.push_back(c.in(static_cast<int>(i)));
    widths.push_back(c.inShape(static_cast<int>(i)).back());
  }
  const int64_t width = c.outShape().back();
  cpu::concat(parts, widths, c.out(), width ? c.outCount() / width : 0);
}
template <class T>
void execSlice(Ctx<T>& c) {
  const int64_t width = c.inShape(0).back();
  cpu::slice(c.in(0), c.out(), width ? numel(c.inShape(0)) / width : 0, width, getAttr<attr::Start>(c.n.attrs),
             getAttr<attr::Length>(c.n.attrs));
}
template <class T>
void execSwigluGrad(Ctx<T>& c) { cpu::swigluGrad(c.in(0), c.in(1), c.out(), numel(c.inShape(0))); }

bool bshd(const Node& n) { return n.attrs.get<attr::Layout>() == "bshd"; }

cpu::FlashShape flashShape(const Graph& g, const Node& n) {
  Shape q = g.shape(n.inputs[0]), k = g.shape(n.inputs[1]);
  if (bshd(n)) std::swap(q[1], q[2]), std::swap(k[1], k[2]);
  cpu::FlashShape s;
  s.batch = q[0];
  s.qHeads = q[1];
  s.kvHeads = k[1];
  s.qLen = q[2];
  s.kvLen = k[2];
  s.headDim = q[3];
  s.scale = n.attrs.get<attr::AttnScale>();
  s.mask = maskSpecOf(n.attrs);
  return s;
}

// [d0, d1, d2, d3] → [d0, d2, d1, d3]: the CPU kernels read [B, H, S, D], so layout "bshd"
// operands are copied into that order and the results copied back.
template <class T>
void swapAxes12(const T* src, T* dst, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t c = 0; c < d2; ++c)
        std::copy(src + ((a * d1 + b) * d2 + c) * d3, src + ((a * d1 + b) * d2 + c + 1) * d3, dst + ((a * d2 + c) * d1 + b) * d3);
}

// The flash operands in [B, H, S, D]: the node's own buffers, or copies for layout "bshd".
template <class T>
struct FlashOperands {
  FlashOperands(const cpu::FlashShape& s, bool transposed) : s_(s), transposed_(transposed) {}
  // Query-shaped (heads = qHeads) or key-shaped operand `p`, copied in when transposed.
  const T* in(const T* p, bool query) {
    if (!transposed_) return p;
    buffers_.emplace_back(static_cast<size_t>(count(query)));
    swapAxes12(p, buffers_.back().data(), s_.batch, query ? s_.qLen : s_.kvLen, query ? s_.qHeads : s_.kvHeads, s_.headDim);
    return buffers_.back().data();
  }
  // An output: a scratch buffer copied back to `p` by finish().
  T* out(T* p, bool query) {
    if (!transposed_) return p;
    buffers_.emplace_back(static_cast<size_t>(count(query)));
    pending_.push_back({p, buffers_.size() - 1, query});
    return buffers_.back().data();
  }
  void finish() {
    for (const Pending& o : pending_)
      swapAxes12(buffers_[o.buffer].data(), o.dst, s_.batch, o.query ? s_.qHeads : s_.kvHeads, o.query ? s_.qLen : s_.kvLen,
                 s_.headDim);
  }

private:
  struct Pending {
    T* dst;
    size_t buffer;
    bool query;
  };
  int64_t count(bool query) const {
    return s_.batch * (query ? s_.qHeads * s_.qLen : s_.kvHeads * s_.kvLen) * s_.headDim;
  }
  const cpu::FlashShape& s_;
  bool transposed_;
  std::deque<std::vector<T>> buffers_;  // a deque: pointers into it stay valid as it grows
  std::vector<Pending> pending_;
};

template <class T>
void execFlashAttention(Ctx<T>& c) {
  const cpu::FlashShape s = flashShape(c.g, c.n);
  FlashOperands<T> f(s, bshd(c.n));
  const T* q = f.in(c.in(0), true);
  const T* k = f.in(c.in(1), false);
  const T* v = f.in(c.in(2), false);
  cpu::flashAttentionForward(q, k, v, c.n.inputs.size() == 4 ? c.in(3) : nullptr, f.out(c.out(0), true), c.out(1), s);
  f.finish();
}

template <class T>
void execFlashAttentionGrad(Ctx<T>& c) {
  const cpu::FlashShape s = flashShape(c.g, c.n);
  const bool sink = c.n.inputs.size() == 7;
  FlashOperands<T> f(s, bshd(c.n));
  const T* q = f.in(c.in(0), true);
  const T* k = f.in(c.in(1), false);
  const T* v = f.in(c.in(2), false);
  const T* o = f.in(c.in(3), true);
  const T* dO = f.in(c.in(5), true);
  T* dq = f.out(c.out(0), true);
  T* dk = f.out(c.out(1), false);
  T* dv = f.out(c.out(2), false);
  cpu::flashAttentionBackward(q, k, v, o, c.in(4), dO, sink ? c.in(6) : nullptr, dq, dk, dv, sink ? c.out(3) : nullptr, s);
  f.finish();
}

// The packed [B, S, Hq + 2 Hk, D] operand of the qkv flash ops: heads [h0, h0 + count) copied to
// or from a [B, count, S, D] buffer, the order the CPU kernels read.
template <class T>
void unpackHeads(const T* packed, T* dst, const cpu::FlashShape& s, int64_t h0, int64_t count) {
  const int64_t heads = s.qHeads + 2 * s.kvHeads, d = s.headDim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < count; ++h)
      for (int64_t q = 0; q < s.qLen; ++q) {
        const T* src = packed + ((b * s.qLen + q) * heads + h0 + h) * d;
        std::copy(src, src + d, dst + ((b * count + h) * s.qLen + q) * d);
      }
}
template <class T>
void packHeads(const T* src, T* packed, const cpu::FlashShape& s, int64_t h0, int64_t count) {
  const int64_t heads = s.qHeads + 2 * s.kvHeads, d = s.headDim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < count; ++h)
      for (int64_t q = 0; q < s.qLen; ++q) {
        const T* from = src + ((b * count + h) * s.qLen + q) * d;
        std::copy(from, from + d, packed + ((b * s.qLen + q) * heads + h0 + h) * d);
      }
}

cpu::FlashShape flashQkvShape(const Graph& g, const Node& n) {
  const Shape& x = g.shape(n.inputs[0]);
  cpu::FlashShape s;
  s.batch = x[0];
  s.kvHeads = n.attrs.get<attr::KvHeads>();
  s.qHeads = x[2] - 2 * s.kvHeads;
  s.qLen = s.kvLen = x[1];
  s.headDim = x[3];
  s.scale = n.attrs.get<attr::AttnScale>();
  s.mask = maskSpecOf(n.attrs);
  return s;
}

// Q, K and V of a packed operand, each [B, H, S, D].
template <class T>
struct UnpackedQkv {
  UnpackedQkv(const T* packed, const cpu::FlashShape& s)
      : q(static_cast<size_t>(s.batch * s.qHeads * s.qLen * s.headDim)), k(static_cast<size_t>(s.batch * s.kvHeads * s.qLen * s.headDim)),
        v(k.size()) {
    unpackHeads(packed, q.data(), s, 0, s.qHeads);
    unpackHeads(packed, k.data(), s, s.qHeads, s.kvHeads);
    unpackHeads(packed, v.data(), s, s.qHeads + s.kvHeads, s.kvHeads);
  }
  std::vector<T> q, k, v;
};

template <class T>
void execFlashAttentionQkv(Ctx<T>& c) {
  const cpu::FlashShape s = flashQkvShape(c.g, c.n);
  const UnpackedQkv<T> u(c.in(0), s);
  FlashOperands<T> f(s, bshd(c.n));
  cpu::flashAttentionForward(u.q.data(), u.k.data(), u.v.data(), c.n.inputs.size() == 2 ? c.in(1) : nullptr,
                             f.out(c.out(0), true), c.out(1), s);
  f.finish();
}

template <class T>
void execFlashAttentionQkvGrad(Ctx<T>& c) {
  const cpu::FlashShape s = flashQkvShape(c.g, c.n);
  const bool sink = c.n.inputs.size() == 5;
  const UnpackedQkv<T> u(c.in(0), s);
  FlashOperands<T> f(s, bshd(c.n));
  const T* o = f.in(c.in(1), true);
  const T* dO = f.in(c.in(3), true);
  std::vector<T> dq(u.q.size()), dk(u.k.size()), dv(u.v.size());
  cpu::flashAttentionBackward(u.q.data(), u.k.data(), u.v.data(), o, c.in(2), dO, sink ? c.in(4) : nullptr, dq.data(), dk.data(),
                              dv.data(), sink ? c.out(1) : nullptr, s);
  packHeads(dq.data(), c.out(0), s, 0, s.qHeads);
  packHeads(dk.data(), c.out(0), s, s.qHeads, s.kvHeads);
  packHeads(dv.data(), c.out(0), s, s.qHeads + s.kvHeads, s.kvHeads);
}

// Evaluates the expression over chunks of the output, one primitive kernel per expression node
// and chunk, so intermediates live in a few small buffers instead of whole tensors.
template <class T>
void execFusedElementwise(Ctx<T>& c) {
  const Expr& e = *c.expr;
  const Shape& out = c.outShape();
  const int64_t total = numel(out);
  // Inputs of another shape are broadcast once into a full-size temporary.
  std::vector<std::vector<T>> expanded(c.n.inputs.size());
  std::vector<const T*> src(c.n.inputs.size());
  for (size_t i = 0; i < c.n.inputs.size(); ++i) {
    if (c.inShape(static_cast<int>(i)) == out) {
      src[i] = c.in(static_cast<int>(i));
      continue;
    }
    expanded[i].resize(static_cast<size_t>(total));
    cpu::gather(c.in(static_cast<int>(i)), broadcastView(c.inShape(static_cast<int>(i)), out), expanded[i].data());
    src[i] = expanded[i].data();
  }
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  // Each thread allocates its registers (one chunk per expression node) once, not per chunk.
#pragma omp parallel if (total > (1 << 15))
  {
    std::vector<T> regs(e.nodes.size() * static_cast<size_t>(kChunk));
    std::vector<const T*> val(e.nodes.size());
    cpu::Strided flat;
    flat.rank = 1;
    flat.stride[0] = 1;
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t at = ch * kChunk, len = std::min(kChunk, total - at);
      flat.extent[0] = len;
      for (size_t i = 0; i < e.nodes.size(); ++i) {
        const ExprNode& x = e.nodes[i];
        if (x.op == OpKind::Input) {
          val[i] = src[static_cast<size_t>(x.input)] + at;
          continue;
        }
        if (x.op == OpKind::BroadcastTo) {  // inputs are already at the output's shape
          val[i] = val[static_cast<size_t>(x.args[0])];
          continue;
        }
        T* r = regs.data() + i * static_cast<size_t>(kChunk);
        const T* a = val[static_cast<size_t>(x.args[0])];
        const T* b = x.args.size() > 1 ? val[static_cast<size_t>(x.args[1])] : nullptr;
        switch (x.op) {
        case OpKind::Add: cpu::binary(cpu::BinaryOp::Add, a, flat, b, flat, r); break;
        case OpKind::Sub: cpu::binary(cpu::BinaryOp::Sub, a, flat, b, flat, r); break;
        case OpKind::Mul: cpu::binary(cpu::BinaryOp::Mul, a, flat, b, flat, r); break;
        case OpKind::Div: cpu::binary(cpu::BinaryOp::Div, a, flat, b, flat, r); break;
        case OpKind::Scale: cpu::scale(a, r, len, x.value); break;
        case OpKind::Relu: cpu::unary(cpu::UnaryOp::Relu, a, r, len); break;
        case OpKind::Gelu: cpu::unary(cpu::UnaryOp::Gelu, a, r, len); break;
        case OpKind::Tanh: cpu::unary(cpu::UnaryOp::Tanh, a, r, len); break;
        case OpKind::Sigmoid: cpu::unary(cpu::UnaryOp::Sigmoid, a, r, len); break;
        case OpKind::Exp: cpu::unary(cpu::UnaryOp::Exp, a, r, len); break;
        case OpKind::ReluGrad: cpu::unaryGrad(cpu::UnaryGradOp::Relu, a, b, r, len); break;
        case OpKind::GeluGrad: cpu::unaryGrad(cpu::UnaryGradOp::Gelu, a, b, r, len); break;
        case OpKind::TanhGrad: cpu::unaryGrad(cpu::UnaryGradOp::Tanh, a, b, r, len); break;
        case OpKind::SigmoidGrad: cpu::unaryGrad(cpu::UnaryGradOp::Sigmoid, a, b, r, len); break;
        case OpKind::Silu: cpu::unary(cpu::UnaryOp::Silu, a, r, len); break;
        case OpKind::GeluTanh: cpu::unary(cpu::UnaryOp::GeluTanh, a, r, len); break;
        case OpKind::SiluGrad: cpu::unaryGrad(cpu::UnaryGradOp::Silu, a, b, r, len); break;
        case OpKind::GeluTanhGrad: cpu::unaryGrad(cpu::UnaryGradOp::GeluTanh, a, b, r, len); break;
        default: assert(false && "op not allowed in an elementwise expression (isExprOp)");
        }
        val[i] = r;
      }
      const T* result = val.back();
      std::copy(result, result + len, c.out() + at);
    }
  }
}

template <class T> void execReluGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Relu, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execGeluGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Gelu, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execTanhGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Tanh, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execSigmoidGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Sigmoid, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execSiluGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::Silu, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T> void execGeluTanhGrad(Ctx<T>& c) { cpu::unaryGrad(cpu::UnaryGradOp::GeluTanh, c.in(0), c.in(1), c.out(), c.outCount()); }
template <class T>
void execLayerNormGrad(Ctx<T>& c) {
  const auto [rows, f] = normRows(c);
  cpu::normGrad(c.in(0), c.in(1), c.in(2), c.in(3), c.in(4), c.n.inputs.size() == 6 ? c.in(5) : nullptr, c.out(0), c.out(1),
                c.out(2), rows, f);
}
template <class T>
void execRmsNormGrad(Ctx<T>& c) {
  const auto [rows, f] = normRows(c);
  cpu::normGrad(c.in(0), c.in(1), c.in(2), static_cast<const T*>(nullptr), c.in(3), c.n.inputs.size() == 5 ? c.in(4) : nullptr,
                c.out(0), c.out(1), static_cast<T*>(nullptr), rows, f);
}

template <class T>
void execSoftmaxGrad(Ctx<T>& c) {
  const AxisSplit s = splitAroundAxis(c.inShape(0), getAttr<attr::Axis>(c.n.attrs));
  cpu::softmaxGrad(c.in(0), c.in(1), c.out(), s.outer, s.len, s.inner);
}

template <class T>
void execSoftmaxSinkGrad(Ctx<T>& c) {
  const AxisSplit s = splitAroundAxis(c.inShape(0), getAttr<attr::Axis>(c.n.attrs));
  cpu::softmaxSinkGrad(c.in(0), c.in(1), c.out(), s.outer, s.len, s.inner);
}

template <class T>
using ExecFn = void (*)(Ctx<T>&);

template <class T>
const ExecFn<T> kExec[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) &exec##Name<T>,
#include "graph/ops.def"
};

}  // namespace

int64_t hostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
  int64_t bytes;
  if (pages <= 0 || pageSize <= 0 || __builtin_mul_overflow(static_cast<int64_t>(pages), static_cast<int64_t>(pageSize), &bytes))
    return std::numeric_limits<int64_t>::max();
  return bytes;
}

template <class T>
CpuExecutor<T>::CpuExecutor(const Graph& g) : g_(g), order_(g.topoOrder()) {
  MemoryLayout layout;
  layout.elementBytes = layout.paramBytes = static_cast<int64_t>(sizeof(T));
  const MemoryPlan plan = planMemory(g);
  checkFitsMemory(g, hostMemoryBytes(), "this machine", layout, &plan);
  arena_.assign(static_cast<size_t>(plan.arenaElements), T(0));
  naiveBytes_ = static_cast<size_t>(plan.naiveElements) * sizeof(T);
  ptr_.assign(g.numValues(), nullptr);
  exprs_.resize(g.numNodes());
  for (NodeId id : order_)
    if (g.node(id).op == OpKind::FusedElementwise) exprs_[id] = parseExpr(g.node(id).attrs.get<attr::Expr>());
  for (size_t v = 0; v < g.numValues(); ++v)
    if (plan.offset[v] >= 0) ptr_[v] = arena_.data() + plan.offset[v];
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    if (n.op != OpKind::Constant) continue;
    T* out = ptr_[n.outputs[0]];
    if (n.attrs.has<attr::Data>()) {
      const std::vector<double> d = n.attrs.get<attr::Data>();
      std::copy(d.begin(), d.end(), out);
    } else {
      cpu::fill(out, numel(g.shape(n.outputs[0])), n.attrs.get<attr::Value>());
    }
  }
}

template <class T>
void CpuExecutor<T>::bind(ValueId v, T* data) {
  ptr_[v] = data;
}

template <class T>
void CpuExecutor<T>::run() {
  for (NodeId id : order_) {
    Ctx<T> c{g_, ptr_, g_.node(id), &exprs_[id]};
    assert(c.n.op == OpKind::Param || c.n.op == OpKind::Input || ptr_[c.n.outputs[0]] != nullptr);
    kExec<T>[static_cast<int>(c.n.op)](c);
    // Values stored in bf16 on the GPU (the lower-bf16 pass) are rounded here the same way, so
    // the CPU trains with the same storage precision and is the GPU's reference.
    for (ValueId v : c.n.outputs)
      if (g_.value(v).type.dtype == DType::BF16 && c.n.op != OpKind::Param && c.n.op != OpKind::Input)
        for (T* p = ptr_[v], *e = p + numel(g_.shape(v)); p != e; ++p) *p = static_cast<T>(roundToBf16(static_cast<float>(*p)));
  }
}

template class CpuExecutor<float>;
template class CpuExecutor<double>;

}  // namespace pa
