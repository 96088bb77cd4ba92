// GPU tests of the flash attention kernels against the float64 reference (label `gpu`).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "kernels/attention_reference.h"
#include "runtime/flash_attention.h"

namespace pa {
namespace {

// ---------------------------------------------------------------------------------------------
// Device and launcher shared by all tests; absent (and every test skipped) without a driver/GPU.
struct GpuEnv {
  std::unique_ptr<cuda::Device> device;
  std::unique_ptr<FlashAttention> flash;
  std::string skipReason;
};
GpuEnv& env() {
  static GpuEnv e = [] {
    GpuEnv g;
    if (!cuda::Driver::instance().available()) {
      g.skipReason = cuda::Driver::instance().unavailableReason();
      return g;
    }
    g.device = std::make_unique<cuda::Device>(0);
    g.flash = std::make_unique<FlashAttention>(*g.device);
    return g;
  }();
  return e;
}
#define REQUIRE_GPU()                                             \
  do {                                                            \
    if (!env().flash) GTEST_SKIP() << env().skipReason;           \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Host <-> device element conversion (round to nearest even, as the kernels' inputs would be).
int elemBytes(FlashDType t) { return t == kFlashF32 ? 4 : 2; }
uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float fromBf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t toF16(float f) {
  const _Float16 h = (_Float16)f;
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float fromF16(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return (float)h;
}
// To TF32 as cvt.rna does: nearest, ties away from zero (13 low mantissa bits dropped).
float toTf32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&f, &u, 4);
  return f;
}
double roundTo(FlashDType t, double x) {
  switch (t) {
    case kFlashF32: return (double)(float)x;
    case kFlashF16: return fromF16(toF16((float)x));
    case kFlashBF16: return fromBf16(toBf16((float)x));
  }
  return x;
}

// A [batch, heads, seq, dim] device tensor; `packed` stores it as [batch, seq, heads, dim] (the
// layout of a fused QKV projection) to exercise non-contiguous strides.
struct DevTensor {
  cuda::DeviceBuffer buf;
  FlashTensor view;
  int batch = 0, heads = 0, seq = 0, dim = 0;
  FlashDType dtype = kFlashF32;
  long long base = 0;  // the view's first element, from the buffer's start (reverseSequence)

  DevTensor(FlashDType t, int b, int h, int s, int d, bool packed)
      : buf((size_t)std::max(1, b * h * s * d) * elemBytes(t) + 16), batch(b), heads(h), seq(s), dim(d), dtype(t) {
    view.ptr = buf.ptr();
    if (packed) {
      view.seqStride = (long long)h * d;
      view.headStride = d;
      view.batchStride = (long long)s * h * d;
    } else {
      view = FlashTensor::contiguous(buf.ptr(), h, s, d);
    }
    poison();
  }
  size_t offset(int b, int h, int s, int d) const {
    return (size_t)(base + b * view.batchStride + h * view.headStride + s * view.seqStride + d);
  }
  // The same values through a view with a negative sequence stride (each slice's last row first
  // in memory), which no TMA map can express.
  void reverseSequence() {
    const std::vector<double> x = download();
    base += (long long)(seq - 1) * view.seqStride;
    view.seqStride = -view.seqStride;
    view.ptr = buf.ptr() + (unsigned long long)base * elemBytes(dtype);
    upload(x);
  }
  void poison() { buf.fill32(dtype == kFlashF32 ? 0x7fc00000u : 0x7fc07fc0u); }
  void upload(const std::vector<double>& x) {
    std::vector<unsigned char> raw(buf.bytes(), 0);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h)
        for (int s = 0; s < seq; ++s)
          for (int d = 0; d < dim; ++d) {
            const double v = x[(((size_t)b * heads + h) * seq + s) * dim + d];
            const size_t o = offset(b, h, s, d);
            if (dtype == kFlashF32) {
              const float f = (float)v;
              std::memcpy(&raw[o * 4], &f, 4);
            } else {
              const uint16_t u = dtype == kFlashBF16 ? toBf16((float)v) : toF16((float)v);
              std::memcpy(&raw[o * 2], &u, 2);
            }
          }
    buf.upload(raw.data(), raw.size());
  }
  std::vector<double> download() const {
    std::vector<unsigned char> raw(buf.bytes());
    buf.download(raw.data(), raw.size());
    std::vector<double> x((size_t)batch * heads * seq * dim);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h)
        for (int s = 0; s < seq; ++s)
          for (int d = 0; d < dim; ++d) {
            const size_t o = offset(b, h, s, d);
            double v;
            if (dtype == kFlashF32) {
              float f;
              std::memcpy(&f, &raw[o * 4], 4);
              v = f;
            } else {
              uint16_t u;
              std::memcpy(&u, &raw[o * 2], 2);
              v = dtype == kFlashBF16 ? fromBf16(u) : fromF16(u);
            }
            x[(((size_t)b * heads + h) * seq + s) * dim + d] = v;
          }
    return x;
  }
};

struct FloatBuffer {
  cuda::DeviceBuffer buf;
  size_t n;
  explicit FloatBuffer(size_t count) : buf(std::max<size_t>(1, count) * 4), n(count) { buf.fill32(0x7fc00000u); }
  void upload(const std::vector<double>& x) {
    std::vector<float> f(x.begin(), x.end());
    buf.upload(f.data(), f.size() * 4);
  }
  std::vector<double> download() const {
    std::vector<float> f(n);
    buf.download(f.data(), n * 4);
    return std::vector<double>(f.begin(), f.end());
  }
};

// ---------------------------------------------------------------------------------------------
struct Case {
  FlashDType dtype = kFlashBF16;
  int batch = 1, heads = 2, kvHeads = 1, qLen = 17, kLen = 17, headDim = 64;
  AttentionMaskSpec mask;
  bool sinkLogits = false;
  double qScale = 1.0;  // > 1 makes logits large (the "very negative logits" stress)
  bool packed = false;
  bool backward = true;
  bool atomicDq = false;       // FlashAttention-2's atomic dQ scheme at any length
  bool deterministic = false;  // fp32: the separate dQ kernel where atomics would run
  bool tf32 = false;           // fp32 on the TF32 tensor cores
  // fp32: FFMA (kOff), the FP64 tensor cores (kOn) or the launcher's default (kAuto); all held to
  // the exact path's bound. The sweeps pin kOff so that the FFMA kernels stay tested on devices
  // where the default would run DMMA.
  FlashFp64Mma fp64Mma = FlashFp64Mma::kOff;
  std::string name() const {
    std::ostringstream os;
    os << (tf32                              ? "tf32"
           : dtype == kFlashF16              ? "f16"
           : dtype == kFlashBF16             ? "bf16"
           : fp64Mma == FlashFp64Mma::kOn   ? "f64mma"
           : fp64Mma == FlashFp64Mma::kAuto ? "f32auto"
                                             : "f32") << "_b" << batch << "_h" << heads
       << "x" << kvHeads << "_q" << qLen << "_k" << kLen << "_d" << headDim << "_c" << mask.causal
       << (mask.alignBottomRight ? "br" : "tl") << "_w" << mask.windowLeft << "," << mask.windowRight << "_s"
       << mask.sinks << (sinkLogits ? "_sl" : "") << (qScale != 1.0 ? "_big" : "") << (packed ? "_packed" : "") << (atomicDq ? "_atomicdq" : "") << (deterministic ? "_det" : "");
    return os.str();
  }
};

struct Errors {
  double maxAbs = 0, relNorm = 0;
  size_t nonFinite = 0;
};
// Compares element-wise; matching infinities (lse of empty rows) count as equal.
Errors compare(const std::vector<double>& got, const std::vector<double>& ref) {
  Errors e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (got[i] != ref[i]) ++e.nonFinite;
      continue;
    }
    if (!std::isfinite(got[i])) {
      ++e.nonFinite;
      continue;
    }
    const double d = std::fabs(got[i] - ref[i]);
    e.maxAbs = std::max(e.maxAbs, d);
    num += d * d;
    den += ref[i] * ref[i];
  }
  e.relNorm = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// Tolerances from the numerics: fp32 inputs and FFMA accumulation land near 1e-6 relative, so
