// CUDA driver API loaded at run time with dlopen: no link-time dependency on libcuda or cudart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace pa {
namespace cuda {

// The few driver types used here, declared locally so that cuda.h is not needed to build.
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
typedef unsigned long long CUdeviceptr;

// cuLaunchKernelEx's configuration, laid out exactly as cuda.h's CUlaunchAttribute and
// CUlaunchConfig (tests/cuda_driver_abi_test.cpp compares sizes and offsets with cuda.h's): the id
// at 0, 4 bytes of padding, a 64-byte value union (8-byte aligned: cuda.h's holds pointers).
typedef struct CUlaunchAttribute_st {
  int id;  // CUlaunchAttributeID
  char pad[4];
  union {
    alignas(8) char bytes[64];
    int programmaticStreamSerializationAllowed;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
  } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

constexpr CUresult kCudaSuccess = 0;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
constexpr unsigned kStreamDefault = 0;              // CU_STREAM_DEFAULT: orders with the legacy stream
constexpr int kStreamCaptureModeThreadLocal = 1;     // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
constexpr int kPointerAttrDeviceOrdinal = 9;         // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kPointerAttrRangeStartAddr = 11;       // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kPointerAttrRangeSize = 12;            // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

// A failed driver call: file:line, the call's text and the driver's name and message for the code.
class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& what, CUresult code) : std::runtime_error(what), code_(code) {}
  CUresult code() const { return code_; }

 private:
  CUresult code_;
};

// Function table filled from libcuda.so.1. Members keep the driver's names (without the _v2
// suffixes the header macros would add) so that calls read like the CUDA documentation.
struct DriverApi {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  // Optional (CUDA 11.8+): null where the driver lacks it; our kernels are then launched plain
  // (runtime/cuda/launch.h).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*cuMemAllocHost)(void**, size_t);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuStreamCreateWithPriority)(CUstream*, unsigned int, int);
  CUresult (*cuCtxGetStreamPriorityRange)(int*, int*);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuGraphGetNodes)(CUgraph, void**, size_t*);
  CUresult (*cuEventCreate)(CUevent*, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  // Optional (CUDA 12+): null where the driver has no TMA; runtime/cuda/tensor_map.h says so.
  CUresult (*cuTensorMapEncodeTiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const uint32_t*,
                                     const uint32_t*, int, int, int, int);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
};

// Loads the driver once per process. Never throws: `available()` says whether a driver and at
// least one device were found, `unavailableReason()` why not ("no CUDA device", "libcuda.so.1 not
// found: ...").
class Driver {
 public:
  static Driver& instance();
  bool available() const { return available_; }
  int version() const { return version_; }  // cuDriverGetVersion: 12030 for CUDA 12.3; 0 if unavailable
  const std::string& unavailableReason() const { return reason_; }
  const DriverApi& api() const { return api_; }
  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a code.
  std::string describe(CUresult code) const;

 private:
  Driver();
  bool available_ = false;
  int version_ = 0;
  std::string reason_;
  DriverApi api_{};
  void* handle_ = nullptr;
};

[[noreturn]] void throwCudaError(CUresult code, const char* call, const char* file, int line);

}  // namespace cuda
}  // namespace pa

// Calls a driver function through the loaded table and throws CudaError on failure, e.g.
//   PA_CU_CHECK(cuMemAlloc(&ptr, bytes));
#define PA_CU_CHECK(call)                                                           \
  do {                                                                              \
    const ::pa::cuda::CUresult paCuStatus_ = ::pa::cuda::Driver::instance().api().call; \
    if (paCuStatus_ != ::pa::cuda::kCudaSuccess)                                    \
      ::pa::cuda::throwCudaError(paCuStatus_, #call, __FILE__, __LINE__);           \
  } while (0)
