// Host launcher of the flash attention templates: validation, instantiation choice, NVRTC, launch.
#pragma once

#include <unordered_map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/flash_attention_params.h"
#include "runtime/cuda/cuda_device.h"

namespace pa {

// A problem the kernels cannot run (bad shape, stride, alignment, unsupported combination).
class FlashAttentionError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A [batch, heads, seq, head_dim] device tensor with unit head_dim stride; strides in elements.
struct FlashTensor {
  unsigned long long ptr = 0;
  long long batchStride = 0, headStride = 0, seqStride = 0;
  static FlashTensor contiguous(unsigned long long ptr, int heads, int seq, int headDim) {
    FlashTensor t;
    t.ptr = ptr;
    t.seqStride = headDim;
    t.headStride = (long long)seq * headDim;
    t.batchStride = (long long)heads * seq * headDim;
    return t;
  }
};

// Where fp32 attention runs on the FP64 tensor cores (FlashAttentionConfig::fp64Mma).
enum class FlashFp64Mma {
  // The forward, where the device runs FP64 at full rate (FlashTarget::fullRateFp64: sm_80 and
  // sm_90, A100 / H100 / H200), the head dim is at most 64 and the grid is large enough
  // (kFp64MmaForwardMinBlocks); the backward on the FFMA kernels, which measured faster on the
  // H100 (bench/RESULTS_flash.md). Everywhere else the FFMA kernels.
  kAuto,
  kOff,  // the exact FFMA kernels throughout
  kOn,   // forward and backward (head dim <= 64; an error otherwise, or with tf32)
};

// What is computed; shared by forward and backward.
struct FlashAttentionConfig {
  FlashDType dtype = kFlashBF16;
  int batch = 1;
  int heads = 1;    // query heads
  int kvHeads = 1;  // heads % kvHeads == 0 (GQA / MQA)
  int qLen = 0;
  int kLen = 0;
  int headDim = 0;   // multiple of 8, at most 256 (fp32 backward: at most 128)
  float scale = 0.f;  // 0 selects 1/sqrt(headDim)
  AttentionMaskSpec mask;
  bool sinkLogits = false;  // learnable per-head sink logits (float [heads]) take part
  // Bit-reproducible backward: no atomics anywhere, and an error if atomicDq asks for them. The
  // 16-bit backward never uses atomics unless atomicDq; the fp32 backward beyond
  // kMaxDqPartialBlocks key blocks adds dQ with atomics unless this is set (then dQ has its own
  // kernel, 7 products per tile pair instead of 5), as PyTorch's memory-efficient backward does.
  bool deterministic = false;
  // FlashAttention-2's scheme: the dK/dV kernel also adds dQ into an fp32 buffer with atomics (5
  // products per tile pair instead of 7), whatever the length. fp16/bf16: measured slower than the
  // separate dQ kernel on the H100 (bench/RESULTS_flash.md), hence off there. Not bit-reproducible.
  bool atomicDq = false;
  // fp32 only: the products on the tensor cores with operands rounded to TF32 (10-bit mantissa,
  // fp32 accumulation; the mma.sync kernels of the 16-bit types), as torch.backends.cuda.matmul.
  // allow_tf32 does for matmuls. Off: the exact FFMA kernels. Errors for fp16/bf16 inputs.
  bool tf32 = false;
  // fp32 only: where the products run on the FP64 tensor cores (DMMA: the mma.sync kernels with
  // MmaStep<F64Tag>). Operands widen to fp64 exactly and the sums are fp64 (the forward keeps S and
  // O in fp64; the backward adds each 16-term partial product to fp32 accumulators), so the
  // result is no less accurate than the FFMA path's. See FlashFp64Mma; ignored where tf32 is set
  // unless kOn (then an error).
  FlashFp64Mma fp64Mma = FlashFp64Mma::kAuto;
};

struct FlashForwardArgs {
  FlashTensor q, k, v, o;
  unsigned long long lse = 0;         // float [batch, heads, qLen]
  unsigned long long sinkLogits = 0;  // float [heads] when config.sinkLogits
};

struct FlashBackwardArgs {
  FlashTensor q, k, v, o, dO, dQ, dK, dV;  // dK, dV: [batch, kvHeads, kLen, headDim]
  unsigned long long lse = 0;              // from the forward
  unsigned long long sinkLogits = 0;       // float [heads] when config.sinkLogits
  unsigned long long dSinkLogits = 0;      // float [heads], overwritten (summed over the batch)
  unsigned long long workspace = 0;        // backwardWorkspaceBytes(config) bytes, 16-aligned
};

enum class FlashKernelKind {
  kForward,
  kBwdPreprocess,
  kBwdSinkReduce,
  kBwdDkDv,
  kBwdDq,
  kBwdDqConvert,
  kBwdDkDvReduce,
  kBwdDqReduce  // fp32: dQ from the dK/dV kernel's per-key-block shares (dqPartial)
};

// One template instantiation: what NVRTC compiles and the launcher launches.
struct FlashKernelSpec {
  FlashKernelKind kind = FlashKernelKind::kForward;
  FlashDType dtype = kFlashBF16;
  int dpad = 64;   // padded head dim of the instantiation (32, 64, 96, 128, 256)
  int warps = 4;   // warps per block
  int tile = 64;   // the streamed tile (keys for forward/dQ, queries for dK/dV)
  int mtiles = 1;  // 16-bit: 16-row m-tiles per warp (rows per block = 16 * warps * mtiles);
                   // fp32 forward: query rows per thread R (rows per block = 16 * R)
  bool atomicDq = false;  // dK/dV kernel also accumulates dQ with atomics (non-deterministic path)
  // fp32 dK/dV kernel also writes each key block's share of dQ (deterministic, summed by
  // kBwdDqReduce): chosen when there are at most kMaxDqPartialBlocks key blocks.
  bool dqPartial = false;
  // Forward / dK,dV / dQ on sm_90a with wgmma (flash_attention_{fwd,bwd}_wgmma.cuh): `warps`
  // counts the consumer warps (4 per warpgroup, 64 rows each; a producer warpgroup more), `tile`
  // the streamed tile's rows, `stages` the depth of its ring.
  bool wgmma = false;
  int stages = 2;
  // fp32 on the tensor cores (FlashAttentionConfig::tf32): the forward / dK,dV / dQ kernels are
  // the 16-bit types' mma.sync kernels with TF32 operands; `warps`, `tile`, `mtiles` as there.
  bool tf32 = false;
  // fp32 on the FP64 tensor cores (FlashAttentionConfig::fp64Mma): the same mma.sync kernels with
  // fp64 fragments (MmaStep<F64Tag>); the tiles are chosen to fit their registers.
  bool f64 = false;
  bool f32Mma() const { return tf32 || f64; }  // fp32 inputs on an mma.sync kernel
  bool ffma() const { return dtype == kFlashF32 && !f32Mma(); }  // the exact FFMA kernels
  int rowsPerBlock() const;
  std::string name() const;      // C identifier of the generated kernel
  std::string source() const;    // generated NVRTC translation unit
  int threads() const;
  int sharedBytes() const;       // dynamic shared memory
};

// The fp32 backward computes dQ from per-key-block shares (5 products per tile pair, no separate
// dQ kernel) up to this many key blocks; beyond, the shares' workspace (blocks × the size of dQ)
// would outgrow what it saves, and the dK/dV kernel adds its shares with atomics instead (or,
// with `deterministic`, the separate dQ kernel runs).
constexpr int kMaxDqPartialBlocks = 8;

// kAuto runs the fp32 forward on the FP64 tensor cores from this many blocks of 64 query rows
// (batch x heads x ceil(qLen / 64)). Forward sweep on the H100 (bench/RESULTS_flash.md; head dims
// 32 and 64, 8-768 queries, 8-512 blocks): from 24 blocks DMMA was faster or within 3% (0.97-2.16x
// FFMA's speed); at 8-16 blocks FFMA's smaller blocks fill more of the GPU and won 4 of 6 (DMMA
// 0.89-1.02x).
constexpr long long kFp64MmaForwardMinBlocks = 24;

// What the launcher's choices depend on in the device.
struct FlashTarget {
  int multiprocessors = 0;    // 0: unknown (the fp32 blocks then take their default sizes)
  bool wgmma = false;         // sm_90a code: the 16-bit forward and default backward at padded head
                              // dims 64 and 128 use flash_attention_{fwd,bwd}_wgmma.cuh unless PA_FLASH_WGMMA=0
  bool fullRateFp64 = false;  // FP64 at the FP32 rate (sm_80, sm_90): FlashFp64Mma::kAuto may use DMMA
  static FlashTarget of(const cuda::DeviceInfo& info);
};

// Every instantiation the launcher can choose (the NVRTC CI test compiles them all).
std::vector<FlashKernelSpec> allFlashKernelSpecs();

// Runs the kernels on one device. Instantiations are compiled by NVRTC on first use and cached
// for the lifetime of the object; launches are asynchronous on the given stream.
class FlashAttention {
 public:
  explicit FlashAttention(const cuda::Device& device);
  ~FlashAttention();
  FlashAttention(const FlashAttention&) = delete;
  FlashAttention& operator=(const FlashAttention&) = delete;

