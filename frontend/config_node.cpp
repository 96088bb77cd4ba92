// CfgNode: typed, located access to a YAML tree.
#include "frontend/config_node.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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

std::string suggestion(const std::string& word, const std::vector<std::string>& choices, const std::string& what) {
  const std::string near = closestMatch(word, choices);
  return (near.empty() ? "." : "; did you mean '" + near + "'?") + " Valid " + what + ": " + joinChoices(choices);
}

namespace {
// True when `path` is `prefix` or lies under it ("a.b" is under "a"; "a[0]" too).
bool under(const std::string& path, const std::string& prefix) {
  return path == prefix || path.rfind(prefix + ".", 0) == 0 || path.rfind(prefix + "[", 0) == 0;
}
}  // namespace

std::string CfgNode::location() const {
  // A key replaced by --set has no position in the file; name the flag instead.
  for (const auto& kv : src_->overrides)
    if (under(path_, kv.first)) return "--set " + kv.first + "=" + kv.second;
  const YAML::Mark m = node_ ? node_.Mark() : YAML::Mark::null_mark();
  std::string at = src_->file;
  if (!m.is_null()) at += ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  // A mistake found on a map (a layer, say) may come from a key set under it by --set.
  if (!path_.empty())
    for (const auto& kv : src_->overrides)
      if (under(kv.first, path_)) at += " (with --set " + kv.first + "=" + kv.second + ")";
  return at;
}

void CfgNode::fail(const std::string& message) const { throw ConfigError(location(), path_, message); }

void CfgNode::checkKeys(const std::vector<std::string>& allowed) const {
  if (!node_.IsMap()) fail("expected a map with keys " + joinChoices(allowed) + ", got " + describe(node_));
  for (const auto& kv : node_) {
    const std::string key = scalarKey(kv.first);
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    // Reported under the key's own path, so that a key added by --set names the flag.
    with(kv.first, path_.empty() ? key : path_ + "." + key)
        .fail("unknown key '" + key + "'" + suggestion(key, allowed, "keys"));
  }
}

std::string CfgNode::scalarKey(const YAML::Node& key) const {
  if (!key.IsScalar()) at(key).fail("a key must be a name, got " + describe(key) + " as a key");
  return key.Scalar();
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
    for (const auto& kv : node_) r.push_back(scalarKey(kv.first));
  return r;
}

bool parseCount(const std::string& s, int64_t& v) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  int64_t n = 0;
  for (char c : s) {
    const int d = c - '0';
    if (n > (INT64_MAX - d) / 10) return false;
    n = n * 10 + d;
  }
  v = n;
  return true;
}

NumberParse parseNumber(const std::string& s, double& v) {
  // strtod, not stod: stod throws on underflow, so 1e-320 (a denormal) would be "not a number".
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return NumberParse::NotANumber;
  const char* begin = s.c_str();
  char* end = nullptr;
  errno = 0;
  v = std::strtod(begin, &end);
  if (end != begin + s.size()) return NumberParse::NotANumber;
  if (std::isnan(v)) return NumberParse::NotFinite;
  if (std::isinf(v)) return errno == ERANGE ? NumberParse::Overflow : NumberParse::NotFinite;
  return NumberParse::Ok;  // underflow to 0 or a denormal is a number
}

double CfgNode::asDouble() const {
  if (!node_.IsScalar()) fail("expected a number, got " + describe(node_));
  const std::string& s = node_.Scalar();
  double v = 0;
  switch (parseNumber(s, v)) {
  case NumberParse::Ok: return v;
  case NumberParse::Overflow: fail("'" + s + "' is too large: beyond the range of a double (about 1.8e308)");
  case NumberParse::NotFinite:
  case NumberParse::NotANumber: break;
  }
  fail("expected a finite number, got '" + s + "'");
}

int64_t CfgNode::asInt() const {
  if (!node_.IsScalar()) fail("expected an integer, got " + describe(node_));
  const std::string& s = node_.Scalar();
  const size_t sign = s.find_first_not_of("+-") == 1 ? 1 : 0;  // one leading sign at most
  if (s.size() > sign && s.find_first_not_of("0123456789", sign) == std::string::npos) {
    errno = 0;
    const long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE)
      fail("'" + s + "' is out of range: an integer here is between " + std::to_string(INT64_MIN) + " and " +
           std::to_string(INT64_MAX));
    return v;
  }
  double d = 0;
  const bool decimal = s.find_first_of("xX") == std::string::npos && s.find_first_of(".eE") != std::string::npos;
  if (decimal && parseNumber(s, d) == NumberParse::Ok && d == std::floor(d) && std::fabs(d) < 9e18)
    fail("expected an integer, got '" + s + "' (write it without a decimal point or exponent)");
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
  if (std::find(choices.begin(), choices.end(), v) == choices.end())
    c.fail("'" + v + "' is not valid" + suggestion(v, choices, "choices"));
  return v;
}

double CfgNode::getPositive(const std::string& key, double dflt, double hi) const {
  if (!has(key)) return dflt;
  const CfgNode c = child(key);
  const double v = c.asDouble();
  if (!(v > 0) || v > hi) c.fail("must be greater than 0 and at most " + formatNumber(hi) + ", got " + c.asString());
  return v;
}

std::string exactNumber(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string formatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
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
  if (v < lo || v > hi) c.fail("must be between " + formatNumber(lo) + " and " + formatNumber(hi) + ", got " + c.asString());
  return v;
}

}  // namespace pa
