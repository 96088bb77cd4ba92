// FlashAttention on a device: loads the chosen instantiations through NVRTC and launches them.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "codegen/flash_spec.h"
#include "codegen/nvrtc_compiler.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/launch.h"

namespace pa {

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

// What the kernel choice needs to know of a device.
FlashTarget flashTargetOf(const cuda::DeviceInfo& info);

// Runs the kernels on one device. Instantiations are compiled by NVRTC through the kernel cache
// (memory and disk, codegen/kernel_cache.h) on first use, or ahead of it by prepare(), and kept
// loaded for the lifetime of the object; launches are asynchronous on the given stream, plain or
// as programmatic dependents (`mode`; every instantiation begins with pa::pdlBegin()).
class FlashAttention {
 public:
  explicit FlashAttention(const cuda::Device& device);
  ~FlashAttention();
  FlashAttention(const FlashAttention&) = delete;
  FlashAttention& operator=(const FlashAttention&) = delete;

  // Throws FlashAttentionError for an invalid problem (message names the offending field).
  void validate(const FlashAttentionConfig& cfg, bool backward) const;
  void forward(const FlashAttentionConfig& cfg, const FlashForwardArgs& args, cuda::CUstream stream,
               cuda::LaunchMode mode = cuda::LaunchMode::Plain);
  // For backward() with the same config, mask included: GQA's dK/dV scheme depends on it.
  size_t backwardWorkspaceBytes(const FlashAttentionConfig& cfg) const;
  void backward(const FlashAttentionConfig& cfg, const FlashBackwardArgs& args, cuda::CUstream stream,
                cuda::LaunchMode mode = cuda::LaunchMode::Plain);
  // Compiles (in parallel, one thread per kernel up to the core count) and loads every kernel the
  // problems' launches will use ({config, backward} pairs), so that no launch compiles.
  void prepare(const std::vector<std::pair<FlashAttentionConfig, bool>>& problems);

  // Overrides of the kernel choice for tuning sweeps and tests (bench/, tests/ only); the default
  // follows the choosers' rules. Applies to the launches after the call.
  void setTuning(const FlashTuning& tuning) { tuning_ = tuning; }
  const FlashTarget& target() const { return target_; }
  // Kernel launches made so far (forward and backward), for per-step launch counts.
  int64_t launches() const { return launches_; }

 private:
  struct Loaded {
    cuda::CUmodule module = nullptr;
    cuda::CUfunction function = nullptr;
  };
  const Loaded& load(const FlashKernelSpec& spec);
  codegen::CompileRequest requestOf(const FlashKernelSpec& spec) const;
  const Loaded& loadCompiled(unsigned long long key, const FlashKernelSpec& spec, const codegen::CompileResult& res);
  // `maps`: the tensor maps of a kernel whose spec.tma is set (null for the others).
  void launch(const FlashKernelSpec& spec, unsigned gridX, unsigned gridY, const FlashKernelParams& params,
              cuda::CUstream stream, cuda::LaunchMode mode, const FlashTensorMaps* maps = nullptr);
  void launchPersistent(const FlashKernelSpec& spec, long long items, long long slices, long long sliceBytes, int counter,
                        FlashKernelParams params, cuda::CUstream stream, cuda::LaunchMode mode,
                        const FlashTensorMaps* maps = nullptr);
  static long long kvBytesPerSlice(const FlashAttentionConfig& cfg);
  // Partials of dK and dV a batch element ([2][batch, parts, kLen, headDim] in the workspace,
  // summed per KV head by the reduce kernel): one per query head with split GQA, one per KV head
  // and part with the fp32 dK/dV kernel's querySplit; 0: the dK/dV kernel stores dK and dV.
  int dkvPartials(const FlashAttentionConfig& cfg, const FlashKernelSpec& dkdv) const;
  static int sliceGroup(long long slices, long long sliceBytes);
  FlashKernelParams baseParams(const FlashAttentionConfig& cfg) const;
  FlashKernelSpec specFor(FlashKernelKind kind, const FlashAttentionConfig& cfg) const;

  const cuda::Device& device_;
  const FlashTarget target_;  // decided once: specFor runs at every launch
  FlashTuning tuning_;
  std::mutex mutex_;
  std::unordered_map<unsigned long long, Loaded> loaded_;  // by spec, see load()
  int64_t launches_ = 0;
  // The persistent kernels' work counters (FlashKernelParams::workCounter; a pair of ints each for
  // the forward, dK/dV and dQ): zeroed here, and by each launch's last block for the next
  // (launches on one stream: they never overlap there).
  cuda::DeviceBuffer workCounter_;
};

}  // namespace pa
