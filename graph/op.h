// The op enum and its static facts, generated from ops.def.
#pragma once

#include <string>

#include "graph/attrs.h"

namespace pa {

enum class OpKind {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs) Name,
#include "graph/ops.def"
};

constexpr int kNumOps = 0
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs) +1
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
