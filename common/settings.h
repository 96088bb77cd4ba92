// Typed run settings that every layer reads: the training precision and who runs the GEMMs.
// frontend/config parses them once from their YAML names; nothing downstream compares strings.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace pa {

// precision: (README, "Config reference").
enum class Precision { Fp32, Fp64, Tf32, Bf16 };

// Who runs the GEMM nodes (MatMul, FusedLinear, MatMulActGrad) on the GPU: the generated
// kernels, cuBLASLt, or whichever of the two measures faster for each node (compiler.gemm).
enum class GemmProvider { Generated, Cublaslt, Auto };

// Every value, in the order messages list them.
constexpr Precision kPrecisions[] = {Precision::Fp32, Precision::Fp64, Precision::Tf32, Precision::Bf16};
constexpr GemmProvider kGemmProviders[] = {GemmProvider::Generated, GemmProvider::Cublaslt, GemmProvider::Auto};

// The names configs use ("fp32", "tf32", ...).
inline const char* precisionName(Precision p) {
  switch (p) {
  case Precision::Fp32: return "fp32";
  case Precision::Fp64: return "fp64";
  case Precision::Tf32: return "tf32";
  case Precision::Bf16: return "bf16";
  }
  return "?";
}

// The names configs use ("generated", "cublaslt", "auto").
inline const char* gemmProviderName(GemmProvider p) {
  switch (p) {
  case GemmProvider::Generated: return "generated";
  case GemmProvider::Cublaslt: return "cublaslt";
  case GemmProvider::Auto: return "auto";
  }
  return "?";
}

// The setting a name stands for; false for a name that is none.
inline bool parsePrecision(const std::string& name, Precision& out) {
  for (Precision p : kPrecisions)
    if (name == precisionName(p)) return out = p, true;
  return false;
}
inline bool parseGemmProvider(const std::string& name, GemmProvider& out) {
  for (GemmProvider p : kGemmProviders)
    if (name == gemmProviderName(p)) return out = p, true;
  return false;
}

// The names of every value of a setting, in kPrecisions / kGemmProviders order.
template <class E, std::size_t N> std::vector<std::string> settingNames(const E (&values)[N], const char* (*name)(E)) {
  std::vector<std::string> r;
  for (E v : values) r.push_back(name(v));
  return r;
}

}  // namespace pa
