// CPU reference kernels (see cpu_kernels.h for the conventions).
#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace pa::cpu {

namespace {

// Elementwise loops go parallel only above this many elements: below it the fork costs more.
constexpr int64_t kParallelMin = 1 << 15;

// Walks the rows (all axes but the last) of `views[0].extent` in row-major order, keeping one
// running offset per view, and hands each row to body(firstIndex, offsets, rowLength, rowStrides)
// so the innermost loop is a plain strided loop the compiler can vectorise.
template <int N, class F>
void forEachRow(const Strided (&views)[N], F&& body) {
  const Strided& shape = views[0];
  const int inner = shape.rank - 1;
  const int64_t len = shape.rank ? shape.extent[inner] : 1;
  int64_t rows = 1;
  for (int d = 0; d < inner; ++d) rows *= shape.extent[d];
  if (rows == 0 || len == 0) return;
  int64_t rowStride[N];
  for (int v = 0; v < N; ++v) rowStride[v] = shape.rank ? views[v].stride[inner] : 0;
  int64_t idx[kMaxRank] = {};
  int64_t off[N] = {};
  for (int64_t r = 0; r < rows; ++r) {
    body(r * len, off, len, rowStride);
    for (int d = inner - 1; d >= 0; --d) {
      ++idx[d];
      for (int v = 0; v < N; ++v) off[v] += views[v].stride[d];
      if (idx[d] < shape.extent[d]) break;
      for (int v = 0; v < N; ++v) off[v] -= views[v].stride[d] * shape.extent[d];
      idx[d] = 0;
    }
  }
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
              ta ? m : k, b, tb ? k : n, 0.0f, c, n);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0, a,
              ta ? m : k, b, tb ? k : n, 0.0, c, n);
}

double geluCdf(double x) { return 0.5 * (1.0 + std::erf(x * M_SQRT1_2)); }
// GELU's tanh form: x · ½(1 + tanh(√(2/π)(x + 0.044715x³))); geluTanhGate is the factor after x.
constexpr double kGeluTanhC = 0.7978845608028654;  // sqrt(2/pi)
double geluTanhGate(double x) { return 0.5 * (1.0 + std::tanh(kGeluTanhC * (x + 0.044715 * x * x * x))); }
double sigmoidOf(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

template <class T>
void matmul(const T* a, const T* b, T* c, int64_t batch, bool aBatched, bool bBatched, int64_t m, int64_t n,
            int64_t k, bool transA, bool transB) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    fill(c, batch * m * n, 0.0);
    return;
  }
  // A batch of row blocks times one shared matrix is a single taller GEMM.
  if (aBatched && !bBatched && !transA) {
    gemm(false, transB, batch * m, n, k, a, b, c);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    gemm(transA, transB, m, n, k, a + (aBatched ? i * m * k : 0), b + (bBatched ? i * k * n : 0), c + i * m * n);
}

template <class T>
void binary(BinaryOp op, const T* a, const Strided& sa, const T* b, const Strided& sb, T* out) {
  Strided so = sa;  // output: same extents, contiguous strides
  int64_t s = 1;
  for (int d = so.rank - 1; d >= 0; --d) {
    so.stride[d] = s;
    s *= so.extent[d];
  }
  const Strided views[3] = {so, sa, sb};
  auto run = [&](auto f) {
    forEachRow(views, [&](int64_t, const int64_t* o, int64_t len, const int64_t* st) {
      T* y = out + o[0];
      const T* pa = a + o[1];
      const T* pb = b + o[2];
      const int64_t s1 = st[1], s2 = st[2];
      if (s1 == 1 && s2 == 1)
        for (int64_t i = 0; i < len; ++i) y[i] = f(pa[i], pb[i]);
      else
        for (int64_t i = 0; i < len; ++i) y[i] = f(pa[i * s1], pb[i * s2]);
    });
  };
  switch (op) {
  case BinaryOp::Add: run([](T x, T y) { return x + y; }); break;
  case BinaryOp::Sub: run([](T x, T y) { return x - y; }); break;
  case BinaryOp::Mul: run([](T x, T y) { return x * y; }); break;
  case BinaryOp::Div: run([](T x, T y) { return x / y; }); break;
  }
}

