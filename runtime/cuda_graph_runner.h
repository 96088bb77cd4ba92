// Runs a whole graph on a CUDA device with the generated kernels (and the FlashAttention
// launcher for its nodes): the GPU counterpart of CpuExecutor<float>.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "graph/graph.h"
#include "kernels/flash_attention.h"
#include "runtime/cuda/cuda_device.h"

namespace pa {

class CudaGraphRunner {
public:
  // Plans memory (one device arena for activations; a buffer per parameter), compiles every
  // node's kernels with NVRTC for the device's architecture as one program, and uploads
  // constants. Throws codegen::NvrtcError, cuda::CudaError or FlashAttentionError.
  CudaGraphRunner(const Graph& g, const cuda::Device& device);
  ~CudaGraphRunner();

  void upload(ValueId v, const float* host);      // inputs and parameters, numel(shape) floats
  void download(ValueId v, float* host) const;    // any value that is still alive after run()
  void run(cuda::CUstream stream = nullptr);      // every node's kernels, in topological order
  cuda::CUdeviceptr devicePtr(ValueId v) const { return ptr(v); }
  size_t arenaBytes() const { return arenaBytes_; }
  int kernelCount() const { return kernelCount_; }

private:
  struct Launch;
  cuda::CUdeviceptr ptr(ValueId v) const;
  const Graph& g_;
  const cuda::Device& device_;
  std::vector<NodeId> order_;
  cuda::DeviceBuffer arena_;
  std::vector<int64_t> offset_;                        // arena offset (floats) per value, -1 if none
  std::map<ValueId, cuda::DeviceBuffer> own_;          // parameters
  std::map<NodeId, cuda::DeviceBuffer> scratch_;       // flash backward workspaces
  std::vector<std::vector<Launch>> launches_;          // per node id
  cuda::CUmodule module_ = nullptr;
  std::unique_ptr<FlashAttention> flash_;
  size_t arenaBytes_ = 0;
  int kernelCount_ = 0;
};

// A module compiled from source through the kernel cache, for kernels outside the graph.
class CudaModule {
public:
  CudaModule(const std::string& source, const cuda::Device& device);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;
  cuda::CUfunction function(const char* name) const;
  // Launches `fn` over `work` items with 256-thread blocks; `args` point at the arguments.
  static void launch(cuda::CUfunction fn, int64_t work, void** args, cuda::CUstream stream = nullptr);

private:
  cuda::CUmodule module_ = nullptr;
};

}  // namespace pa
