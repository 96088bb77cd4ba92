// Every debug switch of the project, read once from the environment. README "Debug switches"
// lists them; add a switch here and there, nowhere else.
#pragma once

#include <cstdlib>
#include <cstring>

namespace pa {

struct DebugSwitches {
  bool printAfterEachPass = false;  // PA_PRINT_AFTER_ALL=1: print the graph (text) after every pass
  bool verifyEachPass = true;       // PA_VERIFY_EACH_PASS=0: skip the verifier between passes
  bool kernelDiskCache = true;      // PA_KERNEL_CACHE=0: compile every kernel afresh, cache nothing on disk
  bool profile = false;             // PA_PROFILE=1: after GPU training, time every node of the step and print the slowest
  bool cudaGraphs = true;           // PA_CUDA_GRAPH=0: launch every kernel of every GPU step instead of replaying a CUDA graph
};

// Kernel tuning overrides, for sweeps: the FlashAttention launcher's tile and rows-per-thread
// choices (docs/flash_attention.md lists each). They are read at every kernel choice rather than
// once, so a sweep (and the flash GPU test) can change them between runs; unset or empty: 0,
// meaning "use the launcher's rule".
//   PA_FLASH_FWD_TILE, PA_FLASH_FWD_MT     fp16/bf16 forward: keys per tile, m-tiles per warp
//   PA_FLASH_FWD_WG, PA_FLASH_FWD_STAGES   sm_90a wgmma forward: consumer warpgroups, K/V stages
//   PA_FLASH_BWD_TILE, PA_FLASH_BWD_WG     sm_90a wgmma backward: streamed tile rows, consumer warpgroups
//   PA_FLASH_WGMMA=0                       sm_90a fp16/bf16 kernels on mma.sync instead of wgmma
//   PA_FLASH_SPLIT_KV=0|1                  fp16/bf16 GQA dK/dV per KV head (0) or per query head (1, default)
//   PA_FLASH_DQ_TILE, PA_FLASH_DQ_MT       fp16/bf16 dQ kernel: keys per tile, m-tiles per warp
//   PA_FLASH_F32_FWD_R, PA_FLASH_F32_BWD_R fp32 forward / backward: rows (keys) per thread
//   PA_FLASH_F64_FWD_WARPS                 fp32 forward on the FP64 tensor cores: warps per block (4; 8)
inline int tuningOverride(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

// An on/off switch as read now: `dflt` when unset or empty, false for "0", "false" or "off", else
// true. debugSwitches() reads its switches once; the FlashAttention launcher's PA_FLASH_WGMMA and
// PA_FLASH_SPLIT_KV are read at every choice, like the tuning overrides above.
inline bool envSwitch(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0 && std::strcmp(v, "off") != 0;
}

inline const DebugSwitches& debugSwitches() {
  static const DebugSwitches s = [] {
    auto flag = envSwitch;
    DebugSwitches d;
    d.printAfterEachPass = flag("PA_PRINT_AFTER_ALL", false);
    d.verifyEachPass = flag("PA_VERIFY_EACH_PASS", true);
    d.kernelDiskCache = flag("PA_KERNEL_CACHE", true);
    d.cudaGraphs = flag("PA_CUDA_GRAPH", true);
    d.profile = flag("PA_PROFILE", false);
    return d;
  }();
  return s;
}

}  // namespace pa