template <class T>
void unary(UnaryOp op, const T* x, T* y, int64_t n) {
  switch (op) {
  case UnaryOp::Relu:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
    break;
  case UnaryOp::Gelu:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(x[i] * geluCdf(x[i]));
    break;
  case UnaryOp::Tanh:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
    break;
  case UnaryOp::Sigmoid:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
    break;
  case UnaryOp::Exp:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
    break;
  case UnaryOp::Silu:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(x[i] * sigmoidOf(x[i]));
    break;
  case UnaryOp::GeluTanh:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(x[i] * geluTanhGate(x[i]));
    break;
  }
}

template <class T>
void scale(const T* x, T* y, int64_t n, double factor) {
  const T f = static_cast<T>(factor);
#pragma omp parallel for if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * f;
}

template <class T>
void fill(T* y, int64_t n, double value) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(value);
}

template <class T>
void unaryGrad(UnaryGradOp op, const T* dy, const T* s, T* dx, int64_t n) {
  switch (op) {
  case UnaryGradOp::Relu:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) dx[i] = s[i] > T(0) ? dy[i] : T(0);
    break;
  case UnaryGradOp::Gelu:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const double x = s[i];
      const double pdf = std::exp(-0.5 * x * x) * 0.3989422804014327;  // 1/sqrt(2*pi)
      dx[i] = static_cast<T>(dy[i] * (geluCdf(x) + x * pdf));
    }
    break;
  case UnaryGradOp::Tanh:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (T(1) - s[i] * s[i]);
    break;
  case UnaryGradOp::Sigmoid:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * s[i] * (T(1) - s[i]);
    break;
  case UnaryGradOp::Silu:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const double x = s[i], sg = sigmoidOf(x);
      dx[i] = static_cast<T>(dy[i] * sg * (1.0 + x * (1.0 - sg)));
    }
    break;
  case UnaryGradOp::GeluTanh:
#pragma omp parallel for if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const double x = s[i], t = std::tanh(kGeluTanhC * (x + 0.044715 * x * x * x));
      dx[i] = static_cast<T>(dy[i] * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluTanhC * (1.0 + 3.0 * 0.044715 * x * x)));
    }
    break;
  }
}

template <class T>
void norm(const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd, int64_t rows, int64_t f, double eps) {
  const bool rms = mean == nullptr;
#pragma omp parallel for if (rows * f > kParallelMin) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = x + r * f;
    T* yr = y + r * f;
    double mu = 0.0;
    if (!rms) {
      for (int64_t j = 0; j < f; ++j) mu += src[j];
      mu /= static_cast<double>(f);
    }
    double var = 0.0;
    for (int64_t j = 0; j < f; ++j) var += (src[j] - mu) * (src[j] - mu);
    const double rs = 1.0 / std::sqrt(var / static_cast<double>(f) + eps);
    for (int64_t j = 0; j < f; ++j)
      yr[j] = static_cast<T>((src[j] - mu) * rs * gain[j] + (bias ? static_cast<double>(bias[j]) : 0.0));
    if (!rms) mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
  }
}

