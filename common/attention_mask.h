// The one key-visibility predicate of every attention path (CPU ops, CUDA forward and backward).
#pragma once

// Compiles as host C++ and as CUDA (nvcc or NVRTC); NVRTC has no standard headers, so none here.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define PA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PA_HOST_DEVICE inline
#endif

namespace pa {

// Note on the mask semantics (README, "Attention masks", has the table).
//
// Query row q (0 <= q < qLen) and key column k (0 <= k < kLen). The aligned diagonal is
//   d = q                      for top-left alignment (PyTorch SDPA's convention),
//   d = q + (kLen - qLen)      for bottom-right alignment (FlashAttention's convention).
// A key is visible when
//   (causal ? k <= d : true) and
//   ( (windowLeft  < 0 || k >= d - windowLeft) and (windowRight < 0 || k <= d + windowRight)
//     or k < sinks ).
// Sinks (StreamingLLM) relax the window, never causality: a query never sees a future sink.
// A row may see no key at all (e.g. bottom-right causal with qLen > kLen); every path then
// writes output 0, log-sum-exp -inf and zero gradients.
struct AttentionMaskSpec {
  int causal = 0;            // 1: keys after the aligned diagonal are hidden
  int alignBottomRight = 0;  // 0: top-left, 1: bottom-right
  int windowLeft = -1;       // inclusive offset before the diagonal; -1 = unbounded
  int windowRight = -1;      // inclusive offset after the diagonal; -1 = unbounded
  int sinks = 0;             // the first `sinks` keys ignore the window
};

PA_HOST_DEVICE long long attentionDiagonal(const AttentionMaskSpec& m, long long q, long long qLen,
                                           long long kLen) {
  return m.alignBottomRight ? q + (kLen - qLen) : q;
}

// Inclusive bounds of the contiguous visible band of row q, clamped to [0, kLen-1]; the band is
// empty when lo > hi. Keys below `sinks` may be visible outside the band (see keyVisible).
PA_HOST_DEVICE void attentionBand(const AttentionMaskSpec& m, long long q, long long qLen,
                                  long long kLen, long long* lo, long long* hi) {
  const long long d = attentionDiagonal(m, q, qLen, kLen);
  long long h = kLen - 1;
  if (m.causal && d < h) h = d;
  if (m.windowRight >= 0 && d + m.windowRight < h) h = d + m.windowRight;
  long long l = 0;
  if (m.windowLeft >= 0 && d - m.windowLeft > l) l = d - m.windowLeft;
  *lo = l;
  *hi = h;
}

// Highest key index a sink may have for row q (causality still applies to sinks).
PA_HOST_DEVICE long long attentionSinkLimit(const AttentionMaskSpec& m, long long q, long long qLen,
                                            long long kLen) {
  long long s = m.sinks < kLen ? m.sinks - 1 : kLen - 1;
  const long long d = attentionDiagonal(m, q, qLen, kLen);
  if (m.causal && d < s) s = d;
  return s;
}

PA_HOST_DEVICE bool keyVisible(const AttentionMaskSpec& m, long long q, long long k, long long qLen,
                               long long kLen) {
  if (k < 0 || k >= kLen) return false;
  long long lo, hi;
  attentionBand(m, q, qLen, kLen, &lo, &hi);
  if (k >= lo && k <= hi) return true;
  return k <= attentionSinkLimit(m, q, qLen, kLen);
}

}  // namespace pa
