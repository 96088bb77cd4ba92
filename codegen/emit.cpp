// Emitters: one function per op of ops.def. Families share a template each:
//   elementwise  every elementwise/broadcast op and FusedElementwise, from its expression;
//   gather       Permute, Reshape, RepeatHeads (an output index mapped to one input offset);
//   reduce       Sum, Mean, SumTo (a thread per output element, double accumulation);
//   rows         Softmax and its gradients (a thread per row);
//   mask         AttentionMask (the shared predicate of common/attention_mask.h);
//   gemm         MatMul and FusedLinear (kernels/gemm.cuh: fp32 SIMT or TF32 mma.sync, tiles
//                from the shape, bias/activation epilogue functor);
//   mse          MseLoss (one block, a fixed-order tree: deterministic);
//   flash        FlashAttention and its gradient: the launcher's instantiations.
// Shapes are baked into the source as constants, so each kernel is specialised to its node
// and the generated text is byte-identical from run to run.
#include "codegen/emit.h"

#include <algorithm>
#include <cassert>
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
// GELU (the erf form) of the expression `x`.
std::string geluOf(const std::string& x) { return "0.5f * " + x + " * (1.0f + erff(" + x + " * 0.70710678118654752f))"; }
// dy ⊙ act′(x) for act relu | gelu (ReluGrad, GeluGrad, matmul-act-grad's epilogues); `x` is
// read more than once, so it should name a value.
std::string activationGradOf(const std::string& act, const std::string& dy, const std::string& x) {
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

const EmitOptions kDefaultOptions{};

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
std::string argType(DType t, bool output) {
  switch (t) {
  case DType::F32: return output ? "float* __restrict__" : "const float* __restrict__";
  case DType::BF16: return output ? "pa_bf16_out" : "pa_bf16_in";
  default: throw std::invalid_argument(std::string("the CUDA backend stores no ") + dtypeName(t) + " values");
  }
}

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
  bool bf16 = false;
  for (const KernelArg& a : k.args) {
    const std::string sep = params.empty() ? "" : ", ";
    if (a.kind == KernelArg::Scratch) {
      params += sep + "float* __restrict__ scratch";
      doc += sep + "scratch";
      continue;
    }
    if (a.kind == KernelArg::InputTensorMap || a.kind == KernelArg::ScratchTensorMap) {
      const std::string name = "map" + std::to_string(a.index);
      const std::string of = c.g.value(c.n.inputs[static_cast<size_t>(a.index)]).name;
      params += sep + "const __grid_constant__ pa::sm90::TensorMap " + name;
      doc += sep + name + " = TMA map of " + (a.kind == KernelArg::InputTensorMap ? of : of + " transposed, in scratch") +
             (a.map.elementBytes == 2 ? " (bf16)" : "");
      continue;
    }
    const bool output = a.kind == KernelArg::Output;
    const std::string name = (output ? "out" : "in") + std::to_string(a.index);
    const Value& v = c.g.value(output ? c.n.outputs[static_cast<size_t>(a.index)] : c.n.inputs[static_cast<size_t>(a.index)]);
    params += sep + argType(v.type.dtype, output) + " " + name;
    doc += sep + name + " = " + v.name + (v.type.dtype == DType::F32 ? "" : " (bf16)");
    bf16 |= v.type.dtype == DType::BF16;
  }
  // The bf16 views; the GEMM headers include them themselves.
  const bool includeStorage = bf16 && std::find(k.headers.begin(), k.headers.end(), "kernels/gemm.cuh") == k.headers.end() &&
                              std::find(k.headers.begin(), k.headers.end(), "kernels/gemm_wgmma.cuh") == k.headers.end();
  if (includeStorage) k.headers.push_back("kernels/storage.cuh");
  vars["NAME"] = k.name;
  vars["PARAMS"] = params;
  k.source = fillTemplate(kHeader, {{"NAME", k.name}, {"NODE", c.n.name}, {"OP", opName(c.n.op)},
                                    {"GX", std::to_string(grid[0])}, {"GY", std::to_string(grid[1])},
                                    {"GZ", std::to_string(grid[2])}, {"BX", std::to_string(block)},
                                    {"SMEM", std::to_string(smem)}, {"ARGDOC", doc}}) +
             (includeStorage ? "#include \"kernels/storage.cuh\"\n" : "") +
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
  case OpKind::Gelu: return geluOf(t(0));
  case OpKind::Tanh: return "tanhf(" + t(0) + ")";
  case OpKind::Sigmoid: return "1.0f / (1.0f + expf(-" + t(0) + "))";
  case OpKind::Exp: return "expf(" + t(0) + ")";
  case OpKind::BroadcastTo: return t(0);
  case OpKind::Cast: return t(0);  // the store rounds to the output's dtype
  case OpKind::ReluGrad: return activationGradOf("relu", t(0), t(1));
  case OpKind::GeluGrad: return activationGradOf("gelu", t(0), t(1));
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

// Note on the split reduction. A thread per output is fine when there are many outputs, but a
// bias gradient sums a [8192, 1024] tensor into 1024 outputs: four blocks, each thread walking
// 8192 values. When the outputs alone cannot fill the device, the reduced range is cut into
// P parts: a first kernel gives each (32 outputs × part) a block of 32×8 threads (lanes on
// consecutive outputs, so the loads coalesce when the kept axis is the inner one) that writes
// the part's double sum to scratch; a second adds the P parts of each output in order. Both
// orders are fixed, so the result is deterministic, and every sum is in double as before.
const char* kReducePartial = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  __shared__ double red[8][32];
  const int lane = threadIdx.x % 32, ty = threadIdx.x / 32;
  const long long idx = (long long)blockIdx.x * 32 + lane, part = blockIdx.y;
  double acc = 0.0;
  if (idx < ${OUTCOUNT}) {
    long long rem = idx, base = 0;
${KEPT}    const long long r0 = part * ${CHUNK}, r1 = min(r0 + ${CHUNK}, ${REDCOUNT});
    for (long long r = r0 + ty; r < r1; r += 8) {
      long long rr = r, off = base;
${REDUCED}      acc += (double)in0[off];
    }
  }
  red[ty][lane] = acc;
  __syncthreads();
  if (ty == 0 && idx < ${OUTCOUNT}) {
    double s = 0.0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s += red[t][lane];
    ((double*)scratch)[part * ${OUTCOUNT} + idx] = s;
  }
}
)";

