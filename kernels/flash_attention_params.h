// Plain-data launch parameters shared by the host launcher and the flash attention templates.
#pragma once

#include "common/attention_mask.h"

namespace pa {

// The wgmma forward and dQ kernels' narrow products for a first key tile whose only visible keys
// are sinks (FlashKernelSpec::sinkTile): sinks below this many keys.
constexpr int kFlashSinkTileKeys = 16;

// Layout of every tensor is [batch, heads, seq, head_dim] with a unit stride on head_dim; the
// three outer strides are in elements and may differ between tensors (views, packed QKV, ...).
struct FlashTensorView {
  unsigned long long ptr;  // device address (CUdeviceptr); 0 when unused
  long long batchStride;
  long long headStride;
  long long seqStride;
};

// Element types the templates are instantiated for.
enum FlashDType : int { kFlashF32 = 0, kFlashF16 = 1, kFlashBF16 = 2 };

// Passed by value to every kernel. Keep it free of constructors and of padding surprises: the
// host copies it byte for byte into the launch's parameter buffer.
struct FlashKernelParams {
  FlashTensorView q, k, v, o, dO, dQ, dK, dV;
  unsigned long long lse;          // float [batch, heads, qLen], natural log, includes the sink logit
  unsigned long long delta;        // float [batch, heads, qLen] workspace: rowsum(dO * O)
  unsigned long long sinkLogits;   // float [heads] or 0
  unsigned long long dSinkLogits;  // float [heads] or 0 (backward)
  unsigned long long sinkPartial;  // float [heads, batch * qTiles] workspace (backward)
  unsigned long long dQAccum;      // float [batch, heads, qLen, headDim] workspace, atomic-dQ backward only
  unsigned long long dKVPartial;   // float [2][batch, heads, kLen, headDim] workspace: per-query-head dK, dV
                                   // (GQA, 16-bit types), summed over each group by the reduce kernel
  unsigned long long dQPartial;    // float [key blocks][batch, heads, qLen, headDim] workspace: fp32
                                   // backward's dS.K per key block, summed in order by the dQ reduce
  int batch;
  int heads;     // query heads
  int kvHeads;   // key/value heads; heads % kvHeads == 0
  int qLen;
  int kLen;
  int headDim;   // actual head dim (<= the template's padded head dim, multiple of 8)
  float scale;   // softmax scale on q.k (natural units)
  float scaleLog2;  // scale * log2(e): the kernels work with exp2
  AttentionMaskSpec mask;
  int qTiles;    // ceil(qLen / query tile of the backward preprocess kernel)
  int workHeads; // (batch, head) slices per group of a persistent kernel's work list, or of a grid's issue order (gridItem; 0: 1)
  int workLead;  // persistent dK/dV: leading key blocks (those holding sink keys) taken for every slice first
  unsigned long long workCounter;  // persistent forward: int [2], zero between launches (items taken, blocks done)
};

// TMA tensor maps (the driver's opaque 128-byte descriptors, 64-byte aligned) of Q, K, V and dO
// (backward) as [batch, heads, seq, head dim] tensors, boxes of 64 columns by the kernel's tile
// rows in 128-byte swizzle, and of the outputs the kernels store by TMA (O in the forward, dK and
// dV in the dK/dV kernel, dQ in the dQ kernel: boxes of 64 columns by the store rows below): the
// second, __grid_constant__ argument of the kernels whose FlashKernelSpec::tma is set.
struct alignas(64) FlashTensorMap {
  unsigned long long words[16];
};
struct FlashTensorMaps {
  FlashTensorMap q, k, v, dO, o, dK, dV, dQ;
};

// Rows of one TMA store of a wgmma kernel's output at padded head dim `dpad`, staged in shared
// memory: 64, a consumer warpgroup's rows (its thread 0 stores them after the warpgroup's named
// barrier), or 16, a warp's rows (its lane 0 stores them after __syncwarp); 0: stored from
// registers. The kernels and the launcher's tensor maps read the same rule; the measurements
// behind it are in bench/RESULTS_flash.md, "TMA stores" and "TMA stores per warp".
PA_HOST_DEVICE constexpr int flashForwardStoreRows(int dpad, int consumerWarpgroups) {
  return dpad == 128 && consumerWarpgroups <= 2 ? 64 : 0;
}
PA_HOST_DEVICE constexpr int flashDkDvStoreRows(int dpad) { return dpad == 64 ? 64 : dpad == 128 ? 16 : 0; }
PA_HOST_DEVICE constexpr int flashDqStoreRows(int dpad) { return dpad == 128 ? 16 : 0; }

// The wgmma dK/dV kernel at padded head dim `dpad`. With roles (at 192 and 256: a warpgroup's
// registers hold one 64 x dpad fp32 accumulator, not two) its two consumer warpgroups share 64
// keys, one holding their dV and the other their dK, and the dV warpgroup hands each tile's fp32 Pᵀ
// (64 keys x `queryTile` queries) to the dK one in shared memory; without, each warpgroup has 64
// keys of its own. The kernel, the spec's shared bytes and rows per block, and the launcher's grid
// and tensor maps read these.
PA_HOST_DEVICE constexpr bool flashDkDvRoles(int dpad) { return dpad > 128; }
PA_HOST_DEVICE constexpr int flashDkDvKeys(int dpad, int consumerWarpgroups) {
  return flashDkDvRoles(dpad) ? 64 : 64 * consumerWarpgroups;
}
PA_HOST_DEVICE constexpr int flashDkDvExchangeBytes(int dpad, int queryTile) {
  return flashDkDvRoles(dpad) ? 64 * queryTile * 4 : 0;
}

}  // namespace pa
