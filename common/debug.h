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
  bool checkReplicas = false;       // PA_CHECK_REPLICAS=1: data parallel: compare every rank's parameters after every step (on in debug builds)
};

// An on/off switch as read now: `dflt` when unset or empty, false for "0", "false" or "off", else
// true. debugSwitches() reads its switches once. (Kernel tuning overrides are no debug switch:
// they are FlashTuning fields, which only bench/ and tests/ fill.)
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
#ifdef NDEBUG
    d.checkReplicas = flag("PA_CHECK_REPLICAS", false);
#else
    d.checkReplicas = flag("PA_CHECK_REPLICAS", true);
#endif
    return d;
  }();
  return s;
}

}  // namespace pa
