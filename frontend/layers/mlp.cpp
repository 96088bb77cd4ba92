// The `mlp` layer: up projection, activation (or SwiGLU's gated pair), down projection back to
// the input width, inside the residual block's norms and add.
#include "frontend/layers/layer.h"

namespace pa {

namespace {

class MlpLayer : public Layer {
public:
  int64_t hidden = 0;
  std::string activation = "gelu";  // relu | gelu | gelu_tanh | silu | swiglu
  bool bias = true;
  BlockOptions block;

  ValueId lower(LayerLowering& L, ValueId x) const override {
    const int64_t width = L.g.shape(x).back();
    return L.block(x, block, [&](ValueId h) {
      ValueId up;
      if (activation == "swiglu") {  // silu(x·gate) ⊙ (x·up), as Llama's MLP
        const ValueId gate = L.linear(h, hidden, "silu", bias, "gate_");
        up = L.g.add(OpKind::Mul, {gate, L.linear(h, hidden, "none", bias, "up_")});
      } else {
        up = L.linear(h, hidden, activation, bias, "up_");
      }
      return L.linear(up, width, "none", bias, "down_");
    });
  }
  std::string resolved() const override {
    return "mlp: {hidden: " + std::to_string(hidden) + ", activation: " + activation + ", bias: " + (bias ? "true" : "false") +
           printBlockOptions(block) + "}";
  }
  std::string origin() const override { return "mlp.hidden = " + std::to_string(hidden); }
  bool hasRelu() const override { return activation == "relu"; }
};

}  // namespace

std::unique_ptr<Layer> parseMlpLayer(const CfgNode& n) {
  auto l = std::make_unique<MlpLayer>();
  if (!n.isMap()) n.fail("expected a map {hidden: N, activation: gelu, ...}");
  n.checkKeys({"hidden", "activation", "bias", "residual", "pre_norm", "post_norm"});
  l->hidden = n.getIntIn("hidden", 0, 1, int64_t{1} << 31);
  if (!n.has("hidden")) n.fail("missing required key 'hidden' (the width of the inner layer)");
  l->activation = n.getChoice("activation", l->activation, {"relu", "gelu", "gelu_tanh", "silu", "swiglu"});
  l->bias = n.getBool("bias", l->bias);
  l->block = parseBlockOptions(n);
  return l;
}

}  // namespace pa
