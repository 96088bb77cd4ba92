// Node attributes: a sorted name -> value map, so printing and hashing are deterministic; read and
// written through the typed keys of attrs.def (attr::WindowLeft), or by name where the name comes
// from the user (explicit YAML nodes).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace pa {

using Attr = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>>;

// The type an attribute holds, as the getters below read it.
enum class AttrKind { Int, Float, Bool, String, Ints, Floats };

// Whether the getter of kind `k` can read `a` (getInt takes an integer or a boolean, getFloat
// an integer or a double, getBool a boolean or an integer, getDoubles either kind of list).
inline bool attrHolds(AttrKind k, const Attr& a) {
  switch (k) {
  case AttrKind::Int: return std::holds_alternative<int64_t>(a) || std::holds_alternative<bool>(a);
  case AttrKind::Float: return std::holds_alternative<int64_t>(a) || std::holds_alternative<double>(a);
  case AttrKind::Bool: return std::holds_alternative<bool>(a) || std::holds_alternative<int64_t>(a);
  case AttrKind::String: return std::holds_alternative<std::string>(a);
  case AttrKind::Ints: return std::holds_alternative<std::vector<int64_t>>(a);
  case AttrKind::Floats:
    return std::holds_alternative<std::vector<int64_t>>(a) || std::holds_alternative<std::vector<double>>(a);
  }
  return false;
}

// "an integer", "a number", "a boolean", "a string", "a list of integers", "a list of numbers".
inline const char* attrKindDescription(AttrKind k) {
  switch (k) {
  case AttrKind::Int: return "an integer";
  case AttrKind::Float: return "a number";
  case AttrKind::Bool: return "a boolean";
  case AttrKind::String: return "a string";
  case AttrKind::Ints: return "a list of integers";
  case AttrKind::Floats: return "a list of numbers";
  }
  return "?";
}

// The C++ type an attribute of kind K is read as.
template <AttrKind K> struct AttrTypeOf;
template <> struct AttrTypeOf<AttrKind::Int> { using Type = int64_t; };
template <> struct AttrTypeOf<AttrKind::Float> { using Type = double; };
template <> struct AttrTypeOf<AttrKind::Bool> { using Type = bool; };
template <> struct AttrTypeOf<AttrKind::String> { using Type = std::string; };
template <> struct AttrTypeOf<AttrKind::Ints> { using Type = std::vector<int64_t>; };
template <> struct AttrTypeOf<AttrKind::Floats> { using Type = std::vector<double>; };

// The typed keys, one per line of attrs.def: its name, kind, C++ type and default.
namespace attr {
#define PA_ATTR(Name, Key, Kind, Default)                                 \
  struct Name {                                                           \
    static constexpr const char* key = Key;                               \
    static constexpr AttrKind kind = AttrKind::Kind;                      \
    using Type = AttrTypeOf<AttrKind::Kind>::Type;                        \
    static Type byDefault() {                                             \
      Type v = Default;                                                   \
      return v;                                                           \
    }                                                                     \
  };
#include "graph/attrs.def"
}  // namespace attr

class AttrMap {
public:
  void set(const std::string& k, Attr v) { map_[k] = std::move(v); }
  bool has(const std::string& k) const { return map_.count(k) != 0; }
  void erase(const std::string& k) { map_.erase(k); }
  const std::map<std::string, Attr>& all() const { return map_; }

  int64_t getInt(const std::string& k, int64_t dflt) const {
    auto it = map_.find(k);
    if (it == map_.end()) return dflt;
    if (auto* b = std::get_if<bool>(&it->second)) return *b;
    if (auto* d = std::get_if<double>(&it->second)) return static_cast<int64_t>(*d);
    return std::get<int64_t>(it->second);
  }
  double getFloat(const std::string& k, double dflt) const {
    auto it = map_.find(k);
    if (it == map_.end()) return dflt;
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
    return std::get<double>(it->second);
  }
  bool getBool(const std::string& k, bool dflt) const {
    auto it = map_.find(k);
    if (it == map_.end()) return dflt;
    if (auto* i = std::get_if<int64_t>(&it->second)) return *i != 0;
    return std::get<bool>(it->second);
  }
  std::vector<int64_t> getInts(const std::string& k) const {
    auto it = map_.find(k);
    if (it == map_.end()) return {};
    return std::get<std::vector<int64_t>>(it->second);
  }
  std::vector<double> getDoubles(const std::string& k) const {
    auto it = map_.find(k);
    if (it == map_.end()) return {};
    if (auto* i = std::get_if<std::vector<int64_t>>(&it->second)) return std::vector<double>(i->begin(), i->end());
    return std::get<std::vector<double>>(it->second);
  }
  std::string getString(const std::string& k, const std::string& dflt) const {
    auto it = map_.find(k);
    if (it == map_.end()) return dflt;
    return std::get<std::string>(it->second);
  }

  // The typed layer: A is a key of attrs.def; an unset attribute reads as A's default.
  template <class A> bool has() const { return has(A::key); }
  template <class A> typename A::Type get() const {
    if constexpr (A::kind == AttrKind::Int) return getInt(A::key, A::byDefault());
    else if constexpr (A::kind == AttrKind::Float) return getFloat(A::key, A::byDefault());
    else if constexpr (A::kind == AttrKind::Bool) return getBool(A::key, A::byDefault());
    else if constexpr (A::kind == AttrKind::String) return getString(A::key, A::byDefault());
    else if constexpr (A::kind == AttrKind::Ints) return has(A::key) ? getInts(A::key) : A::byDefault();
    else return has(A::key) ? getDoubles(A::key) : A::byDefault();
  }
  template <class A> AttrMap& set(typename A::Type v) {
    set(A::key, Attr(std::move(v)));
    return *this;
  }

  bool operator==(const AttrMap& o) const { return map_ == o.map_; }

private:
  std::map<std::string, Attr> map_;
};

// AttrMap::get as a free function, for code inside templates (no `.template` needed).
template <class A> typename A::Type getAttr(const AttrMap& m) { return m.get<A>(); }

std::string attrString(const Attr& a);

}  // namespace pa
