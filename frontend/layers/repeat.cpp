// The `repeat` layer: a list of layers stacked `times` times with distinct parameters
// ("blocks.<r>.<key>.<what>"), and overrides cycled over the repeats (gpt-oss's alternation of
// windowed and full attention is `overrides: [{attention: {window: 128}}, {}]`).
#include <map>

#include "frontend/layers/layer.h"

namespace pa {

namespace {

class RepeatLayer : public Layer {
public:
  int64_t times = 1;
  std::string name = "blocks";
  std::vector<std::string> keys;                               // per layer of the list: kind, or kind_k
  std::vector<std::shared_ptr<const Layer>> base;                 // the list as written, for printing
  // [override][layer]: the list with override i applied; repeat r lowers variants[r % size]
  // (one variant, the list itself, without overrides).
  std::vector<std::vector<std::shared_ptr<const Layer>>> variants;
  std::string overrides;                                          // as written, flow YAML ("" when none)

  ValueId lower(LayerLowering& L, ValueId x) const override {
    for (int64_t r = 0; r < times; ++r) {
      const auto& layers = variants[static_cast<size_t>(r) % variants.size()];
      for (size_t j = 0; j < layers.size(); ++j) {
        LayerLowering sub{L.g, (L.inRepeat ? L.prefix + "." : std::string()) + name + "." + std::to_string(r) + "." + keys[j], true};
        x = layers[j]->lower(sub, x);
      }
    }
    return x;
  }
  std::string resolved() const override {
    std::string s = "repeat: {times: " + std::to_string(times) + ", name: " + name + ", layers: [";
    for (size_t j = 0; j < base.size(); ++j) s += (j ? ", " : "") + std::string("{") + base[j]->resolved() + "}";
    s += "]";
    if (!overrides.empty()) s += ", overrides: " + overrides;
    return s + "}";
  }
  std::string origin() const override { return "repeat.times = " + std::to_string(times); }
  bool hasRelu() const override {
    for (const auto& variant : variants)
      for (const auto& l : variant)
        if (l->hasRelu()) return true;
    return false;
  }
};

}  // namespace

std::unique_ptr<Layer> parseRepeatLayer(const CfgNode& n) {
  auto l = std::make_unique<RepeatLayer>();
  if (!n.isMap()) n.fail("expected a map {times: N, layers: [...]}");
  n.checkKeys({"times", "name", "layers", "overrides"});
  if (!n.has("times")) n.fail("missing required key 'times'");
  l->times = n.getIntIn("times", 1, 1, 1 << 16);
  l->name = n.getString("name", l->name);
  if (l->name.empty() || l->name.find_first_of(". /:") != std::string::npos)
    n.child("name").fail("a parameter-name prefix without '.', '/', ':' or blanks, got '" + l->name + "'");
  if (!n.has("layers") || !n.child("layers").isSequence() || n.child("layers").size() == 0)
    n.fail("'layers' must be a non-empty list of layers");
  const CfgNode list = n.child("layers");
  // The key of each layer: its kind, or kind_k where a kind occurs more than once.
  std::map<std::string, int> count, seen;
  std::vector<std::string> kinds;
  for (size_t j = 0; j < list.size(); ++j) {
    const CfgNode item = list.item(j);
    l->base.push_back(parseLayer(item));
    kinds.push_back(l->base.back()->kind);
    ++count[kinds.back()];
  }
  for (const std::string& k : kinds) l->keys.push_back(count[k] == 1 ? k : k + "_" + std::to_string(seen[k]++));
  std::vector<CfgNode> overrides;
  if (n.has("overrides")) {
    const CfgNode ov = n.child("overrides");
    if (!ov.isSequence() || ov.size() == 0) ov.fail("expected a non-empty list, one map per repeat (cycled): [{attention: {window: 128}}, {}]");
    for (size_t i = 0; i < ov.size(); ++i) {
      const CfgNode o = ov.item(i);
      if (!o.isMap() && !o.yaml().IsNull()) o.fail("expected a map from a layer's key (" + joinChoices(l->keys) + ") to the keys it changes");
      if (o.isMap()) {
        o.checkKeys(l->keys);
        for (const std::string& key : o.keys())
          if (!o.child(key).isMap()) o.child(key).fail("expected a map of the keys this repeat changes");
      }
      overrides.push_back(o);
    }
    YAML::Emitter e;
    e << YAML::Flow << ov.yaml();
    l->overrides = e.c_str();
  }
  if (overrides.empty()) l->variants.push_back(l->base);
  for (const CfgNode& ov : overrides) {
    const CfgNode* o = &ov;
    std::vector<std::shared_ptr<const Layer>> run;
    for (size_t j = 0; j < list.size(); ++j) {
      if (!o->has(l->keys[j])) {
        run.push_back(l->base[j]);
        continue;
      }
      // The layer parsed from the override's own map with the written layer's other keys lent
      // to it for the parse (and taken back after): every key keeps its place in the file, so a
      // mistake is reported where it is written (YAML::Clone would drop the positions).
      const CfgNode item = list.item(j);
      const CfgNode change = o->child(l->keys[j]);
      const YAML::Node base = item.yaml()[kinds[j]];
      if (!base.IsMap() && !base.IsNull())
        change.fail("the layer " + l->keys[j] + " is written as a single value; write it as a map to override its keys");
      YAML::Node body = change.yaml();
      const YAML::Node& lookup = body;  // (a const lookup inserts nothing)
      std::vector<YAML::Node> lent;
      if (base.IsMap())
        for (auto it = base.begin(); it != base.end(); ++it)
          if (!lookup[change.scalarKey(it->first)]) {
            body.force_insert(it->first, it->second);
            lent.push_back(it->first);
          }
      std::shared_ptr<Layer> layer;
      try {
        for (const LayerKind& k : layerKinds())
          if (kinds[j] == k.name) layer = k.parse(change.with(body, change.path()));
        layer->kind = kinds[j];
        layer->path = o->path();  // messages name the override: ...overrides[0].attention.heads
        layer->location = change.location();
      } catch (...) {
        for (const YAML::Node& k : lent) body.remove(k);
        throw;
      }
      for (const YAML::Node& k : lent) body.remove(k);
      run.push_back(layer);
    }
    l->variants.push_back(std::move(run));
  }
  return l;
}

}  // namespace pa