const char* kReduceFinal = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
  if (idx >= ${OUTCOUNT}) return;
  double s = 0.0;
  for (long long p = 0; p < ${PARTS}; ++p) s += ((const double*)scratch)[p * ${OUTCOUNT} + idx];
  out0[idx] = (float)(s * ${FACTOR});
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
  // Split when the outputs give fewer than ~64K threads and each would walk over 256 values.
  constexpr int64_t kWantThreads = 65536, kMinChunk = 256;
  if (outCount < kWantThreads && redCount > kMinChunk) {
    const int64_t outBlocks = (outCount + 31) / 32;
    const int64_t wantParts = std::max<int64_t>(1, kWantThreads / 256 / outBlocks);
    const int64_t parts = std::min(wantParts, (redCount + kMinChunk - 1) / kMinChunk);
    const int64_t chunk = (redCount + parts - 1) / parts;
    const int64_t used = (redCount + chunk - 1) / chunk;
    nk.kernels.push_back(finish(c, "partial", kReducePartial,
                                {{"OUTCOUNT", ll(outCount)}, {"REDCOUNT", ll(redCount)}, {"KEPT", kept}, {"REDUCED", red},
                                 {"CHUNK", ll(chunk)}},
                                {static_cast<unsigned>(outBlocks), static_cast<unsigned>(used), 1}, kThreads,
                                {{KernelArg::Input, 0}, {KernelArg::Scratch, 0}}));
    nk.kernels.push_back(finish(c, "final", kReduceFinal, {{"OUTCOUNT", ll(outCount)}, {"PARTS", ll(used)}, {"FACTOR", f}},
                                {gridFor(outCount), 1, 1}, kThreads, {{KernelArg::Output, 0}, {KernelArg::Scratch, 0}}));
    nk.scratchBytes = static_cast<size_t>(used * outCount) * sizeof(double);
    return nk;
  }
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
  const auto x = in0 + o * ${LEN} * ${INNER} + i;
  const auto y = out0 + o * ${LEN} * ${INNER} + i;
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
    sum += v == ninf ? 0.0f : expf(v - m);
  }
  // The exponentials again rather than stored and rescaled: one rounding of each result.
  const float inv = (float)(1.0 / sum);
  for (long long j = 0; j < ${LEN}; ++j) {
    const float v = x[j * ${INNER}];
    y[j * ${INNER}] = v == ninf ? 0.0f : expf(v - m) * inv;
  }
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

// Note on the GEMM kernels. The algorithms live in kernels/gemm.cuh (fp32 SIMT with blocked
// summation; TF32 mma.sync); a generated kernel only names its problem (shape, transposes, batch
// strides, K splits: compile-time constants), its epilogue (bias, activation, FusedLinear's saved
// pre-activation) and one tile variant. Variants, from the shape:
//   large   128×128 tiles: the efficient one, but only ⌈M/128⌉·⌈N/128⌉ blocks;
//   split   large tiles with K split S ways when that leaves the GPU idle and K is long (the
//           weight gradients Xᵀ·dY of a batch-8192 layer: 64 blocks on 132 SMs for 1024×1024):
//           S·M·N partial sums in the node's scratch buffer, then a reduce kernel adds them in a
//           fixed order (deterministic) and applies the epilogue;
//   tail    large tiles whose last, partial wave is split along K (fp32; see "tail split");
//   medium  64×64 tiles: 4× the blocks, for batched products too small for large tiles;
//   small   32×32 tiles of 64 threads: tiny models (a 3×5 output gets one 64-thread block).
const char* kGemmProblem = R"(
#include "${HEADER}"

// External linkage (no anonymous namespace): each kernel uses only one of the two structs, and
// NVRTC warns about unused internal ones. The kernel's name makes them unique in a program.
struct ${NAME}_problem {
  static constexpr long long M = ${M}, N = ${N}, K = ${K}, strideA = ${ABATCH}, strideB = ${BBATCH};
  static constexpr bool transA = ${TA}, transB = ${TB}, transC = ${TC};
  static constexpr int splits = ${SPLITS};
  static constexpr long long tailTiles = ${TAILTILES};
  static constexpr int tailSplits = ${TAILSPLITS};
  static constexpr long long batch = ${BATCH};
};
struct ${NAME}_epilogue {
${EPIMEMBERS}  __device__ __forceinline__ float operator()(float v, long long m, long long n, long long i) const {
${EPILOGUE}    return v;
  }
};
)";

const char* kGemm = R"(${PROBLEM}${SHAREDCHECK}
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MINBLOCKS}) ${NAME}(${PARAMS}) {
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::${ALGO}<${NAME}_problem, pa::gemm::${CONFIG}>(${APTR}, ${BPTR}, out0, epilogue);
}
)";

const char* kGemmSplit = R"(${PROBLEM}${SHAREDCHECK}
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MINBLOCKS}) ${NAME}(${PARAMS}) {
  pa::gemm::${ALGO}<${NAME}_problem, pa::gemm::${CONFIG}>(${APTR}, ${BPTR}, scratch + ${PARTS}, pa::gemm::Identity());
}
)";

const char* kGemmTail = R"(${PROBLEM}${SHAREDCHECK}
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MINBLOCKS}) ${NAME}(${PARAMS}) {
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::simtGemmTail<${NAME}_problem, pa::gemm::${CONFIG}>(${APTR}, ${BPTR}, out0, scratch + ${PARTS}, epilogue);
}
)";

const char* kGemmTailReduce = R"(${PROBLEM}
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::simtTailReduce<${NAME}_problem, pa::gemm::${CONFIG}>(scratch + ${PARTS}, out0, epilogue);
}
)";

const char* kGemmReduce = R"(${PROBLEM}
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::splitReduce<${NAME}_problem>(scratch + ${PARTS}, out0, epilogue);
}
)";

// An fp32 operand copied transposed into the node's scratch: for the TF32 wgmma kernel, which reads
// both operands K-major, and for cuBLASLt's untransposed-B candidate (libraryGemmTransposeB).
// [copies][R][C] -> [copies][C][R] through 32×32 shared tiles.
const char* kGemmTranspose = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  __shared__ float tile[32][33];
  const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
  const long long r0 = (long long)blockIdx.y * 32, c0 = (long long)blockIdx.x * 32;
  const float* src = in${INPUT} + (long long)blockIdx.z * ${R} * ${C};
  float* dst = scratch + ${OFFSET} + (long long)blockIdx.z * ${R} * ${C};
  for (int i = row; i < 32; i += 8)
    if (r0 + i < ${R} && c0 + lane < ${C}) tile[i][lane] = src[(r0 + i) * ${C} + c0 + lane];
  __syncthreads();
  for (int i = row; i < 32; i += 8)
    if (c0 + i < ${C} && r0 + lane < ${R}) dst[(c0 + i) * ${R} + r0 + lane] = tile[lane][i];
}
)";

// A bf16 operand widened to fp32 in the node's scratch, for the generated GEMM (exact: TF32
// holds every bf16 value, so the TF32 kernels then compute the bf16 product with fp32 sums).
const char* kGemmWiden = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256)
    scratch[${OFFSET} + idx] = in${INPUT}[idx];
}
)";

struct GemmVariant {
  std::string config;  // the kernels/gemm.cuh (or gemm_wgmma.cuh) config type
  int bm, bn, threads, minBlocks;  // minBlocks: __launch_bounds__'s blocks per SM
  // Dynamic shared memory: fp32, the config's kDynamicShared (checked in the kernel); wgmma, its
  // ring and staging; TF32 mma.sync, none (static tiles).
  unsigned sharedBytes = 0;
};

// K of one blocked-summation chunk in every fp32 SIMT config (kernels/gemm.cuh, "Blocked
// summation"): SimtConfig's slices per chunk are this over BK.
constexpr int64_t kBlockedSumK = 64;

// SimtConfig<BM, BN, BK, TM, TN, slices per blocked-sum chunk (chunks of 64 products)>, with its
// dynamic shared memory as SimtConfig::kDynamicShared computes it.
GemmVariant simtVariant(int bm, int bn, int bk, int tm, int tn, int minBlocks) {
  const std::string config = "SimtConfig<" + std::to_string(bm) + ", " + std::to_string(bn) + ", " + std::to_string(bk) + ", " +
                             std::to_string(tm) + ", " + std::to_string(tn) + ", " + std::to_string(kBlockedSumK / bk) + ">";
  return GemmVariant{config, bm, bn, (bm / tm) * (bn / tn), minBlocks, static_cast<unsigned>(2 * bk * (bm + 4 + bn + 4) * 4)};
}