// 1e-4 absolute on unit-scale data has two orders of margin. Not every output is unit-scale: dK and
// dV sum over every query row of a GQA group (thousands of terms), and large-logit inputs scale dK
// with |q|; the bound is therefore 1e-4 times max(1, max |ref|) - exactly 1e-4 for unit-scale
// outputs. bf16/fp16 round P, dS and the outputs to 8/11-bit mantissas (relative 4e-3 / 5e-4 per
// rounding), so a norm-wise relative error of 1e-2 holds.
// TF32 rounds P and dS (and the outputs' inputs) to 11 significant bits, relative error <= 2^-11
// each. As in the 16-bit cases the test inputs are exact in the rounded format (TF32 values in
// fp32), so the logits are exact products with fp32 sums and the error is the kernels' own; else
// dS = P (dP - delta) would inherit the input rounding of dP and delta, which cancel where dS is
// small (one key: exactly 0). A handful of such rounding errors per output, norm-wise, stays below
// 8 * 2^-11 = 3.9e-3 (the 16-bit bound, 1e-2, is 2.6 of its own unit roundoffs).
const double kTf32Bound = 8.0 * std::ldexp(1.0, -11);
void expectClose(const char* what, const std::vector<double>& got, const std::vector<double>& ref, const Case& c) {
  const Errors e = compare(got, ref);
  const std::string caseName = c.name();
  EXPECT_EQ(e.nonFinite, 0u) << caseName << " " << what << ": non-finite or mismatched-inf elements";
  double refScale = 1.0;
  for (double x : ref)
    if (std::isfinite(x)) refScale = std::max(refScale, std::fabs(x));
  if (c.tf32)
    EXPECT_LE(e.relNorm, kTf32Bound) << caseName << " " << what << " relative error (max abs " << e.maxAbs << ")";
  else if (c.dtype == kFlashF32)
    EXPECT_LT(e.maxAbs, 1e-4 * refScale) << caseName << " " << what << " max abs error (max |ref| " << refScale << ")";
  else
    EXPECT_LE(e.relNorm, 1e-2) << caseName << " " << what << " relative error (max abs " << e.maxAbs << ")";
}

std::vector<double> randomVec(size_t n, std::mt19937_64& rng, double scale, FlashDType t, bool tf32 = false) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = tf32 ? toTf32((float)(nd(rng) * scale)) : roundTo(t, nd(rng) * scale);
  return v;
}

// The launcher's problem for a test case.
FlashAttentionConfig configOf(const Case& c) {
  FlashAttentionConfig cfg;
  cfg.dtype = c.dtype, cfg.batch = c.batch, cfg.heads = c.heads, cfg.kvHeads = c.kvHeads;
  cfg.qLen = c.qLen, cfg.kLen = c.kLen, cfg.headDim = c.headDim, cfg.mask = c.mask;
  cfg.sinkLogits = c.sinkLogits;
  cfg.atomicDq = c.atomicDq;
  cfg.deterministic = c.deterministic;
  cfg.tf32 = c.tf32;
  cfg.fp64Mma = c.fp64Mma;
  return cfg;
}

void runCase(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  FlashAttention& fa = *env().flash;
  std::mt19937_64 rng(seed);
  const size_t nq = (size_t)c.batch * c.heads * c.qLen * c.headDim;
  const size_t nk = (size_t)c.batch * c.kvHeads * c.kLen * c.headDim;
  const auto q = randomVec(nq, rng, c.qScale, c.dtype, c.tf32);
  const auto k = randomVec(nk, rng, 1.0, c.dtype, c.tf32);
  const auto v = randomVec(nk, rng, 1.0, c.dtype, c.tf32);
  const auto dO = randomVec(nq, rng, 1.0, c.dtype, c.tf32);
  std::vector<double> sinks;
  if (c.sinkLogits) sinks = randomVec(c.heads, rng, 1.0, kFlashF32);

  AttentionReferenceProblem pr;
  pr.batch = c.batch, pr.heads = c.heads, pr.kvHeads = c.kvHeads, pr.qLen = c.qLen, pr.kLen = c.kLen;
  pr.headDim = c.headDim, pr.mask = c.mask, pr.sinkLogits = c.sinkLogits;

  const FlashAttentionConfig cfg = configOf(c);

  DevTensor dq(c.dtype, c.batch, c.heads, c.qLen, c.headDim, c.packed);
  DevTensor dk(c.dtype, c.batch, c.kvHeads, c.kLen, c.headDim, c.packed);
  DevTensor dv(c.dtype, c.batch, c.kvHeads, c.kLen, c.headDim, c.packed);
  DevTensor dout(c.dtype, c.batch, c.heads, c.qLen, c.headDim, c.packed);
  FloatBuffer lse((size_t)c.batch * c.heads * c.qLen), sinkBuf(c.heads), dSinkBuf(c.heads);
  dq.upload(q), dk.upload(k), dv.upload(v);
  if (c.sinkLogits) sinkBuf.upload(sinks);

  FlashForwardArgs fa_args;
  fa_args.q = dq.view, fa_args.k = dk.view, fa_args.v = dv.view, fa_args.o = dout.view;
  fa_args.lse = lse.buf.ptr(), fa_args.sinkLogits = sinkBuf.buf.ptr();
  fa.forward(cfg, fa_args, nullptr);
  env().device->synchronize();

  const auto ref = attentionForwardReference(pr, q, k, v, sinks);
  expectClose("O", dout.download(), ref.o, c);
  // lse: fp32 path exact to ~1e-6; the mma path computes q.k exactly in fp32 from the rounded
  // inputs and uses ex2.approx (relative 2^-22), so 1e-3 absolute is generous but still catches
  // any wrong mask or scale (TF32 too: its inputs are TF32 values here).
  {
    const Errors e = compare(lse.download(), ref.lse);
    EXPECT_EQ(e.nonFinite, 0u) << "lse non-finite / -inf mismatch";
    EXPECT_LT(e.maxAbs, c.dtype == kFlashF32 && !c.tf32 ? 1e-4 : 1e-3) << "lse max abs error";
  }
  if (!c.backward) return;

  // Backward consumes the kernel's own O (as training would), compared against the exact one.
  DevTensor ddo(c.dtype, c.batch, c.heads, c.qLen, c.headDim, c.packed);
  DevTensor ddq(c.dtype, c.batch, c.heads, c.qLen, c.headDim, c.packed);
  DevTensor ddk(c.dtype, c.batch, c.kvHeads, c.kLen, c.headDim, c.packed);
  DevTensor ddv(c.dtype, c.batch, c.kvHeads, c.kLen, c.headDim, c.packed);
  ddo.upload(dO);
  cuda::DeviceBuffer ws(fa.backwardWorkspaceBytes(cfg));
  ws.fill32(0x7fc00000u);
  FlashBackwardArgs ba;
  ba.q = dq.view, ba.k = dk.view, ba.v = dv.view, ba.o = dout.view, ba.dO = ddo.view;
  ba.dQ = ddq.view, ba.dK = ddk.view, ba.dV = ddv.view;
  ba.lse = lse.buf.ptr(), ba.sinkLogits = sinkBuf.buf.ptr(), ba.dSinkLogits = dSinkBuf.buf.ptr();
  ba.workspace = ws.ptr();
  fa.backward(cfg, ba, nullptr);
  env().device->synchronize();

  const auto g = attentionBackwardReference(pr, q, k, v, sinks, dO);
  expectClose("dQ", ddq.download(), g.dQ, c);
  expectClose("dK", ddk.download(), g.dK, c);
  expectClose("dV", ddv.download(), g.dV, c);
  if (c.sinkLogits) {
    // dSink_h = -sum_{b,q} p_sink * (dO . O) sums terms of both signs, so its error scales with
    // sum |p_sink| * sum_d |dO * O| (each term carries the relative error of O), not with |dSink|.
    const auto got = dSinkBuf.download();
    std::vector<double> termScale(c.heads, 0.0);
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.heads; ++h)
        for (int i = 0; i < c.qLen; ++i) {
          const size_t row = ((size_t)b * c.heads + h) * c.qLen + i;
          const double pSink = std::exp(sinks[h] - ref.lse[row]);
          double dot = 0;
          for (int d = 0; d < c.headDim; ++d) dot += std::fabs(dO[row * c.headDim + d] * ref.o[row * c.headDim + d]);
          termScale[h] += pSink * dot;
        }
    for (int h = 0; h < c.heads; ++h) {
      ASSERT_TRUE(std::isfinite(got[h])) << "dSink[" << h << "]";
      EXPECT_NEAR(got[h], g.dSinkLogits[h],
                  (c.tf32 ? kTf32Bound : c.dtype == kFlashF32 ? 1e-4 : 1e-2) * std::max(1e-3, termScale[h]))
          << "dSink[" << h << "] (sum of |terms| " << termScale[h] << ")";
    }
  }
}

// ---------------------------------------------------------------------------------------------
AttentionMaskSpec maskOf(int causal, int br, int wl, int wr, int sinks) {
  AttentionMaskSpec m;
  m.causal = causal, m.alignBottomRight = br, m.windowLeft = wl, m.windowRight = wr, m.sinks = sinks;
  return m;
}

struct MaskCase {
  AttentionMaskSpec mask;
  bool sinkLogits;
};
const std::vector<MaskCase>& maskCases() {
  static const std::vector<MaskCase> m = {
      {maskOf(0, 0, -1, -1, 0), false},  // none
      {maskOf(1, 0, -1, -1, 0), false},  // causal, top-left (SDPA)
      {maskOf(1, 1, -1, -1, 0), false},  // causal, bottom-right (FlashAttention)
      {maskOf(0, 0, 37, 11, 0), false},  // two-sided window
      {maskOf(1, 1, 63, -1, 4), false},  // causal window + StreamingLLM sinks
      {maskOf(1, 0, -1, -1, 0), true},   // causal + learnable sink logits (gpt-oss)
      {maskOf(1, 0, 100, -1, 3), true},  // everything at once
      {maskOf(0, 1, -1, 0, 2), false},   // window right only, with sinks
  };
  return m;
}

