// TMA tensor maps through the driver's cuTensorMapEncodeTiled.
#include "runtime/cuda/tensor_map.h"

namespace pa {
namespace cuda {

namespace {
// The driver's enum values (cuda.h, CUDA 12 and later).
constexpr int kTensorMapFloat32 = 7;       // CU_TENSOR_MAP_DATA_TYPE_FLOAT32
constexpr int kTensorMapBfloat16 = 9;      // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
constexpr int kTensorMapInterleaveNone = 0;
constexpr int kTensorMapSwizzle128B = 3;   // CU_TENSOR_MAP_SWIZZLE_128B
constexpr int kTensorMapL2Promotion256B = 3;
constexpr int kTensorMapOobFillZero = 0;   // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros
constexpr CUresult kErrorNotSupported = 801;  // CUDA_ERROR_NOT_SUPPORTED
}  // namespace

TensorMap encodeTensorMap(const TensorMapSpec& spec, CUdeviceptr base) {
  const DriverApi& api = Driver::instance().api();
  if (!api.cuTensorMapEncodeTiled)
    throw CudaError("cuTensorMapEncodeTiled: this CUDA driver has no tensor maps (TMA needs CUDA 12 or later)",
                    kErrorNotSupported);
  TensorMap map{};
  const uint32_t elementStrides[4] = {1, 1, 1, 1};
  PA_CU_CHECK(cuTensorMapEncodeTiled(&map, spec.elementBytes == 4 ? kTensorMapFloat32 : kTensorMapBfloat16, spec.rank, reinterpret_cast<void*>(base), spec.dims, spec.strideBytes,
                                     spec.box, elementStrides, kTensorMapInterleaveNone, kTensorMapSwizzle128B,
                                     kTensorMapL2Promotion256B, kTensorMapOobFillZero));
  return map;
}

}  // namespace cuda
}  // namespace pa
