// What every GPU test suite shares: the device (its primary context, made current once) and
// the clean skip where there is none.
#pragma once

#include <gtest/gtest.h>

#include "runtime/cuda/cuda_device.h"

namespace pa::test {

inline cuda::Device& gpuDevice() {
  static cuda::Device d(0);
  return d;
}

}  // namespace pa::test

// Skips the test, with the driver's reason, on a machine without a usable CUDA device.
#define PA_REQUIRE_GPU()                                                                     \
  if (!::pa::cuda::Driver::instance().available())                                           \
  GTEST_SKIP() << "no CUDA device: " << ::pa::cuda::Driver::instance().unavailableReason()