// The precisions the sweeps run: fp32 exact, fp32 on TF32 tensor cores, bf16, fp16, and fp32 on
// the FP64 tensor cores (fp64Mma: head dims <= 64; the exact path's bound).
enum Precision { kF32, kTF32, kBF16, kF16, kF64Mma };
FlashDType dtypeOf(int p) { return p == kBF16 ? kFlashBF16 : p == kF16 ? kFlashF16 : kFlashF32; }
FlashFp64Mma fp64MmaOf(int p) { return p == kF64Mma ? FlashFp64Mma::kOn : FlashFp64Mma::kOff; }
std::string precisionName(int p) {
  return p == kF32 ? "f32" : p == kTF32 ? "tf32" : p == kBF16 ? "bf16" : p == kF16 ? "f16" : "f64mma";
}

class FlashMaskSweep : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(FlashMaskSweep, MatchesFloat64Reference) {
  REQUIRE_GPU();
  const auto [precision, maskIdx, shapeIdx] = GetParam();
  const FlashDType dtype = dtypeOf(precision);
  static const int shapes[][2] = {{1, 1}, {17, 17}, {127, 129}, {128, 128}, {129, 127}, {1000, 1000}, {200, 1000}, {1000, 200}};
  static const int gqa[][2] = {{2, 2}, {4, 2}, {4, 1}, {8, 1}};
  static const int dims[] = {64, 128, 32, 96};
  Case c;
  c.dtype = dtype;
  c.tf32 = precision == kTF32;
  c.mask = maskCases()[maskIdx].mask;
  c.sinkLogits = maskCases()[maskIdx].sinkLogits;
  c.qLen = shapes[shapeIdx][0];
  c.kLen = shapes[shapeIdx][1];
  const bool big = c.qLen * c.kLen > 100000;
  c.batch = big ? 1 : 2;
  c.heads = gqa[(maskIdx + shapeIdx) % 4][0];
  c.kvHeads = gqa[(maskIdx + shapeIdx) % 4][1];
  c.headDim = dims[(maskIdx * 3 + shapeIdx) % 4];
  c.fp64Mma = fp64MmaOf(precision);
  if (precision == kF64Mma && c.headDim > 64) c.headDim /= 2;  // its limit: 128 -> 64, 96 -> 48 (padded to 64)
  // Half the cases per backward scheme: 16-bit and TF32 with and without atomicDq; fp32 (and
  // fp64Mma) by default (FFMA: dQ shares, or atomics beyond 8 key blocks: the lengths 1000 here;
  // fp64Mma: atomics) and deterministic (dQ shares, or the separate dQ kernel).
  const bool odd = (maskIdx + shapeIdx) % 2 == 1;
  const bool fp32Schemes = precision == kF32 || precision == kF64Mma;
  c.atomicDq = !fp32Schemes && odd;
  c.deterministic = fp32Schemes && odd;
  runCase(c, 1000003ull * (maskIdx * 16 + shapeIdx) + precision);
}

INSTANTIATE_TEST_SUITE_P(AllMasks, FlashMaskSweep,
                         ::testing::Combine(::testing::Values(kF32, kTF32, kBF16, kF16, kF64Mma), ::testing::Range(0, 8),
                                            ::testing::Range(0, 8)),
                         [](const auto& info) {
                           return precisionName(std::get<0>(info.param)) + "_mask" + std::to_string(std::get<1>(info.param)) +
                                  "_shape" + std::to_string(std::get<2>(info.param));
                         });

// validate(cfg, backward) must reject the problem with a FlashAttentionError naming `want`.
void expectInvalid(const FlashAttentionConfig& cfg, bool backward, const std::string& want) {
  try {
    env().flash->validate(cfg, backward);
    ADD_FAILURE() << "accepted; expected an error containing \"" << want << "\"";
  } catch (const FlashAttentionError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

class FlashHeadDims : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(FlashHeadDims, MatchesFloat64Reference) {
  REQUIRE_GPU();
  Case c;
  c.dtype = dtypeOf(std::get<0>(GetParam()));
  c.tf32 = std::get<0>(GetParam()) == kTF32;
  c.fp64Mma = fp64MmaOf(std::get<0>(GetParam()));
  c.headDim = std::get<1>(GetParam());
  c.batch = 2, c.heads = 4, c.kvHeads = 2, c.qLen = 129, c.kLen = 127;
  c.mask = maskOf(1, 1, 50, -1, 2);
  c.sinkLogits = true;
  c.backward = !(c.dtype == kFlashF32 && c.headDim > 128);
  if (c.fp64Mma == FlashFp64Mma::kOn && c.headDim > 64) {  // beyond its limit: a clear error, not a spilling kernel
    FlashAttentionConfig cfg;
    cfg.dtype = kFlashF32, cfg.fp64Mma = FlashFp64Mma::kOn, cfg.headDim = c.headDim, cfg.qLen = cfg.kLen = 8;
    expectInvalid(cfg, false, "fp64Mma supports head dim <= 64");
    return;
  }
  runCase(c, 77 + c.headDim);
  if ((c.dtype != kFlashF32 || c.tf32) && c.backward) {  // both backward schemes of the mma.sync kernels
    c.atomicDq = true;
    runCase(c, 78 + c.headDim);
  }
  if (c.fp64Mma == FlashFp64Mma::kOn) {  // its default ran atomics; the deterministic scheme here
    c.deterministic = true;
    runCase(c, 79 + c.headDim);
  }
}
INSTANTIATE_TEST_SUITE_P(Dims, FlashHeadDims,
                         ::testing::Combine(::testing::Values(kF32, kTF32, kBF16, kF16, kF64Mma),
                                            ::testing::Values(8, 32, 40, 64, 96, 128, 176, 200, 256)),
                         [](const auto& info) {
                           return precisionName(std::get<0>(info.param)) + "_d" + std::to_string(std::get<1>(info.param));
                         });

TEST(FlashAttentionGpu, LongSequence4096AllMasks) {
  REQUIRE_GPU();
  for (FlashDType t : {kFlashF32, kFlashBF16}) {
    Case c;
    c.dtype = t, c.batch = 1, c.heads = 2, c.kvHeads = 1, c.qLen = 4096, c.kLen = 4096, c.headDim = 64;
    c.mask = maskOf(1, 1, 1023, -1, 4);
    c.sinkLogits = true;
    runCase(c, 4096 + t);
    if (t != kFlashF32) {
      c.atomicDq = true;
      runCase(c, 4097 + t);
    } else {  // fp32 ran the atomic dQ above; the separate dQ kernel here
      c.deterministic = true;
      runCase(c, 4098);
      c.deterministic = false, c.tf32 = true;  // and on the TF32 tensor cores
      runCase(c, 4099);
      c.tf32 = false, c.fp64Mma = FlashFp64Mma::kOn;  // and on the FP64 ones
      runCase(c, 4100);
    }
  }
}

// The fp32 default (FlashFp64Mma::kAuto): on a device with full-rate FP64 the forward runs on the
// FP64 tensor cores from kFp64MmaForwardMinBlocks blocks at head dims <= 64, and the backward
// there up to kFp64MmaBackwardMaxKeys keys from kFp64MmaBackwardMinBlocks 32-key blocks (dQ from
// the key blocks' shares), else on the FFMA kernels, from the forward's O and log-sum-exp;
// elsewhere FFMA throughout. Each case checks the choice and the results (the exact path's bound).
TEST(FlashAttentionGpu, Fp32DefaultForwardOnTheFp64TensorCoresWhereFullRate) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  struct Shape {
    int batch, heads, kvHeads, qLen, kLen, headDim;
    AttentionMaskSpec mask;
    bool sinkLogits, deterministic;
  };
  // (forward: 64-row blocks; backward: 32-key blocks of the KV heads, up to 512 keys)
  const Shape shapes[] = {
      {2, 8, 2, 300, 300, 64, maskOf(1, 0, -1, -1, 0), true, false},     // 80 blocks: DMMA; backward 40: FFMA
      {1, 16, 4, 1000, 1000, 32, maskOf(1, 1, 200, -1, 4), false, false}, // 256 blocks, d 32; 1000 keys: FFMA backward
      {1, 8, 8, 1000, 700, 40, maskOf(0, 0, 90, 30, 2), true, true},     // 128 blocks, d 40, deterministic
      {1, 4, 4, 129, 127, 48, maskOf(1, 1, -1, -1, 0), false, false},    // 12 blocks: FFMA
      {1, 8, 4, 600, 600, 96, maskOf(1, 0, -1, -1, 0), false, false},    // head dim 96: FFMA
      // the backward on DMMA too, dQ from the key blocks' shares: a window with sinks and sink
      // logits over GQA (16 · 4 · 10 = 640 blocks), causal from the bottom right on unequal lengths
      // (16 · 4 · 9 = 576), both windows deterministic (9 · 4 · 16 = 576, 512 keys: 8 key blocks)
      {16, 8, 4, 300, 300, 64, maskOf(1, 0, 70, -1, 3), true, false},
      {16, 4, 4, 200, 257, 32, maskOf(1, 1, -1, -1, 0), false, false},
      {9, 4, 4, 333, 512, 48, maskOf(0, 0, 100, 40, 0), false, true},
  };
  for (const Shape& sh : shapes) {
    Case c;
    c.dtype = kFlashF32, c.fp64Mma = FlashFp64Mma::kAuto;
    c.batch = sh.batch, c.heads = sh.heads, c.kvHeads = sh.kvHeads, c.qLen = sh.qLen, c.kLen = sh.kLen;
    c.headDim = sh.headDim, c.mask = sh.mask, c.sinkLogits = sh.sinkLogits, c.deterministic = sh.deterministic;
    const FlashAttentionConfig cfg = configOf(c);
    const bool wantDmma = target.fullRateFp64 && c.headDim <= 64 &&
                          (long long)c.batch * c.heads * ((c.qLen + 63) / 64) >= kFp64MmaForwardMinBlocks;
    const bool wantDmmaBackward = target.fullRateFp64 && c.headDim <= 64 && c.kLen <= kFp64MmaBackwardMaxKeys &&
                                  (long long)c.batch * c.kvHeads * ((c.kLen + 31) / 32) >= kFp64MmaBackwardMinBlocks;
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kForward, cfg, target).f64, wantDmma) << c.name();
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target);
    EXPECT_EQ(dkdv.f64, wantDmmaBackward) << c.name();
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg, target).f64, wantDmmaBackward) << c.name();
    if (wantDmmaBackward) {
      EXPECT_TRUE(dkdv.dqPartial && !dkdv.atomicDq) << c.name();
    }
    runCase(c, 5000 + c.qLen + c.headDim);
  }
}

