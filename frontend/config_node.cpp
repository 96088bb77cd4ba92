// CfgNode: typed, located access to a YAML tree.
#include "frontend/config_node.h"

#include <algorithm>
#include <cmath>

namespace pa {

namespace {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string describe(const YAML::Node& n) {
  if (!n || n.IsNull()) return "nothing";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "'" + n.Scalar() + "'";
}

}  // namespace

std::string closestMatch(const std::string& word, const std::vector<std::string>& choices) {
  std::string best;
  size_t bestD = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : choices) {
    const size_t d = editDistance(word, c);
    if (d < bestD) {
      bestD = d;
      best = c;
    }
  }
  return best;
}

std::string joinChoices(const std::vector<std::string>& choices) {
  std::string r;
  for (const std::string& c : choices) r += (r.empty() ? "" : ", ") + c;
  return r;
}

std::string CfgNode::location() const {
  // A key replaced by --set has no position in the file; name the flag instead.
  for (const auto& kv : src_->overrides)
    if (path_ == kv.first || path_.rfind(kv.first + ".", 0) == 0 || path_.rfind(kv.first + "[", 0) == 0)
      return "--set " + kv.first + "=" + kv.second;
  const YAML::Mark m = node_ ? node_.Mark() : YAML::Mark::null_mark();
  if (m.is_null()) return src_->file;
  return src_->file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

void CfgNode::fail(const std::string& message) const { throw ConfigError(location(), path_, message); }

void CfgNode::checkKeys(const std::vector<std::string>& allowed) const {
  if (!node_.IsMap()) fail("expected a map with keys " + joinChoices(allowed) + ", got " + describe(node_));
  for (const auto& kv : node_) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    const std::string near = closestMatch(key, allowed);
    at(kv.first).fail("unknown key '" + key + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
            " Valid keys: " + joinChoices(allowed));
  }
}

CfgNode CfgNode::child(const std::string& key) const {
  const std::string p = path_.empty() ? key : path_ + "." + key;
  if (!node_.IsMap()) fail("expected a map holding '" + key + "', got " + describe(node_));
  YAML::Node c = node_[key];
  if (!c) fail("missing required key '" + key + "'");
  return CfgNode(c, p, src_);
}

CfgNode CfgNode::item(size_t i) const { return CfgNode(node_[i], path_ + "[" + std::to_string(i) + "]", src_); }

std::vector<std::string> CfgNode::keys() const {
  std::vector<std::string> r;
  if (node_.IsMap())
    for (const auto& kv : node_) r.push_back(kv.first.as<std::string>());
  return r;
}

double CfgNode::asDouble() const {
  if (!node_.IsScalar()) fail("expected a number, got " + describe(node_));
  const std::string& s = node_.Scalar();
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  fail("expected a finite number, got '" + s + "'");
}

int64_t CfgNode::asInt() const {
  if (!node_.IsScalar()) fail("expected an integer, got " + describe(node_));
  const std::string& s = node_.Scalar();
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  fail("expected an integer, got '" + s + "'");
}

bool CfgNode::asBool() const {
  if (node_.IsScalar()) {
    const std::string& s = node_.Scalar();
    if (s == "true" || s == "True" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "False" || s == "no" || s == "off") return false;
  }
  fail("expected true or false, got " + describe(node_));
}

std::string CfgNode::asString() const {
  if (!node_.IsScalar()) fail("expected a string, got " + describe(node_));
  return node_.Scalar();
}

std::vector<int64_t> CfgNode::asInts() const {
  if (!node_.IsSequence()) fail("expected a list of integers, got " + describe(node_));
  std::vector<int64_t> r;
  for (size_t i = 0; i < node_.size(); ++i) r.push_back(item(i).asInt());
  return r;
}

std::vector<double> CfgNode::asDoubles() const {
  if (!node_.IsSequence()) fail("expected a list of numbers, got " + describe(node_));
  std::vector<double> r;
  for (size_t i = 0; i < node_.size(); ++i) r.push_back(item(i).asDouble());
  return r;
}

std::string CfgNode::getChoice(const std::string& key, const std::string& dflt,
                               const std::vector<std::string>& choices) const {
  if (!has(key)) return dflt;
  const CfgNode c = child(key);
  const std::string v = c.asString();
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    const std::string near = closestMatch(v, choices);
    c.fail("'" + v + "' is not valid" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
           " Valid choices: " + joinChoices(choices));
  }
  return v;
}

int64_t CfgNode::getIntIn(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) const {
  if (!has(key)) return dflt;
  const CfgNode c = child(key);
  const int64_t v = c.asInt();
  if (v < lo || v > hi)
    c.fail("must be " + (hi == INT64_MAX ? "at least " + std::to_string(lo)
                                         : "between " + std::to_string(lo) + " and " + std::to_string(hi)) +
           ", got " + std::to_string(v));
  return v;
}

double CfgNode::getDoubleIn(const std::string& key, double dflt, double lo, double hi) const {
  if (!has(key)) return dflt;
  const CfgNode c = child(key);
  const double v = c.asDouble();
  if (v < lo || v > hi) c.fail("must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + c.asString());
  return v;
}

}  // namespace pa
