// FlashAttention on the CPU: forward and backward over key tiles with an online softmax, so no
// [q_len, kv_len] matrix is ever stored. The reference the fused graph runs on the CPU.
#pragma once

#include <cstdint>

#include "common/attention_mask.h"

namespace pa::cpu {

struct FlashShape {
  int64_t batch = 1, qHeads = 1, kvHeads = 1, qLen = 1, kvLen = 1, headDim = 1;
  double scale = 1.0;
  AttentionMaskSpec mask;
};

// q [B, Hq, Sq, D], k and v [B, Hk, Sk, D], sink [Hq] or null; writes o [B, Hq, Sq, D] and
// lse [B, Hq, Sq] (natural log; -inf for a row that sees nothing and has no sink).
template <class T>
void flashAttentionForward(const T* q, const T* k, const T* v, const T* sink, T* o, T* lse, const FlashShape& s);

// The FlashAttention-2 backward: P is recomputed from lse; dq, dk, dv (and dsink when sink is
// not null) are overwritten. Deterministic: each (batch, kv head) task owns its dk/dv rows and
// the dq rows of its query-head group; sink gradients are summed over the batch in order.
template <class T>
void flashAttentionBackward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dO, const T* sink,
                            T* dq, T* dk, T* dv, T* dsink, const FlashShape& s);

}  // namespace pa::cpu
