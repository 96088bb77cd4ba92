// The pass-pipeline policy: which passes run for which settings.
#include "passes/pipeline.h"

namespace pa {

TrainPipeline trainPipeline(const std::vector<std::string>& configured, Precision precision, bool noFuse,
                            bool biasGradInProduct) {
  TrainPipeline p;
  bool elementwise = false, linear = false, mlp = false;
  for (const std::string& name : configured) {
    const bool fusion = name.rfind("fuse-", 0) == 0;
    if (fusion && noFuse) continue;
    elementwise |= name == "fuse-elementwise";
    linear |= name == "fuse-linear";
    mlp |= name == "fuse-mlp";
    p.forward.push_back(name);
  }
  const bool bf16 = precision == Precision::Bf16;
  p.training = {"autodiff"};
  if (elementwise) p.training.push_back("fuse-loss");
  if (elementwise && mlp) p.training.push_back("fuse-mlp-train");
  if (linear) p.training.push_back("fuse-linear-grad");
  if (linear && biasGradInProduct) p.training.push_back("fuse-bias-grad");
  if (elementwise) p.training.push_back("fuse-elementwise");
  // dce after lower-bf16: a value it no longer reads (a reshape whose readers now take the
  // reshaped cast) is dead then.
  p.training.push_back("cse");
  if (bf16) p.training.push_back("lower-bf16");
  p.training.insert(p.training.end(), {"dce", "verify"});
  p.validation = p.forward;
  if (bf16) p.validation.insert(p.validation.end(), {"lower-bf16", "dce"});
  return p;
}

PassTarget passTargetOf(Precision precision) {
  PassTarget t;
  t.operands16Bit = precision == Precision::Bf16;
  return t;
}

}  // namespace pa
