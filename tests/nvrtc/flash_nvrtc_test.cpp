// CI test without a GPU: NVRTC compiles every flash attention instantiation production can run
// (flashProductionKernelSpecs): the wgmma kernels for sm_90a, the others for sm_80 and sm_90a.
// sm_90a rather than sm_90: the runner compiles for sm_90a on an H100, and the templates' only
// architecture branches (__CUDA_ARCH__ >= 900: the fp64 mma shape, vector reductions) take the
// same side for both. The `sweep` label compiles the bench-only variants (flash_sweep_nvrtc_test.cpp).
#include <gtest/gtest.h>

#include <set>

#include "codegen/embedded_kernels.h"
#include "codegen/flash_spec.h"
#include "codegen/nvrtc_compiler.h"
#include "tests/nvrtc/compile_in_parallel.h"

namespace pa {
namespace {

TEST(FlashNvrtc, EmbedsEveryTemplate) {
  std::set<std::string> names;
  for (const auto& f : codegen::embeddedKernelFiles()) names.insert(f.name);
  for (const char* want : {"common/attention_mask.h", "kernels/flash_attention_params.h",
                           "kernels/flash_attention_common.cuh", "kernels/flash_attention_fwd.cuh",
                           "kernels/flash_attention_bwd_common.cuh", "kernels/flash_attention_bwd_mma.cuh",
                           "kernels/flash_attention_bwd_ffma.cuh", "kernels/flash_attention_fwd_wgmma.cuh",
                           "kernels/flash_attention_bwd_wgmma.cuh", "kernels/wgmma.cuh"})
    EXPECT_TRUE(names.count(want)) << want << " is not embedded";
}

TEST(FlashNvrtc, CompileErrorCarriesKernelNameAndLog) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  codegen::CompileRequest req;
  req.kernelName = "broken_kernel";
  req.source = "extern \"C\" __global__ void broken_kernel() { undeclared_thing(); }\n";
  try {
    codegen::Nvrtc::instance().compile(req);
    FAIL() << "a broken source compiled";
  } catch (const codegen::NvrtcError& e) {
    EXPECT_EQ(e.kernel(), "broken_kernel");
    EXPECT_NE(e.log().find("undeclared_thing"), std::string::npos) << e.log();
  }
}

// Compiles the production instantiations for one architecture (the wgmma ones only for sm_90a);
// reports every failure.
void compileProduction(const std::string& arch, size_t atLeast) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  std::vector<test::CompileUnit> units;
  for (const FlashKernelSpec& s : flashProductionKernelSpecs())
    if (!s.wgmma || arch == "sm_90a") units.push_back({s.name(), s.name(), s.source()});
  const std::vector<std::string> failures = test::compileInParallel(units, arch, /*rejectWarnings=*/false);
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GE(units.size(), atLeast);
}

TEST(FlashNvrtc, CompilesEveryProductionInstantiationSm80) { compileProduction("sm_80", 40); }
TEST(FlashNvrtc, CompilesEveryProductionInstantiationSm90a) { compileProduction("sm_90a", 50); }

}  // namespace
}  // namespace pa
