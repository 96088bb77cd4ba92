// Tensor shapes: small vectors of extents, row-major, with numpy broadcasting.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <llvm/ADT/ArrayRef.h>
#include <llvm/ADT/SmallVector.h>

namespace pa {

using Shape = llvm::SmallVector<int64_t, 6>;

// The most elements one tensor may hold: 2^48 (1 PiB of fp32, beyond any device). Graph::add
// refuses larger values, so every product of extents of a graph's shapes, and every byte count
// derived from one (elements × an 8-byte dtype, alignment, a few tensors summed), stays exact in
// int64 without further checks.
constexpr int64_t kMaxElements = int64_t{1} << 48;

// The most dimensions one tensor may have: the CPU kernels' strided views hold this many
// (cpu::kMaxRank); Graph::add refuses more, so a config cannot reach them with a larger rank.
constexpr int kMaxRank = 8;

// a * b, false when the product is negative, overflows or exceeds kMaxElements.
inline bool checkedMul(int64_t a, int64_t b, int64_t& out) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > kMaxElements) return false;
  out = r;
  return true;
}

// The element count of `s`; false for a negative extent or more than kMaxElements elements
// (the product is checked at every step, so no intermediate can overflow).
inline bool checkedNumel(llvm::ArrayRef<int64_t> s, int64_t& out) {
  int64_t n = 1;
  for (int64_t d : s)
    if (!checkedMul(n, d, n)) return false;
  out = n;
  return true;
}

// The element count of a shape that is known to be valid: a graph value's (Graph::add checked
// it with checkedNumel) or a part of one. Anything from outside goes through checkedNumel.
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

// The element count of any shape as text, exact or as a power of ten ("1000000000000",
// "about 1.2e+24") where it does not fit int64 (messages about sizes that are too large).
inline std::string elementCountString(llvm::ArrayRef<int64_t> s) {
  int64_t n = 1;
  bool exact = true;
  for (int64_t d : s) exact = exact && d >= 0 && !__builtin_mul_overflow(n, d, &n);
  if (exact) return std::to_string(n);
  long double approx = 1;
  for (int64_t d : s) approx *= static_cast<long double>(d);
  char buf[64];
  std::snprintf(buf, sizeof buf, "about %.2Le", approx);
  return buf;
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
