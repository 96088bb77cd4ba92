// Emitters of the pointwise families: elementwise and fused-elementwise expressions, gathers
// (Permute, Reshape, RepeatHeads), reductions (Sum, Mean, SumTo), softmax rows and their
// gradients, the attention mask and the MSE loss. A thread per output element (or row) unless
// noted; shapes are compile-time constants of the source.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "codegen/emit_internal.h"
#include "codegen/templates/pointwise.h"
#include "graph/elementwise_expr.h"
#include "graph/node_attrs.h"

namespace pa::codegen::detail {

using namespace templates;

namespace {

// ---- elementwise -------------------------------------------------------------------------

// The C expression of one expression node over temporaries t<i>.
std::string exprCode(const ExprNode& x) {
  auto t = [&](int i) { return "t" + std::to_string(x.args[static_cast<size_t>(i)]); };
  switch (x.op) {
  case OpKind::Add: return t(0) + " + " + t(1);
  case OpKind::Sub: return t(0) + " - " + t(1);
  case OpKind::Mul: return t(0) + " * " + t(1);
  case OpKind::Div: return t(0) + " / " + t(1);
  case OpKind::Scale: return t(0) + " * " + num(x.value);
  case OpKind::Relu: return "fmaxf(" + t(0) + ", 0.0f)";
  case OpKind::Gelu: return geluOf(t(0));
  case OpKind::Tanh: return "tanhf(" + t(0) + ")";
  case OpKind::Sigmoid: return "1.0f / (1.0f + expf(-" + t(0) + "))";
  case OpKind::Exp: return "expf(" + t(0) + ")";
  case OpKind::Silu: return t(0) + " / (1.0f + expf(-" + t(0) + "))";
  case OpKind::GeluTanh: return geluTanhOf(t(0));
  case OpKind::BroadcastTo: return t(0);
  case OpKind::Cast: return t(0);  // the store rounds to the output's dtype
  case OpKind::ReluGrad: return activationGradOf("relu", t(0), t(1));
  case OpKind::GeluGrad: return activationGradOf("gelu", t(0), t(1));
  case OpKind::TanhGrad: return t(0) + " * (1.0f - " + t(1) + " * " + t(1) + ")";
  case OpKind::SigmoidGrad: return t(0) + " * " + t(1) + " * (1.0f - " + t(1) + ")";
  case OpKind::SiluGrad: return activationGradOf("silu", t(0), t(1));
  case OpKind::GeluTanhGrad: return activationGradOf("gelu_tanh", t(0), t(1));
  default: throw std::logic_error(std::string("no expression code for op ") + opName(x.op));
  }
}

NodeKernels elementwise(const Ctx& c, const Expr& e) {
  const Shape& out = c.out();
  const int64_t count = numel(out);
  // Offsets of inputs whose shape differs from the output's: decompose idx once per element.
  std::string offsets;
  std::vector<bool> direct(c.n.inputs.size());
  bool anyBroadcast = false;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) {
    direct[i] = c.in(static_cast<int>(i)) == out;
    anyBroadcast |= !direct[i];
  }
  if (anyBroadcast) {
    offsets += "    long long rem = idx;\n";
    for (size_t i = 0; i < c.n.inputs.size(); ++i)
      if (!direct[i]) offsets += "    long long o" + std::to_string(i) + " = 0;\n";
    for (int d = static_cast<int>(out.size()) - 1; d >= 0; --d) {
      offsets += "    { const long long q = rem % " + ll(out[static_cast<size_t>(d)]) + "; rem /= " + ll(out[static_cast<size_t>(d)]) + ";";
      for (size_t i = 0; i < c.n.inputs.size(); ++i) {
        if (direct[i]) continue;
        const Shape& s = c.in(static_cast<int>(i));
        const Shape st = contiguousStrides(s);
        const int off = d - static_cast<int>(out.size() - s.size());
        if (off < 0 || s[static_cast<size_t>(off)] == 1) continue;
        offsets += " o" + std::to_string(i) + " += q * " + ll(st[static_cast<size_t>(off)]) + ";";
      }
      offsets += " }\n";
    }
  }
  std::string body;
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const ExprNode& x = e.nodes[i];
    std::string v;
    if (x.op == OpKind::Input)
      v = "in" + std::to_string(x.input) + "[" + (direct[static_cast<size_t>(x.input)] ? std::string("idx") : "o" + std::to_string(x.input)) + "]";
    else
      v = exprCode(x);
    body += "    const float t" + std::to_string(i) + " = " + v + ";\n";
  }
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kElementwise,
                              {{"COUNT", ll(count)}, {"OFFSETS", offsets}, {"BODY", body},
                               {"RESULT", std::to_string(e.nodes.size() - 1)}},
                              {gridFor((count + 3) / 4), 1, 1}, kThreads, allArgs(c.n)));  // four elements a thread
  return nk;
}

