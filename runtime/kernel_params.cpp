// A generated kernel's arguments as cuLaunchKernel's parameter array.
#include "runtime/kernel_params.h"

namespace pa {

cuda::KernelParams launchParams(const codegen::Kernel& k, const std::function<cuda::CUdeviceptr(int)>& input,
                                const std::function<cuda::CUdeviceptr(int)>& output, cuda::CUdeviceptr scratch,
                                cuda::CUdeviceptr adamBinding) {
  using codegen::KernelArg;
  cuda::KernelParams params(k.args.size());
  for (const KernelArg& a : k.args) {
    switch (a.kind) {
    case KernelArg::Input: params.addPointer(input(a.index)); break;
    case KernelArg::Output: params.addPointer(output(a.index)); break;
    case KernelArg::Scratch: params.addPointer(scratch); break;
    case KernelArg::InputTensorMap: params.addTensorMap(a.map, input(a.index)); break;
    case KernelArg::ScratchTensorMap: params.addTensorMap(a.map, scratch + a.scratchOffsetBytes); break;
    case KernelArg::OutputTensorMap: params.addTensorMap(a.map, output(a.index)); break;
    case KernelArg::AdamBinding: params.addPointer(adamBinding); break;
    }
  }
  return params;
}

}  // namespace pa
