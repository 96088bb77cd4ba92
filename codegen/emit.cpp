// Emitters: one function per op of ops.def. Families share a template each:
//   elementwise  every elementwise/broadcast op and FusedElementwise, from its expression;
//   gather       Permute, Reshape, RepeatHeads (an output index mapped to one input offset);
//   reduce       Sum, Mean, SumTo (a thread per output element, double accumulation);
//   rows         Softmax and its gradients (a thread per row);
//   mask         AttentionMask (the shared predicate of kernels/attention_mask.h);
//   gemm         MatMul and FusedLinear (64×64 tiles, fp32 FFMA, bias/activation epilogue);
//   mse          MseLoss (one block, a fixed-order tree: deterministic);
//   flash        FlashAttention and its gradient: the launcher's instantiations.
// Shapes are baked into the source as constants, so each kernel is specialised to its node
// and the generated text is byte-identical from run to run.
#include "codegen/emit.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/embedded_kernels.h"
#include "codegen/template.h"
#include "graph/elementwise_expr.h"
#include "graph/node_attrs.h"
#include "kernels/flash_attention.h"

namespace pa::codegen {

namespace {

constexpr unsigned kThreads = 256;

std::string num(double v) {
  if (std::isinf(v)) return v < 0 ? "(-__int_as_float(0x7f800000))" : "__int_as_float(0x7f800000)";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9gf", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s.insert(s.size() - 1, ".0");
  return s;
}
std::string ll(int64_t v) { return std::to_string(v) + "LL"; }

std::string sanitize(const std::string& s) {
  std::string r;
  for (char c : s) r += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return r;
}

struct Ctx {
  const Graph& g;
  const Node& n;
  const Shape& in(int i) const { return g.shape(n.inputs[static_cast<size_t>(i)]); }
  const Shape& out(int i = 0) const { return g.shape(n.outputs[static_cast<size_t>(i)]); }
  std::string kernelName(const std::string& part = "") const {
    return "k" + std::to_string(n.id) + "_" + sanitize(opName(n.op)) + (part.empty() ? "" : "_" + part);
  }
};

const char* kHeader = R"(// PureAttention generated kernel ${NAME}
// implements node '${NODE}' (${OP}) of the training graph
// launch: grid (${GX}, ${GY}, ${GZ}), block (${BX}, 1, 1), dynamic shared memory ${SMEM} bytes
// arguments: ${ARGDOC}
)";

// Assembles a kernel: header comment, body from `tpl` with `vars`, launch and arguments.
Kernel finish(const Ctx& c, const std::string& part, const std::string& tpl, TemplateVars vars, std::array<unsigned, 3> grid,
              unsigned block, std::vector<KernelArg> args, std::vector<std::string> headers = {}, unsigned smem = 0) {
  Kernel k;
  k.name = c.kernelName(part);
  k.grid = grid;
  k.block = {block, 1, 1};
  k.sharedBytes = smem;
  k.args = std::move(args);
  k.headers = std::move(headers);
  std::string params, doc;
  int inputs = 0, outputs = 0;
  for (const KernelArg& a : k.args) {
    const std::string sep = params.empty() ? "" : ", ";
    switch (a.kind) {
    case KernelArg::Input:
      params += sep + "const float* __restrict__ in" + std::to_string(a.index);
      doc += sep + "in" + std::to_string(a.index) + " = " + c.g.value(c.n.inputs[static_cast<size_t>(a.index)]).name;
      ++inputs;
      break;
    case KernelArg::Output:
      params += sep + "float* __restrict__ out" + std::to_string(a.index);
      doc += sep + "out" + std::to_string(a.index) + " = " + c.g.value(c.n.outputs[static_cast<size_t>(a.index)]).name;
      ++outputs;
      break;
    case KernelArg::Scratch:
      params += sep + "float* __restrict__ scratch";
      doc += sep + "scratch";
      break;
    }
  }
  (void)inputs;
  (void)outputs;
  vars["NAME"] = k.name;
  vars["PARAMS"] = params;
  k.source = fillTemplate(kHeader, {{"NAME", k.name}, {"NODE", c.n.name}, {"OP", opName(c.n.op)},
                                    {"GX", std::to_string(grid[0])}, {"GY", std::to_string(grid[1])},
                                    {"GZ", std::to_string(grid[2])}, {"BX", std::to_string(block)},
                                    {"SMEM", std::to_string(smem)}, {"ARGDOC", doc}}) +
             fillTemplate(tpl, vars);
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

// ---- elementwise -------------------------------------------------------------------------

const char* kElementwise = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256) {
${OFFSETS}${BODY}    out0[idx] = t${RESULT};
  }
}
)";

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
  case OpKind::Gelu: return "0.5f * " + t(0) + " * (1.0f + erff(" + t(0) + " * 0.70710678118654752f))";
  case OpKind::Tanh: return "tanhf(" + t(0) + ")";
  case OpKind::Sigmoid: return "1.0f / (1.0f + expf(-" + t(0) + "))";
  case OpKind::Exp: return "expf(" + t(0) + ")";
  case OpKind::BroadcastTo: return t(0);
  case OpKind::ReluGrad: return t(1) + " > 0.0f ? " + t(0) + " : 0.0f";
  case OpKind::GeluGrad:
    return t(0) + " * (0.5f * (1.0f + erff(" + t(1) + " * 0.70710678118654752f)) + " + t(1) + " * 0.39894228040143268f * expf(-0.5f * " +
           t(1) + " * " + t(1) + "))";
  case OpKind::TanhGrad: return t(0) + " * (1.0f - " + t(1) + " * " + t(1) + ")";
  case OpKind::SigmoidGrad: return t(0) + " * " + t(1) + " * (1.0f - " + t(1) + ")";
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
                              {gridFor(count), 1, 1}, kThreads, allArgs(c.n)));
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
  op.value = c.n.attrs.getFloat("value", 0.0);
  for (size_t i = 0; i < c.n.inputs.size(); ++i) op.args.push_back(static_cast<int>(i));
  e.nodes.push_back(op);
  return elementwise(c, e);
}

