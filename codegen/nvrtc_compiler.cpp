// Run-time loading of libnvrtc and the compile entry point (headers, options, logs, errors).
#include "codegen/nvrtc_compiler.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <type_traits>

namespace pa {
namespace codegen {

namespace {
typedef int nvrtcResult;
typedef struct _nvrtcProgram* nvrtcProgram;
}  // namespace

struct Nvrtc::Api {
  nvrtcResult (*nvrtcVersion)(int*, int*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*);
};

Nvrtc& Nvrtc::instance() {
  static Nvrtc nvrtc;
  return nvrtc;
}

Nvrtc::Nvrtc() {
  std::vector<std::string> candidates = {"libnvrtc.so.13", "libnvrtc.so"};
  if (const char* home = std::getenv("CUDA_HOME")) candidates.push_back(std::string(home) + "/lib64/libnvrtc.so");
  candidates.push_back("/usr/local/cuda/lib64/libnvrtc.so");
  void* handle = nullptr;
  std::string tried;
  for (const std::string& name : candidates) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (!handle) {
    reason_ = "NVRTC not found (tried " + tried + "); install the CUDA toolkit or set CUDA_HOME";
    return;
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto get = [&](const char* name, auto& slot) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(handle, name));
    if (!slot && missing.empty()) missing = name;
  };
  get("nvrtcVersion", api->nvrtcVersion);
  get("nvrtcGetErrorString", api->nvrtcGetErrorString);
  get("nvrtcCreateProgram", api->nvrtcCreateProgram);
  get("nvrtcDestroyProgram", api->nvrtcDestroyProgram);
  get("nvrtcCompileProgram", api->nvrtcCompileProgram);
  get("nvrtcGetProgramLogSize", api->nvrtcGetProgramLogSize);
  get("nvrtcGetProgramLog", api->nvrtcGetProgramLog);
  get("nvrtcGetCUBINSize", api->nvrtcGetCUBINSize);
  get("nvrtcGetCUBIN", api->nvrtcGetCUBIN);
  get("nvrtcGetPTXSize", api->nvrtcGetPTXSize);
  get("nvrtcGetPTX", api->nvrtcGetPTX);
  if (!missing.empty()) {
    reason_ = "NVRTC library lacks " + missing;
    return;
  }
  api_ = api.release();  // lives for the process, like the library handle
  available_ = true;
}

std::string Nvrtc::version() const {
  if (!available_) return "unavailable";
  int major = 0, minor = 0;
  api_->nvrtcVersion(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

CompileResult Nvrtc::compile(const CompileRequest& req) const {
  if (!available_) throw NvrtcError(req.kernelName, reason_, "");
  std::vector<const char*> headerTexts, headerNames;
  for (const auto& h : req.headers) {
    headerNames.push_back(h.first.c_str());
    headerTexts.push_back(h.second.c_str());
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult rc = api_->nvrtcCreateProgram(&prog, req.source.c_str(), (req.kernelName + ".cu").c_str(),
                                            (int)headerTexts.size(), headerTexts.data(), headerNames.data());
  if (rc != 0) throw NvrtcError(req.kernelName, std::string("nvrtcCreateProgram: ") + api_->nvrtcGetErrorString(rc), "");
  const bool ptxOnly = req.arch.rfind("compute_", 0) == 0;
  std::vector<std::string> opts = {"--gpu-architecture=" + req.arch, "-std=c++17", "-lineinfo"};
  for (const auto& o : req.extraOptions) opts.push_back(o);
  std::vector<const char*> optPtrs;
  for (const auto& o : opts) optPtrs.push_back(o.c_str());
  rc = api_->nvrtcCompileProgram(prog, (int)optPtrs.size(), optPtrs.data());
  CompileResult result;
  size_t logSize = 0;
  api_->nvrtcGetProgramLogSize(prog, &logSize);
  if (logSize > 1) {
    result.log.resize(logSize);
    api_->nvrtcGetProgramLog(prog, &result.log[0]);
    result.log.resize(logSize - 1);
  }
  if (rc != 0) {
    const std::string msg = std::string("compile for ") + req.arch + " failed: " + api_->nvrtcGetErrorString(rc);
    api_->nvrtcDestroyProgram(&prog);
    throw NvrtcError(req.kernelName, msg, result.log);
  }
  size_t size = 0;
  if (ptxOnly) {
    api_->nvrtcGetPTXSize(prog, &size);
    result.ptx.resize(size);
    api_->nvrtcGetPTX(prog, &result.ptx[0]);
    if (!result.ptx.empty() && result.ptx.back() == '\0') result.ptx.pop_back();  // size counts the NUL
  } else {
    api_->nvrtcGetCUBINSize(prog, &size);
    result.cubin.resize(size);
    api_->nvrtcGetCUBIN(prog, result.cubin.data());
  }
  api_->nvrtcDestroyProgram(&prog);
  return result;
}

}  // namespace codegen
}  // namespace pa
