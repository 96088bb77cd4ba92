// Typed run settings that every layer reads: the training precision and who runs the GEMMs.
// frontend/config parses them once from their YAML names; nothing downstream compares strings.
#pragma once

#include <string>

namespace pa {

// precision: (README, "Config reference").
enum class Precision { Fp32, Fp64, Tf32, Bf16 };

// Who runs the GEMM nodes (MatMul, FusedLinear, MatMulActGrad) on the GPU: the generated
// kernels, cuBLASLt, or whichever of the two measures faster for each node (compiler.gemm).
enum class GemmProvider { Generated, Cublaslt, Auto };

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
  for (Precision p : {Precision::Fp32, Precision::Fp64, Precision::Tf32, Precision::Bf16})
    if (name == precisionName(p)) return out = p, true;
  return false;
}
inline bool parseGemmProvider(const std::string& name, GemmProvider& out) {
  for (GemmProvider p : {GemmProvider::Generated, GemmProvider::Cublaslt, GemmProvider::Auto})
    if (name == gemmProviderName(p)) return out = p, true;
  return false;
}

}  // namespace pa