// ---- gather ------------------------------------------------------------------------------

const char* kGather = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256) {
    long long rem = idx, src = 0;
${TERMS}    out0[idx] = in0[src];
  }
}
)";

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
  nk.kernels.push_back(finish(c, "", kGather, {{"COUNT", ll(count)}, {"TERMS", terms}}, {gridFor(count), 1, 1}, kThreads,
                              allArgs(c.n)));
  return nk;
}

// ---- reductions --------------------------------------------------------------------------

const char* kReduce = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${OUTCOUNT}; idx += (long long)gridDim.x * 256) {
    long long rem = idx, base = 0;
${KEPT}    double acc = 0.0;
    for (long long r = 0; r < ${REDCOUNT}; ++r) {
      long long rr = r, off = base;
${REDUCED}      acc += (double)in0[off];
    }
    out0[idx] = (float)(acc * ${FACTOR});
  }
}
)";

// Sums the input over the axes marked in `reduced` (the output keeps the others, in order).
NodeKernels reduce(const Ctx& c, const std::vector<bool>& reduced, double factor) {
  const Shape& x = c.in(0);
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
  nk.kernels.push_back(finish(c, "", kReduce,
                              {{"OUTCOUNT", ll(outCount)}, {"REDCOUNT", ll(redCount)}, {"KEPT", kept}, {"REDUCED", red},
                               {"FACTOR", f}},
                              {gridFor(outCount), 1, 1}, kThreads, allArgs(c.n)));
  return nk;
}

// ---- softmax rows ------------------------------------------------------------------------

const char* kSoftmax = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  const long long row = (long long)blockIdx.x * 256 + threadIdx.x;
  if (row >= ${ROWS}) return;
  const long long o = row / ${INNER}, i = row % ${INNER};
  const float* x = in0 + o * ${LEN} * ${INNER} + i;
  float* y = out0 + o * ${LEN} * ${INNER} + i;
  const float ninf = -__int_as_float(0x7f800000);
  const float s = ${SINK};
  float m = s;
  for (long long j = 0; j < ${LEN}; ++j) m = fmaxf(m, x[j * ${INNER}]);
  if (m == ninf) {  // every logit masked and no sink: zeros, never NaN
    for (long long j = 0; j < ${LEN}; ++j) y[j * ${INNER}] = 0.0f;
    return;
  }
  double sum = s == ninf ? 0.0 : (double)expf(s - m);
  for (long long j = 0; j < ${LEN}; ++j) {
    const float v = x[j * ${INNER}];
    const float e = v == ninf ? 0.0f : expf(v - m);
    y[j * ${INNER}] = e;
    sum += e;
  }
  const float inv = (float)(1.0 / sum);
  for (long long j = 0; j < ${LEN}; ++j) y[j * ${INNER}] *= inv;
}
)";

