// CI test without a GPU: NVRTC compiles every flash attention instantiation for sm_80 and sm_90.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"
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
  const auto headers = codegen::embeddedKernelHeaders();
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  const unsigned workers = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i = next++; i < specs.size(); i = next++) {
        codegen::CompileRequest req;
        req.kernelName = specs[i].name();
        req.source = specs[i].source();
        req.headers = headers;
        req.arch = arch;
        try {
          const codegen::CompileResult r = codegen::Nvrtc::instance().compile(req);
          if (r.cubin.empty()) throw std::runtime_error("empty cubin");
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(specs[i].name() + ": " + e.what());
        }
      }
    });
  for (auto& t : pool) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_GE(specs.size(), 40u);
}

TEST(FlashNvrtc, CompilesEveryInstantiationSm80) { compileAll("sm_80"); }
TEST(FlashNvrtc, CompilesEveryInstantiationSm90) { compileAll("sm_90"); }

}  // namespace
}  // namespace pa
