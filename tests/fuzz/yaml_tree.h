// A tiny ordered YAML tree for the config fuzzer: every scalar and key is kept as the token it is
// written as, so a mutation can put any text (`.nan`, `9e18`, a quoted emoji, a duplicate key)
// exactly where it wants, which a real YAML library's tree would normalise away.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

namespace pa::fuzz {

struct YNode {
  enum class Kind { Scalar, List, Map };
  Kind kind = Kind::Scalar;
  std::string token;                                     // Scalar: the text as written
  std::vector<YNode> items;                              // List
  std::vector<std::pair<std::string, YNode>> entries;    // Map: key token -> value (duplicates allowed)

  static YNode scalar(std::string token);
  static YNode list(std::vector<YNode> items = {});
  static YNode map();
  // Map: replaces the first entry with this key, or appends one.
  YNode& set(const std::string& key, YNode value);
  YNode* find(const std::string& key);
  const YNode* find(const std::string& key) const { return const_cast<YNode*>(this)->find(key); }
  bool isScalar() const { return kind == Kind::Scalar; }
};

// A scalar token for any string: plain where YAML reads it back unchanged as this string, else
// double-quoted with escapes.
std::string quoted(const std::string& s);
std::string plainOrQuoted(const std::string& s);

// Block style for maps, flow style for lists and for anything inside a list.
std::string emitYaml(const YNode& root);
std::string emitFlow(const YNode& n);

YNode fromYaml(const YAML::Node& n);

}  // namespace pa::fuzz