const char* kSoftmaxGrad = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  const long long row = (long long)blockIdx.x * 256 + threadIdx.x;
  if (row >= ${ROWS}) return;
  const long long base = (row / ${INNER}) * ${LEN} * ${INNER} + row % ${INNER};
  double dot = 0.0, mass = 0.0;
  for (long long j = 0; j < ${LEN}; ++j) {
    dot += (double)in0[base + j * ${INNER}] * in1[base + j * ${INNER}];
    mass += in1[base + j * ${INNER}];
  }
${FINISH}}
)";

// ---- GEMM --------------------------------------------------------------------------------

// Note on the GEMM: a correct, plainly tiled fp32 kernel (64×64 output tiles, 16-deep K
// slices through shared memory, a 4×4 register micro-tile per thread). The tensor-core GEMM
// with autotuned tiles is its own piece of work; this one keeps every path exact (TF32 off).
const char* kGemm = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  __shared__ float As[16][64 + 4];
  __shared__ float Bs[16][64 + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const long long m0 = (long long)blockIdx.y * 64, n0 = (long long)blockIdx.x * 64, b = blockIdx.z;
  const float* A = in0 + b * ${ABATCH};
  const float* B = in1 + b * ${BBATCH};
  // Blocked summation: 16 products into `part`, 8 parts (128 of K) into `mid`, then into
  // `acc`: the rounding error grows like (16 + 8 + K/128)·ε instead of K·ε (K = 8192 in the
  // weight gradients of a batch-8192 layer).
  float acc[4][4] = {}, mid[4][4] = {};
  for (long long k0 = 0; k0 < ${K}; k0 += 16) {
    for (int t = threadIdx.x; t < 16 * 64; t += 256) {
      const int kk = t / 64, mm = t % 64;
      const long long m = m0 + mm, k = k0 + kk, n = n0 + mm;
      As[kk][mm] = (m < ${M} && k < ${K}) ? A[${AINDEX}] : 0.0f;
      Bs[kk][mm] = (n < ${N} && k < ${K}) ? B[${BINDEX}] : 0.0f;
    }
    __syncthreads();
    float part[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float a[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] = fmaf(a[i], bv[j], part[i][j]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) mid[i][j] += part[i][j];
    if ((k0 / 16) % 8 == 7) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[i][j] += mid[i][j];
          mid[i][j] = 0.0f;
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] += mid[i][j];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const long long m = m0 + ty * 4 + i;
    if (m >= ${M}) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long n = n0 + tx * 4 + j;
      if (n >= ${N}) continue;
      float v = acc[i][j];
${EPILOGUE}      out0[b * ${M} * ${N} + m * ${N} + n] = v;
    }
  }
}
)";

NodeKernels gemm(const Ctx& c, int64_t batch, int64_t aBatch, int64_t bBatch, int64_t m, int64_t n, int64_t k, bool ta,
                 bool tb, const std::string& epilogue) {
  const unsigned gx = static_cast<unsigned>((n + 63) / 64), gy = static_cast<unsigned>((m + 63) / 64);
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kGemm,
                              {{"M", ll(m)}, {"N", ll(n)}, {"K", ll(k)}, {"ABATCH", ll(aBatch)}, {"BBATCH", ll(bBatch)},
                               {"AINDEX", ta ? "k * " + ll(m) + " + m" : "m * " + ll(k) + " + k"},
                               {"BINDEX", tb ? "n * " + ll(k) + " + k" : "k * " + ll(n) + " + n"},
                               {"EPILOGUE", epilogue}},
                              {gx, gy, static_cast<unsigned>(batch)}, kThreads, allArgs(c.n)));
  return nk;
}

// ---- per-op emitters ---------------------------------------------------------------------

NodeKernels emitInput(const Ctx&) { return {}; }
NodeKernels emitParam(const Ctx&) { return {}; }
NodeKernels emitConstant(const Ctx&) { return {}; }

