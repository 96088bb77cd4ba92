// NVRTC compiles the flash attention instantiations only tuning overrides and bench-only options
// reach (flashSweepKernelSpecs: atomic dQ, DMMA throughout, fp16, tile and rows-per-thread
// sweeps). ctest label `sweep`, not run by default: `ctest --test-dir build -L sweep`.
#include <gtest/gtest.h>

#include "codegen/flash_spec.h"
#include "codegen/nvrtc_compiler.h"
#include "tests/nvrtc/compile_in_parallel.h"

namespace pa {
namespace {

// The bench runs on the H100 (sm_90a) and the wgmma variants need it; the rest compile for sm_80
// too, the oldest target.
void compileSweep(const std::string& arch) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<test::CompileUnit> units;
  for (const FlashKernelSpec& s : flashSweepKernelSpecs())
    if (!s.wgmma || arch == "sm_90a") units.push_back({s.name(), s.name(), s.source()});
  for (const auto& f : test::compileInParallel(units, arch, /*rejectWarnings=*/false)) ADD_FAILURE() << f;
  EXPECT_FALSE(units.empty());
}

TEST(FlashSweepNvrtc, CompilesEverySweepInstantiationSm80) { compileSweep("sm_80"); }
TEST(FlashSweepNvrtc, CompilesEverySweepInstantiationSm90a) { compileSweep("sm_90a"); }

}  // namespace
}  // namespace pa