// A one-op expression over the node's own inputs.
NodeKernels primitive(const Ctx& c) {
  Expr e;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) {
    ExprNode leaf;
    leaf.input = static_cast<int>(i);
    e.nodes.push_back(leaf);
  }
  ExprNode op;
  op.op = c.n.op;
  op.value = c.n.op == OpKind::Scale ? c.n.attrs.get<attr::ScaleFactor>() : 0.0;  // scale is the one primitive with a value
  for (size_t i = 0; i < c.n.inputs.size(); ++i) op.args.push_back(static_cast<int>(i));
  e.nodes.push_back(op);
  return elementwise(c, e);
}

// ---- gather ------------------------------------------------------------------------------

// out[idx] = in[Σ_d (coord_d / div_d) · stride_d] over the output's extents.
NodeKernels gather(const Ctx& c, const std::vector<int64_t>& extents, const std::vector<int64_t>& divs,
                   const std::vector<int64_t>& strides) {
  std::string terms;
  for (int d = static_cast<int>(extents.size()) - 1; d >= 0; --d) {
    const size_t u = static_cast<size_t>(d);
    terms += "    { const long long q = rem % " + ll(extents[u]) + "; rem /= " + ll(extents[u]) + "; src += " +
             (divs[u] == 1 ? std::string("q") : "(q / " + ll(divs[u]) + ")") + " * " + ll(strides[u]) + "; }\n";
  }
  const int64_t count = numel(c.out());
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kGather, {{"COUNT", ll(count)}, {"TERMS", terms}}, {gridFor((count + 3) / 4), 1, 1}, kThreads,
                              allArgs(c.n)));
  return nk;
}

// ---- reductions --------------------------------------------------------------------------

// Note on the split reduction. A thread per output is fine when there are many outputs, but a
// bias gradient sums a [8192, 1024] tensor into 1024 outputs: four blocks, each thread walking
// 8192 values. When the outputs alone cannot fill the device, the reduced range is cut into
// P parts: a first kernel gives each (32 outputs × part) a block of 32×8 threads (lanes on
// consecutive outputs, so the loads coalesce when the kept axis is the inner one) that writes
// the part's double sum to scratch; a second adds the P parts of each output in order. Both
// orders are fixed, so the result is deterministic, and every sum is in double as before.
// Sums the input over the axes marked in `reduced` (the output keeps the others, in order).
// `input` and `output` name the node's operands (default: its only ones); `prefix`, when not
// empty, starts the kernels' names (a node with kernels of its own besides these).
NodeKernels reduce(const Ctx& c, const std::vector<bool>& reduced, double factor, int input = 0, int output = 0,
                   const std::string& prefix = std::string()) {
  const Shape& x = c.in(input);
  const std::string in = "in" + std::to_string(input), out = "out" + std::to_string(output);
  auto part = [&](const std::string& p) { return prefix.empty() ? p : p.empty() ? prefix : prefix + "_" + p; };
  const Shape st = contiguousStrides(x);
  std::string kept, red;
  int64_t outCount = 1, redCount = 1;
  for (int d = static_cast<int>(x.size()) - 1; d >= 0; --d) {
    const size_t u = static_cast<size_t>(d);
    if (reduced[u]) {
      red += "      { const long long q = rr % " + ll(x[u]) + "; rr /= " + ll(x[u]) + "; off += q * " + ll(st[u]) + "; }\n";
      redCount *= x[u];
    } else {
      kept += "    { const long long q = rem % " + ll(x[u]) + "; rem /= " + ll(x[u]) + "; base += q * " + ll(st[u]) + "; }\n";
      outCount *= x[u];
    }
  }
  char f[40];
  std::snprintf(f, sizeof f, "%.17g", factor);
  NodeKernels nk;
  // Split when the outputs give fewer than ~64K threads and each would walk over 256 values.
  constexpr int64_t kWantThreads = 65536, kMinChunk = 256;
  if (outCount < kWantThreads && redCount > kMinChunk) {
    const int64_t outBlocks = (outCount + 31) / 32;
    const int64_t wantParts = std::max<int64_t>(1, kWantThreads / 256 / outBlocks);
    const int64_t parts = std::min(wantParts, (redCount + kMinChunk - 1) / kMinChunk);
    const int64_t chunk = (redCount + parts - 1) / parts;
    const int64_t used = (redCount + chunk - 1) / chunk;
    nk.kernels.push_back(finish(c, part("partial"), kReducePartial,
                                {{"OUTCOUNT", ll(outCount)}, {"REDCOUNT", ll(redCount)}, {"KEPT", kept}, {"REDUCED", red},
                                 {"CHUNK", ll(chunk)}, {"IN", in}},
                                {static_cast<unsigned>(outBlocks), static_cast<unsigned>(used), 1}, kThreads,
                                {{KernelArg::Input, input}, {KernelArg::Scratch, 0}}));
    nk.kernels.push_back(finish(c, part("final"), kReduceFinal,
                                {{"OUTCOUNT", ll(outCount)}, {"PARTS", ll(used)}, {"FACTOR", f}, {"OUT", out}},
                                {gridFor(outCount), 1, 1}, kThreads, {{KernelArg::Output, output}, {KernelArg::Scratch, 0}}));
    nk.scratchBytes = static_cast<size_t>(used * outCount) * sizeof(double);
    return nk;
  }
  nk.kernels.push_back(finish(c, part(""), kReduce,
                              {{"OUTCOUNT", ll(outCount)}, {"REDCOUNT", ll(redCount)}, {"KEPT", kept}, {"REDUCED", red},
                               {"FACTOR", f}, {"IN", in}, {"OUT", out}},
                              {gridFor(outCount), 1, 1}, kThreads, {{KernelArg::Input, input}, {KernelArg::Output, output}}));
  return nk;
}