NodeKernels emitMatMul(const Ctx& c) {
  const Shape& a = c.in(0);
  const Shape& b = c.in(1);
  const bool ta = c.n.attrs.getBool("transpose_a", false), tb = c.n.attrs.getBool("transpose_b", false);
  const int64_t m = ta ? a[a.size() - 1] : a[a.size() - 2], k = ta ? a[a.size() - 2] : a[a.size() - 1];
  const int64_t n = tb ? b[b.size() - 2] : b[b.size() - 1];
  const int64_t batchA = numel(llvm::ArrayRef<int64_t>(a.data(), a.size() - 2));
  const int64_t batchB = numel(llvm::ArrayRef<int64_t>(b.data(), b.size() - 2));
  // A batch of row blocks times one shared matrix is a single taller GEMM.
  if (a.size() > 2 && b.size() == 2 && !ta) return gemm(c, 1, 0, 0, batchA * m, n, k, false, tb, "");
  return gemm(c, std::max(batchA, batchB), a.size() > 2 ? m * k : 0, b.size() > 2 ? k * n : 0, m, n, k, ta, tb, "");
}

NodeKernels emitAdd(const Ctx& c) { return primitive(c); }
NodeKernels emitSub(const Ctx& c) { return primitive(c); }
NodeKernels emitMul(const Ctx& c) { return primitive(c); }
NodeKernels emitDiv(const Ctx& c) { return primitive(c); }
NodeKernels emitScale(const Ctx& c) { return primitive(c); }
NodeKernels emitRelu(const Ctx& c) { return primitive(c); }
NodeKernels emitGelu(const Ctx& c) { return primitive(c); }
NodeKernels emitTanh(const Ctx& c) { return primitive(c); }
NodeKernels emitSigmoid(const Ctx& c) { return primitive(c); }
NodeKernels emitExp(const Ctx& c) { return primitive(c); }
NodeKernels emitBroadcastTo(const Ctx& c) { return primitive(c); }
NodeKernels emitReluGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitGeluGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitTanhGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitSigmoidGrad(const Ctx& c) { return primitive(c); }
NodeKernels emitFusedElementwise(const Ctx& c) { return elementwise(c, parseExpr(c.n.attrs.getString("expr", ""))); }

NodeKernels emitSoftmax(const Ctx& c) {
  const AxisSplit r = splitAroundAxis(c.in(0), c.n.attrs.getInt("axis", -1));
  std::string sink = "-__int_as_float(0x7f800000)";
  if (c.n.inputs.size() == 2) {
    // The sink's offset for this row: its broadcast strides over the kept (outer, inner) index.
    Shape keep = c.in(0);
    keep[static_cast<size_t>(normaliseAxis(c.n.attrs.getInt("axis", -1), keep.size()))] = 1;
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

NodeKernels softmaxGradRows(const Ctx& c, const std::string& finishCode) {
  const AxisSplit r = splitAroundAxis(c.in(0), c.n.attrs.getInt("axis", -1));
  const int64_t rows = r.outer * r.inner;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kSoftmaxGrad,
                              {{"ROWS", ll(rows)}, {"LEN", ll(r.len)}, {"INNER", ll(r.inner)}, {"FINISH", finishCode}},
                              {gridFor(rows), 1, 1}, kThreads, allArgs(c.n)));
  return nk;
}
NodeKernels emitSoftmaxGrad(const Ctx& c) {
  const AxisSplit r = splitAroundAxis(c.in(0), c.n.attrs.getInt("axis", -1));
  return softmaxGradRows(c, "  (void)mass;\n  for (long long j = 0; j < " + ll(r.len) + "; ++j) {\n    const long long e = base + j * " +
                                ll(r.inner) + ";\n    out0[e] = (float)(in1[e] * (in0[e] - dot));\n  }\n");
}
NodeKernels emitSoftmaxSinkGrad(const Ctx&c) { return softmaxGradRows(c, "  out0[row] = (float)(-(1.0 - mass) * dot);\n"); }

NodeKernels emitPermute(const Ctx& c) {
  const Shape& x = c.in(0);
  const Shape st = contiguousStrides(x);
  const std::vector<int64_t> perm = c.n.attrs.getInts("perm");
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
  const int axis = normaliseAxis(c.n.attrs.getInt("axis", 1), x.size());
  std::vector<int64_t> ext(c.out().begin(), c.out().end()), div(x.size(), 1), stride(st.begin(), st.end());
  div[static_cast<size_t>(axis)] = c.n.attrs.getInt("repeats", 1);  // output head h reads input head h / repeats
  return gather(c, ext, div, stride);
}

