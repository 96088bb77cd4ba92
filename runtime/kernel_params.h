// A generated kernel's launch parameters: its arguments resolved to device addresses, tensor maps
// encoded through the driver.
#pragma once

#include <functional>

#include "codegen/emit.h"
#include "runtime/cuda/tensor_map.h"

namespace pa {

// cuLaunchKernel's parameters for `k`: the device addresses of the node's inputs and outputs (by
// index, asked only for the ones `k` takes), of its scratch and of the session's Adam binding;
// tensor maps are encoded here.
cuda::KernelParams launchParams(const codegen::Kernel& k, const std::function<cuda::CUdeviceptr(int)>& input,
                                const std::function<cuda::CUdeviceptr(int)>& output, cuda::CUdeviceptr scratch,
                                cuda::CUdeviceptr adamBinding = 0);

}  // namespace pa