// ---- softmax rows ------------------------------------------------------------------------

NodeKernels softmaxGradRows(const Ctx& c, const std::string& finishCode) {
  const AxisSplit r = splitAroundAxis(c.in(0), c.n.attrs.get<attr::Axis>());
  const int64_t rows = r.outer * r.inner;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kSoftmaxGrad,
                              {{"ROWS", ll(rows)}, {"LEN", ll(r.len)}, {"INNER", ll(r.inner)}, {"FINISH", finishCode}},
                              {gridFor(rows), 1, 1}, kThreads, allArgs(c.n)));
  return nk;
}

}  // namespace

// ---- per-op emitters ---------------------------------------------------------------------

Kernel perIndexKernel(const Ctx& c, const std::string& part, int64_t count, int values, const std::string& loads, const std::string& stores,
                      std::vector<KernelArg> args) {
  return finish(c, part, kPerIndex, {{"COUNT", ll(count)}, {"NV", std::to_string(values)}, {"LOADS", loads}, {"STORES", stores}},
                {gridFor((count + 3) / 4), 1, 1}, kThreads, std::move(args));  // four indices a thread
}

NodeKernels emitInterleave(const Ctx& c) {
  NodeKernels nk;
  nk.kernels.push_back(perIndexKernel(c, "", numel(c.in(0)), 2, "        x[0] = in0[i], x[1] = in1[i];\n",
                                      "        out0[2 * i] = x[0];\n        out0[2 * i + 1] = x[1];\n", allArgs(c.n)));
  return nk;
}
NodeKernels emitDeinterleave(const Ctx& c) {
  NodeKernels nk;
  nk.kernels.push_back(perIndexKernel(c, "", numel(c.out()), 1,
                                      "        x[0] = in0[2 * i + " + std::to_string(c.n.attrs.get<attr::Part>()) + "];\n",
                                      "        out0[i] = x[0];\n", allArgs(c.n)));
  return nk;
}
NodeKernels emitConcat(const Ctx& c) {
  // Output column j of each row: the part whose columns [from, from + width) hold it.
  const int64_t width = c.out().back();
  std::string body = "        const long long r = i / " + ll(width) + ", j = i % " + ll(width) + ";\n";
  int64_t from = 0;
  for (size_t p = 0; p < c.n.inputs.size(); ++p) {
    const int64_t w = c.in(static_cast<int>(p)).back();
    const std::string in = "in" + std::to_string(p);
    const std::string read = in + "[r * " + ll(w) + " + j - " + ll(from) + "]";
    if (p + 1 == c.n.inputs.size()) body += "        else x[0] = " + read + ";\n";
    else body += std::string(p ? "        else " : "        ") + "if (j < " + ll(from + w) + ") x[0] = " + read + ";\n";
    from += w;
  }
  NodeKernels nk;
  nk.kernels.push_back(perIndexKernel(c, "", numel(c.out()), 1, body, "        out0[i] = x[0];\n", allArgs(c.n)));
  return nk;
}
NodeKernels emitSlice(const Ctx& c) {
  const int64_t length = c.n.attrs.get<attr::Length>();
  NodeKernels nk;
  nk.kernels.push_back(perIndexKernel(c, "", numel(c.out()), 1,
                                      "        x[0] = in0[(i / " + ll(length) + ") * " + ll(c.in(0).back()) + " + " +
                                          ll(c.n.attrs.get<attr::Start>()) + " + i % " + ll(length) + "];\n",
                                      "        out0[i] = x[0];\n", allArgs(c.n)));
  return nk;
}
NodeKernels emitSwigluGrad(const Ctx& c) {
  // The gradients dg, du of one (gate g, up) pair from dy = d: both kernels' formula.
  auto formula = [](const std::string& in) {
    return in + "const float s = 1.0f / (1.0f + expf(-g));\n" + in + "dg = d * up * s * (1.0f + g * (1.0f - s));\n" + in + "du = d * g * s;\n";
  };
  NodeKernels nk;
  if (c.inType(0) == DType::BF16 && c.inType(1) == DType::BF16 && c.outType(0) == DType::BF16) {
    const int64_t count = numel(c.in(0));
    nk.kernels.push_back(finish(c, "", kSwigluGradBf16, {{"COUNT", ll(count)}, {"FORMULA", formula("  ")}}, {gridFor((count + 7) / 8), 1, 1},
                                kThreads, allArgs(c.n)));
    return nk;
  }
  nk.kernels.push_back(perIndexKernel(c, "", numel(c.in(0)), 3, "        x[0] = in1[2 * i], x[1] = in1[2 * i + 1], x[2] = in0[i];\n",
                                      "        const float g = x[0], up = x[1], d = x[2];\n        float dg, du;\n" + formula("        ") +
                                          "        out0[2 * i] = dg;\n        out0[2 * i + 1] = du;\n",
                                      allArgs(c.n)));
  return nk;
}