TEST(FlashAttentionGpu, VeryLargeLogitsStayFinite) {
  REQUIRE_GPU();
  for (int p : {kF32, kTF32, kBF16, kF64Mma}) {
    Case c;
    c.dtype = dtypeOf(p), c.tf32 = p == kTF32, c.fp64Mma = fp64MmaOf(p), c.heads = 2, c.kvHeads = 2, c.qLen = 130,
    c.kLen = 300, c.headDim = 64;
    c.mask = maskOf(1, 0, 40, -1, 1);
    c.qScale = 30.0;  // logits of order +-200: exp underflows for all but a few keys per row
    c.sinkLogits = true;
    runCase(c, 99 + p);
  }
}

// Gives the launcher tuning overrides for one scope and restores its rules when it ends, also when
// a failed assertion leaves the test early.
class ScopedTuning {
 public:
  explicit ScopedTuning(const FlashTuning& tuning) { env().flash->setTuning(tuning); }
  ~ScopedTuning() { env().flash->setTuning({}); }
  ScopedTuning(const ScopedTuning&) = delete;
  ScopedTuning& operator=(const ScopedTuning&) = delete;
};

// The variant sweeps' masks, in turn: causal window with sinks, none, causal.
AttentionMaskSpec rotatingMask(int seed) {
  return seed % 3 == 0 ? maskOf(1, 1, 70, -1, 3) : seed % 3 == 1 ? maskOf(0, 0, -1, -1, 0) : maskOf(1, 0, -1, -1, 0);
}

TEST(FlashAttentionGpu, Fp32EveryRowsPerThread) {
  REQUIRE_GPU();
  // The launcher picks R (rows per thread) from the grid size; force each variant here so every
  // one the heuristic can choose is checked whatever the test shapes would pick.
  for (int r : {1, 2, 4, 8}) {
    FlashTuning tuning;
    tuning.f32FwdRows = r;
    tuning.f32BwdRows = r == 8 ? 4 : r;  // the backward stops at R = 4
    const ScopedTuning scoped(tuning);
    Case c;
    c.dtype = kFlashF32, c.batch = 2, c.heads = 4, c.kvHeads = 2, c.qLen = 300, c.kLen = 257, c.headDim = 64;
    c.mask = maskOf(1, 1, 70, -1, 3);
    c.sinkLogits = true;
    runCase(c, 300 + '0' + r);
    // Every part in dQ at each R (257 keys: shares at R = 4, atomics at R = 1 and 2 by default).
    c.atomicDq = true;
    runCase(c, 310 + '0' + r);
    c.atomicDq = false, c.deterministic = true;
    runCase(c, 320 + '0' + r);
  }
}

// The fp32 dK/dV kernel with its key blocks' query tiles split among 2 or 4 blocks
// (FlashTuning::f32BwdSplit; the rule picks it for short sequences on large GPUs): every part in
// dQ, R 2 and 4, GQA, masks under which some parts see no visible tile (few query tiles, bottom-right
// causal over more keys than queries), head dims 40 and 128.
TEST(FlashAttentionGpu, Fp32QueryPartsMatchFloat64) {
  REQUIRE_GPU();
  int seed = 0;
  for (int parts : {2, 4})
    for (int r : {2, 4}) {
      FlashTuning tuning;
      tuning.f32BwdSplit = parts, tuning.f32BwdRows = r;
      const ScopedTuning scoped(tuning);
      for (int shape = 0; shape < 3; ++shape) {
        Case c;
        c.dtype = kFlashF32, c.batch = 2, c.heads = 4, c.kvHeads = 2;
        c.qLen = shape == 1 ? 65 : 300, c.kLen = shape == 1 ? 200 : 257, c.headDim = shape == 2 ? 128 : shape == 1 ? 40 : 64;
        c.mask = shape == 1 ? maskOf(1, 1, -1, -1, 0) : rotatingMask(seed);
        c.sinkLogits = shape != 1;
        SCOPED_TRACE("parts=" + std::to_string(parts) + " R=" + std::to_string(r));
        runCase(c, 700 + seed++);
        c.atomicDq = true;
        runCase(c, 700 + seed++);
        c.atomicDq = false, c.deterministic = true;
        runCase(c, 700 + seed++);
      }
    }
}

// On sm_90a the 16-bit forward at head dims 33-128 runs the wgmma kernel, which the
// sweeps above check; the mma.sync kernel it replaces there still runs on other GPUs and head
// dims. Switch wgmma off and check that kernel on the same problems, and every wgmma tile /
// warpgroup variant the tuning overrides reach (key tiles 64, 128 and the wide 160, 176, 192).
TEST(FlashAttentionGpu, EveryForwardVariantOfTheSixteenBitTypes) {
  REQUIRE_GPU();
  struct Variant {
    bool wgmma;
    int tile, wg, stages;  // 0: the rule
    int pingpong = -1;  // the warpgroups' turns: -1 the rule
    int persistent = -1;  // -1 the rule (persistent where the SM count is known), 0 one item a block
    int tma = -1;         // -1 the rule (TMA loads), 0 cp.async (the launcher's fallback)
  };
  // Every variant fits an H100's shared memory at head dim 128 too (176 and 192 without the
  // persistent kernel's second Q buffer, which the chooser then leaves out).
  const Variant variants[] = {{false, 0, 0, 0},        {true, 64, 1, 2},        {true, 64, 2, 3},
                              {true, 64, 3, 3},        {true, 128, 1, 2},       {true, 128, 2, 2},
                              {true, 128, 2, 3},       {true, 128, 3, 2},       {true, 128, 2, 2, 0},
                              {true, 128, 2, 2, 1},    {true, 64, 3, 3, 1},     {true, 64, 2, 2, 1},
                              {true, 0, 0, 0, -1, 0},  {true, 160, 2, 2},       {true, 160, 2, 2, -1, 0},
                              {true, 176, 2, 2},       {true, 192, 2, 2},       {true, 160, 3, 2, -1, 0},
                              {true, 176, 3, 2, -1, 0},  {true, 160, 2, 2, -1, 0, 0}};
  int seed = 0;
  for (const Variant& v : variants) {
    FlashTuning tuning;
    tuning.wgmma = v.wgmma, tuning.fwdTile = v.tile, tuning.fwdWarpgroups = v.wg, tuning.fwdStages = v.stages;
    tuning.fwdPingPong = v.pingpong, tuning.fwdPersistent = v.persistent, tuning.tma = v.tma;
    const ScopedTuning scoped(tuning);
    for (FlashDType t : {kFlashBF16, kFlashF16})
      for (int d : {64, 128, 40, 104}) {
        Case c;
        c.dtype = t, c.batch = 2, c.heads = 4, c.kvHeads = 2, c.qLen = 300, c.kLen = 257, c.headDim = d;
        c.mask = rotatingMask(seed);
        c.sinkLogits = seed % 2 == 0;
        c.backward = false;
        SCOPED_TRACE("wgmma=" + std::to_string(v.wgmma) + " tile=" + std::to_string(v.tile) + " wg=" + std::to_string(v.wg) +
                     " stages=" + std::to_string(v.stages) + " pingpong=" + std::to_string(v.pingpong) +
                     " persistent=" + std::to_string(v.persistent) + " tma=" + std::to_string(v.tma) + " d=" + std::to_string(d));
        runCase(c, 500 + seed++);
      }
  }
}

