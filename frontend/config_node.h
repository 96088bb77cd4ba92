// Reading YAML with errors for people: every access knows its key path and source position.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/errors.h"

namespace pa {

// A config mistake: "<file>:<line>:<col>: <key path>: <message>"; exit code 2.
class ConfigError : public UserError {
public:
  ConfigError(const std::string& location, const std::string& keyPath, const std::string& message)
      : UserError(location + ": " + (keyPath.empty() ? "" : keyPath + ": ") + message), location_(location),
        keyPath_(keyPath) {}
  // "file:line:col", the file alone, or the --set flag that gave the key.
  const std::string& location() const { return location_; }
  const std::string& keyPath() const { return keyPath_; }

private:
  std::string location_, keyPath_;
};

// Where the config came from: the file, and the key paths that --set replaced.
struct ConfigSource {
  std::string file;
  std::map<std::string, std::string> overrides;  // key path -> the --set text
};

// The closest of `choices` to `word` by edit distance, or "" when none is close.
std::string closestMatch(const std::string& word, const std::vector<std::string>& choices);
std::string joinChoices(const std::vector<std::string>& choices);
// "; did you mean 'x'? Valid <what>: a, b, c" (or ". Valid <what>: ..." when nothing is close).
std::string suggestion(const std::string& word, const std::vector<std::string>& choices, const std::string& what);
// A number as a person writes it: 1000, 1e+12, 0.9.
std::string formatNumber(double v);
// The shortest decimal text that reads back as exactly `v` (resolved configs).
std::string exactNumber(double v);

// Reads a decimal number as strtod does, whole string only.
enum class NumberParse { Ok, NotANumber, NotFinite, Overflow };
NumberParse parseNumber(const std::string& text, double& value);
// A count written in decimal digits alone (no sign, no exponent, no blanks) that fits an int64;
// false for anything else.
bool parseCount(const std::string& text, int64_t& value);

class CfgNode {
public:
  CfgNode(YAML::Node node, std::string path, std::shared_ptr<const ConfigSource> src)
      : node_(std::move(node)), path_(std::move(path)), src_(std::move(src)) {}
  CfgNode(const CfgNode&) = default;
  // YAML::Node's assignment writes into the tree it refers to; a CfgNode is never reassigned.
  CfgNode& operator=(const CfgNode&) = delete;

  const std::string& path() const { return path_; }
  const YAML::Node& yaml() const { return node_; }
  bool isMap() const { return node_.IsMap(); }
  bool isSequence() const { return node_.IsSequence(); }
  bool isScalar() const { return node_.IsScalar(); }
  bool has(const std::string& key) const { return node_.IsMap() && node_[key]; }

  // Fails on any key of this map that is not in `allowed`, suggesting the closest one.
  void checkKeys(const std::vector<std::string>& allowed) const;
  CfgNode child(const std::string& key) const;  // required
  CfgNode item(size_t i) const;                 // sequence element
  // Another YAML node (e.g. a map key) reported under this node's path, for messages.
  CfgNode at(const YAML::Node& n) const { return CfgNode(n, path_, src_); }
  // Another YAML node of the same config under its own key path.
  CfgNode with(const YAML::Node& n, const std::string& path) const { return CfgNode(n, path, src_); }
  size_t size() const { return node_.size(); }
  std::vector<std::string> keys() const;        // map keys in file order

  // Scalars of this node.
  double asDouble() const;
  int64_t asInt() const;
  bool asBool() const;
  std::string asString() const;
  std::vector<int64_t> asInts() const;
  std::vector<double> asDoubles() const;

  // Optional keys with defaults; required ones fail with "missing required key".
  double getDouble(const std::string& key, double dflt) const { return has(key) ? child(key).asDouble() : dflt; }
  int64_t getInt(const std::string& key, int64_t dflt) const { return has(key) ? child(key).asInt() : dflt; }
  bool getBool(const std::string& key, bool dflt) const { return has(key) ? child(key).asBool() : dflt; }
  std::string getString(const std::string& key, const std::string& dflt) const {
    return has(key) ? child(key).asString() : dflt;
  }
  // A string that must be one of `choices`.
  std::string getChoice(const std::string& key, const std::string& dflt, const std::vector<std::string>& choices) const;
  // Integer within [lo, hi].
  int64_t getIntIn(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) const;
  double getDoubleIn(const std::string& key, double dflt, double lo, double hi) const;
  // A number in (0, hi].
  double getPositive(const std::string& key, double dflt, double hi) const;

  // A map key as a string; a map or list used as a key is a mistake reported at the key.
  std::string scalarKey(const YAML::Node& key) const;

  [[noreturn]] void fail(const std::string& message) const;
  std::string location() const;
  const ConfigSource& source() const { return *src_; }

private:
  YAML::Node node_;
  std::string path_;
  std::shared_ptr<const ConfigSource> src_;
};

}  // namespace pa
