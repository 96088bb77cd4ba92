// Float64 CPU reference of masked attention (forward and backward, GQA, sinks, sink logits).
#pragma once

#include <vector>

#include "common/attention_mask.h"

namespace pa {

// Shapes of one attention problem; tensors are contiguous [batch, heads, seq, headDim] doubles
// (k, v, dK, dV with kvHeads heads); lse is [batch, heads, qLen]; sink logits are [heads].
struct AttentionReferenceProblem {
  int batch = 1, heads = 1, kvHeads = 1, qLen = 0, kLen = 0, headDim = 0;
  double scale = 0.0;  // 0 selects 1/sqrt(headDim)
  AttentionMaskSpec mask;
  bool sinkLogits = false;
};

struct AttentionReferenceForward {
  std::vector<double> o, lse;  // lse: natural log, sink included; -inf for a row that sees nothing
};

struct AttentionReferenceBackward {
  std::vector<double> dQ, dK, dV, dSinkLogits;
};

// `sinkLogits` may be empty when !problem.sinkLogits.
AttentionReferenceForward attentionForwardReference(const AttentionReferenceProblem& problem,
                                                    const std::vector<double>& q,
                                                    const std::vector<double>& k,
                                                    const std::vector<double>& v,
                                                    const std::vector<double>& sinkLogits);

AttentionReferenceBackward attentionBackwardReference(const AttentionReferenceProblem& problem,
                                                      const std::vector<double>& q,
                                                      const std::vector<double>& k,
                                                      const std::vector<double>& v,
                                                      const std::vector<double>& sinkLogits,
                                                      const std::vector<double>& dO);

}  // namespace pa