GemmVariant gemmVariant(bool tf32, GemmTile tile) {
  // tf32: Tf32Config<BM, BN, BK, warps along M, warps along N, pipeline stages>.
  switch (tile) {
  case GemmTile::Large:
    // fp32: BK = 16 measured 5% faster than 8 on the H100 (fewer barriers); 16×8 micro-tiles
    // (128 threads, two blocks an SM, running sums in shared memory) measured no faster overall
    // (issue 6). TF32: two blocks an SM (≤ 128 registers) overlap one's barrier with the other's
    // products (+25% measured).
    return tf32 ? GemmVariant{"Tf32Config<128, 128, 16, 2, 4, 2>", 128, 128, 256, 2} : simtVariant(128, 128, 16, 8, 8, 1);
  case GemmTile::Medium:
    return tf32 ? GemmVariant{"Tf32Config<64, 64, 16, 2, 2, 4>", 64, 64, 128, 1} : simtVariant(64, 64, 16, 4, 4, 1);
  case GemmTile::Small:
    return tf32 ? GemmVariant{"Tf32Config<32, 32, 16, 1, 2, 2>", 32, 32, 64, 1} : simtVariant(32, 32, 16, 4, 4, 1);
  case GemmTile::Auto: break;
  }
  assert(false && "GemmTile::Auto is resolved by chooseGemm");
  return {};
}

constexpr int64_t kAssumedSms = 132;  // an H100 SXM; the choice only needs the right magnitude

int64_t tilesOf(int64_t m, int64_t n, int64_t t) { return ((m + t - 1) / t) * ((n + t - 1) / t); }

// Tile variant and K splits from the shape. A large block wants the whole SM (fp32: ~210
// registers a thread) or half of it (TF32). Large tiles from ~90% of a wave. A single product
// with K ≥ 1024 that large tiles cannot fill is split along K, with the tile and the number of
// splits from splitCost() below; otherwise medium tiles while they give half a wave, else small
// ones.
//
// Note on splitCost. It estimates a split product's time as (waves of blocks) × (one block's
// products at its share of an SM) + the reduce kernel's traffic. Per tile: blocks resident per
// SM and the SM throughput they reach relative to large tiles (fp32 measured on the H100:
// large 128×128 tiles ~40 TFLOP/s; medium and small are estimates, to be replaced by
// measurement at first use, issue 6). It keeps at least 128 of K per split. Measured effect on
// attn_block's 256×256 weight gradients (K = 8192): 16 splits of large tiles (the rule before)
// 62 µs; the model picks 32 splits.
double splitCost(bool tf32, GemmTile tile, int64_t m, int64_t n, int64_t k, int64_t splits) {
  const int64_t bm = tile == GemmTile::Large ? 128 : tile == GemmTile::Medium ? 64 : 32;
  const double perSm = tile == GemmTile::Large ? (tf32 ? 2 : 1) : tile == GemmTile::Medium ? 2 : 8;
  const double relRate = tile == GemmTile::Large ? 1.0 : tile == GemmTile::Medium ? 0.8 : 0.45;
  const double smFlops = (tf32 ? 110e12 : 40e12) / static_cast<double>(kAssumedSms);
  const int64_t blocks = tilesOf(m, n, bm) * splits;
  const double waves = std::ceil(static_cast<double>(blocks) / (static_cast<double>(kAssumedSms) * perSm));
  const double blockFlops = 2.0 * static_cast<double>(bm * bm) * std::ceil(static_cast<double>(k) / static_cast<double>(splits));
  const double reduce = splits > 1 ? 2.0 * static_cast<double>(splits * m * n) * 4.0 / 2.5e12 + 2e-6 : 0.0;
  return waves * blockFlops * perSm / (relRate * smFlops) + reduce;
}

std::pair<GemmTile, int> chooseGemm(bool tf32, int64_t batch, int64_t m, int64_t n, int64_t k) {
  const int64_t large = batch * tilesOf(m, n, 128);
  if (large >= kAssumedSms * 9 / 10) return {GemmTile::Large, 1};
  if (batch == 1 && k >= 1024) {
    std::pair<GemmTile, int> best{GemmTile::Large, 1};
    double bestCost = splitCost(tf32, GemmTile::Large, m, n, k, 1);
    for (GemmTile t : {GemmTile::Large, GemmTile::Medium, GemmTile::Small})
      for (int64_t s = 2; s <= 64 && k / s >= 128; s *= 2) {
        const double cost = splitCost(tf32, t, m, n, k, s);
        if (cost < bestCost) bestCost = cost, best = {t, static_cast<int>(s)};
      }
    if (best.second > 1) return best;
  }
  if (batch * tilesOf(m, n, 64) >= kAssumedSms / 2) return {GemmTile::Medium, 1};
  return {GemmTile::Small, 1};
}

// Note on the tail split. A large fp32 block fills an SM (its registers), so T tiles run as
// ⌈T/SMs⌉ waves of equal blocks, and the last wave is partial: 8192×4096 has 2048 tiles, 15 waves
// on 132 SMs and a 16th of 68 tiles during which half the GPU idles (1/16 of the product). Split
// along K S ways, that wave's r tiles become S·r pieces of 1/S of a tile each, which run in
// ⌈S·r/SMs⌉ rounds after the whole tiles in the same launch; a second kernel adds each tail
// tile's S partial sums in split order (deterministic) and applies the epilogue. tailTime
// models the last wave's time: rounds × (a piece's products + ~3 µs to start and store it) + the
// reduce's traffic and launch. The split is taken where it saves at least 1% of the product.
// Pieces are whole blocked-sum chunks (tailPieceK). Measured on the H100, 8192×4096×4096 fp32:
// 6.00-6.01 ms without; S = 2 6.00 (136 pieces: still two rounds of half a tile), 3 5.88, 4 5.91,
// 5 5.86 (the model's pick: 3 rounds of 0.2), 6-9 5.87-5.88. Pieces cut at any slice ran S = 6,
// 7 and 9 (43, 37 and 29 slices a piece) at 5.98-6.01 ms, as if without the split; not
// understood, and whole chunks avoid it.
struct TailSplit {
  int64_t tiles = 0;  // the last `tiles` tiles (tileOf order) ...
  int splits = 1;     // ... split this many ways along K; 1: none
};

// Pieces are whole chunks of the blocked summation (as simtGemmTail cuts them), so S splits give
// ⌈K / piece⌉ pieces a tile, which may be fewer than S.
int64_t tailPieceK(int64_t k, int64_t splits) {
  return ((k + splits - 1) / splits + kBlockedSumK - 1) / kBlockedSumK * kBlockedSumK;
}

double tailTime(int64_t tailTiles, int64_t k, int64_t bm, int64_t bn, int64_t slots, int64_t splits) {
  const double tile = 2.0 * static_cast<double>(bm * bn * k) / (45e12 / static_cast<double>(kAssumedSms));
  if (splits == 1) return tile;
  const int64_t pieceK = tailPieceK(k, splits), pieces = (k + pieceK - 1) / pieceK;
  const double rounds = std::ceil(static_cast<double>(tailTiles * pieces) / static_cast<double>(slots));
  const double reduce = static_cast<double>((pieces + 1) * tailTiles * bm * bn) * 4.0 / 2.5e12 + 3e-6;
  return rounds * (tile * static_cast<double>(pieceK) / static_cast<double>(k) + 3e-6) + reduce;
}

