// FNV-1a, 64 bits: the project's hash for names, parameter checks and checksums (not for
// security). Chained calls hash the concatenation: fnv1a(b, nb, fnv1a(a, na)).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pa {

constexpr uint64_t kFnvBasis = 1469598103934665603ull;

inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvBasis) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace pa