NodeKernels emitSum(const Ctx& c) { return reduce(c, reducedAxes(c.n, c.in(0)), 1.0); }
NodeKernels emitMean(const Ctx& c) {
  const std::vector<bool> r = reducedAxes(c.n, c.in(0));
  int64_t count = 1;
  for (size_t d = 0; d < r.size(); ++d) count *= r[d] ? c.in(0)[d] : 1;
  return reduce(c, r, count ? 1.0 / static_cast<double>(count) : 0.0);
}
NodeKernels emitSumTo(const Ctx& c) {
  return reduce(c, sumToReducedAxes(c.in(0), c.out()), 1.0);
}

const char* kMask = R"(
#include "kernels/attention_mask.h"

extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::AttentionMaskSpec m;
  m.causal = ${CAUSAL};
  m.alignBottomRight = ${BR};
  m.windowLeft = ${LEFT};
  m.windowRight = ${RIGHT};
  m.sinks = ${SINKS};
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256) {
    const long long k = idx % ${KLEN}, q = (idx / ${KLEN}) % ${QLEN};
    out0[idx] = pa::keyVisible(m, q, k, ${QLEN}, ${KLEN}) ? in0[idx] : ${FILL};
  }
}
)";

NodeKernels emitAttentionMask(const Ctx& c) {
  const Shape& x = c.in(0);
  const int64_t count = numel(x);
  const AttrMap& a = c.n.attrs;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kMask,
                              {{"CAUSAL", a.getBool("causal", false) ? "1" : "0"},
                               {"BR", a.getString("align", "top-left") == "bottom-right" ? "1" : "0"},
                               {"LEFT", std::to_string(a.getInt("window_left", -1))},
                               {"RIGHT", std::to_string(a.getInt("window_right", -1))},
                               {"SINKS", std::to_string(a.getInt("sinks", 0))}, {"COUNT", ll(count)},
                               {"QLEN", ll(x[x.size() - 2])}, {"KLEN", ll(x[x.size() - 1])},
                               {"FILL", num(a.getFloat("fill", -INFINITY))}},
                              {gridFor(count), 1, 1}, kThreads, allArgs(c.n), {"kernels/attention_mask.h"}));
  return nk;
}

const char* kMse = R"(
extern "C" __global__ void __launch_bounds__(1024) ${NAME}(${PARAMS}) {
  __shared__ double part[1024];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < ${COUNT}; i += 1024) {
    const double d = (double)in0[i] - (double)in1[i];
    acc += d * d;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 512; s > 0; s >>= 1) {  // a fixed tree: the same sum every run
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out0[0] = (float)(part[0] / ${DENOM});
}
)";

NodeKernels emitMseLoss(const Ctx& c) {
  const int64_t n = numel(c.in(0));
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kMse, {{"COUNT", ll(n)}, {"DENOM", std::to_string(std::max<int64_t>(n, 1)) + ".0"}},
                              {1, 1, 1}, 1024, allArgs(c.n)));
  return nk;
}

NodeKernels emitFusedLinear(const Ctx& c) {
  const Shape& x = c.in(0);
  const Shape& w = c.in(1);
  const bool tw = c.n.attrs.getBool("transpose_w", false);
  const int64_t k = x.back(), n = tw ? w[0] : w[1], rows = numel(x) / std::max<int64_t>(k, 1);
  const std::string act = c.n.attrs.getString("activation", "none");
  std::string epi;
  if (c.n.inputs.size() == 3) epi += "      v += in2[n];\n";
  if (act == "gelu") epi += "      out1[m * " + ll(n) + " + n] = v;\n      v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));\n";
  if (act == "relu") epi += "      v = fmaxf(v, 0.0f);\n";
  return gemm(c, 1, 0, 0, rows, n, k, false, tw, epi);
}

}  // namespace

FlashAttentionConfig flashConfigOf(const Graph& g, const Node& n) {
  const Ctx c{g, n};
  const Shape& q = c.in(0);
  const Shape& k = c.in(1);
  FlashAttentionConfig f;
  f.dtype = kFlashF32;
  f.batch = static_cast<int>(q[0]);
  f.heads = static_cast<int>(q[1]);
  f.kvHeads = static_cast<int>(k[1]);
  f.qLen = static_cast<int>(q[2]);
  f.kLen = static_cast<int>(k[2]);
  f.headDim = static_cast<int>(q[3]);
  f.scale = static_cast<float>(c.n.attrs.getFloat("scale", 1.0));
  f.mask = maskSpecOf(c.n.attrs);
  f.sinkLogits = c.n.op == OpKind::FlashAttention ? c.n.inputs.size() == 4 : c.n.inputs.size() == 7;
  return f;
}

