// The emitters' shared helpers: number literals, activation formulas, and the assembly of a
// kernel (header comment naming its node and launch, parameter list, bf16 views).
#include <algorithm>
#include <cassert>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include "codegen/emit_internal.h"
#include "common/hash.h"

namespace pa::codegen {

std::string sourceWithoutName(const Kernel& k) {
  auto identChar = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  const std::string& src = k.source;
  size_t from = 0;
  while (src.compare(from, 2, "//") == 0) {
    const size_t eol = src.find('\n', from);
    if (eol == std::string::npos) break;
    from = eol + 1;
  }
  std::string out;
  out.reserve(src.size() - from);
  size_t at = k.name.empty() ? std::string::npos : src.find(k.name, from);
  while (at != std::string::npos) {
    const size_t end = at + k.name.size();
    if ((at > 0 && identChar(src[at - 1])) || (end < src.size() && identChar(src[end]) && src[end] != '_')) {
      at = src.find(k.name, at + 1);
      continue;
    }
    out.append(src, from, at - from).push_back('\x01');
    from = end;
    at = src.find(k.name, end);
  }
  return out.append(src, from, std::string::npos);
}

std::string compiledName(const Kernel& k, const std::string& key) {
  const uint64_t h = fnv1a(key.data(), key.size());
  size_t op = 0;  // past "k<digits>_"
  if (k.name.size() > 1 && k.name[0] == 'k' && std::isdigit(static_cast<unsigned char>(k.name[1]))) {
    const size_t us = k.name.find('_');
    if (us != std::string::npos) op = us + 1;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "pa_" + k.name.substr(op) + "_" + hex;
}

std::string sourceNamed(const std::string& key, const std::string& name) {
  std::string out;
  out.reserve(key.size() + 64);
  for (char c : key) {
    if (c == '\x01')
      out += name;
    else
      out.push_back(c);
  }
  return out;
}

std::vector<std::vector<size_t>> splitIntoPrograms(const std::vector<const Kernel*>& kernels) {
  constexpr size_t kPacked = 8;
  std::vector<std::vector<size_t>> programs, packed;
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (compilesSlowly(*kernels[i])) {
      programs.push_back({i});
      continue;
    }
    if (packed.empty() || packed.back().size() == kPacked) packed.emplace_back();
    packed.back().push_back(i);
  }
  programs.insert(programs.end(), packed.begin(), packed.end());
  return programs;
}

bool compilesSlowly(const Kernel& k) {
  return std::any_of(k.headers.begin(), k.headers.end(), [](const std::string& h) {
    return h == "kernels/gemm_simt.cuh" || h == "kernels/gemm_tf32.cuh" || h == "kernels/gemm_wgmma.cuh" ||
           h == "kernels/fused_mlp.cuh";
  });
}

}  // namespace pa::codegen

namespace pa::codegen::detail {

namespace {

const char* kHeader = R"(// PureAttention generated kernel ${NAME}
// implements node '${NODE}' (${OP}) of the training graph
// launch: grid (${GX}, ${GY}, ${GZ}), block (${BX}, 1, 1), dynamic shared memory ${SMEM} bytes
// arguments: ${ARGDOC}
)";

}  // namespace

std::string num(double v) {
  if (std::isinf(v)) return v < 0 ? "(-__int_as_float(0x7f800000))" : "__int_as_float(0x7f800000)";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9gf", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s.insert(s.size() - 1, ".0");
  return s;
}
std::string exactDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}
std::string ll(int64_t v) { return std::to_string(v) + "LL"; }
std::string geluOf(const std::string& x) { return "0.5f * " + x + " * (1.0f + erff(" + x + " * 0.70710678118654752f))"; }
std::string geluTanhOf(const std::string& x) {
  return "0.5f * " + x + " * (1.0f + tanhf(0.79788456080286536f * (" + x + " + 0.044715f * " + x + " * " + x + " * " + x + ")))";
}
std::string activationGradOf(const std::string& act, const std::string& dy, const std::string& x) {
  if (act == "silu")
    return dy + " * (1.0f / (1.0f + expf(-" + x + "))) * (1.0f + " + x + " * (1.0f - 1.0f / (1.0f + expf(-" + x + "))))";
  if (act == "gelu_tanh")
    return dy + " * (0.5f * (1.0f + tanhf(0.79788456080286536f * (" + x + " + 0.044715f * " + x + " * " + x + " * " + x +
           "))) + 0.5f * " + x + " * (1.0f - tanhf(0.79788456080286536f * (" + x + " + 0.044715f * " + x + " * " + x + " * " + x +
           ")) * tanhf(0.79788456080286536f * (" + x + " + 0.044715f * " + x + " * " + x + " * " + x +
           "))) * 0.79788456080286536f * (1.0f + 0.134145f * " + x + " * " + x + "))";
  if (act == "gelu")
    return dy + " * (0.5f * (1.0f + erff(" + x + " * 0.70710678118654752f)) + " + x + " * 0.39894228040143268f * expf(-0.5f * " + x +
           " * " + x + "))";
  return "(" + x + " > 0.0f ? " + dy + " : 0.0f)";
}

std::string sanitize(const std::string& s) {
  std::string r;
  for (char c : s) r += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return r;
}