// `slots`: blocks resident at once (SMs × blocks an SM); `forced`: EmitOptions::gemmTailSplits.
TailSplit chooseTailSplit(int64_t tiles, int64_t k, int64_t bm, int64_t bn, int64_t slots, int forced) {
  const int64_t rest = tiles % slots;
  if (forced == 1 || tiles == 0) return {};
  if (forced > 1) return {rest > 0 ? rest : std::min(tiles, slots), forced};
  if (tiles < slots || rest == 0) return {};
  const double whole = tailTime(rest, k, bm, bn, slots, 1);
  const double product = static_cast<double>(tiles / slots + 1) * whole;
  TailSplit best;
  double bestTime = whole;
  for (int64_t s = 2; s <= 16 && tailPieceK(k, s) * (s - 1) < k; ++s) {  // (every piece non-empty)
    const double t = tailTime(rest, k, bm, bn, slots, s);
    if (t < bestTime) bestTime = t, best = {rest, static_cast<int>(s)};
  }
  return whole - bestTime >= 0.01 * product ? best : TailSplit{};
}

// The wgmma variants (kernels/gemm_wgmma.cuh): WgmmaConfig<BN, consumer warpgroups, stages>.
// Large and medium tiles fill an SM's shared memory with their ring and staging (one block an
// SM); small ones (64×128, 89 KB with 3 stages) leave room for two.
// TF32 (fp32 operands) uses the same tiles and ring: a slice row is 128 bytes either way.
GemmVariant wgmmaVariant(GemmTile tile, bool tf32) {
  auto make = [](const char* config, int bm, int bn, int consumers, int stages, int minBlocks) {
    return GemmVariant{config, bm, bn, 128 * (1 + consumers), minBlocks,
                       static_cast<unsigned>(stages * (bm + bn) * 128 + consumers * 64 * 256 + 1024)};
  };
  switch (tile) {
  case GemmTile::Large: return make(tf32 ? "WgmmaConfig<256, 2, 4, true>" : "WgmmaConfig<256, 2, 4>", 128, 256, 2, 4, 1);
  case GemmTile::Medium: return make(tf32 ? "WgmmaConfig<128, 2, 6, true>" : "WgmmaConfig<128, 2, 6>", 128, 128, 2, 6, 1);
  case GemmTile::Small: return make(tf32 ? "WgmmaConfig<128, 1, 3, true>" : "WgmmaConfig<128, 1, 3>", 64, 128, 1, 3, 2);
  case GemmTile::Auto: break;
  }
  assert(false && "GemmTile::Auto is resolved by chooseWgmma");
  return {};
}

int64_t tilesOf(int64_t m, int64_t n, int64_t bm, int64_t bn) { return ((m + bm - 1) / bm) * ((n + bn - 1) / bn); }

// Note on choosing wgmma tiles. The largest tile that still gives ~90% of a wave. A single product
// that not even medium tiles fill (weight gradients: small M×N, long K) is split along K, tile and
// splits from wgmmaSplitCost(): waves × one block's time (its products at the block's measured
// rate, plus ~2 µs of pipeline fill and epilogue) + the reduce kernel's traffic (the fp32 partial
// sums read once, the result written) at ~2.5 TB/s + 3 µs. Block rates measured on the H100
// (8192×4096×4096, bf16, the persistent TMA kernel): large 768 TFLOP/s a GPU (one block an SM),
// medium 582 (one), small 502 (two an SM). Splits keep at least 128 of K.
double wgmmaSplitCost(GemmTile tile, int64_t m, int64_t n, int64_t k, int64_t splits) {
  const int64_t bm = tile == GemmTile::Small ? 64 : 128, bn = tile == GemmTile::Large ? 256 : 128;
  const double perSm = tile == GemmTile::Small ? 2 : 1;
  const double gpuRate = tile == GemmTile::Large ? 768e12 : tile == GemmTile::Medium ? 582e12 : 502e12;
  const double blockRate = gpuRate / (static_cast<double>(kAssumedSms) * perSm);
  const double waves = std::ceil(static_cast<double>(tilesOf(m, n, bm, bn) * splits) / (static_cast<double>(kAssumedSms) * perSm));
  const double sliceK = std::ceil(static_cast<double>(k) / static_cast<double>(splits) / 64.0) * 64.0;
  const double block = 2.0 * static_cast<double>(bm * bn) * sliceK / blockRate + 2e-6;
  const double reduce = splits > 1 ? static_cast<double>((splits + 1) * m * n) * 4.0 / 2.5e12 + 3e-6 : 0.0;
  return waves * block + reduce;
}

std::pair<GemmTile, int> chooseWgmma(int64_t batch, int64_t m, int64_t n, int64_t k) {
  const int64_t wave = kAssumedSms * 9 / 10;
  if (batch * tilesOf(m, n, 128, 256) >= wave) return {GemmTile::Large, 1};
  if (batch * tilesOf(m, n, 128, 128) >= wave) return {GemmTile::Medium, 1};
  if (batch > 1) return {GemmTile::Small, 1};
  std::pair<GemmTile, int> best{GemmTile::Small, 1};
  double bestCost = wgmmaSplitCost(GemmTile::Small, m, n, k, 1);
  for (GemmTile t : {GemmTile::Large, GemmTile::Medium, GemmTile::Small})
    for (int64_t s = 1; s <= 64 && (s == 1 || k / s >= 128); s *= 2) {
      const double cost = wgmmaSplitCost(t, m, n, k, s);
      if (cost < bestCost) bestCost = cost, best = {t, static_cast<int>(s)};
    }
  return best;
}

// The TMA map of a wgmma GEMM operand (kernels/gemm_wgmma.cuh's note): matrices of `contiguous`
// × `other` elements of `bytes` each (2: bf16, 4: fp32), `batch` of them `stride` elements apart
// (0: one shared matrix), boxes of 128 bytes along the contiguous extent and `boxOther` along the
// other.
TensorMapSpec gemmTensorMap(int64_t contiguous, int64_t other, int64_t batch, int64_t stride, int64_t boxOther, int bytes = 2) {
  TensorMapSpec t;
  t.elementBytes = static_cast<uint32_t>(bytes);
  t.dims[0] = static_cast<uint64_t>(contiguous);
  t.dims[1] = static_cast<uint64_t>(other);
  t.dims[2] = static_cast<uint64_t>(stride != 0 ? batch : 1);
  t.strideBytes[0] = static_cast<uint64_t>(contiguous * bytes);
  t.strideBytes[1] = static_cast<uint64_t>((stride != 0 ? stride : contiguous * other) * bytes);
  t.box[0] = static_cast<uint32_t>(128 / bytes);
  t.box[1] = static_cast<uint32_t>(boxOther);
  t.box[2] = 1;
  return t;
}

// How a TF32 product runs on the wgmma kernel (kernels/gemm_wgmma.cuh), which reads B K-major
// and A either K-major (from shared memory) or M-major (from registers, whose rows need 16-byte
// multiples). `product` is the kernel's geometry: with `swap`, the transposed product Cᵀ = Bᵀ·Aᵀ
// (written transposed, back as C), chosen for a weight gradient Aᵀ·B (both operands stored
// M/N-major) whose A is the narrower: then A, not B, is the operand copied transposed. Kernel
// operand i is node input `input[i]`; `copy[i]`: copied transposed into the node's scratch first.
// `transposeB`: B is stored N-major and the product kernel's producer warpgroup transposes it as
// it loads it instead (EmitOptions::tf32BLoad; Auto: whichever tf32WgmmaTime() says is faster).
struct Tf32Plan {
  GemmGeometry product;
  bool swap = false;
  int input[2] = {0, 1};
  bool copy[2] = {false, false};
  bool transposeB = false;
};

double tf32WgmmaTime(const GemmGeometry& q, const Tf32Plan& p);

