// The `linear` layer: MatMul -> Add (bias) -> activation; fuse-linear finds it again. With
// residual / pre_norm / post_norm it is a residual block like attention and mlp.
#include "common/errors.h"
#include "frontend/layers/layer.h"

namespace pa {

namespace {

class LinearLayer : public Layer {
public:
  int64_t units = 0;
  std::string activation = "none";  // relu | gelu | gelu_tanh | silu | tanh | sigmoid | none
  bool bias = true;
  BlockOptions block;

  ValueId lower(LayerLowering& L, ValueId x) const override {
    const int64_t width = L.g.shape(x).back();
    if (block.residual && width != units)
      throw ConfigError(location, path + ".linear.residual",
                        "a residual adds the input to the output, but units " + std::to_string(units) +
                            " differs from the input width " + std::to_string(width));
    return L.block(x, block, [&](ValueId h) { return L.linear(h, units, activation, bias, ""); });
  }
  std::string resolved() const override {
    return "linear: {units: " + std::to_string(units) + ", activation: " + activation +
           ", bias: " + (bias ? "true" : "false") + printBlockOptions(block) + "}";
  }
  std::string origin() const override { return "linear.units = " + std::to_string(units); }
  std::string predictionKey() const override { return "linear.units"; }
  bool hasRelu() const override { return activation == "relu"; }
};

}  // namespace

std::unique_ptr<Layer> parseLinearLayer(const CfgNode& n) {
  auto l = std::make_unique<LinearLayer>();
  n.checkKeys({"units", "activation", "bias", "residual", "pre_norm", "post_norm"});
  l->units = n.child("units").asInt();
  if (l->units < 1) n.child("units").fail("must be at least 1");
  l->activation = n.getChoice("activation", l->activation, {"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "none"});
  l->bias = n.getBool("bias", l->bias);
  l->block = parseBlockOptions(n);
  return l;
}

}  // namespace pa
