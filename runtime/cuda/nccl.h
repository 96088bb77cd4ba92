// NCCL loaded at run time with dlopen, for data-parallel training on GPUs: the gradient
// all-reduce of every rank's step. Like cuBLASLt, nothing links it and the build reads no NCCL
// header: the few types and functions used are declared here, as NCCL's API documents them
// (stable since NCCL 2.10, which added ncclAvg).
#pragma once

#include <memory>
#include <string>

#include "runtime/cuda/cuda_driver.h"

namespace pa::cuda {

// ncclUniqueId: the bytes rank 0 makes and every rank passes to the communicator's creation.
struct NcclUniqueId {
  char internal[128];
};

// The library, loaded once per process. Never throws: available() says whether it loaded,
// unavailableReason() why not. Search order: $PA_NCCL_LIBRARY, libnccl.so.2 on the loader's
// path, the CUDA toolkit's lib64, the nvidia-nccl wheel of a Python installation (PyTorch's).
class Nccl {
public:
  static Nccl& instance();
  bool available() const { return available_; }
  const std::string& unavailableReason() const { return reason_; }
  const std::string& path() const { return path_; }
  std::string version() const;  // "2.27.3"
  // ncclGetUniqueId (rank 0 calls it).
  NcclUniqueId uniqueId() const;
  ~Nccl();
  struct Api;  // the resolved functions (nccl.cpp)

private:
  Nccl();
  friend class NcclComm;
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;
  bool available_ = false;
  std::string reason_, path_;
  int version_ = 0;
};

// One rank's NCCL communicator on the current device (ncclCommInitRank: every rank of the
// group must create it at the same time). Throws CudaError naming the NCCL call that failed.
class NcclComm {
public:
  NcclComm(const NcclUniqueId& id, int ranks, int rank);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // Calls between groupStart and groupEnd are issued as one operation (one kernel launch).
  void groupStart();
  void groupEnd();
  // In place: `count` fp32 values become their mean over the ranks (ncclAvg), queued on
  // `stream` (capturable in a CUDA graph).
  void allReduceMean(CUdeviceptr buffer, size_t count, CUstream stream);

private:
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace pa::cuda