NodeKernels emitInput(const Ctx&) { return {}; }
NodeKernels emitParam(const Ctx&) { return {}; }
NodeKernels emitConstant(const Ctx&) { return {}; }

NodeKernels emitAdd(const Ctx& c) { return primitive(c); }
NodeKernels emitSub(const Ctx& c) { return primitive(c); }
NodeKernels emitMul(const Ctx& c) { return primitive(c); }
NodeKernels emitDiv(const Ctx& c) { return primitive(c); }
NodeKernels emitScale(const Ctx& c) { return primitive(c); }
NodeKernels emitCast(const Ctx& c) { return primitive(c); }
NodeKernels emitRelu(const Ctx& c) { return primitive(c); }
NodeKernels emitGelu(const Ctx& c) { return primitive(c); }
NodeKernels emitTanh(const Ctx& c) { return primitive(c); }
NodeKernels emitSigmoid(const Ctx& c) { return primitive(c); }
NodeKernels emitExp(const Ctx& c) { return primitive(c); }
NodeKernels emitSilu(const Ctx& c) { return primitive(c); }
NodeKernels emitGeluTanh(const Ctx& c) { return primitive(c); }
NodeKernels emitBroadcastTo(const Ctx& c) { return primitive(c); }
NodeKernels emitReluGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitGeluGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitTanhGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitSigmoidGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitSiluGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitGeluTanhGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitFusedElementwise(const Ctx& c) { return elementwise(c, parseExpr(c.n.attrs.get<attr::Expr>())); }

NodeKernels emitSoftmax(const Ctx& c) {
  const AxisSplit r = splitAroundAxis(c.in(0), c.n.attrs.get<attr::Axis>());
  std::string sink = "-__int_as_float(0x7f800000)";
  if (c.n.inputs.size() == 2) {
    // The sink's offset for this row: its broadcast strides over the kept (outer, inner) index.
    Shape keep = c.in(0);
    keep[static_cast<size_t>(normaliseAxis(c.n.attrs.get<attr::Axis>(), keep.size()))] = 1;
    const Shape& s = c.in(1);
    const Shape st = contiguousStrides(s);
    std::string off = "0LL";
    int64_t div = 1;
    for (int d = static_cast<int>(keep.size()) - 1; d >= 0; --d) {
      const int sd = d - static_cast<int>(keep.size() - s.size());
      if (keep[static_cast<size_t>(d)] == 1) continue;
      if (sd >= 0 && s[static_cast<size_t>(sd)] != 1)
        off += " + ((row / " + ll(div) + ") % " + ll(keep[static_cast<size_t>(d)]) + ") * " + ll(st[static_cast<size_t>(sd)]);
      div *= keep[static_cast<size_t>(d)];
    }
    sink = "in1[" + off + "]";
  }
  const int64_t rows = r.outer * r.inner;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kSoftmax,
                              {{"ROWS", ll(rows)}, {"LEN", ll(r.len)}, {"INNER", ll(r.inner)}, {"SINK", sink}},
                              {gridFor(rows), 1, 1}, kThreads, allArgs(c.n)));
  return nk;
}

