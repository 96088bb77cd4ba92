// The `linear` layer: MatMul -> Add (bias) -> activation; fuse-linear finds it again.
#include "frontend/layers/layer.h"

namespace pa {

namespace {

class LinearLayer : public Layer {
public:
  int64_t units = 0;
  std::string activation = "none";  // relu | gelu | tanh | sigmoid | none
  bool bias = true;

  ValueId lower(LayerLowering& L, ValueId x) const override { return L.linear(x, units, activation, bias, ""); }
  std::string resolved() const override {
    return "linear: {units: " + std::to_string(units) + ", activation: " + activation +
           ", bias: " + (bias ? "true" : "false") + "}";
  }
  std::string origin() const override { return "linear.units = " + std::to_string(units); }
  std::string predictionKey() const override { return "linear.units"; }
  bool hasRelu() const override { return activation == "relu"; }
};

}  // namespace

std::unique_ptr<Layer> parseLinearLayer(const CfgNode& n) {
  auto l = std::make_unique<LinearLayer>();
  n.checkKeys({"units", "activation", "bias"});
  l->units = n.child("units").asInt();
  if (l->units < 1) n.child("units").fail("must be at least 1");
  l->activation = n.getChoice("activation", l->activation, {"relu", "gelu", "tanh", "sigmoid", "none"});
  l->bias = n.getBool("bias", l->bias);
  return l;
}

}  // namespace pa
