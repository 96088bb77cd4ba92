// The op enum and its static facts, generated from ops.def.
#pragma once

#include <cstdint>
#include <string>

#include "graph/attrs.h"

namespace pa {

// A bit set of input or output indices, as ops.def writes it: slots(0, 1).
template <class... I> constexpr uint32_t slots(I... i) { return (0u | ... | (1u << i)); }

enum class OpKind {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) Name,
#include "graph/ops.def"
};

constexpr int kNumOps = 0
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) +1
#include "graph/ops.def"
    ;

enum class FusionKind { Elementwise, Broadcast, Injective, Reduction, Opaque };
enum class GradKind { Leaf, Differentiable, BackwardOnly };

struct OpInfo {
  OpKind kind;
  const char* name;  // kebab-case, as written in YAML and printed graphs
  int minInputs;
  int maxInputs;
  FusionKind fusion;
  GradKind grad;
  const char* attrs;  // space-separated attribute names
  uint32_t tensorCoreInputs;  // slots(): inputs multiplied on tensor cores (bf16 under precision: bf16)
  uint32_t fp32Inputs;        // slots(): inputs read as fp32 whatever the precision (sink logits, log-sum-exp)
  uint32_t fp32Outputs;       // slots(): outputs written in fp32 whatever the precision
  bool isTensorCoreInput(size_t i) const { return i < 32 && (tensorCoreInputs >> i & 1u) != 0; }
  bool isFp32Input(size_t i) const { return i < 32 && (fp32Inputs >> i & 1u) != 0; }
  bool isFp32Output(size_t i) const { return i < 32 && (fp32Outputs >> i & 1u) != 0; }
};

const OpInfo& opInfo(OpKind k);
const char* opName(OpKind k);
const char* fusionKindName(FusionKind k);
// Finds an op by its kebab-case name; false when unknown.
bool opFromName(const std::string& name, OpKind& out);
// Whether `attr` is one of the op's attribute names.
bool opHasAttr(OpKind k, const std::string& attr);
// Every op's name, for error messages that list the valid choices.
std::string allOpNames();

// The type attribute `attr` holds (a name means the same thing on every op that takes it);
// false for a name no op takes.
bool attrKindOf(const std::string& attr, AttrKind& out);

}  // namespace pa