// The rule's wide key tiles (160 keys, one item a block) where rows see 8,192 keys or more, at
// padded head dim 128: keys not a multiple of the tile, no mask, bottom-right causal (the last
// rows see every key) and a window as wide as the threshold with sinks, sink logits on half.
TEST(FlashAttentionGpu, WideForwardTilesOnLongKeys) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  int seed = 0;
  for (FlashDType t : {kFlashBF16, kFlashF16})
    for (int d : {128, 104})
      for (int m = 0; m < 3; ++m) {
        Case c;
        c.dtype = t, c.batch = 1, c.heads = 2, c.kvHeads = 1, c.qLen = 130, c.kLen = 8200, c.headDim = d;
        c.mask = m == 0 ? maskOf(0, 0, -1, -1, 0) : m == 1 ? maskOf(1, 1, -1, -1, 0) : maskOf(1, 1, 8191, -1, 4);
        c.sinkLogits = seed % 2 == 0;
        c.backward = false;
        SCOPED_TRACE("d=" + std::to_string(d) + " mask " + std::to_string(m));
        if (target.wgmma) {
          EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kForward, configOf(c), target).tile, 160);
        }
        runCase(c, 900 + seed++);
      }
}

// One run's outputs (downloaded tensors and buffers) one after another, and two runs compared bit
// for bit.
std::vector<double> joined(std::initializer_list<std::vector<double>> parts) {
  std::vector<double> all;
  for (const std::vector<double>& x : parts) all.insert(all.end(), x.begin(), x.end());
  return all;
}
void expectSameBits(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0);
}

// One backward of `cfg` on these inputs with the current tuning and a fresh workspace: dQ, dK, dV
// and, given `sinks`, the sink-logit gradient, in one vector.
std::vector<double> backwardOutputs(const FlashAttentionConfig& cfg, const DevTensor& q, const DevTensor& k,
                                    const DevTensor& v, const DevTensor& o, const DevTensor& dO, const FloatBuffer& lse,
                                    const FloatBuffer* sinks) {
  FlashAttention& fa = *env().flash;
  cuda::DeviceBuffer ws(fa.backwardWorkspaceBytes(cfg));
  DevTensor dq(cfg.dtype, cfg.batch, cfg.heads, cfg.qLen, cfg.headDim, false);
  DevTensor dk(cfg.dtype, cfg.batch, cfg.kvHeads, cfg.kLen, cfg.headDim, false);
  DevTensor dv(cfg.dtype, cfg.batch, cfg.kvHeads, cfg.kLen, cfg.headDim, false);
  FloatBuffer dSink(cfg.heads);
  FlashBackwardArgs a;
  a.q = q.view, a.k = k.view, a.v = v.view, a.o = o.view, a.dO = dO.view, a.dQ = dq.view, a.dK = dk.view;
  a.dV = dv.view, a.lse = lse.buf.ptr(), a.workspace = ws.ptr();
  if (sinks) a.sinkLogits = sinks->buf.ptr(), a.dSinkLogits = dSink.buf.ptr();
  fa.backward(cfg, a, nullptr);
  env().device->synchronize();
  return sinks ? joined({dq.download(), dk.download(), dv.download(), dSink.download()})
               : joined({dq.download(), dk.download(), dv.download()});
}

// Random inputs of `cfg`: Q, K, V, dO and the sink logits, drawn in that order from one generator
// seeded with `seed`, in packed or contiguous layouts.
struct RandomAttentionInputs {
  DevTensor q, k, v, dO;
  FloatBuffer sinks;
  RandomAttentionInputs(const FlashAttentionConfig& c, bool packed, uint64_t seed)
      : q(c.dtype, c.batch, c.heads, c.qLen, c.headDim, packed), k(c.dtype, c.batch, c.kvHeads, c.kLen, c.headDim, packed),
        v(c.dtype, c.batch, c.kvHeads, c.kLen, c.headDim, packed), dO(c.dtype, c.batch, c.heads, c.qLen, c.headDim, packed),
        sinks(c.heads) {
    std::mt19937_64 rng(seed);
    const long long qElems = (long long)c.batch * c.heads * c.qLen * c.headDim;
    const long long kvElems = (long long)c.batch * c.kvHeads * c.kLen * c.headDim;
    q.upload(randomVec(qElems, rng, 1, c.dtype));
    k.upload(randomVec(kvElems, rng, 1, c.dtype));
    v.upload(randomVec(kvElems, rng, 1, c.dtype));
    dO.upload(randomVec(qElems, rng, 1, c.dtype));
    sinks.upload(randomVec(c.heads, rng, 1, kFlashF32));
  }
  const FloatBuffer* sinksOf(const FlashAttentionConfig& c) const { return c.sinkLogits ? &sinks : nullptr; }
  // Q, K, V and dO keep their values through views with negative sequence strides.
  void reverseSequences() {
    for (DevTensor* t : {&q, &k, &v, &dO}) t->reverseSequence();
  }
  // The forward into `o` and `lse` under the current tuning.
  void forward(const FlashAttentionConfig& c, const DevTensor& o, const FloatBuffer& lse) const {
    env().flash->forward(c, {q.view, k.view, v.view, o.view, lse.buf.ptr(), c.sinkLogits ? sinks.buf.ptr() : 0}, nullptr);
    env().device->synchronize();
  }
  // O and lse of a forward into fresh buffers, then the backward's outputs (backwardOutputs).
  std::vector<double> forwardBackwardOutputs(const FlashAttentionConfig& c) const {
    DevTensor o(c.dtype, c.batch, c.heads, c.qLen, c.headDim, false);
    FloatBuffer lse(c.batch * c.heads * c.qLen);
    forward(c, o, lse);
    return joined({o.download(), lse.download(), backwardOutputs(c, q, k, v, o, dO, lse, sinksOf(c))});
  }
};

// A bf16 problem of the bitwise comparisons below: its sizes, mask and whether it has sink logits.
struct Bf16Problem {
  int batch, heads, kvHeads, qLen, kLen, headDim;
  AttentionMaskSpec mask;
  bool sinks;
  FlashAttentionConfig config() const {
    FlashAttentionConfig c;
    c.dtype = kFlashBF16, c.batch = batch, c.heads = heads, c.kvHeads = kvHeads;
    c.qLen = qLen, c.kLen = kLen, c.headDim = headDim, c.mask = mask, c.sinkLogits = sinks;
    return c;
  }
  // "d<head dim> q <query length> k <key length>", for SCOPED_TRACE.
  std::string name() const {
    return "d" + std::to_string(headDim) + " q " + std::to_string(qLen) + " k " + std::to_string(kLen);
  }
};

// The persistent wgmma forward (blocks walking a work list of many items each, Q of the next
// item loaded under the current one, groups of slices) computes every item as the one-item-a-block
// kernel does: the same operations in the same order, so the same bits, O and lse. Shapes with
// several items a block, several groups of slices (the last one short), partial last tiles, every
// kind of mask, GQA, head dims 64 and 128 (two and three consumer warpgroups, ping-pong), and
// query tiles that see no key (bottom-right causal, more queries than keys).
TEST(FlashAttentionGpu, PersistentForwardEqualsOneItemABlock) {
  REQUIRE_GPU();
  FlashAttention& fa = *env().flash;
  const FlashTarget target = flashTargetOf(env().device->info());
  if (!target.wgmma) GTEST_SKIP() << "the persistent forward is the sm_90a wgmma kernel";
  const Bf16Problem shapes[] = {{8, 16, 4, 1000, 1000, 64, maskOf(1, 0, -1, -1, 0), true},
                          {3, 6, 6, 4100, 4100, 128, maskOf(1, 0, -1, -1, 0), false},
                          {2, 12, 3, 2200, 2200, 64, maskOf(1, 0, 300, -1, 4), true},
                          {4, 8, 8, 700, 1500, 128, maskOf(0, 0, -1, -1, 0), false},
                          {6, 8, 2, 1300, 900, 64, maskOf(1, 1, 200, 50, 2), false},
                          {2, 8, 8, 1500, 400, 64, maskOf(1, 1, -1, -1, 0), false}};  // tiles that see no key
  for (const Bf16Problem& sh : shapes) {
    const FlashAttentionConfig cfg = sh.config();
    ASSERT_TRUE(chooseFlashSpec(FlashKernelKind::kForward, cfg, target).persistent);
    SCOPED_TRACE(sh.name());
    std::mt19937_64 rng(sh.qLen * 7 + sh.headDim);
    const long long qElems = (long long)sh.batch * sh.heads * sh.qLen * sh.headDim;
    const long long kvElems = (long long)sh.batch * sh.kvHeads * sh.kLen * sh.headDim;
    DevTensor q(cfg.dtype, sh.batch, sh.heads, sh.qLen, sh.headDim, false);
    DevTensor k(cfg.dtype, sh.batch, sh.kvHeads, sh.kLen, sh.headDim, false), v(cfg.dtype, sh.batch, sh.kvHeads, sh.kLen, sh.headDim, false);
    q.upload(randomVec(qElems, rng, 1, cfg.dtype));
    k.upload(randomVec(kvElems, rng, 1, cfg.dtype));
    v.upload(randomVec(kvElems, rng, 1, cfg.dtype));
    FloatBuffer sinks(sh.heads);
    sinks.upload(randomVec(sh.heads, rng, 1, kFlashF32));
    std::vector<std::vector<double>> outs;
    for (int persistent : {1, 0}) {
      FlashTuning tuning;
      tuning.fwdPersistent = persistent;
      const ScopedTuning scoped(tuning);
      DevTensor o(cfg.dtype, sh.batch, sh.heads, sh.qLen, sh.headDim, false);
      FloatBuffer lse(sh.batch * sh.heads * sh.qLen);
      fa.forward(cfg, {q.view, k.view, v.view, o.view, lse.buf.ptr(), sh.sinks ? sinks.buf.ptr() : 0}, nullptr);
      env().device->synchronize();
      outs.push_back(joined({o.download(), lse.download()}));
    }
    expectSameBits(outs[0], outs[1]);
  }
}