template <class T>
void normGrad(const T* dy, const T* x, const T* gain, const T* mean, const T* rstd, const T* dsum, T* dx, T* dgain,
              T* dbias, int64_t rows, int64_t f) {
#pragma omp parallel for if (rows * f > kParallelMin) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* dyr = dy + r * f;
    const T* xr = x + r * f;
    const double mu = mean ? static_cast<double>(mean[r]) : 0.0, rs = rstd[r];
    double sumG = 0.0, sumGx = 0.0;  // Σ ĝ and Σ ĝ·x̂, with ĝ = dy·gain
    for (int64_t j = 0; j < f; ++j) {
      const double gh = static_cast<double>(dyr[j]) * gain[j], xh = (xr[j] - mu) * rs;
      sumG += gh;
      sumGx += gh * xh;
    }
    const double meanG = mean ? sumG / static_cast<double>(f) : 0.0, meanGx = sumGx / static_cast<double>(f);
    for (int64_t j = 0; j < f; ++j) {
      const double gh = static_cast<double>(dyr[j]) * gain[j], xh = (xr[j] - mu) * rs;
      dx[r * f + j] = static_cast<T>(rs * (gh - meanG - xh * meanGx) + (dsum ? static_cast<double>(dsum[r * f + j]) : 0.0));
    }
  }
  std::vector<double> accG(static_cast<size_t>(f), 0.0), accB(static_cast<size_t>(f), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double mu = mean ? static_cast<double>(mean[r]) : 0.0, rs = rstd[r];
    for (int64_t j = 0; j < f; ++j) {
      accG[static_cast<size_t>(j)] += static_cast<double>(dy[r * f + j]) * (x[r * f + j] - mu) * rs;
      accB[static_cast<size_t>(j)] += dy[r * f + j];
    }
  }
  for (int64_t j = 0; j < f; ++j) {
    dgain[j] = static_cast<T>(accG[static_cast<size_t>(j)]);
    if (dbias) dbias[j] = static_cast<T>(accB[static_cast<size_t>(j)]);
  }
}

template <class T>
void swiglu(const T* pre, T* h, int64_t count) {
#pragma omp parallel for if (count > kParallelMin) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const double g = pre[2 * i];
    h[i] = static_cast<T>(g * sigmoidOf(g) * pre[2 * i + 1]);
  }
}

template <class T>
void swigluGrad(const T* dy, const T* pre, T* dpre, int64_t count) {
#pragma omp parallel for if (count > kParallelMin) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const double g = pre[2 * i], u = pre[2 * i + 1], sg = sigmoidOf(g), d = dy[i];
    dpre[2 * i] = static_cast<T>(d * u * sg * (1.0 + g * (1.0 - sg)));
    dpre[2 * i + 1] = static_cast<T>(d * g * sg);
  }
}

template <class T>
void interleave(const T* a, const T* b, T* out, int64_t count) {
#pragma omp parallel for if (count > kParallelMin) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    out[2 * i] = a[i];
    out[2 * i + 1] = b[i];
  }
}

template <class T>
void deinterleave(const T* x, T* out, int64_t count, int part) {
#pragma omp parallel for if (count > kParallelMin) schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = x[2 * i + part];
}

template <class T>
void rope(const T* x, T* y, int64_t batch, int64_t heads, int64_t seq, int64_t dim, bool bshd, int64_t dims, double base,
          bool interleaved, bool inverse, int64_t turnHeads) {
  const int64_t half = dims / 2;
  std::vector<double> invFreq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) invFreq[static_cast<size_t>(j)] = std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(dims));
  const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for if (batch * heads * seq * dim > kParallelMin) schedule(static)
  for (int64_t bh = 0; bh < batch * heads; ++bh) {
    const int64_t b = bh / heads, h = bh % heads;
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t row = bshd ? ((b * seq + s) * heads + h) * dim : ((b * heads + h) * seq + s) * dim;
      const T* xr = x + row;
      T* yr = y + row;
      if (turnHeads > 0 && h >= turnHeads) {
        std::copy(xr, xr + dim, yr);
        continue;
      }
      for (int64_t j = dims; j < dim; ++j) yr[j] = xr[j];
      for (int64_t j = 0; j < half; ++j) {
        const double angle = static_cast<double>(s) * invFreq[static_cast<size_t>(j)];
        const double c = std::cos(angle), sn = sign * std::sin(angle);
        const int64_t i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
        const double a = xr[i0], bb = xr[i1];
        yr[i0] = static_cast<T>(a * c - bb * sn);
        yr[i1] = static_cast<T>(a * sn + bb * c);
      }
    }
  }
}

template <class T>
void concat(const std::vector<const T*>& parts, const std::vector<int64_t>& widths, T* out, int64_t rows) {
  int64_t width = 0;
  for (int64_t w : widths) width += w;
#pragma omp parallel for if (rows * width > kParallelMin) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = out + r * width;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::copy(parts[i] + r * widths[i], parts[i] + (r + 1) * widths[i], dst);
      dst += widths[i];
    }
  }
}