Tf32Plan tf32Plan(const GemmGeometry& q, Tf32BLoad bLoad) {
  if (bLoad == Tf32BLoad::Auto) {
    const Tf32Plan copied = tf32Plan(q, Tf32BLoad::Copy), loaded = tf32Plan(q, Tf32BLoad::InKernel);
    return tf32WgmmaTime(q, loaded) < tf32WgmmaTime(q, copied) ? loaded : copied;
  }
  Tf32Plan p;
  p.swap = q.transA && !q.transB && q.batch == 1 && q.m < q.n && q.n % 4 == 0;
  GemmGeometry& g = p.product;
  g = q;
  if (p.swap) {
    g.m = q.n, g.n = q.m;
    g.transA = !q.transB, g.transB = !q.transA;  // Bᵀ as stored is M-major; Aᵀ K-major iff A is M-major
    p.input[0] = 1, p.input[1] = 0;
  }
  if (g.transA && (g.m % 4 != 0 || g.strideA % 4 != 0)) p.copy[0] = true, g.transA = false;
  if (!g.transB) (bLoad == Tf32BLoad::Copy ? p.copy[1] : p.transposeB) = true;
  if (p.copy[1]) g.transB = true;
  // A copy is dense: [copies][rows][K].
  if (p.copy[0] && g.strideA != 0) g.strideA = g.m * g.k;
  if (p.copy[1] && g.strideB != 0) g.strideB = g.n * g.k;
  return p;
}

// The estimated time of a TF32 product on the wgmma kernel with plan p, copies included: the
// products at the rates measured on the H100 (365 TFLOP/s on 8192×4096×4096 with both operands
// read by TMA; 150-166 where the producer transposes B with 4-byte copies, which then bind: taken
// as 160), each transposed copy read and written at ~2.5 TB/s plus 3 µs. Measured (2026-11-23,
// ms, B copied / transposed by the kernel): 8192×4096×4096 0.763 / 1.657, 256×256×8192 dW
// 0.0240 / 0.0196 (memory-bound: the copy's traffic is what the kernel saves).
double tf32WgmmaTime(const GemmGeometry& q, const Tf32Plan& p) {
  const double flops = 2.0 * static_cast<double>(q.batch * q.m) * static_cast<double>(q.n * q.k);
  double copies = 0, launches = 0;
  const int64_t rows[2] = {p.product.m, p.product.n}, strides[2] = {p.product.strideA, p.product.strideB};
  for (int i = 0; i < 2; ++i)
    if (p.copy[i]) copies += static_cast<double>((strides[i] != 0 ? q.batch : 1) * rows[i] * q.k), ++launches;
  return flops / (p.transposeB ? 160e12 : 365e12) + copies * 8.0 / 2.5e12 + launches * 3e-6;
}

// Whether a TF32 product is faster on the wgmma kernel (tf32WgmmaTime) than on the mma.sync TF32
// kernel: ~110 TFLOP/s where large tiles fill the GPU, 40-77 on the split weight gradients
// (256×256×8192 40, 256×1024×8192 77, taken as 45). Measured (2026-11-23): 256×256×8192 0.025 ms
// on wgmma with B copied, 0.027 on mma.sync. Tiny products keep mma.sync where a copy's launch
// dominates.
bool tf32WgmmaPays(const GemmGeometry& q, Tf32BLoad bLoad) {
  const double flops = 2.0 * static_cast<double>(q.batch * q.m) * static_cast<double>(q.n * q.k);
  const bool fills = q.batch * tilesOf(q.m, q.n, 128) >= kAssumedSms * 9 / 10;
  return tf32WgmmaTime(q, tf32Plan(q, bLoad)) < flops / (fills ? 110e12 : 45e12);
}

