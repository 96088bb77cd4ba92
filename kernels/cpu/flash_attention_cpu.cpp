// FlashAttention on the CPU.
//
// Note on the tiling. A block of up to 64 query rows meets one tile of up to 64 keys at a
// time: S = Q·Kᵀ, P and (backward) dP = dO·Vᵀ, dS and the three gradient products are small
// GEMMs through OpenBLAS (single-threaded inside our OpenMP tasks), so the arithmetic runs at
// GEMM speed instead of one dot product per (row, key). Measured on the 2-core machine with
// attn_block's shape (B 32, H 4, S 256, D 64, causal, float): forward 230 -> 24 ms, backward
// 454 -> 36 ms against one dot product per (row, key) (bench/RESULTS.md).
//
// Note on the visible keys of a block. Each row sees the union of two intervals: the band
// [lo, hi] around its aligned diagonal and the sinks [0, sinkHi] (common/attention_mask.h).
// A block walks the tiles of the union of its rows' intervals, so tiles that every row of the
// block hides are never touched and the cost follows the visible area; inside a walked tile,
// keys a row does not see get probability 0.
//
// Note on the online softmax: per row we keep the running maximum m, the running sum l of
// exp(s - m) (both in double) and the unnormalised output acc; a new tile with row maximum t
// rescales l and acc by exp(m - max(m, t)). A learnable sink logit starts the row at m = sink,
// l = 1, acc = 0, so it joins the denominator without contributing to the output. Products and
// exponentials are in the element type (the float path vectorises; the double path is the
// exact reference).
#include "kernels/cpu/flash_attention_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace pa::cpu {

namespace {

constexpr int64_t kRowBlock = 64, kKeyTile = 64;

// c = alpha·op(a)·op(b) + beta·c, row-major, with explicit leading dimensions.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

// The visible keys of each row of a block, and the tiles that cover their union.
struct BlockKeys {
  std::vector<long long> lo, hi, sinkHi;       // per row: band [lo, hi], sinks [0, sinkHi]
  std::vector<std::pair<int64_t, int64_t>> tiles;  // [k0, k1), disjoint, increasing

