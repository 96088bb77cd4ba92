// Plain and programmatic-dependent launches of our kernels (runtime/cuda/launch.h).
#include "runtime/cuda/launch.h"

#include "runtime/cuda/cuda_device.h"

namespace pa {
namespace cuda {

namespace {

constexpr int kFirstPdlMajor = 9;             // griddepcontrol: sm_90 and later
constexpr int kFirstPdlCaptureDriver = 12030;  // CUDA 12.3: programmatic edges in captured graphs

}  // namespace

LaunchMode chooseLaunchMode(bool wanted, int computeMajor, int driverVersion, bool haveLaunchKernelEx) {
  const bool able = computeMajor >= kFirstPdlMajor && driverVersion >= kFirstPdlCaptureDriver && haveLaunchKernelEx;
  return wanted && able ? LaunchMode::Programmatic : LaunchMode::Plain;
}

LaunchMode launchModeFor(bool wanted, const DeviceInfo& device) {
  const Driver& d = Driver::instance();
  return chooseLaunchMode(wanted, device.major, d.version(), d.api().cuLaunchKernelEx != nullptr);
}

const char* launchModeName(LaunchMode mode) {
  switch (mode) {
  case LaunchMode::Plain: return "plain";
  case LaunchMode::Programmatic: return "programmatic";
  }
  return "?";
}

CUlaunchConfig launchConfig(const LaunchShape& shape, CUstream stream, LaunchMode mode, CUlaunchAttribute* attr) {
  CUlaunchConfig c{};
  c.gridDimX = shape.grid[0], c.gridDimY = shape.grid[1], c.gridDimZ = shape.grid[2];
  c.blockDimX = shape.block[0], c.blockDimY = shape.block[1], c.blockDimZ = shape.block[2];
  c.sharedMemBytes = shape.sharedBytes;
  c.hStream = stream;
  if (mode == LaunchMode::Programmatic) {
    *attr = CUlaunchAttribute{};
    attr->id = kLaunchAttrProgrammaticStreamSerialization;
    attr->value.programmaticStreamSerializationAllowed = 1;
    c.attrs = attr;
    c.numAttrs = 1;
  }
  return c;
}

void launchKernel(CUfunction fn, const LaunchShape& shape, CUstream stream, void** args, LaunchMode mode) {
  if (mode == LaunchMode::Plain) {
    PA_CU_CHECK(cuLaunchKernel(fn, shape.grid[0], shape.grid[1], shape.grid[2], shape.block[0], shape.block[1],
                               shape.block[2], shape.sharedBytes, stream, args, nullptr));
    return;
  }
  CUlaunchAttribute attr;
  const CUlaunchConfig config = launchConfig(shape, stream, mode, &attr);
  PA_CU_CHECK(cuLaunchKernelEx(&config, fn, args, nullptr));
}

}  // namespace cuda
}  // namespace pa
