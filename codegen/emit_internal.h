// Private to the emitters (codegen/emit*.cpp): the node being emitted, number formatting, and the
// assembly of a kernel from a template (header comment, parameter list, launch).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "codegen/template.h"

namespace pa::codegen::detail {

// Threads of every one-dimensional generated kernel (elementwise, gather, reductions, epilogues).
constexpr unsigned kThreads = 256;

inline const EmitOptions kDefaultOptions{};

// A float literal (infinities as bit patterns), a double literal that reads back to `v` exactly,
// an int64 literal.
std::string num(double v);
std::string exactDouble(double v);
std::string ll(int64_t v);
// GELU (the erf form) of the expression `x`.
std::string geluOf(const std::string& x);
// GELU's tanh form of the expression `x`.
std::string geluTanhOf(const std::string& x);
// dy ⊙ act′(x) for act relu | gelu | silu | gelu_tanh (ReluGrad, GeluGrad, matmul-act-grad's epilogues); `x` is
// read more than once, so it should name a value.
std::string activationGradOf(const std::string& act, const std::string& dy, const std::string& x);
// `s` with every character that is not a letter or digit replaced by '_'.
std::string sanitize(const std::string& s);

struct Ctx {
  const Graph& g;
  const Node& n;
  const EmitOptions* opt = &kDefaultOptions;
  const Shape& in(int i) const { return g.shape(n.inputs[static_cast<size_t>(i)]); }
  const Shape& out(int i = 0) const { return g.shape(n.outputs[static_cast<size_t>(i)]); }
  DType inType(int i) const { return g.value(n.inputs[static_cast<size_t>(i)]).type.dtype; }
  DType outType(int i = 0) const { return g.value(n.outputs[static_cast<size_t>(i)]).type.dtype; }
  std::string kernelName(const std::string& part = "") const {
    return "k" + std::to_string(n.id) + "_" + sanitize(opName(n.op)) + opt->kernelSuffix + (part.empty() ? "" : "_" + part);
  }
};

// The C type of a kernel argument, or of an epilogue member holding one, by the value's
// storage type: a pointer for fp32, a bf16 view of kernels/storage.cuh for bf16.
std::string argType(DType t, bool output);

// The parameter name finish() gives a tensor-map argument: map<i> over input i or its copy in
// scratch, mapParts over a split product's partial sums, mapOut<i> over output i.
std::string tensorMapArgName(const KernelArg& a);

// Assembles a kernel: header comment, body from `tpl` with `vars`, launch and arguments.
Kernel finish(const Ctx& c, const std::string& part, const std::string& tpl, TemplateVars vars, std::array<unsigned, 3> grid,
              unsigned block, std::vector<KernelArg> args, std::vector<std::string> headers = {}, unsigned smem = 0);

// Statements turning the float lvalues `a` and `b` (a feature pair) by the double expression
// `angle` (the other way where `inverse`), as the rope kernel and FusedLinear (rope) do.
std::string ropeTurn(const std::string& angle, const std::string& a, const std::string& b, bool inverse);
// A kernel over the indices i < count (codegen/templates/pointwise.h, kPerIndex): `loads` reads
// index i's `values` values into x[0 .. values), `stores` computes from them and writes.
Kernel perIndexKernel(const Ctx& c, const std::string& part, int64_t count, int values, const std::string& loads, const std::string& stores,
                      std::vector<KernelArg> args);

// Blocks of kThreads for `work` items, grid-stride beyond 65535·8.
unsigned gridFor(int64_t work);
// Every input, then every output, of the node, as pointers.
std::vector<KernelArg> allArgs(const Node& n);
// The sums over the rows of node input `input`, a matrix [K, L], into output `output` [L]: the
// split reduction's kernels (a thread per column, or split along K, in double; a SumTo over
// leading axes runs the one-launch column sums instead, the same sums in another order). Their
// names end in _colsum[_partial|_final], apart from the node's other kernels.
NodeKernels columnSums(const Ctx& c, int input, int output);
// Σ_k in0[k, m] · in1[k] into output 0 [M] (in0 a matrix [K, M], in1 one column [K, 1]) and, with
// `bias`, Σ_k in1[k] into output 1: one kernel (name ending in _colprod; "Note on the column
// product" in emit_pointwise.cpp).
NodeKernels columnProduct(const Ctx& c, bool bias);
// out0[r, j] = in0[r]·in1[j], r < m, j < n: a product over one shared index (K = 1), whatever the
// operands' transposes (a vector either way); one kernel, name ending in _outer.
NodeKernels outerProduct(const Ctx& c, int64_t m, int64_t n);
// out0[r] = act(Σ_k in0[r, k]·in1[k] (+ in2[0])), act relu where `relu`, over `rows` rows of k: a
// product to one column (FusedLinear to one output), a warp a row; one kernel, name ending in _rowdot.
NodeKernels rowDot(const Ctx& c, int64_t rows, int64_t k, bool relu);

// The per-op emitters, one per op of graph/ops.def, defined in the family files
// (emit_pointwise.cpp, emit_gemm.cpp, emit_flash.cpp).
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) NodeKernels emit##Name(const Ctx& c);
#include "graph/ops.def"

}  // namespace pa::codegen::detail