NodeKernels emitSoftmaxGrad(const Ctx& c) {
  const AxisSplit r = splitAroundAxis(c.in(0), c.n.attrs.get<attr::Axis>());
  return softmaxGradRows(c, "  (void)mass;\n  for (long long j = 0; j < " + ll(r.len) + "; ++j) {\n    const long long e = base + j * " +
                                ll(r.inner) + ";\n    out0[e] = (float)(in1[e] * (in0[e] - dot));\n  }\n");
}
NodeKernels emitSoftmaxSinkGrad(const Ctx&c) { return softmaxGradRows(c, "  out0[row] = (float)(-(1.0 - mass) * dot);\n"); }

NodeKernels emitPermute(const Ctx& c) {
  const Shape& x = c.in(0);
  const Shape st = contiguousStrides(x);
  const std::vector<int64_t> perm = c.n.attrs.get<attr::Perm>();
  std::vector<int64_t> ext, div, stride;
  for (int64_t p : perm) {
    ext.push_back(x[static_cast<size_t>(p)]);
    div.push_back(1);
    stride.push_back(st[static_cast<size_t>(p)]);
  }
  return gather(c, ext, div, stride);
}

NodeKernels emitReshape(const Ctx& c) {
  const int64_t n = numel(c.out());
  return gather(c, {n}, {1}, {1});
}

NodeKernels emitRepeatHeads(const Ctx& c) {
  const Shape& x = c.in(0);
  const Shape st = contiguousStrides(x);
  const int axis = normaliseAxis(c.n.attrs.get<attr::RepeatAxis>(), x.size());
  std::vector<int64_t> ext(c.out().begin(), c.out().end()), div(x.size(), 1), stride(st.begin(), st.end());
  div[static_cast<size_t>(axis)] = c.n.attrs.get<attr::Repeats>();  // output head h reads input head h / repeats
  return gather(c, ext, div, stride);
}

NodeKernels emitSum(const Ctx& c) { return reduce(c, reducedAxes(c.n, c.in(0)), 1.0); }
NodeKernels emitMean(const Ctx& c) {
  const std::vector<bool> r = reducedAxes(c.n, c.in(0));
  int64_t count = 1;
  for (size_t d = 0; d < r.size(); ++d) count *= r[d] ? c.in(0)[d] : 1;
  return reduce(c, r, count ? 1.0 / static_cast<double>(count) : 0.0);
}
NodeKernels emitAttentionMask(const Ctx& c) {
  const Shape& x = c.in(0);
  const int64_t count = numel(x);
  const AttrMap& a = c.n.attrs;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kMask,
                              {{"CAUSAL", a.get<attr::Causal>() ? "1" : "0"},
                               {"BR", a.get<attr::Align>() == "bottom-right" ? "1" : "0"},
                               {"LEFT", std::to_string(a.get<attr::WindowLeft>())},
                               {"RIGHT", std::to_string(a.get<attr::WindowRight>())},
                               {"SINKS", std::to_string(a.get<attr::Sinks>())}, {"COUNT", ll(count)},
                               {"QLEN", ll(x[x.size() - 2])}, {"KLEN", ll(x[x.size() - 1])},
                               {"FILL", num(a.get<attr::Fill>())}},
                              {gridFor(count), 1, 1}, kThreads, allArgs(c.n), {"common/attention_mask.h"}));
  return nk;
}

// MseLoss's split: one block up to kMseSplitAbove terms, else chunks of kMseChunk per block
// (kMseTerms a thread, all loaded in one round, so that a chunk waits on memory once; 16 keeps
// the grid of mlp_wide's 2M terms to one wave of blocks at the kernels' registers, where 8 took
// 1.3: bench/RESULTS.md, twenty-fifth and twenty-sixth sessions).
constexpr int64_t kMseSplitAbove = 65536, kMseTerms = 16, kMseChunk = 256 * kMseTerms;

// kMseRound for a chunk of the loss's sum; `gradStore`: the statement that also stores a term's
// gradient (MseLossGrad), or empty.
std::string mseRound(const std::string& gradStore) {
  return fillTemplate(kMseRound, {{"TERMS", std::to_string(kMseTerms)}, {"GRADSTORE", gradStore}});
}

