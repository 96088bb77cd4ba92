// CI test without a GPU: NVRTC compiles every flash attention instantiation for sm_80 and sm_90.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"
#include "tests/nvrtc/compile_in_parallel.h"
#include "kernels/flash_attention.h"

namespace pa {
namespace {

TEST(FlashNvrtc, EmbedsEveryTemplate) {
  std::set<std::string> names;
  for (const auto& f : codegen::embeddedKernelFiles()) names.insert(f.name);
  for (const char* want : {"kernels/attention_mask.h", "kernels/flash_attention_params.h",
                           "kernels/flash_attention_common.cuh", "kernels/flash_attention_fwd.cuh",
                           "kernels/flash_attention_bwd.cuh"})
    EXPECT_TRUE(names.count(want)) << want << " is not embedded";
}

TEST(FlashNvrtc, SpecNamesAreUnique) {
  std::set<std::string> names;
  for (const FlashKernelSpec& s : allFlashKernelSpecs()) EXPECT_TRUE(names.insert(s.name()).second) << s.name();
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

// Compiles all instantiations for one architecture on every core; reports every failure.
void compileAll(const std::string& arch) {
  if (!codegen::Nvrtc::instance().available()) GTEST_SKIP() << codegen::Nvrtc::instance().unavailableReason();
  const std::vector<FlashKernelSpec> specs = allFlashKernelSpecs();
  std::vector<test::CompileUnit> units;
  for (const FlashKernelSpec& s : specs) units.push_back({s.name(), s.name(), s.source()});
  const std::vector<std::string> failures = test::compileInParallel(units, arch, /*rejectWarnings=*/false);
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GE(specs.size(), 40u);
}

TEST(FlashNvrtc, CompilesEveryInstantiationSm80) { compileAll("sm_80"); }
TEST(FlashNvrtc, CompilesEveryInstantiationSm90) { compileAll("sm_90"); }

}  // namespace
}  // namespace pa