// The narrow sink tile (FlashKernelSpec::sinkTile: a first key tile that holds only sinks runs
// kFlashSinkTileKeys-key products in the forward and dQ kernels) adds exactly what the full tile
// adds, its other keys' P and dS being exact zeros: the same bits in O, lse, dQ, dK, dV and the
// sink-logit gradient with and without it. GQA, head dims 64 and 128, unequal lengths, bottom-right
// alignment, 1 to kFlashSinkTileKeys sinks.
TEST(FlashAttentionGpu, SinkTileEqualsTheFullTile) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  if (!target.wgmma) GTEST_SKIP() << "the sink tile is the sm_90a wgmma kernels'";
  const Bf16Problem shapes[] = {{2, 8, 2, 1500, 1500, 64, maskOf(1, 0, 200, -1, 4), true},
                          {1, 4, 4, 1100, 1100, 128, maskOf(1, 1, 300, -1, kFlashSinkTileKeys), false},
                          {2, 6, 3, 900, 700, 96, maskOf(0, 1, 100, 40, 1), true}};
  for (const Bf16Problem& sh : shapes) {
    const FlashAttentionConfig cfg = sh.config();
    ASSERT_TRUE(chooseFlashSpec(FlashKernelKind::kForward, cfg, target).sinkTile);
    ASSERT_TRUE(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg, target).sinkTile);
    SCOPED_TRACE(sh.name());
    const RandomAttentionInputs in(cfg, false, sh.qLen * 11 + sh.headDim);
    std::vector<std::vector<double>> runs;
    for (int tile : {-1, 0}) {
      FlashTuning tuning;
      tuning.sinkTile = tile;
      const ScopedTuning scoped(tuning);
      runs.push_back(in.forwardBackwardOutputs(cfg));
    }
    expectSameBits(runs[0], runs[1]);
  }
}

// The wgmma kernels' TMA loads (FlashKernelSpec::tma) hand the consumers the same tiles as the
// producer warpgroup's cp.async, and their TMA stores (O at head dim 128, dK and dV, dQ at 128) write
// what the register stores write: the same bits in O, lse, dQ, dK, dV and the sink-logit gradient,
// for padded head dims 64, 128, 192 and 256 with columns past the head dim (40, 96, 144, 200) and rows past the
// lengths (zeros either way), packed strides, GQA (dK/dV per query head and per KV head), the
// sink tile, two and three warpgroups, persistent and one item a block, one row.
TEST(FlashAttentionGpu, TmaLoadsEqualCpAsync) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  if (!target.wgmma) GTEST_SKIP() << "TMA loads are the sm_90a wgmma forward's";
  struct Shape : Bf16Problem {
    bool packed;
    int persistent;  // FlashTuning::fwdPersistent and ::bwdPersistent
    int splitKv;     // FlashTuning::splitKv
  };
  const Shape shapes[] = {{{2, 8, 2, 1500, 1500, 128, maskOf(1, 0, 200, -1, 4), true}, false, -1, -1},
                          {{2, 6, 3, 129, 257, 96, maskOf(1, 1, -1, -1, 0), false}, true, 1, 1},
                          {{2, 3, 3, 2100, 2100, 64, maskOf(0, 0, -1, -1, 0), false}, false, -1, -1},
                          {{1, 4, 1, 300, 77, 40, maskOf(0, 0, 50, 20, 0), true}, true, 0, 0},
                          {{1, 2, 2, 1, 1, 128, maskOf(0, 0, -1, -1, 0), false}, false, 0, -1},
                          {{3, 4, 2, 700, 700, 128, maskOf(1, 0, -1, -1, 0), false}, false, 0, 1},
                          {{2, 8, 2, 1024, 1024, 64, maskOf(1, 0, 128, -1, 0), true}, false, -1, 0},
                          {{2, 4, 2, 300, 333, 256, maskOf(1, 1, 100, -1, 3), true}, false, -1, 0},
                          {{1, 4, 4, 200, 129, 200, maskOf(0, 0, -1, -1, 0), false}, true, -1, -1},
                          {{2, 4, 2, 300, 333, 192, maskOf(1, 1, 100, -1, 3), true}, false, -1, 0},
                          {{1, 4, 4, 200, 129, 144, maskOf(0, 0, -1, -1, 0), false}, true, -1, -1}};
  for (const Shape& sh : shapes) {
    const FlashAttentionConfig cfg = sh.config();
    for (FlashKernelKind kind : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
      ASSERT_TRUE(chooseFlashSpec(kind, cfg, target).tma);
    SCOPED_TRACE(sh.name());
    const RandomAttentionInputs in(cfg, sh.packed, sh.qLen * 13 + sh.headDim);
    std::vector<std::vector<double>> runs;
    for (int tma : {-1, 0}) {
      FlashTuning tuning;
      tuning.tma = tma;
      tuning.fwdPersistent = tuning.bwdPersistent = sh.persistent;
      tuning.splitKv = sh.splitKv;
      const ScopedTuning scoped(tuning);
      runs.push_back(in.forwardBackwardOutputs(cfg));
    }
    expectSameBits(runs[0], runs[1]);
  }
}

// Views that no TMA map can express (negative sequence strides: each slice's last row first in
// memory) run the kernels the rule picks with the producer's cp.async instead (the launcher's
// mapsOrFallBack): the same bits as the TMA kernels on the same values laid out forward, forward
// and backward (O, lse, dQ, dK, dV, the sink-logit gradient), at padded head dims 64 and 128, with
// GQA, sinks, windows and lengths off the tiles.
TEST(FlashAttentionGpu, ViewsNoTmaMapExpressesFallBackToCpAsync) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  if (!target.wgmma) GTEST_SKIP() << "TMA is the sm_90a wgmma kernels'";
  const Bf16Problem shapes[] = {{2, 8, 2, 700, 700, 128, maskOf(1, 0, 200, -1, 4), true},
                          {1, 4, 4, 333, 333, 64, maskOf(1, 0, -1, -1, 0), false},
                          {2, 6, 3, 129, 257, 96, maskOf(0, 0, -1, -1, 0), false}};
  for (const Bf16Problem& sh : shapes) {
    const FlashAttentionConfig cfg = sh.config();
    for (FlashKernelKind kind : {FlashKernelKind::kForward, FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
      ASSERT_TRUE(chooseFlashSpec(kind, cfg, target).tma);
    SCOPED_TRACE(sh.name());
    RandomAttentionInputs in(cfg, false, sh.qLen * 7 + sh.headDim);
    const std::vector<double> byTma = in.forwardBackwardOutputs(cfg);
    in.reverseSequences();
    ASSERT_LT(in.q.view.seqStride, 0);
    expectSameBits(byTma, in.forwardBackwardOutputs(cfg));
  }
}

// A small persistent forward with more items than SMs (blocks take two or three items each, so
// Q buffers and the work counter are handed on), for compute-sanitizer's memcheck and racecheck
// (bench/flash_device_run.sh sanitize): against the float64 reference. The first case has the
// narrow sink tile at head dim 64; the second is head dim 128 (O stored by TMA from the Q buffer,
// ping-pong), whose first query tile of each slice sees no key (causal, bottom-right, 300 queries
// over 100 keys): an item without products hands its Q buffer on too.
TEST(FlashAttentionGpu, PersistentForwardSeveralItemsABlock) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  Case c;
  c.dtype = kFlashBF16, c.batch = 3, c.heads = 2 * std::max(1, target.multiprocessors / 2) + 11, c.kvHeads = 1;
  c.qLen = 130, c.kLen = 100, c.headDim = 64;
  c.mask = maskOf(1, 1, 40, -1, 2);
  c.sinkLogits = true;
  c.backward = false;
  runCase(c, 4242);
  c.qLen = 300, c.kLen = 100, c.headDim = 128;
  c.mask = maskOf(1, 1, -1, -1, 0);
  c.sinkLogits = false;
  runCase(c, 4244);
}