  void build(const FlashShape& s, int64_t i0, int64_t i1) {
    const int64_t n = i1 - i0;
    lo.resize(static_cast<size_t>(n));
    hi.resize(static_cast<size_t>(n));
    sinkHi.resize(static_cast<size_t>(n));
    long long bandLo = s.kvLen, bandHi = -1, sinks = -1;
    for (int64_t r = 0; r < n; ++r) {
      attentionBand(s.mask, i0 + r, s.qLen, s.kvLen, &lo[static_cast<size_t>(r)], &hi[static_cast<size_t>(r)]);
      sinkHi[static_cast<size_t>(r)] = attentionSinkLimit(s.mask, i0 + r, s.qLen, s.kvLen);
      if (lo[static_cast<size_t>(r)] <= hi[static_cast<size_t>(r)]) {
        bandLo = std::min(bandLo, lo[static_cast<size_t>(r)]);
        bandHi = std::max(bandHi, hi[static_cast<size_t>(r)]);
      }
      sinks = std::max(sinks, sinkHi[static_cast<size_t>(r)]);
    }
    tiles.clear();
    auto walk = [&](long long a, long long b) {  // inclusive range
      for (long long k0 = a; k0 <= b; k0 += kKeyTile) tiles.emplace_back(k0, std::min<long long>(b + 1, k0 + kKeyTile));
    };
    if (sinks >= 0 && bandHi >= 0 && bandLo <= sinks + 1) {
      walk(0, std::max(sinks, bandHi));
    } else {
      if (sinks >= 0) walk(0, sinks);
      if (bandHi >= 0) walk(std::max(bandLo, sinks + 1), bandHi);
    }
  }
  bool visible(int64_t r, int64_t key) const {
    const size_t u = static_cast<size_t>(r);
    return (key >= lo[u] && key <= hi[u]) || key <= sinkHi[u];
  }
};

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
      std::vector<T> acc(static_cast<size_t>(kRowBlock * D)), sc(static_cast<size_t>(kRowBlock * kKeyTile));
      std::vector<double> m(kRowBlock), l(kRowBlock);
      BlockKeys keys;
      for (int64_t i0 = 0; i0 < s.qLen; i0 += kRowBlock) {
        const int64_t i1 = std::min(s.qLen, i0 + kRowBlock), nq = i1 - i0;
        const int64_t row0 = (b * s.qHeads + h) * s.qLen + i0;
        const T* qb = q + row0 * D;
        std::fill(m.begin(), m.end(), sink ? static_cast<double>(sink[h]) : ninf);
        std::fill(l.begin(), l.end(), sink ? 1.0 : 0.0);
        std::fill(acc.begin(), acc.end(), T(0));
        keys.build(s, i0, i1);
        for (const auto& [k0, k1] : keys.tiles) {
          const int64_t nk = k1 - k0;
          gemm(false, true, nq, nk, D, static_cast<T>(s.scale), qb, D, kb + k0 * D, D, T(0), sc.data(), nk);
          for (int64_t r = 0; r < nq; ++r) {
            T* sr = sc.data() + r * nk;
            double tmax = ninf;
            for (int64_t j = 0; j < nk; ++j)
              if (keys.visible(r, k0 + j)) tmax = std::max(tmax, static_cast<double>(sr[j]));
            const size_t u = static_cast<size_t>(r);
            const double mNew = std::max(m[u], tmax);
            if (mNew == ninf) {  // nothing visible yet in this row
              std::fill(sr, sr + nk, T(0));
              continue;
            }
            const double corr = m[u] == ninf ? 0.0 : std::exp(m[u] - mNew);
            double sum = 0.0;
            const T mt = static_cast<T>(mNew);
            for (int64_t j = 0; j < nk; ++j) {
              const T p = keys.visible(r, k0 + j) ? std::exp(sr[j] - mt) : T(0);
              sr[j] = p;
              sum += static_cast<double>(p);
            }
            l[u] = l[u] * corr + sum;
            m[u] = mNew;
            if (corr != 1.0) {
              const T c = static_cast<T>(corr);
              T* ar = acc.data() + r * D;
              for (int64_t d = 0; d < D; ++d) ar[d] *= c;
            }
          }
          gemm(false, false, nq, D, nk, T(1), sc.data(), nk, vb + k0 * D, D, T(1), acc.data(), D);
        }
        for (int64_t r = 0; r < nq; ++r) {
          const size_t u = static_cast<size_t>(r);
          T* oi = o + (row0 + r) * D;
          const bool empty = l[u] == 0.0;
          for (int64_t d = 0; d < D; ++d) oi[d] = empty ? T(0) : static_cast<T>(acc[static_cast<size_t>(r * D + d)] / l[u]);
          lse[row0 + r] = empty ? static_cast<T>(ninf) : static_cast<T>(m[u] + std::log(l[u]));
        }
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
      std::vector<T> dkAcc(static_cast<size_t>(s.kvLen * D), T(0)), dvAcc(dkAcc.size(), T(0));
      std::vector<T> dqBlock(static_cast<size_t>(kRowBlock * D)), p(static_cast<size_t>(kRowBlock * kKeyTile)),
          dp(p.size());
      std::vector<T> di(kRowBlock), L(kRowBlock);
      BlockKeys keys;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < s.qLen; i0 += kRowBlock) {
          const int64_t i1 = std::min(s.qLen, i0 + kRowBlock), nq = i1 - i0;
          const int64_t row0 = (b * s.qHeads + h) * s.qLen + i0;
          const T* qb = q + row0 * D;
          const T* dob = dO + row0 * D;
          keys.build(s, i0, i1);
          for (int64_t r = 0; r < nq; ++r) {
            const double Lr = lse[row0 + r];
            const size_t u = static_cast<size_t>(r);
            if (std::isinf(Lr) && Lr < 0) {  // the row saw nothing: zero gradients, no key visible
              keys.lo[u] = 1, keys.hi[u] = 0, keys.sinkHi[u] = -1;
              di[u] = T(0), L[u] = T(0);
              continue;
            }
            L[u] = static_cast<T>(Lr);
            di[u] = dot(dob + r * D, o + (row0 + r) * D, D);  // = sum_j P_ij dP_ij
            if (sink) sinkPartial[static_cast<size_t>(b * s.qHeads + h)] -= std::exp(static_cast<double>(sink[h]) - Lr) * di[u];
          }
          std::fill(dqBlock.begin(), dqBlock.end(), T(0));
          for (const auto& [k0, k1] : keys.tiles) {
            const int64_t nk = k1 - k0;
            const T* kt = k + kvOff + k0 * D;
            const T* vt = v + kvOff + k0 * D;
            gemm(false, true, nq, nk, D, static_cast<T>(s.scale), qb, D, kt, D, T(0), p.data(), nk);  // scaled scores
            gemm(false, true, nq, nk, D, T(1), dob, D, vt, D, T(0), dp.data(), nk);                      // dP = dO·Vᵀ
            const T scale = static_cast<T>(s.scale);
            for (int64_t r = 0; r < nq; ++r) {
              T* pr = p.data() + r * nk;
              T* dr = dp.data() + r * nk;
              const size_t u = static_cast<size_t>(r);
              for (int64_t j = 0; j < nk; ++j) {
                const T pj = keys.visible(r, k0 + j) ? std::exp(pr[j] - L[u]) : T(0);
                pr[j] = pj;
                dr[j] = pj * (dr[j] - di[u]) * scale;  // dS
              }
            }
            gemm(true, false, nk, D, nq, T(1), p.data(), nk, dob, D, T(1), dvAcc.data() + k0 * D, D);   // dV += Pᵀ·dO
            gemm(true, false, nk, D, nq, T(1), dp.data(), nk, qb, D, T(1), dkAcc.data() + k0 * D, D);   // dK += dSᵀ·Q
            gemm(false, false, nq, D, nk, T(1), dp.data(), nk, kt, D, T(1), dqBlock.data(), D);         // dQ += dS·K
          }
          std::copy(dqBlock.begin(), dqBlock.begin() + nq * D, dq + row0 * D);
        }
      }
      std::copy(dkAcc.begin(), dkAcc.end(), dk + kvOff);
      std::copy(dvAcc.begin(), dvAcc.end(), dv + kvOff);
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