NodeKernels emitMseLoss(const Ctx& c) {
  const int64_t n = numel(c.in(0));
  const std::string denom = std::to_string(std::max<int64_t>(n, 1)) + ".0";
  NodeKernels nk;
  constexpr int64_t kSplitAbove = kMseSplitAbove, kChunk = kMseChunk;
  if (n > kSplitAbove) {
    const int64_t parts = (n + kChunk - 1) / kChunk;
    nk.kernels.push_back(finish(c, "partial", kMsePartial, {{"COUNT", ll(n)}, {"CHUNK", ll(kChunk)}, {"ROUND", mseRound("")}},
                                {static_cast<unsigned>(parts), 1, 1}, kThreads,
                                {{KernelArg::Input, 0}, {KernelArg::Input, 1}, {KernelArg::Scratch, 0}}));
    nk.kernels.push_back(finish(c, "final", kMseFinal, {{"PARTS", ll(parts)}, {"DENOM", denom}}, {1, 1, 1}, kThreads,
                                {{KernelArg::Output, 0}, {KernelArg::Scratch, 0}}));
    nk.scratchBytes = static_cast<size_t>(parts) * sizeof(double);
    return nk;
  }
  nk.kernels.push_back(finish(c, "", kMse, {{"COUNT", ll(n)}, {"DENOM", denom}}, {1, 1, 1}, 1024, allArgs(c.n)));
  return nk;
}

// The loss and the prediction's gradient in one launch, the loss summed as MseLoss sums it (the
// same split, chunks and trees: the same bits). Small: one block; large: one block per chunk and
// a last-block-done final sum (kMseGradChunks), which needs the scratch zeroed once.
NodeKernels emitMseLossGrad(const Ctx& c) {
  const int64_t n = numel(c.in(0));
  const std::string denom = std::to_string(std::max<int64_t>(n, 1)) + ".0";
  const std::string scale = num(n ? 2.0 / static_cast<double>(n) : 0.0);
  NodeKernels nk;
  if (n > kMseSplitAbove) {
    std::vector<KernelArg> args = allArgs(c.n);
    args.push_back({KernelArg::Scratch, 0});
    const int64_t parts = (n + kMseChunk - 1) / kMseChunk;
    nk.kernels.push_back(finish(c, "", kMseGradChunks,
                                {{"COUNT", ll(n)}, {"CHUNK", ll(kMseChunk)}, {"PARTS", ll(parts)}, {"DENOM", denom},
                                 {"ROUND", mseRound("        out1[i + 256 * u] = ((p[u] - t[u]) * " + scale + ") * dy;\n")}},
                                {static_cast<unsigned>(parts), 1, 1}, kThreads, args));
    nk.scratchBytes = static_cast<size_t>(parts) * sizeof(double) + sizeof(unsigned);
    nk.zeroScratch = true;
    return nk;
  }
  nk.kernels.push_back(finish(c, "", kMseGrad, {{"COUNT", ll(n)}, {"DENOM", denom}, {"SCALE", scale}}, {1, 1, 1}, 1024, allArgs(c.n)));
  return nk;
}

/*
 * Note on the column product. A layer to one output has a weight gradient Aᵀ·B with B one column: a
 * weighted column sum of A [K, M], memory-bound, a GEMM tile 1/8 used. One launch does it and the
 * bias gradient Σ_k B[k] beside: a grid of (column blocks of CB = LANES·VEC columns) × (PARTS row
 * chunks); a block's LANES threads span its columns, VEC consecutive ones each (4, one 16-byte
 * load, where A is fp32 and 4 divides M), and its 256 / LANES rows of threads walk the chunk's
 * rows, four loads each in flight. CB is 32 columns (a 128-byte line of fp32), fewer where M is
 * narrower, so a narrow A still gives every thread rows, and a wide one many column blocks and so
 * few parts, which keeps the last block's sum short. The grid is about two blocks an SM
 * (EmitOptions::sms), each thread walking at least four rows. A block adds its rows in double in a
 * fixed tree and writes its partial row to scratch; the block that finishes a column block last (a
 * ticket after a fence, as MseLossGrad's chunks) adds the PARTS partial rows in a fixed order and
 * resets its ticket. No value is atomic, so every run gives the same bits. Scratch: PARTS·M
 * doubles, PARTS more for the bias, a ticket per column block, zeroed once by the runner.
 */
