// The fuzzer's YAML tree: construction, emission, conversion from yaml-cpp.
#include "tests/fuzz/yaml_tree.h"

#include <cctype>
#include <cstdio>

namespace pa::fuzz {

YNode YNode::scalar(std::string token) {
  YNode n;
  n.token = std::move(token);
  return n;
}

YNode YNode::list(std::vector<YNode> items) {
  YNode n;
  n.kind = Kind::List;
  n.items = std::move(items);
  return n;
}

YNode YNode::map() {
  YNode n;
  n.kind = Kind::Map;
  return n;
}

YNode& YNode::set(const std::string& key, YNode value) {
  if (YNode* v = find(key)) return *v = std::move(value);
  entries.emplace_back(key, std::move(value));
  return entries.back().second;
}

YNode* YNode::find(const std::string& key) {
  for (auto& kv : entries)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

std::string quoted(const std::string& s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    } else {
      r += static_cast<char>(c);  // UTF-8 passes through
    }
  }
  return r + "\"";
}

std::string plainOrQuoted(const std::string& s) {
  if (s.empty()) return "\"\"";
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || c == '+'))
      return quoted(s);
  return s;
}

std::string emitFlow(const YNode& n) {
  switch (n.kind) {
    case YNode::Kind::Scalar:
      return n.token;
    case YNode::Kind::List: {
      std::string r = "[";
      for (size_t i = 0; i < n.items.size(); ++i) r += (i ? ", " : "") + emitFlow(n.items[i]);
      return r + "]";
    }
    case YNode::Kind::Map: {
      std::string r = "{";
      for (size_t i = 0; i < n.entries.size(); ++i)
        r += (i ? ", " : "") + n.entries[i].first + ": " + emitFlow(n.entries[i].second);
      return r + "}";
    }
  }
  return "";
}

namespace {

void emitBlock(const YNode& n, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (n.kind == YNode::Kind::Map) {
    for (const auto& kv : n.entries) {
      out += pad + kv.first + ":";
      const YNode& v = kv.second;
      if (v.kind == YNode::Kind::Map && !v.entries.empty()) {
        out += "\n";
        emitBlock(v, indent + 2, out);
      } else if (v.kind == YNode::Kind::List && !v.items.empty() && !v.items[0].isScalar()) {
        out += "\n";
        emitBlock(v, indent + 2, out);
      } else {
        out += " " + emitFlow(v) + "\n";
      }
    }
  } else if (n.kind == YNode::Kind::List) {
    for (const YNode& item : n.items) out += pad + "- " + emitFlow(item) + "\n";
  } else {
    out += pad + n.token + "\n";
  }
}

}  // namespace

std::string emitYaml(const YNode& root) {
  std::string out;
  if (root.kind == YNode::Kind::Map && !root.entries.empty()) emitBlock(root, 0, out);
  else if (root.kind == YNode::Kind::List && !root.items.empty()) emitBlock(root, 0, out);
  else out = emitFlow(root) + "\n";
  return out;
}

YNode fromYaml(const YAML::Node& n) {
  if (n.IsMap()) {
    YNode m = YNode::map();
    for (const auto& kv : n) m.entries.emplace_back(plainOrQuoted(kv.first.Scalar()), fromYaml(kv.second));
    return m;
  }
  if (n.IsSequence()) {
    YNode l = YNode::list();
    for (const auto& item : n) l.items.push_back(fromYaml(item));
    return l;
  }
  if (n.IsNull()) return YNode::scalar("~");
  return YNode::scalar(plainOrQuoted(n.Scalar()));
}

}  // namespace pa::fuzz