NodeKernels gemm(const Ctx& c, const GemmGeometry& q, const std::string& epilogue, const std::string& members,
                 const std::string& init) {
  const int64_t m = q.m, n = q.n, k = q.k;
  // bf16 operands on an sm_90a device go to the wgmma kernel when their contiguous extents and
  // batch strides allow 16-byte copies. Elsewhere they are widened into the scratch buffer first
  // and multiplied on the TF32 path (exact: TF32 holds every bf16 value).
  const bool wide[2] = {c.inType(0) == DType::BF16, c.inType(1) == DType::BF16};
  const bool wgmmaBf16 = c.opt->wgmma && wide[0] && wide[1] && (q.transA ? m : k) % 8 == 0 &&
                         (q.transB ? k : n) % 8 == 0 && q.strideA % 8 == 0 && q.strideB % 8 == 0;
  // fp32 operands with precision tf32 on an sm_90a device: the same kernel on TF32, which reads B
  // K-major and A K-major or, from registers, M-major: tf32Plan says which operand is first
  // copied transposed into the scratch (K a multiple of 4: 16-byte rows for TMA).
  const bool wgmmaTf32 = c.opt->wgmma && c.opt->tf32 && !wide[0] && !wide[1] && k % 4 == 0 && (k + 31) / 32 <= 65535 &&
                         q.batch <= 65535 &&  // (the transpose kernels' grid)
                         (c.opt->gemmTile != GemmTile::Auto || c.opt->tf32BLoad != Tf32BLoad::Auto ||  // forced: wherever it can
                          tf32WgmmaPays(q, c.opt->tf32BLoad));
  const bool wgmma = wgmmaBf16 || wgmmaTf32;
  const bool tf32 = !wgmma && (c.opt->tf32 || wide[0] || wide[1]);
  // The product the kernel computes: TF32 wgmma's from tf32Plan, the node's elsewhere.
  const Tf32Plan plan = wgmmaTf32 ? tf32Plan(q, c.opt->tf32BLoad) : Tf32Plan{q};
  const GemmGeometry& pq = plan.product;
  std::pair<GemmTile, int> choice = wgmma ? chooseWgmma(q.batch, pq.m, pq.n, k) : chooseGemm(tf32, q.batch, m, n, k);
  if (c.opt->gemmTile != GemmTile::Auto) choice = {c.opt->gemmTile, 1};
  if (c.opt->gemmSplits > 0 && q.batch == 1) choice.second = c.opt->gemmSplits;
  const GemmVariant v = wgmma ? wgmmaVariant(choice.first, wgmmaTf32) : gemmVariant(tf32, choice.first);
  const std::string header = wgmma ? "kernels/gemm_wgmma.cuh" : "kernels/gemm.cuh";
  const int splits = choice.second;
  const int64_t tiles = tilesOf(pq.m, pq.n, v.bm, v.bn);
  const TailSplit tail = !wgmma && !tf32 && choice.first == GemmTile::Large && splits == 1 && q.batch == 1
                             ? chooseTailSplit(tiles, k, v.bm, v.bn, int64_t{c.opt->sms} * v.minBlocks, c.opt->gemmTailSplits)
                             : TailSplit{};
  TemplateVars vars = {{"TAILTILES", ll(tail.tiles)}, {"TAILSPLITS", std::to_string(tail.splits)},
                       {"M", ll(pq.m)}, {"N", ll(pq.n)}, {"K", ll(k)}, {"ABATCH", ll(pq.strideA)}, {"BBATCH", ll(pq.strideB)},
                       {"TA", pq.transA ? "true" : "false"}, {"TB", pq.transB ? "true" : "false"},
                       {"TC", plan.swap ? "true" : "false"},
                       {"SPLITS", std::to_string(splits)}, {"BATCH", ll(q.batch)}, {"EPIMEMBERS", members},
                       {"EPILOGUE", "    (void)m, (void)n, (void)i;\n" + epilogue}};
  NodeKernels nk;
  // Scratch, in floats: [widened or transposed A][widened or transposed B][split partial sums].
  // The product reads each operand from the node, or its copy.
  int64_t scratchFloats = 0;
  std::string operand[2] = {wgmma ? "map0" : "in0", wgmma ? "map1" : "in1"};
  std::vector<KernelArg> operandArgs;
  if (wgmmaTf32) {
    // Kernel operand i (node input plan.input[i]): K-major rows, `other` rows of K (the product's
    // M for A, N for B) per batch entry; or A M-major (K rows of M, boxes of 32 × 32, read into
    // registers); or a K-major copy.
    for (int i = 0; i < 2; ++i) {
      const int input = plan.input[i];
      operand[i] = "map" + std::to_string(input);  // (a map's parameter is named after the input it holds)
      const int64_t other = i == 0 ? pq.m : pq.n, stride = i == 0 ? pq.strideA : pq.strideB, box = i == 0 ? v.bm : v.bn;
      if (i == 0 && pq.transA) {
        operandArgs.push_back({KernelArg::InputTensorMap, input, gemmTensorMap(other, k, q.batch, stride, 32, 4)});
        continue;
      }
      if (i == 1 && plan.transposeB) {  // the pointer, whose type picks the transposing producer
        operand[i] = "static_cast<const float*>(in" + std::to_string(input) + ")";
        operandArgs.push_back({KernelArg::Input, input});
        continue;
      }
      const TensorMapSpec map = gemmTensorMap(k, other, q.batch, stride, box, 4);
      if (!plan.copy[i]) {
        operandArgs.push_back({KernelArg::InputTensorMap, input, map});
        continue;
      }
      const int64_t copies = stride != 0 ? q.batch : 1;  // stored [copies][K][other]
      nk.kernels.push_back(finish(c, std::string("transpose_") + (input == 0 ? "a" : "b"), kGemmTranspose,
                                  {{"R", ll(k)}, {"C", ll(other)}, {"OFFSET", ll(scratchFloats)}, {"INPUT", std::to_string(input)}},
                                  {static_cast<unsigned>((other + 31) / 32), static_cast<unsigned>((k + 31) / 32),
                                   static_cast<unsigned>(copies)},
                                  kThreads, {{KernelArg::Input, input}, {KernelArg::Scratch, 0}}));
      operandArgs.push_back({KernelArg::ScratchTensorMap, input, map, static_cast<uint64_t>(scratchFloats) * sizeof(float)});
      scratchFloats += (copies * k * other + 63) / 64 * 64;  // 256-byte aligned, as TMA wants 16
    }
  }
  if (wgmmaBf16) {
    operandArgs.push_back({KernelArg::InputTensorMap, 0,
                           q.transA ? gemmTensorMap(m, k, q.batch, q.strideA, 64) : gemmTensorMap(k, m, q.batch, q.strideA, v.bm)});
    operandArgs.push_back({KernelArg::InputTensorMap, 1,
                           q.transB ? gemmTensorMap(k, n, q.batch, q.strideB, v.bn) : gemmTensorMap(n, k, q.batch, q.strideB, 64)});
  }
  for (int i = 0; i < 2 && !wgmma; ++i) {
    if (!wide[i]) {
      operandArgs.push_back({KernelArg::Input, i});
      continue;
    }
    const int64_t count = numel(c.in(i));
    nk.kernels.push_back(finish(c, std::string("widen_") + (i == 0 ? "a" : "b"), kGemmWiden,
                                {{"COUNT", ll(count)}, {"OFFSET", ll(scratchFloats)}, {"INPUT", std::to_string(i)}},
                                {gridFor(count), 1, 1}, kThreads, {{KernelArg::Input, i}, {KernelArg::Scratch, 0}}));
    operand[i] = "scratch + " + ll(scratchFloats);
    scratchFloats += (count + 63) / 64 * 64;  // 256-byte aligned: the vector loads want 16
  }
  std::vector<KernelArg> epilogueArgs;  // the epilogue's inputs (bias, saved activation) and the outputs
  for (const KernelArg& a : allArgs(c.n))
    if (a.kind != KernelArg::Input || a.index >= 2) epilogueArgs.push_back(a);
  auto join = [](std::vector<KernelArg> a, const std::vector<KernelArg>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<KernelArg> scratchArg{{KernelArg::Scratch, 0}};
  // The wgmma kernel is persistent: its blocks walk the work items (tiles × batch or splits).
  const int64_t items = tiles * (splits > 1 ? splits : q.batch);
  const std::array<unsigned, 3> grid =
      wgmma ? std::array<unsigned, 3>{static_cast<unsigned>(std::max<int64_t>(std::min<int64_t>(items, int64_t{c.opt->sms} * v.minBlocks), 1)), 1, 1}
            : std::array<unsigned, 3>{static_cast<unsigned>(std::max<int64_t>(tiles, 1)), 1, static_cast<unsigned>(splits > 1 ? splits : q.batch)};
  auto problem = [&](const std::string& part) {
    TemplateVars pv = vars;
    pv["NAME"] = c.kernelName(part);
    pv["HEADER"] = part == "reduce" ? "kernels/gemm.cuh" : header;
    if (part == "reduce") pv["M"] = ll(m), pv["N"] = ll(n), pv["TC"] = "false";  // the partial sums are laid out as C
    return fillTemplate(kGemmProblem, pv);
  };
  const TemplateVars kernelVars = {{"THREADS", std::to_string(v.threads)}, {"MINBLOCKS", std::to_string(v.minBlocks)},
                                   {"ALGO", wgmma ? "wgmmaGemm" : tf32 ? "tf32Gemm" : "simtGemm"}, {"CONFIG", v.config},
                                   {"APTR", operand[0]}, {"BPTR", operand[1]},
                                   {"SHAREDCHECK", wgmma || tf32 ? std::string()
                                                                 : "static_assert(pa::gemm::" + v.config + "::kDynamicShared == " +
                                                                       std::to_string(v.sharedBytes) +
                                                                       ", \"the launch's dynamic shared memory is the config's\");\n"}};
  if (tail.splits > 1) {
    TemplateVars kv = kernelVars;
    kv["PROBLEM"] = problem("");
    kv["EPIINIT"] = init;
    kv["PARTS"] = ll(scratchFloats);
    kv.erase("ALGO");  // (simtGemmTail)
    const int64_t blocks = tiles - tail.tiles + tail.tiles * tail.splits;
    nk.kernels.push_back(finish(c, "", kGemmTail, kv, {static_cast<unsigned>(blocks), 1, 1}, static_cast<unsigned>(v.threads),
                                join(join(operandArgs, epilogueArgs), scratchArg), {header}, v.sharedBytes));
    const int64_t count = tail.tiles * v.bm * v.bn;
    TemplateVars rv = {{"PROBLEM", problem("reduce")}, {"EPIINIT", init}, {"PARTS", ll(scratchFloats)}, {"CONFIG", v.config}};
    nk.kernels.push_back(finish(c, "reduce", kGemmTailReduce, rv, {gridFor(count), 1, 1}, kThreads, join(scratchArg, epilogueArgs),
                                {"kernels/gemm.cuh"}));
    nk.scratchBytes = static_cast<size_t>(scratchFloats + tail.splits * count) * sizeof(float);
    return nk;
  }
  if (splits == 1) {
    TemplateVars kv = kernelVars;
    kv["PROBLEM"] = problem("");
    kv["EPIINIT"] = init;
    const std::vector<KernelArg> args = join(join(operandArgs, epilogueArgs), scratchFloats > 0 ? scratchArg : std::vector<KernelArg>{});
    nk.kernels.push_back(finish(c, "", kGemm, kv, grid, static_cast<unsigned>(v.threads), args, {header}, v.sharedBytes));
    nk.scratchBytes = static_cast<size_t>(scratchFloats) * sizeof(float);
    return nk;
  }
  TemplateVars kv = kernelVars;
  kv["PROBLEM"] = problem("split");
  kv["PARTS"] = ll(scratchFloats);
  nk.kernels.push_back(finish(c, "split", kGemmSplit, kv, grid, static_cast<unsigned>(v.threads), join(operandArgs, scratchArg),
                              {header}, v.sharedBytes));
  TemplateVars rv = {{"PROBLEM", problem("reduce")}, {"EPIINIT", init}, {"PARTS", ll(scratchFloats)}};
  nk.kernels.push_back(finish(c, "reduce", kGemmReduce, rv, {gridFor(m * n), 1, 1}, kThreads, join(scratchArg, epilogueArgs),
                              {"kernels/gemm.cuh"}));
  nk.scratchBytes = static_cast<size_t>(scratchFloats + splits * m * n) * sizeof(float);
  return nk;
}

// ---- per-op emitters ---------------------------------------------------------------------

NodeKernels emitInput(const Ctx&) { return {}; }
NodeKernels emitParam(const Ctx&) { return {}; }
NodeKernels emitConstant(const Ctx&) { return {}; }

// A MatMul-shaped node (transpose_a/transpose_b, batched or shared operands) as one GEMM.
GemmGeometry matmulGeometry(const Ctx& c) {
  const Shape& a = c.in(0);
  const Shape& b = c.in(1);
  GemmGeometry q;
  q.transA = c.n.attrs.getBool("transpose_a", false);
  q.transB = c.n.attrs.getBool("transpose_b", false);
  q.m = q.transA ? a[a.size() - 1] : a[a.size() - 2];
  q.k = q.transA ? a[a.size() - 2] : a[a.size() - 1];
  q.n = q.transB ? b[b.size() - 2] : b[b.size() - 1];
  const int64_t batchA = numel(llvm::ArrayRef<int64_t>(a.data(), a.size() - 2));
  const int64_t batchB = numel(llvm::ArrayRef<int64_t>(b.data(), b.size() - 2));
  if (a.size() > 2 && b.size() == 2 && !q.transA) {  // a batch of row blocks times one shared matrix: one taller GEMM
    q.m *= batchA;
    return q;
  }
  q.batch = std::max(batchA, batchB);
  q.strideA = a.size() > 2 ? q.m * q.k : 0;
  q.strideB = b.size() > 2 ? q.k * q.n : 0;
  return q;
}

GemmGeometry fusedLinearGeometry(const Ctx& c) {
  const Shape& x = c.in(0);
  const Shape& w = c.in(1);
  GemmGeometry q;
  q.transB = c.n.attrs.getBool("transpose_w", false);
  q.k = x.back();
  q.n = q.transB ? w[0] : w[1];
  q.m = numel(x) / std::max<int64_t>(q.k, 1);
  return q;
}

NodeKernels emitMatMul(const Ctx& c) { return gemm(c, matmulGeometry(c), "", "", ""); }

// The matmul with ReluGrad/GeluGrad's formula as its epilogue (x: the saved activation input).
NodeKernels emitMatMulActGrad(const Ctx& c) {
  const std::string members = "  " + argType(c.inType(2), false) + " x;\n", init = "  epilogue.x = in2;\n";
  const std::string epi =
      "    { const float s = x[i];\n      v = " + activationGradOf(c.n.attrs.getString("activation", "relu"), "v", "s") + "; }\n";
  return gemm(c, matmulGeometry(c), epi, members, init);
}

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
#include "common/attention_mask.h"

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
                              {gridFor(count), 1, 1}, kThreads, allArgs(c.n), {"common/attention_mask.h"}));
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

