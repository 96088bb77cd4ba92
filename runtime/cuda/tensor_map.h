// TMA tensor maps (cuTensorMapEncodeTiled) and the parameter block of a launch that passes them.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/tensor_map_spec.h"
#include "runtime/cuda/cuda_driver.h"

namespace pa {
namespace cuda {

// What a map describes (codegen emits it with the kernel that takes the map).
using codegen::TensorMapSpec;

// The driver's opaque 128-byte descriptor (CUtensorMap), passed to kernels by value.
struct alignas(64) TensorMap {
  uint64_t words[16];
};

// Encodes `spec` over the tensor at `base`; throws CudaError when the driver rejects it (a base
// not 16-byte aligned, strides not multiples of 16) or has no TMA (before CUDA 12).
TensorMap encodeTensorMap(const TensorMapSpec& spec, CUdeviceptr base);

// cuLaunchKernel's parameter array for one launch: device pointers and tensor maps in argument
// order, at addresses that do not move while the object lives (moving it keeps them).
class KernelParams {
 public:
  explicit KernelParams(size_t count = 0) {
    pointers_.reserve(count);
    maps_.reserve(count);
    params_.reserve(count);
  }
  // Moves keep the heap buffers the parameter pointers point into; copies would not.
  KernelParams(const KernelParams&) = delete;
  KernelParams& operator=(const KernelParams&) = delete;
  KernelParams(KernelParams&&) = default;
  KernelParams& operator=(KernelParams&&) = default;

  void addPointer(CUdeviceptr p) {
    pointers_.push_back(p);
    params_.push_back(&pointers_.back());
  }
  void addTensorMap(const TensorMapSpec& spec, CUdeviceptr base) {
    maps_.push_back(encodeTensorMap(spec, base));
    params_.push_back(&maps_.back());
  }
  // cuLaunchKernel's kernelParams (which it only reads).
  void** data() const { return const_cast<void**>(params_.data()); }

 private:
  // Reserved up front and never grown past `count`, so the addresses in params_ stay valid.
  std::vector<CUdeviceptr> pointers_;
  std::vector<TensorMap> maps_;
  std::vector<void*> params_;
};

}  // namespace cuda
}  // namespace pa