// The extent-1 products' test for their 16-byte accesses: whether `ptr` is 16-byte aligned where
// they move VEC = 4 values at once, `false` (one value at a time) where VEC = 1 or the operand is
// bf16 (a view with no address to test).
static std::string aligned16(int vec, const char* ptr) {
  return vec == 4 ? std::string("(((unsigned long long)") + ptr + ") & 15ull) == 0" : "false";
}

/*
 * Note on the column sums. A SumTo that reduces leading axes and keeps the trailing ones (a
 * bias gradient: [rows, N] -> [N]) runs as one launch: strips of CW = 32·VEC columns, a lane
 * taking VEC consecutive ones in one 16-byte load (8 bf16 or 4 fp32 values, where N holds whole
 * groups and the input's address allows), so that a warp reads 512 contiguous bytes of a row and
 * owns its columns (no sum across lanes); a block's eight warps take every eighth row of its
 * chunk, eight loads in flight. A lane adds its rows in fp32 (at most kColumnSumRows of them,
 * in order), the block its warps' sums in double in order, and the last block of a strip (a
 * ticket, as the column product) the chunks' in order: the same bits every run. The chunks:
 * about two blocks an SM, at most kColumnSumParts of them so that the last block's sums stay short.
 */
constexpr int64_t kColumnSumParts = 32, kColumnSumRows = 64;

NodeKernels sumToColumns(const Ctx& c, int64_t rows, int64_t n) {
  const bool bf16 = c.inType(0) == DType::BF16;
  const int vec = bf16 && n % 8 == 0 ? 8 : !bf16 && n % 4 == 0 ? 4 : 1;
  const int64_t cw = 32 * vec, strips = (n + cw - 1) / cw;
  const int64_t wantParts = std::max<int64_t>(1, 2 * std::max(c.opt->sms, 1) / strips);
  const int64_t minParts = (rows + 8 * kColumnSumRows - 1) / (8 * kColumnSumRows);  // a lane's rows at most kColumnSumRows
  const int64_t parts = std::max<int64_t>(minParts, std::min({wantParts, kColumnSumParts, (rows + 63) / 64}));
  const int64_t chunk = std::max<int64_t>(1, (rows + parts - 1) / parts);
  const int64_t used = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  std::string load, aligned = "false";
  if (vec == 8) {
    load = "      const uint4 v = *reinterpret_cast<const uint4*>(in0.p + r * N + col);\n"
           "      const unsigned w[4] = {v.x, v.y, v.z, v.w};\n"
           "#pragma unroll\n"
           "      for (int j = 0; j < 4; ++j) a[2 * j] = __uint_as_float(w[j] << 16), a[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);\n";
    aligned = "(((unsigned long long)in0.p) & 15ull) == 0";
  } else if (vec == 4) {
    load = "      const float4 v = *reinterpret_cast<const float4*>(in0 + r * N + col);\n"
           "      a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;\n";
    aligned = aligned16(4, "in0");
  }
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "colsums", kColumnSums,
                              {{"VEC", std::to_string(vec)}, {"N", ll(n)}, {"R", ll(rows)}, {"PARTS", ll(used)}, {"CHUNK", ll(chunk)},
                               {"ALIGNED", aligned}, {"LOADVEC", load}},
                              {static_cast<unsigned>(strips), static_cast<unsigned>(used), 1}, kThreads,
                              {{KernelArg::Input, 0}, {KernelArg::Output, 0}, {KernelArg::Scratch, 0}}, {"kernels/column_reduce.cuh"}));
  nk.scratchBytes = static_cast<size_t>(used * n) * sizeof(double) + static_cast<size_t>(strips) * sizeof(unsigned);
  nk.zeroScratch = true;
  return nk;
}

NodeKernels emitSumTo(const Ctx& c) {
  const Shape& x = c.in(0);
  const std::vector<bool> reduced = sumToReducedAxes(x, c.out());
  // Leading axes reduced, trailing ones kept (axes of extent 1 count as either): column sums.
  int64_t rows = 1;
  bool keeping = false, leading = true;
  for (size_t d = 0; d < x.size(); ++d) {
    if (x[d] == 1) continue;
    if (reduced[d] && keeping) leading = false;
    if (reduced[d]) rows *= x[d];
    else keeping = true;
  }
  if (leading && rows > 1 && numel(x) > 0) return sumToColumns(c, rows, numel(x) / rows);
  return reduce(c, reduced, 1.0);
}

