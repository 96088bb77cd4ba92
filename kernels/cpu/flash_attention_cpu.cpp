// FlashAttention on the CPU.
//
// Note on the visible keys of a row. The mask predicate makes them the union of two intervals:
// the band [lo, hi] around the aligned diagonal and the sinks [0, sinkLimit]. Both loops below
// walk sinks first, then the part of the band past them, so no key is counted twice and masked
// tiles are never touched: the cost follows the visible area.
//
// Note on the online softmax: per row we keep the running maximum m, the running sum l of
// exp(s - m) and the unnormalised output acc; a new tile with maximum t rescales l and acc by
// exp(m - max(m, t)). A learnable sink logit starts the row at m = sink, l = 1, acc = 0, so it
// joins the denominator without contributing to the output. Dot products and the output
// accumulate in the element type (so the float path vectorises; the double path is the exact
// reference), the softmax's running sums in double.
#include "kernels/cpu/flash_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace pa::cpu {

namespace {

constexpr int64_t kKeyTile = 64;

// Calls f(k0, k1) for each tile [k0, k1) of the visible keys of row q.
template <class F>
void forVisibleTiles(const FlashShape& s, int64_t q, F&& f) {
  long long lo, hi;
  attentionBand(s.mask, q, s.qLen, s.kvLen, &lo, &hi);
  const long long sinkHi = attentionSinkLimit(s.mask, q, s.qLen, s.kvLen);
  auto walk = [&](long long a, long long b) {  // inclusive range
    for (long long k0 = a; k0 <= b; k0 += kKeyTile) f(static_cast<int64_t>(k0), static_cast<int64_t>(std::min<long long>(b + 1, k0 + kKeyTile)));
  };
  if (sinkHi >= 0) walk(0, sinkHi);
  walk(std::max(lo, sinkHi + 1), hi);
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T r = 0;
  for (int64_t i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

}  // namespace

template <class T>
void flashAttentionForward(const T* q, const T* k, const T* v, const T* sink, T* o, T* lse, const FlashShape& s) {
  const int64_t D = s.headDim, group = s.qHeads / s.kvHeads;
  const double ninf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.qHeads; ++h) {
      const int64_t kvh = h / group;
      const T* kb = k + (b * s.kvHeads + kvh) * s.kvLen * D;
      const T* vb = v + (b * s.kvHeads + kvh) * s.kvLen * D;
      std::vector<T> acc(static_cast<size_t>(D));
      std::vector<double> sc(kKeyTile);
      for (int64_t i = 0; i < s.qLen; ++i) {
        const int64_t row = (b * s.qHeads + h) * s.qLen + i;
        const T* qi = q + row * D;
        double m = sink ? static_cast<double>(sink[h]) : ninf;
        double l = sink ? 1.0 : 0.0;
        std::fill(acc.begin(), acc.end(), T(0));
        forVisibleTiles(s, i, [&](int64_t k0, int64_t k1) {
          double tmax = ninf;
          for (int64_t j = k0; j < k1; ++j) {
            sc[static_cast<size_t>(j - k0)] = s.scale * dot(qi, kb + j * D, D);
            tmax = std::max(tmax, sc[static_cast<size_t>(j - k0)]);
          }
          const double mNew = std::max(m, tmax);
          const double corr = m == ninf ? 0.0 : std::exp(m - mNew);
          l *= corr;
          const T c = static_cast<T>(corr);
          for (T& a : acc) a *= c;
          for (int64_t j = k0; j < k1; ++j) {
            const double p = std::exp(sc[static_cast<size_t>(j - k0)] - mNew);
            l += p;
            const T pt = static_cast<T>(p);
            const T* vj = vb + j * D;
            T* ap = acc.data();
            for (int64_t d = 0; d < D; ++d) ap[d] += pt * vj[d];
          }
          m = mNew;
        });
        T* oi = o + row * D;
        const bool empty = l == 0.0;
        for (int64_t d = 0; d < D; ++d) oi[d] = empty ? T(0) : static_cast<T>(acc[static_cast<size_t>(d)] / l);
        lse[row] = empty ? static_cast<T>(ninf) : static_cast<T>(m + std::log(l));
      }
    }
  }
}

