// Run-time loading of libcuda.so.1 and the PA_CU_CHECK error path.
#include "runtime/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <sstream>

namespace pa {
namespace cuda {

namespace {

// Resolves `name` into `slot`; returns false (and names the symbol in `missing`) if absent.
template <typename Fn>
bool resolve(void* handle, const char* name, Fn& slot, std::string& missing) {
  slot = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!slot && missing.empty()) missing = name;
  return slot != nullptr;
}

}  // namespace

Driver& Driver::instance() {
  static Driver driver;
  return driver;
}

Driver::Driver() {
  handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* err = dlerror();
    reason_ = std::string("no CUDA device: the CUDA driver (libcuda.so.1) was not found (") +
              (err ? err : "dlopen failed") + ")";
    return;
  }
  std::string missing;
  // Versioned names: the unversioned symbols keep their CUDA 3.x signatures for old binaries.
  resolve(handle_, "cuInit", api_.cuInit, missing);
  resolve(handle_, "cuDriverGetVersion", api_.cuDriverGetVersion, missing);
  resolve(handle_, "cuDeviceGetCount", api_.cuDeviceGetCount, missing);
  resolve(handle_, "cuDeviceGet", api_.cuDeviceGet, missing);
  resolve(handle_, "cuDeviceGetName", api_.cuDeviceGetName, missing);
  resolve(handle_, "cuDeviceGetAttribute", api_.cuDeviceGetAttribute, missing);
  resolve(handle_, "cuDeviceTotalMem_v2", api_.cuDeviceTotalMem, missing);
  resolve(handle_, "cuDevicePrimaryCtxRetain", api_.cuDevicePrimaryCtxRetain, missing);
  resolve(handle_, "cuDevicePrimaryCtxRelease_v2", api_.cuDevicePrimaryCtxRelease, missing);
  resolve(handle_, "cuCtxSetCurrent", api_.cuCtxSetCurrent, missing);
  resolve(handle_, "cuCtxGetCurrent", api_.cuCtxGetCurrent, missing);
  resolve(handle_, "cuCtxSynchronize", api_.cuCtxSynchronize, missing);
  resolve(handle_, "cuModuleLoadData", api_.cuModuleLoadData, missing);
  resolve(handle_, "cuModuleUnload", api_.cuModuleUnload, missing);
  resolve(handle_, "cuModuleGetFunction", api_.cuModuleGetFunction, missing);
  resolve(handle_, "cuFuncSetAttribute", api_.cuFuncSetAttribute, missing);
  resolve(handle_, "cuLaunchKernel", api_.cuLaunchKernel, missing);
  resolve(handle_, "cuMemAlloc_v2", api_.cuMemAlloc, missing);
  resolve(handle_, "cuMemFree_v2", api_.cuMemFree, missing);
  resolve(handle_, "cuMemcpyHtoD_v2", api_.cuMemcpyHtoD, missing);
  resolve(handle_, "cuMemcpyDtoH_v2", api_.cuMemcpyDtoH, missing);
  resolve(handle_, "cuMemsetD32_v2", api_.cuMemsetD32, missing);
  resolve(handle_, "cuMemcpyHtoDAsync_v2", api_.cuMemcpyHtoDAsync, missing);
  resolve(handle_, "cuMemcpyDtoHAsync_v2", api_.cuMemcpyDtoHAsync, missing);
  resolve(handle_, "cuMemcpyDtoDAsync_v2", api_.cuMemcpyDtoDAsync, missing);
  resolve(handle_, "cuMemsetD32Async", api_.cuMemsetD32Async, missing);
  resolve(handle_, "cuPointerGetAttribute", api_.cuPointerGetAttribute, missing);
  resolve(handle_, "cuMemAllocHost_v2", api_.cuMemAllocHost, missing);
  resolve(handle_, "cuMemFreeHost", api_.cuMemFreeHost, missing);
  resolve(handle_, "cuStreamCreate", api_.cuStreamCreate, missing);
  resolve(handle_, "cuStreamCreateWithPriority", api_.cuStreamCreateWithPriority, missing);
  resolve(handle_, "cuCtxGetStreamPriorityRange", api_.cuCtxGetStreamPriorityRange, missing);
  resolve(handle_, "cuStreamWaitEvent", api_.cuStreamWaitEvent, missing);
  resolve(handle_, "cuStreamDestroy_v2", api_.cuStreamDestroy, missing);
  resolve(handle_, "cuStreamSynchronize", api_.cuStreamSynchronize, missing);
  resolve(handle_, "cuStreamBeginCapture_v2", api_.cuStreamBeginCapture, missing);
  resolve(handle_, "cuStreamEndCapture", api_.cuStreamEndCapture, missing);
  resolve(handle_, "cuGraphInstantiateWithFlags", api_.cuGraphInstantiate, missing);
  resolve(handle_, "cuGraphLaunch", api_.cuGraphLaunch, missing);
  resolve(handle_, "cuGraphExecDestroy", api_.cuGraphExecDestroy, missing);
  resolve(handle_, "cuGraphDestroy", api_.cuGraphDestroy, missing);
  resolve(handle_, "cuGraphGetNodes", api_.cuGraphGetNodes, missing);
  resolve(handle_, "cuEventCreate", api_.cuEventCreate, missing);
  resolve(handle_, "cuEventDestroy_v2", api_.cuEventDestroy, missing);
  resolve(handle_, "cuEventRecord", api_.cuEventRecord, missing);
  resolve(handle_, "cuEventSynchronize", api_.cuEventSynchronize, missing);
  resolve(handle_, "cuEventElapsedTime", api_.cuEventElapsedTime, missing);
  std::string optional;  // without them: no TMA kernels, and plain launches instead of PDL (launch.h)
  resolve(handle_, "cuTensorMapEncodeTiled", api_.cuTensorMapEncodeTiled, optional);
  resolve(handle_, "cuLaunchKernelEx", api_.cuLaunchKernelEx, optional);
  resolve(handle_, "cuGetErrorName", api_.cuGetErrorName, missing);
  resolve(handle_, "cuGetErrorString", api_.cuGetErrorString, missing);
  if (!missing.empty()) {
    reason_ = "no CUDA device: libcuda.so.1 lacks " + missing + " (driver too old?)";
    return;
  }
  const CUresult init = api_.cuInit(0);
  if (init != kCudaSuccess) {
    reason_ = "no CUDA device: cuInit failed with " + describe(init);
    return;
  }
  int count = 0;
  const CUresult cnt = api_.cuDeviceGetCount(&count);
  if (cnt != kCudaSuccess || count == 0) {
    reason_ = "no CUDA device: the driver reports none";
    return;
  }
  if (api_.cuDriverGetVersion(&version_) != kCudaSuccess) version_ = 0;
  available_ = true;
}

std::string Driver::describe(CUresult code) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.cuGetErrorName) api_.cuGetErrorName(code, &name);
  if (api_.cuGetErrorString) api_.cuGetErrorString(code, &text);
  std::ostringstream os;
  os << (name ? name : "CUDA error") << " " << code << " (" << (text ? text : "no description") << ")";
  return os.str();
}

void throwCudaError(CUresult code, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << file << ":" << line << ": " << call << " failed: " << Driver::instance().describe(code);
  throw CudaError(os.str(), code);
}

}  // namespace cuda
}  // namespace pa