namespace {

// FlashAttention nodes run through the launcher; these are the instantiations it would pick.

NodeKernels flashKernels(const Ctx& c, const std::vector<FlashKernelKind>& kinds) {
  NodeKernels nk;
  nk.external = true;
  const FlashAttentionConfig cfg = flashConfigOf(c.g, c.n);
  for (FlashKernelKind kind : kinds) {
    FlashKernelSpec spec;
    try {
      spec = FlashAttention::chooseSpec(kind, cfg);
    } catch (const std::exception&) {
      continue;  // a kind this configuration does not use
    }
    Kernel k;
    k.name = spec.name();
    k.source = "// PureAttention: FlashAttention instantiation for node '" + c.n.name + "' (" + opName(c.n.op) +
               "), launched by kernels/flash_attention.cpp\n" + spec.source();
    k.block = {static_cast<unsigned>(spec.threads()), 1, 1};
    k.sharedBytes = static_cast<unsigned>(spec.sharedBytes());
    nk.kernels.push_back(std::move(k));
  }
  return nk;
}
NodeKernels emitFlashAttention(const Ctx& c) { return flashKernels(c, {FlashKernelKind::kForward}); }
NodeKernels emitFlashAttentionGrad(const Ctx& c) {
  return flashKernels(c, {FlashKernelKind::kBwdPreprocess, FlashKernelKind::kBwdSinkReduce, FlashKernelKind::kBwdDkDv,
                          FlashKernelKind::kBwdDq, FlashKernelKind::kBwdDqConvert, FlashKernelKind::kBwdDkDvReduce});
}

using EmitFn = NodeKernels (*)(const Ctx&);
const EmitFn kEmit[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs) &emit##Name,
#include "graph/ops.def"
};

}  // namespace

NodeKernels emitNode(const Graph& g, NodeId id) {
  const Ctx c{g, g.node(id)};
  return kEmit[static_cast<int>(c.n.op)](c);
}

std::string selfContainedSource(const Kernel& k) {
  // Paste each embedded header at its first #include (headers include one another, so repeat
  // until nothing is left) and drop later #includes of the same file.
  std::string src = k.source;
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& h : embeddedKernelHeaders()) {
      const std::string inc = "#include \"" + h.first + "\"";
      size_t at = src.find(inc);
      if (at == std::string::npos) continue;
      src.replace(at, inc.size(), "// ---- " + h.first + " (embedded) ----\n" + h.second);
      changed = true;
      while ((at = src.find(inc)) != std::string::npos) src.erase(at, inc.size());
    }
  }
  return src;
}

int dumpKernels(const Graph& g, const std::string& dir) {
  std::filesystem::create_directories(dir);
  int written = 0;
  for (NodeId id : g.topoOrder()) {
    for (const Kernel& k : emitNode(g, id).kernels) {
      std::ofstream(std::filesystem::path(dir) / (k.name + ".cu")) << selfContainedSource(k);
      ++written;
    }
  }
  return written;
}

}  // namespace pa::codegen

namespace pa::codegen {

// Adam here is the formula of kernels/cpu/cpu_kernels.cpp's adamStep, in double, so the CPU and
// GPU trainers take the same steps up to the rounding of the gradients they are given.
std::string trainingKernelsSource() {
  return R"(// PureAttention training kernels: batch gather and Adam (decoupled weight decay).
extern "C" __global__ void __launch_bounds__(256) pa_gather_rows(const float* __restrict__ src, const int* __restrict__ idx,
                                                                  float* __restrict__ dst, long long rowSize, long long rows) {
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < rows * rowSize; i += (long long)gridDim.x * 256) {
    const long long r = i / rowSize, c = i % rowSize;
    dst[i] = src[(long long)idx[r] * rowSize + c];
  }
}

extern "C" __global__ void __launch_bounds__(256) pa_adam(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                                          float* __restrict__ v, long long n, double lr, double beta1, double beta2,
                                                          double eps, double decay, double c1, double c2, double gradScale) {
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n; i += (long long)gridDim.x * 256) {
    const double gi = (double)g[i] * gradScale;
    const double mi = beta1 * m[i] + (1.0 - beta1) * gi;
    const double vi = beta2 * v[i] + (1.0 - beta2) * gi * gi;
    m[i] = (float)mi;
    v[i] = (float)vi;
    p[i] = (float)(p[i] * decay - lr * (mi / c1) / (sqrt(vi / c2) + eps));
  }
}
)";
}

}  // namespace pa::codegen
