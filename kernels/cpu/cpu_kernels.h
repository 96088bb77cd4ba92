// CPU reference kernels, templated on the element type: float for training on the CPU,
// double for the reference every other kernel is tested against. Row-major, contiguous.
//
// Note on accumulation: reductions (sums, softmax denominators, MSE) accumulate in double for
// both element types, so the float path differs from the double one only by the final rounding
// of each value and by BLAS's own float accumulation in matmuls.
// Note on determinism: loops run in parallel only where each output element is written by one
// iteration; reductions are sequential in a fixed order, so results are bit-identical run to run.
#pragma once

#include <cstdint>
#include <vector>

#include "common/attention_mask.h"

namespace pa::cpu {

// Extents and strides of up to kMaxRank dimensions; a stride of 0 broadcasts.
constexpr int kMaxRank = 8;
struct Strided {
  int rank = 0;
  int64_t extent[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};
};

// C[b] = op(A[b]) · op(B[b]). A is [batchA, M, K] (or [batchA, K, M] when transA), B likewise;
// batchA and batchB are each either `batch` or 1 (a plain matrix shared by every batch).
template <class T>
void matmul(const T* a, const T* b, T* c, int64_t batch, bool aBatched, bool bBatched, int64_t m,
            int64_t n, int64_t k, bool transA, bool transB);

enum class BinaryOp { Add, Sub, Mul, Div };
// out[i] = a[ia] op b[ib], with `out` describing the output extents and a/b its broadcast strides.
template <class T>
void binary(BinaryOp op, const T* a, const Strided& sa, const T* b, const Strided& sb, T* out);

enum class UnaryOp { Relu, Gelu, Tanh, Sigmoid, Exp, Silu, GeluTanh };
template <class T>
void unary(UnaryOp op, const T* x, T* y, int64_t n);
template <class T>
void scale(const T* x, T* y, int64_t n, double factor);
template <class T>
void fill(T* y, int64_t n, double value);

enum class UnaryGradOp { Relu, Gelu, Tanh, Sigmoid, Silu, GeluTanh };
// dx = dy * f'(saved), where saved is x for Relu/Gelu/Silu/GeluTanh and y for Tanh/Sigmoid.
template <class T>
void unaryGrad(UnaryGradOp op, const T* dy, const T* saved, T* dx, int64_t n);

// Gathers a strided view into a contiguous output (permute, broadcast-to, repeat-heads).
template <class T>
void gather(const T* x, const Strided& view, T* y);
// Sums x (extents `view.extent`) into y; view.stride holds y's strides, 0 on reduced axes.
// y has `outCount` elements and is overwritten.
template <class T>
void reduceSum(const T* x, const Strided& view, T* y, int64_t outCount, double factor);

// Softmax along the middle axis of [outer, len, inner]. `sink` (may be null) holds one extra
// logit per (outer, inner) row that joins the denominator only. A row whose logits are all -inf
// (and no sink) yields zeros.
template <class T>
void softmax(const T* x, const T* sink, T* y, int64_t outer, int64_t len, int64_t inner);
// dx = y * (dy - sum(dy * y)) along the same axis.
template <class T>
void softmaxGrad(const T* dy, const T* y, T* dx, int64_t outer, int64_t len, int64_t inner);
// d sink = -(1 - sum(y)) * sum(dy * y) per row; output [outer, inner].
template <class T>
void softmaxSinkGrad(const T* dy, const T* y, T* ds, int64_t outer, int64_t len, int64_t inner);

// y = x where the key is visible, `fill` where it is masked; x is [batch, qLen, kLen].
template <class T>
void attentionMask(const T* x, T* y, int64_t batch, int64_t qLen, int64_t kLen, const AttentionMaskSpec& m,
                   double fill);

// The linear layer's epilogue in one pass over [rows, n]: y = act(y + bias) in place (bias may
// be null); `pre` (may be null) receives y + bias before the activation.
enum class Activation { None, Relu, Gelu };
template <class T>
void biasActivation(T* y, const T* bias, T* pre, int64_t rows, int64_t n, Activation act);

// Normalises each row of [rows, f]: layer norm y = (x - μ)·rstd·gain + bias, or RMS norm
// (mean == nullptr, bias == nullptr) y = x·rstd·gain, with rstd = 1/sqrt(var + eps) and var the
// mean square about μ (about 0 for RMS). Statistics accumulate in double. (A fused residual's
// sum is the executor's: it rounds it to its storage type before normalising.)
template <class T>
void norm(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, int64_t rows, int64_t f, double eps);
// The gradient of norm() from its saved statistics: dx = rstd·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) with
// ĝ = dy·gain (no mean(ĝ) term for RMS, mean == nullptr), plus dsum (may be null); d gain = Σ dy·x̂
// and d bias = Σ dy over rows (dbias may be null), summed in a fixed order.
template <class T>
void normGrad(const T* dy, const T* x, const T* gain, const T* mean, const T* rstd, const T* dsum, T* dx, T* dgain,
              T* dbias, int64_t rows, int64_t f);

// Rotary position embedding over [batch, heads, seq, dim] (or [batch, seq, heads, dim] when
// bshd): feature pair j < dims/2, (j, j + dims/2) or (2j, 2j+1) when interleaved, turns by
// s·base^(-2j/dims) at position s (the other way when inverse); features from `dims` on pass, and
// so do heads from `turnHeads` on when it is > 0.
template <class T>
void rope(const T* x, T* y, int64_t batch, int64_t heads, int64_t seq, int64_t dim, bool bshd, int64_t dims, double base,
          bool interleaved, bool inverse, int64_t turnHeads = 0);

// SwiGLU over (gate, up) pairs: h[r, j] = silu(pre[r, 2j]) · pre[r, 2j+1] for `count` = rows·N
// outputs; its gradient d pre[2j] = dy·up·silu'(gate), d pre[2j+1] = dy·silu(gate).
template <class T>
void swiglu(const T* pre, T* h, int64_t count);
template <class T>
void swigluGrad(const T* dy, const T* pre, T* dpre, int64_t count);
// out[r, 2j] = a[r, j], out[r, 2j+1] = b[r, j] over `count` = rows·N pairs; and back: out[r, j] =
// x[r, 2j + part].
template <class T>
void interleave(const T* a, const T* b, T* out, int64_t count);
template <class T>
void deinterleave(const T* x, T* out, int64_t count, int part);
// Along the last axis of `rows` rows: out = [a | b | ...] (widths[i] columns from part i), and
// out[r, j] = x[r, start + j] for j < length (x `width` columns wide).
template <class T>
void concat(const std::vector<const T*>& parts, const std::vector<int64_t>& widths, T* out, int64_t rows);
template <class T>
void slice(const T* x, T* out, int64_t rows, int64_t width, int64_t start, int64_t length);

// Mean of squared differences over n elements.
template <class T>
double mse(const T* pred, const T* target, int64_t n);

// One decoupled-weight-decay Adam step (AdamW when weightDecay > 0) for n elements; `step`
// counts from 1.
struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
};
template <class T>
void adamStep(T* param, const T* grad, T* m, T* v, int64_t n, const AdamHyper& h, int64_t step, double gradScale);

// The per-step scalars of that update, which the CPU and GPU trainers both take from here (the
// GPU's through codegen::StepHeader), so that they round alike: p ← p·decay − lrOverC1·m̂ /
// (√v̂·invSqrtC2 + eps), with lrOverC1 = lr / (1 − β1^step), invSqrtC2 = 1 / √(1 − β2^step) and
// decay = 1 − lr·weightDecay. One division and one square root a value (PyTorch's Adam, up to the
// rounding of its scalar divisions).
struct AdamScalars {
  double lrOverC1 = 0, invSqrtC2 = 1, decay = 1;
};
AdamScalars adamScalars(double lr, double beta1, double beta2, double weightDecay, int64_t step);

}  // namespace pa::cpu