// A small persistent backward with more items than SMs (dK/dV and dQ blocks take two or three
// items each, handing on K/V and Q/dO buffers and the work counters), GQA split per query head,
// for compute-sanitizer's memcheck and racecheck (bench/flash_device_run.sh sanitize): forward and
// backward against the float64 reference.
TEST(FlashAttentionGpu, PersistentBackwardSeveralItemsABlock) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  Case c;
  c.dtype = kFlashBF16, c.batch = 3, c.heads = 2 * std::max(1, target.multiprocessors / 2) + 11, c.kvHeads = 1;
  c.qLen = 130, c.kLen = 200, c.headDim = 64;
  c.mask = maskOf(1, 1, 60, -1, 2);
  c.sinkLogits = true;
  runCase(c, 4343);
}

// The persistent wgmma backward (dK/dV and dQ blocks walking work lists) computes every item as
// the one-item-a-block kernels do: the same bits in dQ, dK, dV and the sink-logit gradient, with
// split GQA (dK/dV per query head) and without, several items a block, groups of slices.
TEST(FlashAttentionGpu, PersistentBackwardEqualsOneItemABlock) {
  REQUIRE_GPU();
  const FlashTarget target = flashTargetOf(env().device->info());
  if (!target.wgmma) GTEST_SKIP() << "the persistent backward is the sm_90a wgmma kernels";
  struct Shape : Bf16Problem {
    bool splitKv;
  };
  const Shape shapes[] = {{{8, 8, 2, 1000, 1000, 64, maskOf(1, 0, -1, -1, 0), true}, true},
                          {{3, 6, 6, 4100, 4100, 128, maskOf(1, 0, -1, -1, 0), false}, true},
                          {{2, 12, 3, 2200, 2200, 64, maskOf(1, 0, 300, -1, 4), true}, false},
                          {{4, 8, 8, 700, 1500, 128, maskOf(0, 0, -1, -1, 0), false}, true},
                          // sink keys in two key blocks: both lead the dK/dV list
                          {{2, 8, 2, 900, 900, 128, maskOf(1, 0, 200, -1, 130), true}, false}};
  for (const Shape& sh : shapes) {
    const FlashAttentionConfig cfg = sh.config();
    FlashTuning base, forced;
    base.splitKv = forced.splitKv = sh.splitKv;
    forced.bwdPersistent = 1;  // the rule's too, where the SM count is known
    ASSERT_TRUE(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target, forced).persistent);
    ASSERT_TRUE(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg, target, forced).persistent);
    SCOPED_TRACE(sh.name());
    const RandomAttentionInputs in(cfg, false, sh.qLen * 5 + sh.headDim);
    DevTensor o(cfg.dtype, sh.batch, sh.heads, sh.qLen, sh.headDim, false);
    FloatBuffer lse(sh.batch * sh.heads * sh.qLen);
    {
      const ScopedTuning scoped(base);
      in.forward(cfg, o, lse);
    }
    std::vector<std::vector<double>> runs;
    for (int persistent : {1, 0}) {
      FlashTuning tuning = base;
      tuning.bwdPersistent = persistent;
      const ScopedTuning scoped(tuning);
      runs.push_back(backwardOutputs(cfg, in.q, in.k, in.v, o, in.dO, lse, in.sinksOf(cfg)));
    }
    expectSameBits(runs[0], runs[1]);
  }
}

// Same for the sm_90a backward kernels (dK/dV and dQ on wgmma): each tile / warpgroup variant the
// overrides reach, and mma.sync (FlashTuning::wgmma off), through the whole backward.
TEST(FlashAttentionGpu, EveryBackwardVariantOfTheSixteenBitTypes) {
  REQUIRE_GPU();
  struct Variant {
    bool wgmma;
    int tile, wg;  // 0: the rule
    bool splitKv;  // GQA dK/dV per query head (true) or per KV head (false)
    int persistent = -1;  // dK/dV and dQ: -1 the rule (persistent where the SM count is known), 0 one item a block
  };
  const Variant variants[] = {{false, 0, 0, true},  {false, 0, 0, false}, {true, 64, 1, true},  {true, 64, 2, true},
                              {true, 128, 1, true}, {true, 128, 2, true}, {true, 64, 2, false}, {true, 128, 2, false},
                              {true, 0, 0, true, 0}};
  int seed = 0;
  for (const Variant& v : variants) {
    FlashTuning tuning;
    tuning.wgmma = v.wgmma, tuning.bwdTile = v.tile, tuning.bwdWarpgroups = v.wg, tuning.splitKv = v.splitKv;
    tuning.bwdPersistent = v.persistent;
    const ScopedTuning scoped(tuning);
    for (FlashDType t : {kFlashBF16, kFlashF16})
      for (int d : {64, 128, 40}) {
        Case c;
        c.dtype = t, c.batch = 2, c.heads = 4, c.kvHeads = seed % 2 ? 1 : 2, c.qLen = 300, c.kLen = 257, c.headDim = d;
        c.mask = rotatingMask(seed);
        c.sinkLogits = seed % 2 == 0;
        SCOPED_TRACE("wgmma=" + std::to_string(v.wgmma) + " bwd tile=" + std::to_string(v.tile) + " wg=" +
                     std::to_string(v.wg) + " splitKv=" + std::to_string(v.splitKv) + " persistent=" +
                     std::to_string(v.persistent) + " d=" + std::to_string(d));
        runCase(c, 700 + seed++);
      }
  }
  // The mask sweep gives head dim 128 to its atomic-dQ half only; every mask through the default
  // (wgmma on sm_90a) backward at 128 here.
  for (size_t m = 0; m < maskCases().size(); ++m) {
    Case c;
    c.dtype = m % 2 ? kFlashF16 : kFlashBF16, c.batch = 2, c.heads = 4, c.kvHeads = m % 3 ? 2 : 4;
    c.qLen = 129, c.kLen = m % 2 ? 127 : 200, c.headDim = 128;
    c.mask = maskCases()[m].mask;
    c.sinkLogits = maskCases()[m].sinkLogits;
    SCOPED_TRACE("d128 mask " + std::to_string(m));
    runCase(c, 800 + m);
  }
  // Head dims 129-192 and 193-256, padded to 192 and 256 (the dK/dV kernel's warpgroups share
  // their keys, one holding dV and the other dK; dQ streams 64-key tiles at 192, 32 at 256): every
  // mask, GQA's dK/dV per query head (fp32 partials and the reduce) and per KV head, lengths off
  // the tiles; then every third mask at 192 with the 32-key dQ tiles the tuning can ask for.
  for (size_t m = 0; m < maskCases().size(); ++m)
    for (int splitKv : {1, 0})
      for (int wide : {0, 1}) {
        FlashTuning tuning;
        tuning.splitKv = splitKv;
        const ScopedTuning scoped(tuning);
        Case c;
        c.dtype = m % 2 ? kFlashF16 : kFlashBF16, c.batch = 2, c.heads = 4, c.kvHeads = 2;
        c.qLen = m % 3 ? 129 : 65, c.kLen = m % 2 ? 127 : 200;
        c.headDim = (m + splitKv) % 2 ? (wide ? 256 : 192) : (wide ? 200 : 160);
        c.mask = maskCases()[m].mask;
        c.sinkLogits = maskCases()[m].sinkLogits;
        SCOPED_TRACE("d" + std::to_string(c.headDim) + " mask " + std::to_string(m) + " splitKv " + std::to_string(splitKv));
        runCase(c, 900 + 4 * m + 2 * splitKv + wide);
      }
  for (size_t m = 0; m < maskCases().size(); m += 3) {
    FlashTuning tuning;
    tuning.dqTile = 32;
    const ScopedTuning scoped(tuning);
    Case c;
    c.dtype = m % 2 ? kFlashF16 : kFlashBF16, c.batch = 2, c.heads = 4, c.kvHeads = 2;
    c.qLen = 129, c.kLen = m % 2 ? 127 : 200, c.headDim = 176;
    c.mask = maskCases()[m].mask;
    c.sinkLogits = maskCases()[m].sinkLogits;
    SCOPED_TRACE("d176 dQ tile 32 mask " + std::to_string(m));
    runCase(c, 1000 + m);
  }
}

TEST(FlashAttentionGpu, PackedStridesMatchContiguous) {
  REQUIRE_GPU();
  for (int p : {kF32, kTF32, kBF16, kF64Mma}) {
    Case c;
    c.dtype = dtypeOf(p), c.tf32 = p == kTF32, c.fp64Mma = fp64MmaOf(p), c.batch = 2, c.heads = 4, c.kvHeads = 2;
    c.qLen = 77, c.kLen = 150;
    c.headDim = 64, c.mask = maskOf(1, 1, -1, -1, 0);
    c.packed = true;
    runCase(c, 5 + p);
  }
}

TEST(FlashAttentionGpu, FullyMaskedRowsAreZeroNotNaN) {
  REQUIRE_GPU();
  // Bottom-right causal with qLen > kLen: the first qLen - kLen rows see no key at all; a window
  // with right offset < 0 is impossible, so also use a window that excludes the rows' diagonal.
  for (int p : {kF32, kTF32, kBF16, kF16, kF64Mma}) {
    Case c;
    c.dtype = dtypeOf(p), c.tf32 = p == kTF32, c.fp64Mma = fp64MmaOf(p), c.heads = 2, c.kvHeads = 1, c.qLen = 150;
    c.kLen = 40, c.headDim = 32;
    c.mask = maskOf(1, 1, -1, -1, 0);
    runCase(c, 31 + p);
    c.kLen = 0;  // no keys at all
    c.qLen = 5;
    runCase(c, 32 + p);
  }
}

