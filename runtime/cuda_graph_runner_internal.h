// Private to the CUDA graph runner's files (cuda_graph_runner.cpp, gemm_provider.cpp): a launch of
// a generated kernel and a GEMM node's cuBLASLt plan.
#pragma once

#include <memory>
#include <vector>

#include "runtime/cuda/cublaslt.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/tensor_map.h"
#include "runtime/cuda_graph_runner.h"

namespace pa {

struct CudaGraphRunner::Launch {
  cuda::CUfunction fn = nullptr;
  codegen::Kernel kernel;
  int program = 0;
  cuda::KernelParams params;  // resolved once: the buffers never move
  // Every generated kernel begins with pa::pdlBegin(), so either mode is safe (kernels/pdl.cuh).
  void enqueue(cuda::CUstream stream, cuda::LaunchMode mode) const {
    cuda::LaunchShape shape;
    shape.grid = kernel.grid;
    shape.block = kernel.block;
    shape.sharedBytes = kernel.sharedBytes;
    cuda::launchKernel(fn, shape, stream, params.data(), mode);
  }
};

// cuBLASLt's fastest candidate for a node, as measured (ms < 0: none ran).
struct CudaGraphRunner::LibraryTiming {
  double ms = -1;
  cuda::LtAlgo algo;
  bool transposed = false;
};

struct CudaGraphRunner::LibraryNode {
  std::unique_ptr<cuda::LtPlan> plan;
  // The same product with B copied untransposed into the node's scratch first (transposed B only).
  std::unique_ptr<cuda::LtPlan> planT;
  std::vector<Launch> transpose;  // codegen::libraryGemmTransposeB
  cuda::LtAlgo algo;
  bool use = false;         // chosen over the generated kernels
  bool transposed = false;  // runs transpose + planT instead of plan
  int output = 0;           // the node output cuBLASLt writes
  int launches = 1;         // kernels a run queues (counted from a capture of it)
  std::vector<Launch> post;  // what cuBLASLt leaves of the epilogue (codegen::libraryGemmEpilogue)
};

}  // namespace pa