template <class T>
void flashAttentionBackward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dO, const T* sink,
                            T* dq, T* dk, T* dv, T* dsink, const FlashShape& s) {
  const int64_t D = s.headDim, group = s.qHeads / s.kvHeads;
  std::vector<double> sinkPartial(static_cast<size_t>(s.batch * s.qHeads), 0.0);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t kvh = 0; kvh < s.kvHeads; ++kvh) {
      const int64_t kvOff = (b * s.kvHeads + kvh) * s.kvLen * D;
      std::vector<T> dkAcc(static_cast<size_t>(s.kvLen * D), T(0)), dvAcc(dkAcc.size(), T(0)), dqRow(static_cast<size_t>(D));
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i = 0; i < s.qLen; ++i) {
          const int64_t row = (b * s.qHeads + h) * s.qLen + i;
          const T* qi = q + row * D;
          const T* doi = dO + row * D;
          std::fill(dqRow.begin(), dqRow.end(), T(0));
          const double L = lse[row];
          if (std::isinf(L) && L < 0) {  // the row saw nothing: zero gradients
            for (int64_t d = 0; d < D; ++d) dq[row * D + d] = T(0);
            continue;
          }
          const double Di = dot(doi, o + row * D, D);  // = sum_j P_ij dP_ij
          if (sink) sinkPartial[static_cast<size_t>(b * s.qHeads + h)] -= std::exp(static_cast<double>(sink[h]) - L) * Di;
          forVisibleTiles(s, i, [&](int64_t k0, int64_t k1) {
            for (int64_t j = k0; j < k1; ++j) {
              const T* kj = k + kvOff + j * D;
              const T* vj = v + kvOff + j * D;
              const double p = std::exp(s.scale * dot(qi, kj, D) - L);
              const T pt = static_cast<T>(p), ds = static_cast<T>(p * (dot(doi, vj, D) - Di) * s.scale);
              T* dkj = dkAcc.data() + j * D;
              T* dvj = dvAcc.data() + j * D;
              T* dqr = dqRow.data();
              for (int64_t d = 0; d < D; ++d) {
                dvj[d] += pt * doi[d];
                dkj[d] += ds * qi[d];
                dqr[d] += ds * kj[d];
              }
            }
          });
          for (int64_t d = 0; d < D; ++d) dq[row * D + d] = static_cast<T>(dqRow[static_cast<size_t>(d)]);
        }
      }
      for (int64_t x = 0; x < s.kvLen * D; ++x) {
        dk[kvOff + x] = static_cast<T>(dkAcc[static_cast<size_t>(x)]);
        dv[kvOff + x] = static_cast<T>(dvAcc[static_cast<size_t>(x)]);
      }
    }
  }
  if (sink && dsink) {
    for (int64_t h = 0; h < s.qHeads; ++h) {
      double acc = 0.0;
      for (int64_t b = 0; b < s.batch; ++b) acc += sinkPartial[static_cast<size_t>(b * s.qHeads + h)];
      dsink[h] = static_cast<T>(acc);
    }
  }
}

template void flashAttentionForward<float>(const float*, const float*, const float*, const float*, float*, float*, const FlashShape&);
template void flashAttentionForward<double>(const double*, const double*, const double*, const double*, double*, double*, const FlashShape&);
template void flashAttentionBackward<float>(const float*, const float*, const float*, const float*, const float*, const float*,
                                            const float*, float*, float*, float*, float*, const FlashShape&);
template void flashAttentionBackward<double>(const double*, const double*, const double*, const double*, const double*,
                                             const double*, const double*, double*, double*, double*, double*, const FlashShape&);

}  // namespace pa::cpu