  // Throws FlashAttentionError for an invalid problem (message names the offending field).
  void validate(const FlashAttentionConfig& cfg, bool backward) const;
  void forward(const FlashAttentionConfig& cfg, const FlashForwardArgs& args, cuda::CUstream stream);
  size_t backwardWorkspaceBytes(const FlashAttentionConfig& cfg) const;
  void backward(const FlashAttentionConfig& cfg, const FlashBackwardArgs& args, cuda::CUstream stream);

  // Spec chosen for a problem on a target (exposed for tests, codegen's dumps and the benchmark's
  // report); the default target is an sm_80-class device of unknown size without full-rate FP64.
  static FlashKernelSpec chooseSpec(FlashKernelKind kind, const FlashAttentionConfig& cfg,
                                    const FlashTarget& target = {});
  // Kernel launches made so far (forward and backward), for per-step launch counts.
  int64_t launches() const { return launches_; }

 private:
  struct Loaded {
    cuda::CUmodule module = nullptr;
    cuda::CUfunction function = nullptr;
  };
  const Loaded& load(const FlashKernelSpec& spec);
  void launch(const FlashKernelSpec& spec, unsigned gridX, unsigned gridY, const FlashKernelParams& params,
              cuda::CUstream stream);
  FlashKernelParams baseParams(const FlashAttentionConfig& cfg) const;
  FlashKernelSpec specFor(FlashKernelKind kind, const FlashAttentionConfig& cfg) const;

  const cuda::Device& device_;
  const FlashTarget target_;  // decided once: specFor runs at every launch
  std::mutex mutex_;
  std::unordered_map<unsigned long long, Loaded> loaded_;  // by spec, see load()
  int64_t launches_ = 0;
};

}  // namespace pa
