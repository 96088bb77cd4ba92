// --dump-kernels: kernels as self-contained sources (embedded headers pasted in), one file each.
#include <filesystem>
#include <fstream>
#include <set>

#include "codegen/emit.h"
#include "codegen/embedded_kernels.h"
#include "passes/autodiff.h"
#include "passes/memory_plan.h"

namespace pa::codegen {

std::string selfContainedSource(const Kernel& k) {
  // Paste each embedded header at its first #include and drop every other #include of it, also
  // those that headers pasted later bring in (headers include one another, so repeat until
  // nothing is left): each header's text appears once, as #pragma once would have it.
  std::string src = k.source;
  std::set<std::string> pasted;
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& h : embeddedKernelHeaders()) {
      const std::string inc = "#include \"" + h.first + "\"";
      size_t at = src.find(inc);
      if (at == std::string::npos) continue;
      if (pasted.insert(h.first).second) {
        src.replace(at, inc.size(), "// ---- " + h.first + " (embedded) ----\n" + h.second);
        changed = true;
      }
      while ((at = src.find(inc)) != std::string::npos) src.erase(at, inc.size());
    }
  }
  return src;
}

int dumpKernels(const Graph& g, const std::string& dir) { return dumpKernels(g, dir, EmitOptions{}); }

int dumpKernels(const Graph& g, const std::string& dir, const EmitOptions& opt) {
  std::filesystem::create_directories(dir);
  // The GPU runner's plan: a reshape that shares its input's bytes launches nothing; nor does a
  // node that only unpacks a parameter's gradient from a packed one (Adam reads it in place).
  const MemoryPlan plan = planMemory(g, 16, /*aliasReshapes=*/true, /*storageSizes=*/true);
  const std::vector<std::vector<NodeId>> users = g.users();
  std::set<NodeId> unpacking;
  for (ValueId p : g.params()) unpacking.insert(unpackingOfParamGradient(g, p, users));
  int written = 0;
  for (NodeId id : g.topoOrder()) {
    if (aliasedReshape(g, id, plan) || unpacking.count(id)) continue;
    for (const Kernel& k : emitNode(g, id, opt).kernels) {
      std::ofstream(std::filesystem::path(dir) / (k.name + ".cu")) << selfContainedSource(k);
      ++written;
    }
  }
  return written;
}

}  // namespace pa::codegen