std::string argType(DType t, bool output) {
  switch (t) {
  case DType::F32: return output ? "float* __restrict__" : "const float* __restrict__";
  case DType::BF16: return output ? "pa_bf16_out" : "pa_bf16_in";
  default: throw std::invalid_argument(std::string("the CUDA backend stores no ") + dtypeName(t) + " values");
  }
}

std::string tensorMapArgName(const KernelArg& a) {
  if (a.kind == KernelArg::OutputTensorMap) return "mapOut" + std::to_string(a.index);
  return a.index < 0 ? std::string("mapParts") : "map" + std::to_string(a.index);
}

Kernel finish(const Ctx& c, const std::string& part, const std::string& tpl, TemplateVars vars, std::array<unsigned, 3> grid,
              unsigned block, std::vector<KernelArg> args, std::vector<std::string> headers, unsigned smem) {
  Kernel k;
  k.name = c.kernelName(part);
  k.grid = grid;
  k.block = {block, 1, 1};
  k.sharedBytes = smem;
  k.args = std::move(args);
  k.headers = std::move(headers);
  std::string params, doc;
  bool bf16 = false;
  for (const KernelArg& a : k.args) {
    const std::string sep = params.empty() ? "" : ", ";
    if (a.kind == KernelArg::Scratch) {
      params += sep + "float* __restrict__ scratch";
      doc += sep + "scratch";
      continue;
    }
    if (a.kind == KernelArg::AdamBinding) {
      params += sep + "const pa::adam::Binding* __restrict__ adam";
      doc += sep + "adam = the session's Adam binding";
      continue;
    }
    if (a.kind == KernelArg::InputTensorMap || a.kind == KernelArg::ScratchTensorMap || a.kind == KernelArg::OutputTensorMap) {
      const std::string name = tensorMapArgName(a);
      const std::string of = a.kind == KernelArg::OutputTensorMap ? c.g.value(c.n.outputs[static_cast<size_t>(a.index)]).name
                             : a.index < 0                         ? std::string("the split partial sums")
                                                                   : c.g.value(c.n.inputs[static_cast<size_t>(a.index)]).name;
      params += sep + "const __grid_constant__ pa::sm90::TensorMap " + name;
      doc += sep + name + " = TMA map of " + (a.kind == KernelArg::ScratchTensorMap && a.index >= 0 ? of + " transposed" : of) +
             (a.kind == KernelArg::ScratchTensorMap ? ", in scratch" : "") + (a.map.elementBytes == 2 ? " (bf16)" : "");
      continue;
    }
    const bool output = a.kind == KernelArg::Output;
    const std::string name = (output ? "out" : "in") + std::to_string(a.index);
    const Value& v = c.g.value(output ? c.n.outputs[static_cast<size_t>(a.index)] : c.n.inputs[static_cast<size_t>(a.index)]);
    params += sep + argType(v.type.dtype, output) + " " + name;
    doc += sep + name + " = " + v.name + (v.type.dtype == DType::F32 ? "" : " (bf16)");
    bf16 |= v.type.dtype == DType::BF16;
  }
  // The bf16 views; the GEMM headers (kernels/gemm_*.cuh) include them themselves.
  const bool includeStorage = bf16 && std::none_of(k.headers.begin(), k.headers.end(), [](const std::string& h) {
                                return h.rfind("kernels/gemm_", 0) == 0;
                              });
  if (includeStorage) k.headers.push_back("kernels/storage.cuh");
  vars["NAME"] = k.name;
  vars["PARAMS"] = params;
  k.source = fillTemplate(kHeader, {{"NAME", k.name}, {"NODE", c.n.name}, {"OP", opName(c.n.op)},
                                    {"GX", std::to_string(grid[0])}, {"GY", std::to_string(grid[1])},
                                    {"GZ", std::to_string(grid[2])}, {"BX", std::to_string(block)},
                                    {"SMEM", std::to_string(smem)}, {"ARGDOC", doc}}) +
             "#include \"kernels/pdl.cuh\"\n" + (includeStorage ? "#include \"kernels/storage.cuh\"\n" : "") +
             fillTemplate(tpl, vars);
  // The runtime launches every generated kernel as a programmatic dependent (kernels/pdl.cuh).
  assert(beginsWithPdlPrologue(k.source) && "a kernel template must begin with pa::pdlBegin();");
  return k;
}

unsigned gridFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

std::vector<KernelArg> allArgs(const Node& n) {
  std::vector<KernelArg> a;
  for (size_t i = 0; i < n.inputs.size(); ++i) a.push_back({KernelArg::Input, static_cast<int>(i)});
  for (size_t i = 0; i < n.outputs.size(); ++i) a.push_back({KernelArg::Output, static_cast<int>(i)});
  return a;
}

}  // namespace pa::codegen::detail

namespace pa::codegen {

bool beginsWithPdlPrologue(const std::string& source) {
  const std::string prologue = "pa::pdlBegin();";
  bool any = false;
  for (size_t at = source.find("__global__"); at != std::string::npos; at = source.find("__global__", at + 1)) {
    const size_t open = source.find('{', at);
    if (open == std::string::npos) return false;
    const size_t first = source.find_first_not_of(" \t\r\n", open + 1);
    if (first == std::string::npos || source.compare(first, prologue.size(), prologue) != 0) return false;
    any = true;
  }
  return any;
}

}  // namespace pa::codegen
