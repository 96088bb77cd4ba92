// Launches of the kernels we compile: as programmatic dependents (PDL) on sm_90 and later, plain
// elsewhere. kernels/pdl.cuh states the rule that makes every such kernel safe either way.
#pragma once

#include <array>

#include "runtime/cuda/cuda_driver.h"

namespace pa {
namespace cuda {

struct DeviceInfo;

enum class LaunchMode {
  // cuLaunchKernel: the kernel starts once everything before it in the stream has finished.
  Plain,
  // cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the kernel may
  // start while the kernel before it runs, and waits for it in pa::pdlBegin().
  Programmatic,
};

// Programmatic where the caller wants it and everything it needs is there: a device of compute
// capability 9.0 or later (griddepcontrol), a driver that has cuLaunchKernelEx, and a CUDA 12.3
// or later driver (`driverVersion` as cuDriverGetVersion gives it: 12030), whose stream capture
// keeps the launch's programmatic edge in the CUDA graph. Plain otherwise. A pure function, so
// that the choice is tested without a GPU.
LaunchMode chooseLaunchMode(bool wanted, int computeMajor, int driverVersion, bool haveLaunchKernelEx);
// The same for `device` with the loaded driver.
LaunchMode launchModeFor(bool wanted, const DeviceInfo& device);
const char* launchModeName(LaunchMode mode);  // "plain", "programmatic"

struct LaunchShape {
  std::array<unsigned, 3> grid{1, 1, 1}, block{1, 1, 1};
  unsigned sharedBytes = 0;
};

// cuLaunchKernelEx's configuration of a launch of `shape` on `stream`: in Programmatic mode its one
// attribute is `*attr`, filled here (programmatic stream serialization allowed); in Plain mode it
// has none.
CUlaunchConfig launchConfig(const LaunchShape& shape, CUstream stream, LaunchMode mode, CUlaunchAttribute* attr);

// Queues `fn` on `stream` with kernel arguments `args`: Plain through cuLaunchKernel,
// Programmatic through cuLaunchKernelEx and launchConfig. Only a kernel whose first statement is
// pa::pdlBegin() (codegen::beginsWithPdlPrologue) may be launched Programmatic; cuBLASLt's, NCCL's
// and any other kernel stay with their own launches.
void launchKernel(CUfunction fn, const LaunchShape& shape, CUstream stream, void** args, LaunchMode mode);

}  // namespace cuda
}  // namespace pa
