// The `norm` layer: LayerNorm or RMSNorm over the features, with a learnable gain (and bias).
#include "frontend/layers/layer.h"

namespace pa {

namespace {

class NormLayer : public Layer {
public:
  NormSpec spec;

  ValueId lower(LayerLowering& L, ValueId x) const override { return L.norm(x, spec, ""); }
  std::string resolved() const override { return "norm: " + printNorm(spec); }
};

}  // namespace

std::unique_ptr<Layer> parseNormLayer(const CfgNode& n) {
  auto l = std::make_unique<NormLayer>();
  l->spec = parseNormSpec(n);
  return l;
}

}  // namespace pa
