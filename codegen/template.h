// Generated CUDA comes from templates with named placeholders, ${NAME}, never from scattered
// concatenation: every value a template needs is named at the call.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

namespace pa::codegen {

using TemplateVars = std::map<std::string, std::string>;

// Replaces every ${NAME} in `tpl`; throws std::logic_error naming a placeholder without a value
// or a value no placeholder uses (both are codegen bugs).
inline std::string fillTemplate(const std::string& tpl, const TemplateVars& vars) {
  std::string out;
  std::map<std::string, bool> used;
  size_t at = 0;
  for (;;) {
    const size_t open = tpl.find("${", at);
    if (open == std::string::npos) break;
    const size_t close = tpl.find('}', open);
    if (close == std::string::npos) throw std::logic_error("unterminated placeholder in a kernel template");
    out.append(tpl, at, open - at);
    const std::string name = tpl.substr(open + 2, close - open - 2);
    auto it = vars.find(name);
    if (it == vars.end()) throw std::logic_error("kernel template placeholder ${" + name + "} has no value");
    out += it->second;
    used[name] = true;
    at = close + 1;
  }
  out.append(tpl, at, std::string::npos);
  for (const auto& kv : vars)
    if (!used.count(kv.first)) throw std::logic_error("kernel template has no placeholder ${" + kv.first + "}");
  return out;
}

}  // namespace pa::codegen
