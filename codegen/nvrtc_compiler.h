// NVRTC loaded at run time: compile CUDA C++ source with embedded headers to cubin / PTX.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pa {
namespace codegen {

// A failed compile: carries the kernel's name and NVRTC's full log.
class NvrtcError : public std::runtime_error {
 public:
  NvrtcError(const std::string& kernel, const std::string& message, const std::string& log)
      : std::runtime_error("NVRTC: " + kernel + ": " + message + (log.empty() ? "" : "\n" + log)),
        kernel_(kernel), log_(log) {}
  const std::string& kernel() const { return kernel_; }
  const std::string& log() const { return log_; }

 private:
  std::string kernel_, log_;
};

struct CompileRequest {
  std::string kernelName;  // for messages and the program name
  std::string source;
  std::vector<std::pair<std::string, std::string>> headers;  // include name -> text
  std::string arch = "sm_90";  // sm_80, sm_90, sm_90a: cubin; compute_XX: PTX only
  std::vector<std::string> extraOptions;
};

struct CompileResult {
  std::vector<char> cubin;  // empty for a compute_XX target
  std::string ptx;          // only for compute_XX targets
  std::string log;          // warnings, if any
};

// The NVRTC library, loaded once. `available()` is false (with a reason) when none is found.
class Nvrtc {
 public:
  static Nvrtc& instance();
  bool available() const { return available_; }
  const std::string& unavailableReason() const { return reason_; }
  std::string version() const;  // "13.0"
  // Throws NvrtcError when the library is missing or the source does not compile.
  CompileResult compile(const CompileRequest& request) const;

 private:
  Nvrtc();
  struct Api;
  bool available_ = false;
  std::string reason_;
  Api* api_ = nullptr;
};

}  // namespace codegen
}  // namespace pa
