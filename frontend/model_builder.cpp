// Model building: the layer sugar (each kind in frontend/layers/ lowers itself) or the explicit
// nodes of model.nodes, then the target input and the loss.
#include "frontend/model_builder.h"

#include <cmath>
#include <map>
#include <utility>

namespace pa {

namespace {

Shape withBatch(int64_t batch, const std::vector<int64_t>& s) {
  Shape r{batch};
  r.append(s.begin(), s.end());
  return r;
}

Attr attrFromYaml(const std::string& key, const CfgNode& n) {
  if (n.isSequence()) {
    // Integers give an integer list (shapes, axes); any other number makes it a float list
    // (constant data; YAML writes infinities as .inf and -.inf).
    std::vector<double> d;
    bool ints = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string s = n.item(i).asString();
      if (s == ".inf" || s == "-.inf" || s == "+.inf") {
        d.push_back(s[0] == '-' ? -HUGE_VAL : HUGE_VAL);
        ints = false;
        continue;
      }
      size_t used = 0;
      try {
        std::stoll(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != s.size()) ints = false;
      d.push_back(n.item(i).asDouble());
    }
    if (ints) return n.asInts();
    return d;
  }
  if (!n.isScalar()) n.fail("attribute '" + key + "' must be a number, a string, a boolean or a list of integers");
  const std::string s = n.asString();
  if (s == "true" || s == "false") return s == "true";
  if (s == ".inf" || s == "+.inf" || s == "-.inf") return s[0] == '-' ? -HUGE_VAL : HUGE_VAL;  // YAML's infinities
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return static_cast<int64_t>(i);
  } catch (const std::exception&) {
  }
  try {
    size_t used = 0;
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

// Why `name` cannot name a value of an explicit graph, or "" when it can: the builder, autodiff
// and lower-bf16 give values names of their own, and a user value of such a name would collide
// with one of them after the model is built.
std::string reservedNameReason(const std::string& name) {
  const char* kReserved = "reserved names: input, target, loss, grad_seed; names starting with 'grad/' or "
                          "'zero_grad/', ending in '.bf16' or '.f32', or holding ':'";
  auto startsWith = [&](const char* p) { return name.rfind(p, 0) == 0; };
  auto endsWith = [&](const std::string& x) {
    return name.size() >= x.size() && name.compare(name.size() - x.size(), x.size(), x) == 0;
  };
  if (name == "input" || name == "target" || name == "loss" || name == "grad_seed" || startsWith("grad/") ||
      startsWith("zero_grad/") || endsWith(".bf16") || endsWith(".f32") || name.find(':') != std::string::npos)
    return "'" + name + "' is a name the trainer gives values of its own (" + kReserved + ")";
  if (name.empty()) return "a value needs a name";
  return "";
}

// The ops a model may write: every op but the graph's own inputs and parameters (declared
// under `params`) and the backward-only ops autodiff emits (they have no gradient of their own,
// so a model using one could not be trained). Constants and fused ops are writable.
bool writableOp(OpKind k) {
  return k != OpKind::Input && k != OpKind::Param && opInfo(k).grad != GradKind::BackwardOnly;
}

ValueId buildExplicit(Graph& g, const ModelConfig& m, ValueId x) {
  std::map<std::string, ValueId> named{{"input", x}};
  for (const ExplicitParam& p : m.params) {
    const std::string key = "model.params." + p.name;
    const std::string reserved = reservedNameReason(p.name);
    if (!reserved.empty()) throw ConfigError(p.nameLocation, key, reserved);
    try {
      named[p.name] = g.addParam(p.name, Shape(p.shape.begin(), p.shape.end()), p.init);
    } catch (const ShapeError& e) {
      throw ConfigError(p.location, key + ".shape", e.what());
    }
    g.node(g.value(named[p.name]).producer).origin = p.location + ": " + key + ".shape = " + shapeString(p.shape);
  }
  for (const ExplicitNode& e : m.nodes) {
    OpKind op;
    const bool known = opFromName(e.op, op);
    if (!known || !writableOp(op)) {
      std::vector<std::string> valid;
      for (int k = 0; k < kNumOps; ++k)
        if (writableOp(static_cast<OpKind>(k))) valid.push_back(opInfo(static_cast<OpKind>(k)).name);
      std::string why;
      if (!known) {
        const std::string near = closestMatch(e.op, valid);
        why = "unknown op '" + e.op + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?");
      } else if (op == OpKind::Input || op == OpKind::Param) {
        why = "op '" + e.op + "' cannot be written as a node (the graph's input is 'input'; parameters are declared "
              "under model.params).";
      } else {
        why = "op '" + e.op + "' is backward-only: autodiff emits it, and it has no gradient of its own, so a model "
              "using it cannot be trained.";
      }
      throw ConfigError(e.location, e.path + ".op", why + " Valid ops: " + joinChoices(valid));
    }
    std::vector<ValueId> ins;
    for (const std::string& name : e.inputs) {
      auto it = named.find(name);
      if (it == named.end())
        throw ConfigError(e.location, e.path + ".inputs", "no value named '" + name +
                                                          "' (inputs may name 'input', a parameter, or an earlier node's output)");
      ins.push_back(it->second);
    }
    AttrMap a;
    for (const auto& kv : e.attrs) {
      if (!opHasAttr(op, kv.first)) {
        std::vector<std::string> valid;
        std::string list = opInfo(op).attrs;
        for (size_t p = 0; p < list.size();) {
          size_t q = list.find(' ', p);
          if (q == std::string::npos) q = list.size();
          valid.push_back(list.substr(p, q - p));
          p = q + 1;
        }
        kv.second.fail("op '" + e.op + "' has no attribute '" + kv.first + "'" +
                       (valid.empty() ? " (it takes none)" : "; valid: " + joinChoices(valid)));
      }
      Attr value = attrFromYaml(kv.first, kv.second);
      AttrKind kind;
      if (attrKindOf(kv.first, kind) && !attrHolds(kind, value))
        kv.second.fail("attribute '" + kv.first + "' of op '" + e.op + "' must be " + attrKindDescription(kind) +
                       ", got " + attrString(value));
      a.set(kv.first, std::move(value));
    }
    if (named.count(e.output)) throw ConfigError(e.location, e.path + ".output", "a value named '" + e.output + "' already exists");
    const std::string reserved = reservedNameReason(e.output);
    if (!reserved.empty()) throw ConfigError(e.location, e.path + ".output", reserved);
    try {
      named[e.output] = g.add(op, ins, a, e.output);
    } catch (const ShapeError& err) {  // arity, shapes, attribute values: name the YAML node
      throw ConfigError(e.location, e.path, e.op + ": " + err.what());
    }
    g.node(g.value(named[e.output]).producer).origin = e.location + ": " + e.path + " (op " + e.op + ")";
  }
  auto it = named.find(m.output);
  if (it == named.end()) {
    std::vector<std::string> defined;
    for (const auto& kv : named) defined.push_back(kv.first);
    const std::string near = closestMatch(m.output, defined);
    throw ConfigError(m.outputLocation, "model.output", "no value named '" + m.output + "'" +
                                                (near.empty() ? "" : "; did you mean '" + near + "'?") +
                                                " Defined values: " + joinChoices(defined));
  }
  return it->second;
}

// Where the prediction comes from, for messages about its shape: the last layer, or the node
// (else model.output) that defines model.output.
std::pair<std::string, std::string> predictionSource(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  if (!m.explicitGraph()) {
    const Layer& l = *m.layers.back();
    return {l.location, l.path + "." + l.predictionKey()};
  }
  for (const ExplicitNode& e : m.nodes)
    if (e.output == m.output) return {e.location, e.path};
  return {m.outputLocation, "model.output"};
}

}  // namespace

BuiltModel buildModel(const Config& cfg, const std::vector<int64_t>& sampleX, const std::vector<int64_t>& sampleY,
                      int64_t batch) {
  BuiltModel bm;
  Graph& g = bm.graph;
  const ModelConfig& m = cfg.model;
  std::vector<int64_t> inShape = m.input.empty() ? sampleX : m.input;
  int64_t inCount = 0, sampleCount = 0, targetCount = 0;
  if (!checkedNumel(sampleX, sampleCount) || !checkedNumel(sampleY, targetCount))
    cfg.where.fail("data", "a sample " + shapeString(sampleX) + " -> " + shapeString(sampleY) +
                               " holds more than 2^48 elements");
  // + 1: the batch's dimension. (Samples of the data kinds have at most 2 dimensions.)
  if (m.input.size() + 1 > static_cast<size_t>(kMaxRank))
    throw ConfigError(m.inputLocation, "model.input",
                      shapeString(m.input) + " has " + std::to_string(m.input.size()) + " dimensions, " +
                          std::to_string(m.input.size() + 1) + " with the batch's; a tensor may have at most " +
                          std::to_string(kMaxRank));
  if (!checkedNumel(inShape, inCount))
    throw ConfigError(m.inputLocation, "model.input", shapeString(inShape) + " holds " + elementCountString(inShape) +
                                                          " elements, more than 2^48; no machine holds a tensor that large");
  if (inCount != sampleCount)
    throw ConfigError(m.inputLocation, "model.input", shapeString(inShape) + " holds " + std::to_string(inCount) +
                                                          " elements but one data sample " + shapeString(sampleX) +
                                                          " holds " + std::to_string(sampleCount));
  try {
    bm.x = g.addInput("input", withBatch(batch, inShape));
  } catch (const ShapeError&) {
    cfg.where.fail("train.batch_size", std::to_string(batch) + " samples of " + shapeString(inShape) +
                                           " make an input batch of " + elementCountString(withBatch(batch, inShape)) +
                                           " elements, more than 2^48; no machine holds a tensor that large");
  }
  {
    const std::string at = cfg.where.location("train.batch_size");
    g.node(g.value(bm.x).producer).origin = (at.empty() ? "" : at + ": ") + "train.batch_size = " + std::to_string(batch);
  }
  ValueId h = bm.x;
  if (m.explicitGraph()) {
    h = buildExplicit(g, m, bm.x);
  } else {
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const Layer& l = *m.layers[i];
      LayerLowering L{g, "layers." + std::to_string(i)};
      const size_t firstNode = g.numNodes();
      try {
        h = l.lower(L, h);
      } catch (const ShapeError& e) {  // sizes too large, shapes that do not fit: name the layer
        throw ConfigError(l.location, l.path + "." + l.kind, e.what());
      }
      // Every node of the layer, its parameters too: a message about a size (a weight or an
      // activation that does not fit in memory) names the layer that made it.
      const std::string origin = l.location + ": " + l.path + "." + l.origin();
      for (size_t id = firstNode; id < g.numNodes(); ++id) g.node(static_cast<NodeId>(id)).origin = origin;
    }
  }
  const Shape ps = g.shape(h);
  int64_t expected = 0;
  if (ps.empty() || ps[0] != batch || !checkedMul(batch, targetCount, expected) || numel(ps) != expected) {
    const auto [location, key] = predictionSource(cfg);
    throw ConfigError(location, key, "the model's prediction " + shapeString(ps) + " does not match the target " +
                                         shapeString(withBatch(batch, sampleY)) +
                                         " (batch first; a sample's prediction must hold as many elements as its "
                                         "target, " + std::to_string(targetCount) + ")");
  }
  bm.y = g.addInput("target", ps);  // the target is reshaped to the prediction's shape
  g.setOutput("prediction", h);
  g.setOutput("loss", g.add(OpKind::MseLoss, {h, bm.y}, {}, "loss"));
  return bm;
}

}  // namespace pa