// Large MSE sums (mlp_wide: 2M terms) take two kernels: one block per contiguous chunk writes
// the chunk's fixed-tree sum to scratch, then one block adds the chunks' sums in a fixed tree,
// so the result is still the same every run.
const char* kMsePartial = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  __shared__ double part[256];
  const long long begin = (long long)blockIdx.x * ${CHUNK}, end = min(begin + ${CHUNK}, ${COUNT});
  double acc = 0.0;
  for (long long i = begin + threadIdx.x; i < end; i += 256) {
    const double d = (double)in0[i] - (double)in1[i];
    acc += d * d;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) ((double*)scratch)[blockIdx.x] = part[0];
}
)";

const char* kMseFinal = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  __shared__ double part[256];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < ${PARTS}; i += 256) acc += ((const double*)scratch)[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out0[0] = (float)(part[0] / ${DENOM});
}
)";

NodeKernels emitMseLoss(const Ctx& c) {
  const int64_t n = numel(c.in(0));
  const std::string denom = std::to_string(std::max<int64_t>(n, 1)) + ".0";
  NodeKernels nk;
  constexpr int64_t kSplitAbove = 65536, kChunk = 8192;
  if (n > kSplitAbove) {
    const int64_t parts = (n + kChunk - 1) / kChunk;
    nk.kernels.push_back(finish(c, "partial", kMsePartial, {{"COUNT", ll(n)}, {"CHUNK", ll(kChunk)}},
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

NodeKernels emitFusedLinear(const Ctx& c) {
  const GemmGeometry q = fusedLinearGeometry(c);
  const std::string act = c.n.attrs.getString("activation", "none");
  // The epilogue functor: bias by column, GELU's input saved to out1 (its gradient reads it).
  std::string epi, members, init;
  if (c.n.inputs.size() == 3) {
    members += "  " + argType(c.inType(2), false) + " bias;\n";
    init += "  epilogue.bias = in2;\n";
    epi += "    v += bias[n];\n";
  }
  if (act == "gelu") {
    members += "  " + argType(c.outType(1), true) + " pre;\n";
    init += "  epilogue.pre = out1;\n";
    epi += "    pre[i] = v;\n    v = " + geluOf("v") + ";\n";
  }
  if (act == "relu") epi += "    v = fmaxf(v, 0.0f);\n";
  return gemm(c, q, epi, members, init);
}

// ---- GEMMs run by a library (cuBLASLt) -------------------------------------------------------

// Note on library GEMMs. cuBLASLt computes the product and, where it can, the bias and ReLU;
// its GELU is the tanh approximation, not the erf form the graph means, so GELU and the
// activation derivatives of matmul-act-grad run here as one elementwise pass over its result.
const char* kLibraryEpilogue = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < ${COUNT}; i += (long long)gridDim.x * 256) {
    float v = ${SOURCE}[i];
${BODY}  }
}
)";

}  // namespace

LibraryGemm libraryGemmOf(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  const Ctx c{g, n};
  LibraryGemm lg;
  switch (n.op) {
  case OpKind::MatMul:
  case OpKind::MatMulActGrad: lg.geometry = matmulGeometry(c); break;
  case OpKind::FusedLinear: {
    lg.geometry = fusedLinearGeometry(c);
    lg.bias = n.inputs.size() == 3;
    const std::string act = n.attrs.getString("activation", "none");
    lg.relu = act == "relu";
    lg.output = act == "gelu" ? 1 : 0;  // the saved pre-activation; out0 = GELU(out1) afterwards
    break;
  }
  default: return lg;
  }
  lg.supported = true;
  return lg;
}

