// Element types of graph values.
#pragma once

#include <cstddef>

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

inline size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F32: return 4;
  case DType::F64: return 8;
  case DType::BF16: return 2;
  case DType::F16: return 2;
  }
  return 0;
}

}  // namespace pa
