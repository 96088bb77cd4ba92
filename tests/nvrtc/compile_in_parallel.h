// The NVRTC CI tests' shared loop: compiles many translation units on every core (codegen::compileEach), each distinct
// program once, and collects every failure instead of stopping at the first.
#pragma once

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "codegen/embedded_kernels.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"

namespace pa::test {

struct CompileUnit {
  std::string label;       // how a failure is reported
  std::string kernelName;  // the extern "C" symbol
  std::string source;
};

// Note on what the tests build. Production compiles for the device it runs on: sm_90a on an
// H100, the device's own sm_XX elsewhere. The test of a target checks what can break there: the
// front end (templates, intrinsics behind __CUDA_ARCH__ guards) for every target, and ptxas
// (registers, shared memory, the sm_90a-only wgmma and setmaxnreg) where production runs it in
// CI's place, on sm_90a. So sm_90a builds a full cubin and any other sm_XX its PTX only
// (compute_XX, no ptxas), which is most of the time saved; bench/RESULTS.md has the numbers.
inline std::string testTarget(const std::string& arch) {
  if (arch == "sm_90a" || arch.rfind("sm_", 0) != 0) return arch;
  return "compute_" + arch.substr(3);
}

// What one call did: units given, distinct programs among them, programs compiled by this call
// (the rest were compiled earlier in the process).
struct CompileStats {
  size_t units = 0, programs = 0, compiled = 0;
};

struct CompileOptions {
  std::string arch;             // an sm_XX, built as testTarget(arch) says; or compute_XX
  bool rejectWarnings = false;  // a warning in the log fails the unit
  bool embeddedHeaders = true;  // false: only what the source itself holds (a dumped kernel)
  CompileStats* stats = nullptr;
};

namespace detail {

// The outcome of one distinct program: empty when it compiled, else why not.
struct Outcome {
  std::string error;
  std::string log;
};

// Every distinct program compiled in this process, keyed by everything that can change its
// outcome (target, header set, the name-normalised source). Tests that share programs (the
// same kernel for two configs, or twice in one list) compile them once.
inline std::mutex& memoMutex() {
  static std::mutex mu;
  return mu;
}
inline std::unordered_map<std::string, Outcome>& memo() {
  static std::unordered_map<std::string, Outcome> m;
  return m;
}

const char* const kFixedName = "pa_test_unit_kernel";

inline std::string replaced(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out.append(text, pos, hit - pos).append(to);
  out.append(text, pos, std::string::npos);
  return out;
}

// The source without its leading comment lines (a generated kernel's banner names its graph
// node) and with its kernel's name replaced by one fixed name: kernels that differ only in their
// `k<id>_<op>` names and banners (the same op on the same shapes in another config or graph
// position) become one program.
inline std::string normalisedSource(const CompileUnit& u) {
  size_t start = 0;
  while (u.source.compare(start, 2, "//") == 0) {
    const size_t eol = u.source.find('\n', start);
    if (eol == std::string::npos) break;
    start = eol + 1;
  }
  const std::string body = u.source.substr(start);
  return u.kernelName.empty() ? body : replaced(body, u.kernelName, kFixedName);
}

}  // namespace detail

// "label: reason" for every unit that fails to compile, gives no output, or (with
// rejectWarnings) logs a warning. Units whose normalised programs are equal compile once; a
// failure is reported under each of their labels.
inline std::vector<std::string> compileInParallel(const std::vector<CompileUnit>& units, const CompileOptions& options) {
  const std::string target = testTarget(options.arch);
  const std::vector<std::pair<std::string, std::string>> headers =
      options.embeddedHeaders ? codegen::embeddedKernelHeaders() : std::vector<std::pair<std::string, std::string>>{};
  const std::string prefix = target + (options.embeddedHeaders ? "\n+headers\n" : "\n-headers\n");

  // Group the units by program; compile only the programs this process has not seen.
  std::unordered_map<std::string, size_t> groupOf;
  std::vector<std::string> keys, sources;
  std::vector<std::vector<size_t>> members;
  for (size_t i = 0; i < units.size(); ++i) {
    std::string source = detail::normalisedSource(units[i]);
    std::string key = prefix + source;
    auto [it, fresh] = groupOf.emplace(key, keys.size());
    if (fresh) {
      keys.push_back(std::move(key));
      sources.push_back(std::move(source));
      members.emplace_back();
    }
    members[it->second].push_back(i);
  }
  std::vector<size_t> todo;
  {
    std::lock_guard<std::mutex> lock(detail::memoMutex());
    for (size_t g = 0; g < keys.size(); ++g)
      if (!detail::memo().count(keys[g])) todo.push_back(g);
  }

  auto compileOne = [&](const std::string& name, const std::string& source) {
    codegen::CompileRequest req;
    req.kernelName = name;
    req.source = source;
    req.headers = headers;
    req.arch = target;
    detail::Outcome out;
    try {
      const codegen::CompileResult r = codegen::Nvrtc::instance().compile(req);
      out.log = r.log;
      if (r.cubin.empty() && r.ptx.empty()) out.error = "no cubin or PTX";
    } catch (const std::exception& e) {
      out.error = e.what();
    }
    return out;
  };

  codegen::compileEach(todo.size(), [&](size_t t) {
    const size_t g = todo[t];
    detail::Outcome out = compileOne(units[members[g].front()].kernelName, sources[g]);
    std::lock_guard<std::mutex> lock(detail::memoMutex());
    detail::memo()[keys[g]] = std::move(out);
  });
  if (options.stats) *options.stats = {units.size(), keys.size(), todo.size()};

  std::vector<std::string> failures;
  std::lock_guard<std::mutex> lock(detail::memoMutex());
  for (size_t g = 0; g < keys.size(); ++g) {
    const detail::Outcome& out = detail::memo().at(keys[g]);
    std::string why = out.error;
    if (why.empty() && options.rejectWarnings && out.log.find("warning") != std::string::npos) why = "warnings:\n" + out.log;
    if (why.empty()) continue;
    for (size_t i : members[g]) failures.push_back(units[i].label + " (" + target + "): " + why);
  }
  return failures;
}

inline std::vector<std::string> compileInParallel(const std::vector<CompileUnit>& units, const std::string& arch,
                                                  bool rejectWarnings) {
  CompileOptions options;
  options.arch = arch;
  options.rejectWarnings = rejectWarnings;
  return compileInParallel(units, options);
}

}  // namespace pa::test
