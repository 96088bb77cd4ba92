// cuBLASLt loaded at run time with dlopen, as the second GEMM provider beside the generated
// kernels (compiler.gemm: generated | cublaslt | auto). Like the driver, nothing links it: a
// machine without the library builds, runs on the CPU and trains with the generated GEMMs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_driver.h"

namespace pa::cuda {

// One GEMM as the graph states it, row-major: C[b] = op(A[b]) · op(B[b]) (+ bias by column,
// then ReLU, when the library applies them), M×N outputs over K, `batch` products.
struct LtProblem {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t strideA = 0, strideB = 0;  // elements between batch items; 0: one matrix shared by all
  bool transA = false, transB = false;
  bool tf32 = false;                 // CUBLAS_COMPUTE_32F_FAST_TF32 instead of exact fp32
  // precision: bf16. A and B in bf16 (fp32 sums, CUBLAS_COMPUTE_32F); C in bf16 unless `fp32C`
  // (a weight gradient or the prediction, kept fp32). The bias stays fp32 either way.
  bool bf16 = false, fp32C = false;
  bool bias = false, relu = false;   // the epilogue cuBLASLt applies (bias before ReLU)
  // Instead of a bias: the sums over K of the graph's B (its columns: length n) or of the graph's
  // A (length m) written to the bias pointer, fp32 (BGRADA / BGRADB: see the note in cublaslt.cpp).
  bool biasGradB = false, biasGradA = false;
  // Bytes every A, B and C matrix (each batch item's too) is aligned to; cuBLASLt's heuristic
  // assumes 256 unless told, and would otherwise pick kernels that fault on smaller ones.
  uint32_t alignA = 256, alignB = 256, alignC = 256;
  // "8192x1024x1024 b1/0/0 NT fp32 bias relu a256/256/256" (bf16: "bf16>fp32"; "bgradB"/"bgradA"): a cache key part
  std::string describe() const;
};

// An opaque cuBLASLt algorithm (cublasLtMatmulAlgo_t is 8 64-bit words) and its workspace need.
struct LtAlgo {
  uint64_t data[8] = {};
  size_t workspaceBytes = 0;
  std::string hex() const;
  static bool fromHex(const std::string& s, LtAlgo& out);
};

class LtPlan;

// The library, loaded once per process. Never throws: available() says whether it loaded,
// unavailableReason() why not. Search order: $PA_CUBLASLT_LIBRARY, libcublasLt.so.13 on the
// loader's path, the CUDA toolkit's lib64, the nvidia-cublas wheel of a Python installation.
class CublasLt {
public:
  static CublasLt& instance();
  bool available() const { return available_; }
  const std::string& unavailableReason() const { return reason_; }
  const std::string& path() const { return path_; }
  size_t version() const { return version_; }  // cublasLtGetVersion(), e.g. 130100
  // The descriptors of `p` and up to `maxAlgos` algorithms from cuBLASLt's heuristic that fit
  // in `workspaceBytes`; a plan with none means cuBLASLt cannot run this problem.
  std::unique_ptr<LtPlan> plan(const LtProblem& p, size_t workspaceBytes, int maxAlgos) const;
  ~CublasLt();

private:
  CublasLt();
  friend class LtPlan;
  struct Api;
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
  void* lt_ = nullptr;  // cublasLtHandle_t
  bool available_ = false;
  std::string reason_, path_;
  size_t version_ = 0;
};

// A prepared problem: matmul and layout descriptors, plus the heuristic's candidates.
class LtPlan {
public:
  ~LtPlan();
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  const LtProblem& problem() const { return p_; }
  const std::vector<LtAlgo>& candidates() const { return algos_; }
  // Whether `algo` (from a cache) is valid for this problem on this device and library.
  bool check(const LtAlgo& algo) const;
  // Queues the product on `stream` (capturable: no allocation, no synchronisation). `bias` is
  // read when the problem has one, written when it has a bias gradient; `workspace` must hold
  // algo.workspaceBytes.
  void run(const LtAlgo& algo, CUdeviceptr a, CUdeviceptr b, CUdeviceptr bias, CUdeviceptr c, CUdeviceptr workspace,
           CUstream stream) const;

private:
  friend class CublasLt;
  explicit LtPlan(const LtProblem& p) : p_(p) {}
  LtProblem p_;
  void* op_ = nullptr;  // cublasLtMatmulDesc_t
  void* layoutA_ = nullptr;  // cuBLASLt's A: the graph's B (column-major view, see cublaslt.cpp)
  void* layoutB_ = nullptr;
  void* layoutC_ = nullptr;
  std::vector<LtAlgo> algos_;
};

}  // namespace pa::cuda
