// Tensor shapes: small vectors of extents, row-major, with numpy broadcasting.
#pragma once

#include <cstdint>
#include <string>

#include <llvm/ADT/ArrayRef.h>
#include <llvm/ADT/SmallVector.h>

namespace pa {

using Shape = llvm::SmallVector<int64_t, 6>;

inline int64_t numel(llvm::ArrayRef<int64_t> s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline std::string shapeString(llvm::ArrayRef<int64_t> s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Numpy broadcasting of two shapes; returns false when they are incompatible.
inline bool broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b, Shape& out) {
  const size_t rank = a.size() > b.size() ? a.size() : b.size();
  out.assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

// Row-major strides of a contiguous tensor.
inline Shape contiguousStrides(llvm::ArrayRef<int64_t> s) {
  Shape st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// Normalises a possibly negative axis; returns -1 when out of range.
inline int normaliseAxis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < 0) axis += r;
  return axis >= 0 && axis < r ? static_cast<int>(axis) : -1;
}

}  // namespace pa
