// Float64 CPU reference of masked attention: the naive row-by-row definition, no tiling.
#include "kernels/attention_reference.h"

#include <cmath>
#include <limits>

namespace pa {

namespace {

struct RowProbabilities {
  std::vector<double> p;  // per key; 0 where hidden
  double pSink = 0.0;     // probability mass of the sink logit
  double lse = -std::numeric_limits<double>::infinity();
};

// Softmax of one query row over the visible keys plus the optional sink logit.
RowProbabilities rowSoftmax(const AttentionReferenceProblem& pr, double scale, const double* qRow,
                            const double* kHead, int qi, bool hasSink, double sink) {
  RowProbabilities r;
  r.p.assign(pr.kLen, 0.0);
  std::vector<double> x(pr.kLen, 0.0);
  double mx = hasSink ? sink : -std::numeric_limits<double>::infinity();
  bool any = hasSink;
  for (int j = 0; j < pr.kLen; ++j) {
    if (!keyVisible(pr.mask, qi, j, pr.qLen, pr.kLen)) continue;
    double dot = 0.0;
    for (int d = 0; d < pr.headDim; ++d) dot += qRow[d] * kHead[(size_t)j * pr.headDim + d];
    x[j] = dot * scale;
    mx = std::max(mx, x[j]);
    any = true;
  }
  if (!any) return r;
  double sum = hasSink ? std::exp(sink - mx) : 0.0;
  for (int j = 0; j < pr.kLen; ++j)
    if (keyVisible(pr.mask, qi, j, pr.qLen, pr.kLen)) sum += std::exp(x[j] - mx);
  r.lse = mx + std::log(sum);
  for (int j = 0; j < pr.kLen; ++j)
    if (keyVisible(pr.mask, qi, j, pr.qLen, pr.kLen)) r.p[j] = std::exp(x[j] - r.lse);
  r.pSink = hasSink ? std::exp(sink - r.lse) : 0.0;
  return r;
}

}  // namespace

AttentionReferenceForward attentionForwardReference(const AttentionReferenceProblem& pr,
                                                    const std::vector<double>& q,
                                                    const std::vector<double>& k,
                                                    const std::vector<double>& v,
                                                    const std::vector<double>& sinkLogits) {
  const double scale = pr.scale > 0 ? pr.scale : 1.0 / std::sqrt((double)pr.headDim);
  const int group = pr.heads / pr.kvHeads;
  const size_t D = pr.headDim;
  AttentionReferenceForward out;
  out.o.assign((size_t)pr.batch * pr.heads * pr.qLen * D, 0.0);
  out.lse.assign((size_t)pr.batch * pr.heads * pr.qLen, 0.0);
  // (batch, head) slices are independent; OpenMP only shortens the wait in the GPU tests.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < pr.batch; ++b)
    for (int h = 0; h < pr.heads; ++h) {
      const size_t qh = ((size_t)b * pr.heads + h) * pr.qLen;
      const size_t kh = ((size_t)b * pr.kvHeads + h / group) * pr.kLen;
      for (int i = 0; i < pr.qLen; ++i) {
        const RowProbabilities r = rowSoftmax(pr, scale, &q[(qh + i) * D], &k[kh * D], i, pr.sinkLogits,
                                              pr.sinkLogits ? sinkLogits[h] : 0.0);
        out.lse[qh + i] = r.lse;
        for (int j = 0; j < pr.kLen; ++j)
          if (r.p[j] != 0.0)
            for (size_t d = 0; d < D; ++d) out.o[(qh + i) * D + d] += r.p[j] * v[(kh + j) * D + d];
      }
    }
  return out;
}

AttentionReferenceBackward attentionBackwardReference(const AttentionReferenceProblem& pr,
                                                      const std::vector<double>& q,
                                                      const std::vector<double>& k,
                                                      const std::vector<double>& v,
                                                      const std::vector<double>& sinkLogits,
                                                      const std::vector<double>& dO) {
  const double scale = pr.scale > 0 ? pr.scale : 1.0 / std::sqrt((double)pr.headDim);
  const int group = pr.heads / pr.kvHeads;
  const size_t D = pr.headDim;
  AttentionReferenceBackward g;
  g.dQ.assign(q.size(), 0.0);
  g.dK.assign(k.size(), 0.0);
  g.dV.assign(v.size(), 0.0);
  g.dSinkLogits.assign(pr.sinkLogits ? pr.heads : 0, 0.0);
  // Parallel over (batch, kv head): the query heads of one group share dK/dV, so they stay in one
  // iteration; the sink gradient is summed per (batch, head) first, then in a fixed order.
  std::vector<double> dSinkPart((size_t)pr.batch * pr.heads, 0.0);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < pr.batch; ++b)
    for (int hk = 0; hk < pr.kvHeads; ++hk)
      for (int h = hk * group; h < (hk + 1) * group; ++h) {
      std::vector<double> dP(pr.kLen);
      const size_t qh = ((size_t)b * pr.heads + h) * pr.qLen;
      const size_t kh = ((size_t)b * pr.kvHeads + h / group) * pr.kLen;
      for (int i = 0; i < pr.qLen; ++i) {
        const RowProbabilities r = rowSoftmax(pr, scale, &q[(qh + i) * D], &k[kh * D], i, pr.sinkLogits,
                                              pr.sinkLogits ? sinkLogits[h] : 0.0);
        const double* dOi = &dO[(qh + i) * D];
        double delta = 0.0;  // sum_j p_j dP_j = dO . O
        for (int j = 0; j < pr.kLen; ++j) {
          dP[j] = 0.0;
          if (r.p[j] == 0.0) continue;
          for (size_t d = 0; d < D; ++d) dP[j] += dOi[d] * v[(kh + j) * D + d];
          delta += r.p[j] * dP[j];
        }
        dSinkPart[(size_t)b * pr.heads + h] -= r.pSink * delta;
        for (int j = 0; j < pr.kLen; ++j) {
          if (r.p[j] == 0.0) continue;
          const double dS = r.p[j] * (dP[j] - delta);
          for (size_t d = 0; d < D; ++d) {
            g.dQ[(qh + i) * D + d] += scale * dS * k[(kh + j) * D + d];
            g.dK[(kh + j) * D + d] += scale * dS * q[(qh + i) * D + d];
            g.dV[(kh + j) * D + d] += r.p[j] * dOi[d];
          }
        }
      }
    }
  if (pr.sinkLogits)
    for (int b = 0; b < pr.batch; ++b)
      for (int h = 0; h < pr.heads; ++h) g.dSinkLogits[h] += dSinkPart[(size_t)b * pr.heads + h];
  return g;
}

}  // namespace pa