NodeKernels libraryGemmEpilogue(const Graph& g, NodeId id, bool libraryBias, bool libraryRelu) {
  const Node& n = g.node(id);
  const Ctx c{g, n};
  const LibraryGemm lg = libraryGemmOf(g, id);
  assert(lg.supported);
  const int64_t count = numel(c.out(0));
  std::string body;
  std::vector<KernelArg> args;
  if (n.op == OpKind::MatMulActGrad) {
    body = "    const float s = in2[i];\n    out0[i] = " + activationGradOf(n.attrs.getString("activation", "relu"), "v", "s") + ";\n";
    args = {{KernelArg::Input, 2}, {KernelArg::Output, 0}};
  } else if (n.op == OpKind::FusedLinear) {
    const bool gelu = lg.output == 1;
    const bool addBias = lg.bias && !libraryBias, relu = lg.relu && !libraryRelu;
    if (!gelu && !addBias && !relu) return {};
    if (addBias) {
      body += "    v += in2[i % " + ll(lg.geometry.n) + "];\n";
      args.push_back({KernelArg::Input, 2});
    }
    if (gelu) {
      if (addBias) body += "    out1[i] = v;\n";
      body += "    out0[i] = " + geluOf("v") + ";\n";
      args.push_back({KernelArg::Output, 0});
      args.push_back({KernelArg::Output, 1});
    } else {
      body += relu ? "    out0[i] = fmaxf(v, 0.0f);\n" : "    out0[i] = v;\n";
      args.push_back({KernelArg::Output, 0});
    }
  } else {
    return {};  // MatMul: the product is the result
  }
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "epilogue", kLibraryEpilogue,
                              {{"COUNT", ll(count)}, {"SOURCE", "out" + std::to_string(lg.output)}, {"BODY", body}},
                              {gridFor(count), 1, 1}, kThreads, args));
  return nk;
}

NodeKernels libraryGemmTransposeB(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  const Ctx c{g, n};
  const LibraryGemm lg = libraryGemmOf(g, id);
  assert(lg.supported && lg.geometry.transB && lg.geometry.batch == 1);
  const int64_t nn = lg.geometry.n, k = lg.geometry.k;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "transpose_b", kGemmTranspose, {{"R", ll(nn)}, {"C", ll(k)}, {"OFFSET", "0"}, {"INPUT", "1"}},
                              {static_cast<unsigned>((k + 31) / 32), static_cast<unsigned>((nn + 31) / 32), 1}, kThreads,
                              {{KernelArg::Input, 1}, {KernelArg::Scratch, 0}}));
  nk.scratchBytes = static_cast<size_t>(nn * k) * sizeof(float);
  return nk;
}

bool flashLayoutBshd(const Node& n) { return n.attrs.getString("layout", "bhsd") == "bshd"; }

FlashAttentionConfig flashConfigOf(const Graph& g, const Node& n, bool tf32) {
  const Ctx c{g, n};
  Shape q = c.in(0), k = c.in(1);
  if (flashLayoutBshd(n)) std::swap(q[1], q[2]), std::swap(k[1], k[2]);  // the [B, H, S, D] view
  FlashAttentionConfig f;
  f.dtype = c.inType(0) == DType::BF16 ? kFlashBF16 : kFlashF32;
  f.batch = static_cast<int>(q[0]);
  f.heads = static_cast<int>(q[1]);
  f.kvHeads = static_cast<int>(k[1]);
  f.qLen = static_cast<int>(q[2]);
  f.kLen = static_cast<int>(k[2]);
  f.headDim = static_cast<int>(q[3]);
  f.scale = static_cast<float>(c.n.attrs.getFloat("scale", 1.0));
  f.mask = maskSpecOf(c.n.attrs);
  f.sinkLogits = c.n.op == OpKind::FlashAttention ? c.n.inputs.size() == 4 : c.n.inputs.size() == 7;
  f.tf32 = tf32 && f.dtype == kFlashF32;
  return f;
}

namespace {

// FlashAttention nodes run through the launcher; these are the instantiations it would pick (the
// wgmma ones for sm_90a targets; the fp32 rows-per-thread rule, which needs the device's SM count,
// takes its default here).

FlashTarget flashTargetOf(const EmitOptions& opt) {
  FlashTarget t;
  t.wgmma = opt.wgmma;
  t.fullRateFp64 = opt.fullRateFp64;
  return t;
}

NodeKernels flashKernels(const Ctx& c, const std::vector<FlashKernelKind>& kinds) {
  NodeKernels nk;
  nk.external = true;
  const FlashAttentionConfig cfg = flashConfigOf(c.g, c.n, c.opt->tf32);
  for (FlashKernelKind kind : kinds) {
    FlashKernelSpec spec;
    try {
      spec = FlashAttention::chooseSpec(kind, cfg, flashTargetOf(*c.opt));
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
  // dQ from the dK/dV kernel's per-key-block shares (fp32, short keys), from its atomics (fp32
  // beyond; the default, non-deterministic backward), or from its own kernel.
  const FlashKernelSpec dkdv =
      FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, flashConfigOf(c.g, c.n, c.opt->tf32), flashTargetOf(*c.opt));
  std::vector<FlashKernelKind> kinds = {FlashKernelKind::kBwdPreprocess, FlashKernelKind::kBwdSinkReduce,
                                        FlashKernelKind::kBwdDkDv};
  if (dkdv.dqPartial)
    kinds.push_back(FlashKernelKind::kBwdDqReduce);
  else if (!dkdv.atomicDq)
    kinds.push_back(FlashKernelKind::kBwdDq);
  kinds.push_back(FlashKernelKind::kBwdDqConvert);
  kinds.push_back(FlashKernelKind::kBwdDkDvReduce);
  return flashKernels(c, kinds);
}

using EmitFn = NodeKernels (*)(const Ctx&);
const EmitFn kEmit[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) &emit##Name,
#include "graph/ops.def"
};

}  // namespace

NodeKernels emitNode(const Graph& g, NodeId id) { return emitNode(g, id, kDefaultOptions); }

NodeKernels emitNode(const Graph& g, NodeId id, const EmitOptions& opt) {
  const Ctx c{g, g.node(id), &opt};
  return kEmit[static_cast<int>(c.n.op)](c);
}

cuda::KernelParams launchParams(const Kernel& k, const std::function<cuda::CUdeviceptr(int)>& input,
                                const std::function<cuda::CUdeviceptr(int)>& output, cuda::CUdeviceptr scratch) {
  cuda::KernelParams params(k.args.size());
  for (const KernelArg& a : k.args) {
    switch (a.kind) {
    case KernelArg::Input: params.addPointer(input(a.index)); break;
    case KernelArg::Output: params.addPointer(output(a.index)); break;
    case KernelArg::Scratch: params.addPointer(scratch); break;
    case KernelArg::InputTensorMap: params.addTensorMap(a.map, input(a.index)); break;
    case KernelArg::ScratchTensorMap: params.addTensorMap(a.map, scratch + a.scratchOffsetBytes); break;
    }
  }
  return params;
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

int dumpKernels(const Graph& g, const std::string& dir) { return dumpKernels(g, dir, EmitOptions{}); }

int dumpKernels(const Graph& g, const std::string& dir, const EmitOptions& opt) {
  std::filesystem::create_directories(dir);
  int written = 0;
  for (NodeId id : g.topoOrder()) {
    for (const Kernel& k : emitNode(g, id, opt).kernels) {
      std::ofstream(std::filesystem::path(dir) / (k.name + ".cu")) << selfContainedSource(k);
      ++written;
    }
  }
  return written;
}

}  // namespace pa::codegen