NodeKernels columnProduct(const Ctx& c, bool bias) {
  const Shape& a = c.in(0);
  const int64_t k = a[0], m = a[1];
  const int vec = c.inType(0) == DType::F32 && m % 4 == 0 ? 4 : 1;
  int lanes = 1;
  while (lanes * vec < 32 && lanes * vec < m) lanes *= 2;
  const int64_t cb = lanes * vec, colBlocks = (m + cb - 1) / cb, rowThreads = 256 / lanes;
  const int64_t wantBlocks = 2 * std::max(c.opt->sms, 1);
  const int64_t parts = std::max<int64_t>(1, std::min(wantBlocks / colBlocks, k / (4 * rowThreads)));
  const int64_t chunk = std::max<int64_t>(1, (k + parts - 1) / parts);
  const int64_t used = std::max<int64_t>(1, (k + chunk - 1) / chunk);
  const std::string load = vec == 4 ? "        const float4 v = *reinterpret_cast<const float4*>(in0 + r * M + col);\n"
                                      "        a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;\n"
                                    : "";
  std::vector<KernelArg> args{{KernelArg::Input, 0}, {KernelArg::Input, 1}, {KernelArg::Output, 0}};
  if (bias) args.push_back({KernelArg::Output, 1});
  args.push_back({KernelArg::Scratch, 0});
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "colprod", kColumnProduct,
                              {{"LANES", std::to_string(lanes)}, {"VEC", std::to_string(vec)}, {"M", ll(m)}, {"K", ll(k)},
                               {"PARTS", ll(used)}, {"CHUNK", ll(chunk)}, {"ALIGNED", aligned16(vec, "in0")}, {"LOADVEC", load},
                               {"BIAS", bias ? "true" : "false"},
                               {"BIASSTORE", bias ? "if (threadIdx.x == 0) out1[0] = (float)bred[0];" : ""}},
                              {static_cast<unsigned>(colBlocks), static_cast<unsigned>(used), 1}, kThreads, args,
                              {"kernels/column_reduce.cuh"}));
  nk.scratchBytes = static_cast<size_t>(used * m + used) * sizeof(double) + static_cast<size_t>(colBlocks) * sizeof(unsigned);
  nk.zeroScratch = true;
  return nk;
}

NodeKernels outerProduct(const Ctx& c, int64_t m, int64_t n) {
  // 16-byte stores where the rows hold whole ones: 4 fp32 or 8 bf16 values (rounded as one at a time).
  const bool f32 = c.outType(0) == DType::F32;
  const int vec = f32 && n % 4 == 0 ? 4 : !f32 && n % 8 == 0 ? 8 : 1;
  const int64_t groups = m * n / vec;
  const std::string store =
      vec == 4   ? "        *reinterpret_cast<float4*>(out0 + i) = make_float4(v[0], v[1], v[2], v[3]);\n"
      : vec == 8 ? "        *reinterpret_cast<uint4*>(out0.p + i) = make_uint4(pa::storage::packBf16x2(v[0], v[1]), "
                   "pa::storage::packBf16x2(v[2], v[3]), pa::storage::packBf16x2(v[4], v[5]), pa::storage::packBf16x2(v[6], v[7]));\n"
                 : "";
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "outer", kOuterProduct,
                              {{"VEC", std::to_string(vec)}, {"N", ll(n)}, {"GROUPS", ll(groups)},
                               {"ALIGNED", vec == 8 ? "(((unsigned long long)out0.p) & 15ull) == 0" : aligned16(vec, "out0")},
                               {"STOREVEC", store}},
                              {gridFor((groups + 3) / 4), 1, 1}, kThreads, {{KernelArg::Input, 0}, {KernelArg::Input, 1}, {KernelArg::Output, 0}}));
  return nk;
}

NodeKernels rowDot(const Ctx& c, int64_t rows, int64_t k, bool relu) {
  const int vec = c.inType(0) == DType::F32 && k % 4 == 0 ? 4 : 1;
  const std::string load = vec == 4 ? "        const float4 t = *reinterpret_cast<const float4*>(in0 + row * K + q * 4);\n"
                                      "        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;\n"
                                    : "";
  std::string epi;
  if (c.n.inputs.size() == 3) epi += "      v += (float)in2[0];\n";
  if (relu) epi += "      v = fmaxf(v, 0.0f);\n";
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "rowdot", kRowDot,
                              {{"VEC", std::to_string(vec)}, {"ROWS", ll(rows)}, {"K", ll(k)}, {"ALIGNED", aligned16(vec, "in0")},
                               {"LOADVEC", load}, {"EPILOGUE", epi}},
                              {gridFor(rows * 32), 1, 1}, kThreads, allArgs(c.n)));
  return nk;
}

NodeKernels columnSums(const Ctx& c, int input, int output) { return reduce(c, {true, false}, 1.0, input, output, "colsum"); }

}  // namespace pa::codegen::detail