// With `deterministic`, two backward runs give the same bits: bf16 and TF32 (never atomics unless
// atomicDq), and fp32 (FFMA at a length where its default would add dQ with atomics; fp64Mma,
// whose default always does).
TEST(FlashAttentionGpu, BackwardIsBitwiseDeterministic) {
  REQUIRE_GPU();
  for (const auto& [precision, len] :
       {std::pair<int, int>{kBF16, 300}, {kF32, 1000}, {kTF32, 1000}, {kF64Mma, 1000}, {kF64Mma, 300}}) {
    const FlashDType dtype = dtypeOf(precision);
    FlashAttentionConfig cfg;
    cfg.dtype = dtype, cfg.batch = 2, cfg.heads = 8, cfg.kvHeads = 2, cfg.qLen = len, cfg.kLen = len;
    cfg.headDim = 64, cfg.mask = maskOf(1, 0, -1, -1, 0), cfg.sinkLogits = true, cfg.deterministic = true;
    cfg.tf32 = precision == kTF32;
    cfg.fp64Mma = fp64MmaOf(precision);
    SCOPED_TRACE(std::string(precisionName(precision)) + " " + std::to_string(len));
    const FlashTarget target = flashTargetOf(env().device->info());
    EXPECT_FALSE(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target).atomicDq);
    // What the flag changes: fp32's default here adds dQ with atomics, except on the FP64 tensor
    // cores up to kMaxDqPartialBlocks key blocks of 64, whose per-block shares are summed in order
    // with or without it (checked without it).
    const bool shares = precision == kF64Mma && len <= 64 * kMaxDqPartialBlocks;
    cfg.deterministic = false;
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target).atomicDq,
              precision == kF32 || (precision == kF64Mma && !shares));
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target).dqPartial, shares);
    cfg.deterministic = !shares;
    const RandomAttentionInputs in(cfg, false, 11);
    DevTensor o(dtype, 2, 8, len, 64, false);
    FloatBuffer lse(2 * 8 * len);
    in.forward(cfg, o, lse);
    std::vector<std::vector<double>> runs;
    for (int r = 0; r < 2; ++r) runs.push_back(backwardOutputs(cfg, in.q, in.k, in.v, o, in.dO, lse, &in.sinks));
    expectSameBits(runs[0], runs[1]);
  }
}

// The parts' partials are summed in a fixed order: the backward with a query split stays bit for
// bit the same from run to run where dQ does (deterministic: the separate dQ kernel; short keys:
// the per-key-block shares).
TEST(FlashAttentionGpu, Fp32QueryPartsAreBitwiseDeterministic) {
  REQUIRE_GPU();
  for (const auto& [len, deterministic] : {std::pair<int, bool>{1000, true}, {300, false}}) {
    FlashTuning tuning;
    tuning.f32BwdSplit = 4;
    const ScopedTuning scoped(tuning);
    FlashAttentionConfig cfg;
    cfg.dtype = kFlashF32, cfg.batch = 2, cfg.heads = 8, cfg.kvHeads = 2, cfg.qLen = len, cfg.kLen = len;
    cfg.headDim = 64, cfg.mask = maskOf(1, 0, -1, -1, 0), cfg.sinkLogits = true, cfg.deterministic = deterministic;
    const FlashTarget target = flashTargetOf(env().device->info());
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target, tuning);
    ASSERT_EQ(dkdv.querySplit, 4);
    ASSERT_FALSE(dkdv.atomicDq) << dkdv.name();
    SCOPED_TRACE(dkdv.name());
    const RandomAttentionInputs in(cfg, false, 13);
    DevTensor o(kFlashF32, 2, 8, len, 64, false);
    FloatBuffer lse(2 * 8 * len);
    in.forward(cfg, o, lse);
    std::vector<std::vector<double>> runs;
    for (int run = 0; run < 2; ++run) runs.push_back(backwardOutputs(cfg, in.q, in.k, in.v, o, in.dO, lse, &in.sinks));
    expectSameBits(runs[0], runs[1]);
  }
}

// TF32 takes smaller blocks when its grid would not fill the GPU (every other TF32 test here is
// that small); a grid of 160-320 blocks keeps the full ones: 2 m-tiles in the forward and dQ, 4
// warps in dK/dV.
TEST(FlashAttentionGpu, Tf32FullBlocksOnALargeGrid) {
  REQUIRE_GPU();
  Case c;
  c.dtype = kFlashF32, c.tf32 = true, c.batch = 4, c.heads = 8, c.kvHeads = 8, c.qLen = 600, c.kLen = 600;
  c.headDim = 64, c.mask = maskOf(1, 0, -1, -1, 0);
  FlashAttentionConfig cfg;
  cfg.dtype = kFlashF32, cfg.tf32 = true, cfg.batch = 4, cfg.heads = cfg.kvHeads = 8, cfg.qLen = cfg.kLen = 600;
  cfg.headDim = 64;
  const FlashTarget target = flashTargetOf(env().device->info());
  if (target.multiprocessors <= 160) {  // 160 forward / dQ blocks of 128 rows, 320 dK/dV blocks of 64 keys
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kForward, cfg, target).mtiles, 2);
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg, target).mtiles, 2);
    EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target).warps, 4);
  }
  cfg.batch = 1;  // 40 / 80 blocks: the small ones
  EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kForward, cfg, target).mtiles, 1);
  EXPECT_EQ(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg, target).warps, 2);
  runCase(c, 600);
}

// tf32 really rounds: on fp32 inputs that are not TF32 values, its O differs from the exact
// path's by about the TF32 unit roundoff (far above fp32's 6e-8, below the 8 * 2^-11 bound), so
// a launcher that dropped the flag would fail here.
TEST(FlashAttentionGpu, Tf32RoundsWhereTheExactPathDoesNot) {
  REQUIRE_GPU();
  FlashAttention& fa = *env().flash;
  const int heads = 4, len = 300, d = 64;
  std::mt19937_64 rng(21);
  DevTensor q(kFlashF32, 1, heads, len, d, false), k(kFlashF32, 1, heads, len, d, false), v(kFlashF32, 1, heads, len, d, false);
  for (DevTensor* t : {&q, &k, &v}) t->upload(randomVec((size_t)heads * len * d, rng, 1.0, kFlashF32));
  std::vector<double> out[2];
  for (int tf32 = 0; tf32 < 2; ++tf32) {
    FlashAttentionConfig cfg;
    cfg.dtype = kFlashF32, cfg.heads = cfg.kvHeads = heads, cfg.qLen = cfg.kLen = len, cfg.headDim = d, cfg.tf32 = tf32;
    DevTensor o(kFlashF32, 1, heads, len, d, false);
    FloatBuffer lse((size_t)heads * len);
    fa.forward(cfg, {q.view, k.view, v.view, o.view, lse.buf.ptr(), 0}, nullptr);
    env().device->synchronize();
    out[tf32] = o.download();
  }
  const Errors e = compare(out[1], out[0]);
  EXPECT_EQ(e.nonFinite, 0u);
  EXPECT_GT(e.relNorm, std::ldexp(1.0, -14)) << "tf32 output equals the exact one: TF32 not used?";
  EXPECT_LT(e.relNorm, kTf32Bound);
}

TEST(FlashAttentionGpu, InvalidProblemsFailWithClearErrors) {
  REQUIRE_GPU();
  FlashAttention& fa = *env().flash;
  FlashAttentionConfig cfg;
  cfg.heads = 6, cfg.kvHeads = 4, cfg.qLen = 8, cfg.kLen = 8, cfg.headDim = 64;
  expectInvalid(cfg, false, "multiple of kv heads");
  cfg.kvHeads = 2, cfg.headDim = 60;
  EXPECT_THROW(fa.validate(cfg, false), FlashAttentionError);
  cfg.headDim = 256, cfg.dtype = kFlashF32;
  EXPECT_NO_THROW(fa.validate(cfg, false));
  EXPECT_THROW(fa.validate(cfg, true), FlashAttentionError);
  cfg.headDim = 64, cfg.dtype = kFlashBF16, cfg.deterministic = true, cfg.atomicDq = true;
  expectInvalid(cfg, true, "deterministic");
  cfg.atomicDq = false;
  EXPECT_NO_THROW(fa.validate(cfg, true));
  cfg.tf32 = true;  // TF32 is an option of fp32 inputs only
  expectInvalid(cfg, false, "tf32 applies to fp32");
  cfg.dtype = kFlashF32;
  EXPECT_NO_THROW(fa.validate(cfg, true));
  cfg.fp64Mma = FlashFp64Mma::kOn;  // one way to the tensor cores at a time
  expectInvalid(cfg, false, "tf32 and fp64Mma");
  cfg.tf32 = false;
  EXPECT_NO_THROW(fa.validate(cfg, true));
  cfg.dtype = kFlashBF16;
  expectInvalid(cfg, false, "fp64Mma applies to fp32");
}

}  // namespace
}  // namespace pa
