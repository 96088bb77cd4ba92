// The `position` layer: absolute positions added to a sequence [batch, seq, features], a learned
// [seq, features] table or the fixed sinusoidal one of "Attention Is All You Need".
#include <cmath>

#include "common/errors.h"
#include "frontend/layers/layer.h"

namespace pa {

namespace {

class PositionLayer : public Layer {
public:
  std::string kind = "learned";  // learned | sinusoidal

  ValueId lower(LayerLowering& L, ValueId x) const override {
    const Shape xs = L.g.shape(x);
    if (xs.size() != 3)
      throw ConfigError(location, path + ".position", "needs a sequence input [seq, features] per sample, got " +
                                                          shapeString(Shape(xs.begin() + 1, xs.end())));
    const int64_t seq = xs[1], f = xs[2];
    ValueId table;
    if (kind == "learned") {
      table = L.param("table", {seq, f}, "normal");
    } else {
      // table[s, 2i] = sin(s / 10000^(2i/f)), table[s, 2i+1] = cos(the same angle)
      std::vector<double> data(static_cast<size_t>(seq * f));
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t j = 0; j < f; ++j) {
          const double angle = static_cast<double>(s) / std::pow(10000.0, static_cast<double>(j - j % 2) / static_cast<double>(f));
          data[static_cast<size_t>(s * f + j)] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
        }
      table = L.g.add(OpKind::Constant, {}, AttrMap().set<attr::Shape>({seq, f}).set<attr::Data>(data), L.prefix + ".sinusoid");
    }
    return L.g.add(OpKind::Add, {x, table});
  }
  std::string resolved() const override { return "position: {kind: " + kind + "}"; }
};

}  // namespace

std::unique_ptr<Layer> parsePositionLayer(const CfgNode& n) {
  auto l = std::make_unique<PositionLayer>();
  if (!n.isMap()) n.fail("expected a map {kind: learned|sinusoidal}");
  n.checkKeys({"kind"});
  l->kind = n.getChoice("kind", l->kind, {"learned", "sinusoidal"});
  return l;
}

}  // namespace pa
