// Libraries loaded at run time (runtime/cuda/dynamic_library.h).
#include "runtime/cuda/dynamic_library.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>

namespace pa::cuda {

std::vector<std::string> libraryCandidates(const char* envVar, std::initializer_list<const char*> names,
                                           std::initializer_list<const char*> patterns) {
  if (const char* env = std::getenv(envVar); env && *env) return {env};
  std::vector<std::string> paths(names.begin(), names.end());
  for (const char* pattern : patterns) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) paths.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return paths;
}

void* openFirstLibrary(const std::vector<std::string>& candidates, std::string& path, std::string& tried) {
  for (const std::string& p : candidates) {
    if (void* handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      path = p;
      return handle;
    }
    tried += (tried.empty() ? "" : ", ") + p;
  }
  return nullptr;
}

void* findSymbol(void* handle, const char* name, std::string& missing) {
  void* s = dlsym(handle, name);
  if (!s && missing.empty()) missing = name;
  return s;
}

}  // namespace pa::cuda