template <class T>
void slice(const T* x, T* out, int64_t rows, int64_t width, int64_t start, int64_t length) {
#pragma omp parallel for if (rows * length > kParallelMin) schedule(static)
  for (int64_t r = 0; r < rows; ++r) std::copy(x + r * width + start, x + r * width + start + length, out + r * length);
}

template <class T>
void gather(const T* x, const Strided& view, T* y) {
  const Strided views[1] = {view};
  forEachRow(views, [&](int64_t first, const int64_t* o, int64_t len, const int64_t* st) {
    const T* src = x + o[0];
    const int64_t s0 = st[0];
    for (int64_t i = 0; i < len; ++i) y[first + i] = src[i * s0];
  });
}

template <class T>
void reduceSum(const T* x, const Strided& view, T* y, int64_t outCount, double factor) {
  std::vector<double> acc(static_cast<size_t>(outCount), 0.0);
  const Strided views[1] = {view};
  forEachRow(views, [&](int64_t first, const int64_t* o, int64_t len, const int64_t* st) {
    double* dst = acc.data() + o[0];
    const int64_t s0 = st[0];
    for (int64_t i = 0; i < len; ++i) dst[i * s0] += x[first + i];
  });
  for (int64_t i = 0; i < outCount; ++i) y[i] = static_cast<T>(acc[i] * factor);
}

template <class T>
void softmax(const T* x, const T* sink, T* y, int64_t outer, int64_t len, int64_t inner) {
  const double ninf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for collapse(2) if (outer * len * inner > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* xr = x + o * len * inner + i;
      T* yr = y + o * len * inner + i;
      const double s = sink ? static_cast<double>(sink[o * inner + i]) : ninf;
      double mx = s;
      for (int64_t j = 0; j < len; ++j) mx = std::max(mx, static_cast<double>(xr[j * inner]));
      if (mx == ninf) {  // every logit masked and no sink: define the row as zeros, not NaN
        for (int64_t j = 0; j < len; ++j) yr[j * inner] = T(0);
        continue;
      }
      // exp in T (float exp on the float path), the sum in double; masked logits skip exp.
      const T m = static_cast<T>(mx);
      double sum = sink ? std::exp(s - mx) : 0.0;
      for (int64_t j = 0; j < len; ++j) {
        const T v = xr[j * inner];
        const T e = v == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(v - m);
        yr[j * inner] = e;
        sum += e;
      }
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t j = 0; j < len; ++j) yr[j * inner] *= inv;
    }
  }
}

template <class T>
void softmaxGrad(const T* dy, const T* y, T* dx, int64_t outer, int64_t len, int64_t inner) {
#pragma omp parallel for collapse(2) if (outer * len * inner > kParallelMin) schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * len * inner + i;
      double dot = 0.0;
      for (int64_t j = 0; j < len; ++j) dot += static_cast<double>(dy[base + j * inner]) * y[base + j * inner];
      for (int64_t j = 0; j < len; ++j)
        dx[base + j * inner] = static_cast<T>(y[base + j * inner] * (dy[base + j * inner] - dot));
    }
  }
}

template <class T>
void softmaxSinkGrad(const T* dy, const T* y, T* ds, int64_t outer, int64_t len, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * len * inner + i;
      double dot = 0.0, mass = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        dot += static_cast<double>(dy[base + j * inner]) * y[base + j * inner];
        mass += y[base + j * inner];
      }
      ds[o * inner + i] = static_cast<T>(-(1.0 - mass) * dot);
    }
  }
}

template <class T>
void attentionMask(const T* x, T* y, int64_t batch, int64_t qLen, int64_t kLen, const AttentionMaskSpec& m,
                   double fill) {
  const T f = static_cast<T>(fill);
#pragma omp parallel for collapse(2) if (batch * qLen * kLen > kParallelMin) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t q = 0; q < qLen; ++q) {
      const int64_t row = (b * qLen + q) * kLen;
      long long lo, hi;
      attentionBand(m, q, qLen, kLen, &lo, &hi);
      const long long sinkLimit = attentionSinkLimit(m, q, qLen, kLen);
      for (int64_t k = 0; k < kLen; ++k) y[row + k] = (k >= lo && k <= hi) || k <= sinkLimit ? x[row + k] : f;
    }
  }
}

