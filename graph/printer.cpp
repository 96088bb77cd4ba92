// Graph printers. Output is deterministic (sorted attributes, insertion order of nodes).
#include "graph/printer.h"

#include <cstdio>
#include <sstream>

namespace pa {

std::string attrString(const Attr& a) {
  if (auto* i = std::get_if<int64_t>(&a)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&a)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", *d);
    return buf;
  }
  if (auto* b = std::get_if<bool>(&a)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&a)) return "\"" + *s + "\"";
  if (auto* v = std::get_if<std::vector<int64_t>>(&a)) return shapeString(*v);
  const auto& d = std::get<std::vector<double>>(a);
  std::string r = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i == 8 && d.size() > 10) {  // long tensors (constant data) print their head and length
      r += ", ... (" + std::to_string(d.size()) + " values)";
      break;
    }
    r += (i ? ", " : "") + attrString(Attr(d[i]));
  }
  return r + "]";
}

namespace {

std::string typeString(const Value& v) { return std::string(dtypeName(v.type.dtype)) + shapeString(v.type.shape); }

std::string attrsString(const Node& n) {
  std::string r;
  for (const auto& kv : n.attrs.all()) r += (r.empty() ? "" : ", ") + kv.first + "=" + attrString(kv.second);
  return r;
}

std::string dotEscape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}

}  // namespace

std::string graphToText(const Graph& g, const std::string& title) {
  std::ostringstream os;
  os << "graph " << title << " (" << g.liveNodeCount() << " nodes)\n";
  for (NodeId id : g.topoOrder()) {
    const Node& n = g.node(id);
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << "%" << g.value(n.outputs[i]).name;
    os << " = " << opName(n.op) << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << "%" << g.value(n.inputs[i]).name;
    os << ")";
    const std::string attrs = attrsString(n);
    if (!attrs.empty()) os << " {" << attrs << "}";
    os << " : ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << typeString(g.value(n.outputs[i]));
    os << "\n";
  }
  for (const auto& kv : g.outputs()) os << "  output " << kv.first << " = %" << g.value(kv.second).name << "\n";
  return os.str();
}

std::string graphToDot(const Graph& g, const std::string& title) {
  std::ostringstream os;
  os << "digraph \"" << dotEscape(title) << "\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  for (NodeId id : g.topoOrder()) {
    const Node& n = g.node(id);
    const char* fill = n.op == OpKind::Param ? "lightyellow" : n.op == OpKind::Input ? "lightblue" : "white";
    os << "  n" << id << " [label=\"" << dotEscape(n.name) << "\\n" << opName(n.op);
    const std::string attrs = attrsString(n);
    if (!attrs.empty()) os << "\\n" << dotEscape(attrs);
    os << "\\n" << typeString(g.value(n.outputs[0])) << "\", style=filled, fillcolor=" << fill << "];\n";
  }
  for (NodeId id : g.topoOrder()) {
    const Node& n = g.node(id);
    for (size_t i = 0; i < n.inputs.size(); ++i) os << "  n" << g.value(n.inputs[i]).producer << " -> n" << id << ";\n";
  }
  int k = 0;
  for (const auto& kv : g.outputs()) {
    os << "  out" << k << " [label=\"" << dotEscape(kv.first) << "\", shape=ellipse];\n";
    os << "  n" << g.value(kv.second).producer << " -> out" << k++ << ";\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace pa
