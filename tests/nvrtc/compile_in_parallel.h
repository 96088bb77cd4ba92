// The NVRTC CI tests' shared loop: compiles many translation units for one architecture on up
// to 8 threads and collects every failure instead of stopping at the first.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"

namespace pa::test {

struct CompileUnit {
  std::string label;       // how a failure is reported
  std::string kernelName;  // the extern "C" symbol
  std::string source;
};

// "label: reason" for every unit that fails to compile, gives an empty cubin, or (with
// `rejectWarnings`) logs a warning; the embedded kernel headers are available to every unit.
inline std::vector<std::string> compileInParallel(const std::vector<CompileUnit>& units, const std::string& arch,
                                                  bool rejectWarnings) {
  const auto headers = codegen::embeddedKernelHeaders();
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  const unsigned workers = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i = next++; i < units.size(); i = next++) {
        codegen::CompileRequest req;
        req.kernelName = units[i].kernelName;
        req.source = units[i].source;
        req.headers = headers;
        req.arch = arch;
        try {
          const codegen::CompileResult r = codegen::Nvrtc::instance().compile(req);
          if (r.cubin.empty()) throw std::runtime_error("empty cubin");
          if (rejectWarnings && r.log.find("warning") != std::string::npos) throw std::runtime_error("warnings:\n" + r.log);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(units[i].label + ": " + e.what());
        }
      }
    });
  for (std::thread& t : pool) t.join();
  return failures;
}

}  // namespace pa::test