template <class T>
void biasActivation(T* y, const T* bias, T* pre, int64_t rows, int64_t n, Activation act) {
#pragma omp parallel for if (rows * n > kParallelMin) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* yr = y + r * n;
    for (int64_t j = 0; j < n; ++j) {
      const T x = bias ? yr[j] + bias[j] : yr[j];
      if (pre) pre[r * n + j] = x;
      switch (act) {
      case Activation::None: yr[j] = x; break;
      case Activation::Relu: yr[j] = x > T(0) ? x : T(0); break;
      case Activation::Gelu: yr[j] = static_cast<T>(x * geluCdf(x)); break;
      }
    }
  }
}

template <class T>
double mse(const T* pred, const T* target, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(pred[i]) - target[i];
    acc += d * d;
  }
  return n ? acc / static_cast<double>(n) : 0.0;
}

AdamScalars adamScalars(double lr, double beta1, double beta2, double weightDecay, int64_t step) {
  AdamScalars s;
  s.lrOverC1 = lr / (1.0 - std::pow(beta1, static_cast<double>(step)));
  s.invSqrtC2 = 1.0 / std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
  s.decay = 1.0 - lr * weightDecay;
  return s;
}

template <class T>
void adamStep(T* p, const T* g, T* m, T* v, int64_t n, const AdamHyper& h, int64_t step, double gradScale) {
  const AdamScalars s = adamScalars(h.lr, h.beta1, h.beta2, h.weightDecay, step);
#pragma omp parallel for if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double gi = static_cast<double>(g[i]) * gradScale;
    const double mi = h.beta1 * m[i] + (1.0 - h.beta1) * gi;
    const double vi = h.beta2 * v[i] + (1.0 - h.beta2) * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(p[i] * s.decay - s.lrOverC1 * mi / (std::sqrt(vi) * s.invSqrtC2 + h.eps));
  }
}

#define PA_INSTANTIATE(T)                                                                                  \
  template void matmul<T>(const T*, const T*, T*, int64_t, bool, bool, int64_t, int64_t, int64_t, bool, bool); \
  template void binary<T>(BinaryOp, const T*, const Strided&, const T*, const Strided&, T*);              \
  template void unary<T>(UnaryOp, const T*, T*, int64_t);                                                 \
  template void scale<T>(const T*, T*, int64_t, double);                                                  \
  template void fill<T>(T*, int64_t, double);                                                             \
  template void unaryGrad<T>(UnaryGradOp, const T*, const T*, T*, int64_t);                               \
  template void gather<T>(const T*, const Strided&, T*);                                                  \
  template void reduceSum<T>(const T*, const Strided&, T*, int64_t, double);                              \
  template void softmax<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);                            \
  template void softmaxGrad<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);                        \
  template void softmaxSinkGrad<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);                    \
  template void attentionMask<T>(const T*, T*, int64_t, int64_t, int64_t, const AttentionMaskSpec&, double); \
  template double mse<T>(const T*, const T*, int64_t);                                                    \
  template void biasActivation<T>(T*, const T*, T*, int64_t, int64_t, Activation);                                                    \
  template void adamStep<T>(T*, const T*, T*, T*, int64_t, const AdamHyper&, int64_t, double);               \
  template void norm<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, double);                 \
  template void normGrad<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t); \
  template void rope<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, bool, int64_t, double, bool, bool, int64_t); \
  template void concat<T>(const std::vector<const T*>&, const std::vector<int64_t>&, T*, int64_t);         \
  template void slice<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t);                                \
  template void swiglu<T>(const T*, T*, int64_t);                                                          \
  template void swigluGrad<T>(const T*, const T*, T*, int64_t);                                            \
  template void interleave<T>(const T*, const T*, T*, int64_t);                                            \
  template void deinterleave<T>(const T*, T*, int64_t, int);

PA_INSTANTIATE(float)
PA_INSTANTIATE(double)

}  // namespace pa::cpu
