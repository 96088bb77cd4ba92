// The CUDA session: the training and validation graphs on CudaGraphRunner, the step's own
// kernels (batch gather, gradient clipping, multi-tensor Adam, loss record) beside them.
#pragma once

#include <memory>

#include "runtime/session.h"

namespace pa {

namespace cuda {
class Device;
}

// The device sessions and predictors run on, opened once per process: device 0, or the one
// setCudaDeviceOrdinal chose before (a data-parallel rank's local rank, modulo the devices).
cuda::Device& cudaDevice0();
void setCudaDeviceOrdinal(int ordinal);

// Compiles both graphs for device 0. Throws SessionSettingError for compiler.gemm: cublaslt
// without cuBLASLt; codegen::NvrtcError, cuda::CudaError as the runner does.
std::unique_ptr<Session> makeCudaSession(SessionSpec spec);

}  // namespace pa
