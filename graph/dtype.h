// Element types of graph values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace pa {

enum class DType { F32, F64, BF16, F16 };

inline const char* dtypeName(DType t) {
  switch (t) {
  case DType::F32: return "f32";
  case DType::F64: return "f64";
  case DType::BF16: return "bf16";
  case DType::F16: return "f16";
  }
  return "?";
}

// The inverse of dtypeName; false for any other string.
inline bool dtypeFromName(const std::string& s, DType& out) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16})
    if (s == dtypeName(t)) {
      out = t;
      return true;
    }
  return false;
}

inline size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F32: return 4;
  case DType::F64: return 8;
  case DType::BF16: return 2;
  case DType::F16: return 2;
  }
  return 0;
}

// The bfloat16 nearest to `x` (ties to even), as __float2bfloat16 does, as its 16 bits; NaN
// stays NaN.
inline uint16_t bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16Value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// `x` rounded to the nearest bfloat16 value.
inline float roundToBf16(float x) { return bf16Value(bf16Bits(x)); }

}  // namespace pa
