// The op table generated from ops.def.
#include "graph/op.h"

#include <cstring>
#include <utility>

namespace pa {

namespace {
const OpInfo kOps[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, TensorCoreIns, Fp32Ins, Fp32Outs) \
  {OpKind::Name, Kebab, MinIn, MaxIn, FusionKind::Fusion, GradKind::Grad, Attrs, TensorCoreIns, Fp32Ins, Fp32Outs},
#include "graph/ops.def"
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumOps, "op table out of step with ops.def");
}  // namespace

const OpInfo& opInfo(OpKind k) { return kOps[static_cast<int>(k)]; }
const char* opName(OpKind k) { return kOps[static_cast<int>(k)].name; }

const char* fusionKindName(FusionKind k) {
  switch (k) {
  case FusionKind::Elementwise: return "elementwise";
  case FusionKind::Broadcast: return "broadcast";
  case FusionKind::Injective: return "injective";
  case FusionKind::Reduction: return "reduction";
  case FusionKind::Opaque: return "opaque";
  }
  return "?";
}

bool opFromName(const std::string& name, OpKind& out) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) {
      out = info.kind;
      return true;
    }
  }
  return false;
}

bool opHasAttr(OpKind k, const std::string& attr) {
  const std::string list = std::string(" ") + opInfo(k).attrs + " ";
  return !attr.empty() && list.find(" " + attr + " ") != std::string::npos;
}

bool attrKindOf(const std::string& attr, AttrKind& out) {
  // A key declared twice in attrs.def (two defaults) has one kind: graph_test checks it.
  static const std::pair<const char*, AttrKind> kKinds[] = {
#define PA_ATTR(Name, Key, Kind, Default) {Key, AttrKind::Kind},
#include "graph/attrs.def"
  };
  for (const auto& k : kKinds)
    if (attr == k.first) {
      out = k.second;
      return true;
    }
  return false;
}

std::string allOpNames() {
  std::string r;
  for (const OpInfo& info : kOps) r += (r.empty() ? "" : ", ") + std::string(info.name);
  return r;
}

}  // namespace pa
