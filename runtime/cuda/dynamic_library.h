// Libraries loaded at run time with dlopen (cuBLASLt, NCCL): where to look, the first that loads,
// and their symbols.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace pa::cuda {

// Where a library may be: $envVar alone when it is set, else `names` (the loader's search path,
// then fixed paths), then every match of the glob `patterns` (Python wheels).
std::vector<std::string> libraryCandidates(const char* envVar, std::initializer_list<const char*> names,
                                           std::initializer_list<const char*> patterns);

// The first candidate that dlopen loads (RTLD_NOW | RTLD_LOCAL), with `path` set to it; null when
// none does, with `tried` listing them.
void* openFirstLibrary(const std::vector<std::string>& candidates, std::string& path, std::string& tried);

// Symbol `name` of `handle` into `slot`; the first name missing goes to `missing`.
void* findSymbol(void* handle, const char* name, std::string& missing);
template <class F>
void resolveSymbol(void* handle, F*& slot, const char* name, std::string& missing) {
  slot = reinterpret_cast<F*>(findSymbol(handle, name, missing));
}

}  // namespace pa::cuda
