// Emitters of the row-normalisation and rotary-embedding families: LayerNorm, RmsNorm (each
// optionally fused with a residual add) and their gradients; Rope. Shapes are compile-time
// constants of the source; every value is read and written through its storage type's view
// (finish()'s argType), so any mix of fp32 and bf16 operands that lower-bf16 makes compiles.
//
// Note on the row layout (kernels/norm.cuh draws it). A row of F features is cut into chunks of N
// consecutive features: N = 8 where some tensor the kernel moves in chunks is bf16 and 8 divides F
// (16 bytes of bf16), else 4 where 4 divides F (16 bytes of fp32, 8 of bf16), else 1 (the scalar
// layout, for widths such as 1, 3, 17 or 513). The row's T threads, whole warps, each hold chunks
// lane + k·T (k < V = ⌈(F / N) / T⌉) in registers, at most 16 features a thread: T is the fewest
// of 32, 64, 128 and 256 that keeps to that, with 256 / T rows per 256-thread block (a warp per
// row up to F = 512); wider rows take a block each of T threads, the fewest multiple of 32 that
// keeps to it, up to 1024 (beyond F = 16384 V grows and the arrays leave the registers, which is
// slow but correct). Every chunk moves in vector accesses when the kernel's tensors are 16-byte
// aligned, one element at a time otherwise, with the same results.
// Row statistics are fp32 sums over the row (pa::norm::rowSum2, a fixed-order tree). The
// gradients' d gain and d bias are column sums over the rows: each block adds its rows' terms per
// feature and writes a partial row to scratch; a second kernel adds the partial rows in a fixed
// order (in double). A row group of the gradient takes the fewest rows that keep the blocks to at
// most kGradBlocksPerSm per SM (EmitOptions::sms), and blocks of several rows are compiled so that
// an SM holds that many at once: one wave of blocks fills the device, while the partial rows, one
// per block, stay few beside the rows' own traffic. No atomics, so every run on a device gives the
// same bits.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>

#include "codegen/emit_internal.h"
#include "codegen/templates/norm.h"
#include "graph/node_attrs.h"

namespace pa::codegen::detail {

using namespace templates;

namespace {

struct RowLayout {
  int chunk;      // N: consecutive features a thread moves at once (8, 4 or 1; divides F)
  int threads;    // T: threads per row
  int block;      // threads per block: 256 (256 / T rows), or T above that
  int perThread;  // V = ⌈(F / N) / T⌉ chunks (at least 1, so that F = 0 still compiles)
};

// The features a thread holds in registers (up to F = 16384).
constexpr int64_t kFeaturesPerThread = 16;
// The gradient's blocks per SM: its grid holds at most this many per SM, and its blocks of
// several rows (which keep their column sums in shared memory) are compiled to fit this many at once.
constexpr int kGradBlocksPerSm = 4;

// `bf16`: some tensor the kernel moves in chunks is stored in bf16.
RowLayout rowLayout(int64_t f, bool bf16) {
  const int n = bf16 && f % 8 == 0 ? 8 : f % 4 == 0 ? 4 : 1;
  const int64_t chunks = std::max<int64_t>(1, f / n), most = std::max<int64_t>(1, kFeaturesPerThread / n);
  int64_t t = 32;
  while (t < static_cast<int64_t>(kThreads) && t * most < chunks) t *= 2;
  if (t * most < chunks) t = std::min<int64_t>(1024, 32 * ((chunks + 32 * most - 1) / (32 * most)));
  return {n, static_cast<int>(t), static_cast<int>(std::max<int64_t>(t, kThreads)), static_cast<int>((chunks + t - 1) / t)};
}

// Whether any input or output of the node is stored in bf16 (the statistics never are).
bool anyBf16(const Ctx& c) {
  for (size_t i = 0; i < c.n.inputs.size(); ++i)
    if (c.inType(static_cast<int>(i)) == DType::BF16) return true;
  for (size_t i = 0; i < c.n.outputs.size(); ++i)
    if (c.outType(static_cast<int>(i)) == DType::BF16) return true;
  return false;
}

// The argument names finish() gives `args`, as a call's argument list.
std::string argNames(const std::vector<KernelArg>& args) {
  std::string s;
  for (const KernelArg& a : args) {
    s += s.empty() ? "" : ", ";
    switch (a.kind) {
    case KernelArg::Input: s += "in" + std::to_string(a.index); break;
    case KernelArg::Output: s += "out" + std::to_string(a.index); break;
    case KernelArg::Scratch: s += "scratch"; break;
    case KernelArg::InputTensorMap:
    case KernelArg::ScratchTensorMap:
    case KernelArg::OutputTensorMap:
    case KernelArg::AdamBinding: assert(false && "the norm kernels take no tensor maps and no Adam binding"); break;
    }
  }
  return s;
}

// Floats of the row sums' shared memory (kernels/norm.cuh's rowSum2): 2 * (T / 32) per row.
std::string rowSumFloats(const RowLayout& l) { return std::to_string(l.threads > 32 ? 2 * (l.block / 32) : 1); }

// The kernel's run-time alignment check over the tensors it moves in chunks.
std::string alignedCheck(const std::vector<std::string>& names) {
  std::string s = "pa::norm::allAligned16(";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + ")";
}

// Rows and features of a norm's (or its gradient's) input [..., F].
std::pair<int64_t, int64_t> rowsOf(const Ctx& c) {
  const Shape& x = c.in(0);
  const int64_t f = x.back();
  return {f ? numel(x) / f : 0, f};
}

std::string unrollOf(const RowLayout& l) { return l.perThread * l.chunk <= 32 ? "" : "1"; }

// `v` rounded to the storage type of output `i` (the fused sum is normalised as stored).
std::string roundedTo(const Ctx& c, int i, const std::string& v) {
  argType(c.outType(i), true);  // throws for a type the CUDA backend does not store
  return c.outType(i) == DType::BF16 ? "pa::storage::bf16ToFloat(pa::storage::floatToBf16(" + v + "))" : v;
}

// LayerNorm (params = 2: gain, bias) and RmsNorm (params = 1: gain).
NodeKernels normForward(const Ctx& c, int params) {
  const auto [rows, f] = rowsOf(c);
  const RowLayout l = rowLayout(f, anyBf16(c));
  const bool layer = params == 2;
  const bool fused = static_cast<int>(c.n.inputs.size()) == params + 2;
  const int stats = layer ? 2 : 1;
  std::vector<std::string> chunked{"in0", "in1", "out0"};
  if (layer) chunked.push_back("in2");
  std::string load = "        pa::norm::load(in0, base + j, v[k], vec);\n", sum;
  if (fused) {
    const std::string r = "in" + std::to_string(params + 1), out = "out" + std::to_string(1 + stats);
    chunked.push_back(r);
    chunked.push_back(out);
    load = "        float r[N];\n" + load + "        pa::norm::load(" + r + ", base + j, r, vec);\n" +
           "#pragma unroll\n        for (int e = 0; e < N; ++e) v[k][e] += r[e];\n";
    // The sum is stored, then normalised as stored.
    const std::string rounded = roundedTo(c, 1 + stats, "v[k][e]");
    sum = "#pragma unroll " + unrollOf(l) + "\n    for (int k = 0; k < V; ++k) {\n" +
          "      const long long j = (lane + (long long)k * T) * N;\n      if (j >= F) continue;\n" +
          "      pa::norm::store(" + out + ", base + j, v[k], vec);\n" +
          (rounded == "v[k][e]" ? "" : "#pragma unroll\n      for (int e = 0; e < N; ++e) v[k][e] = " + rounded + ";\n") + "    }\n";
  }
  const int64_t rowsPerBlock = l.block / l.threads;
  const int64_t blocks = std::max<int64_t>(1, (rows + rowsPerBlock - 1) / rowsPerBlock);
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kNormForward,
                              {{"BLOCK", std::to_string(l.block)}, {"TPR", std::to_string(l.threads)},
                               {"VPT", std::to_string(l.perThread)}, {"VEC", std::to_string(l.chunk)}, {"F", ll(f)},
                               {"ROWS", ll(rows)}, {"UNROLL", unrollOf(l)}, {"ALIGNED", alignedCheck(chunked)}, {"LOAD", load},
                               {"SUM", sum}, {"CENTER", layer ? "1" : "0"}, {"EPS", num(c.n.attrs.get<attr::Eps>())},
                               {"BIASDECL", layer ? ", b[V][N]" : ""},
                               {"BIASLOAD", layer ? "      pa::norm::load(in2, j, b[k], vec);\n" : ""}, {"BIAS", layer ? " + b[k][e]" : ""},
                               {"STATS", layer ? "    out1[row] = mu;\n    out2[row] = rs;\n" : "    out1[row] = rs;\n"},
                               {"SH", rowSumFloats(l)}, {"ARGS", argNames(allArgs(c.n))}},
                              {static_cast<unsigned>(blocks), 1, 1}, static_cast<unsigned>(l.block), allArgs(c.n), {"kernels/norm.cuh"}));
  return nk;
}

// LayerNormGrad (layer: inputs dy, x, gain, mean, rstd[, dsum]; outputs dx, dgain, dbias) and
// RmsNormGrad (dy, x, gain, rstd[, dsum]; dx, dgain).
NodeKernels normGrad(const Ctx& c, bool layer) {
  const auto [rows, f] = rowsOf(c);
  const RowLayout l = rowLayout(f, anyBf16(c));
  const int stats = layer ? 2 : 1;
  const bool dsum = static_cast<int>(c.n.inputs.size()) == 4 + stats;
  // Rows per group: the fewest that keep the blocks to kGradBlocksPerSm per SM (the note above).
  const int64_t groups = l.block / l.threads;
  const int64_t target = kGradBlocksPerSm * std::max(1, c.opt->sms);
  const int64_t rowsPerGroup = std::max<int64_t>(1, (rows + groups * target - 1) / (groups * target));
  const int64_t blocks = std::max<int64_t>(1, (rows + groups * rowsPerGroup - 1) / (groups * rowsPerGroup));
  const std::string dsumIn = "in" + std::to_string(3 + stats);
  std::vector<std::string> chunked{"in0", "in1", "in2", "out0", "scratch"};
  if (dsum) chunked.push_back(dsumIn);
  std::vector<KernelArg> rowArgs;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) rowArgs.push_back({KernelArg::Input, static_cast<int>(i)});
  rowArgs.push_back({KernelArg::Output, 0});
  rowArgs.push_back({KernelArg::Scratch, 0});
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "rows", kNormGradRows,
                              {{"BLOCK", std::to_string(l.block)}, {"TPR", std::to_string(l.threads)},
                               {"VPT", std::to_string(l.perThread)}, {"VEC", std::to_string(l.chunk)}, {"F", ll(f)},
                               {"ROWS", ll(rows)}, {"UNROLL", unrollOf(l)}, {"ALIGNED", alignedCheck(chunked)},
                               {"RPG", std::to_string(rowsPerGroup)},
                               {"MINBLOCKS", groups > 1 ? ", " + std::to_string(kGradBlocksPerSm) : ""},
                               {"MEAN", layer ? "in3[row]" : "0.0f"}, {"RSTD", layer ? "in4[row]" : "in3[row]"},
                               {"CENTER", layer ? "1" : "0"},
                               {"DSUMLOAD", dsum ? "        float ds[N];\n        pa::norm::load(" + dsumIn + ", base + j, ds, vec);\n" : ""},
                               {"DSUMFOLD", dsum ? "          gh[k][e] = rs * gh[k][e] + ds[e];\n" : ""},
                               {"DX", dsum ? "gh[k][e] - rs * (mg + xh[k][e] * mgx)" : "rs * (gh[k][e] - mg - xh[k][e] * mgx)"},
                               {"SH", rowSumFloats(l)}, {"PART", groups > 1 ? ll(std::max<int64_t>(1, stats * groups * f)) : "1"},
                               {"ARGS", argNames(rowArgs)}},
                              {static_cast<unsigned>(blocks), 1, 1}, static_cast<unsigned>(l.block), rowArgs, {"kernels/norm.cuh"}));
  std::vector<KernelArg> colArgs{{KernelArg::Output, 1}};
  if (layer) colArgs.push_back({KernelArg::Output, 2});
  colArgs.push_back({KernelArg::Scratch, 0});
  // The column sums' slices: four partial rows or more each, 32 to 128 slices of 8 threads (the
  // grid has only ⌈F / 8⌉ blocks a quantity, so each block takes as many rows at once as it can).
  const int64_t colBlocks = std::max<int64_t>(1, (f + 7) / 8);
  int64_t slices = 32;
  while (slices < 128 && slices * 2 * 4 <= blocks) slices *= 2;
  nk.kernels.push_back(finish(c, "columns", kNormGradColumns,
                              {{"F", ll(f)}, {"PARTS", ll(blocks)}, {"SLICES", ll(slices)},
                               {"STORE", layer ? "    if (blockIdx.y == 0) out1[j] = (float)s;\n    else out2[j] = (float)s;\n"
                                               : "    out1[j] = (float)s;\n"}},
                              {static_cast<unsigned>(colBlocks), static_cast<unsigned>(stats), 1}, static_cast<unsigned>(8 * slices), colArgs));
  nk.scratchBytes = static_cast<size_t>(stats * blocks * std::max<int64_t>(f, 1)) * sizeof(float);
  return nk;
}


}  // namespace

NodeKernels emitLayerNorm(const Ctx& c) { return normForward(c, 2); }
NodeKernels emitRmsNorm(const Ctx& c) { return normForward(c, 1); }
NodeKernels emitLayerNormGrad(const Ctx& c) { return normGrad(c, true); }
NodeKernels emitRmsNormGrad(const Ctx& c) { return normGrad(c, false); }

// Note on the turn's precision. The angle position · invFreq is formed in double (the CPU
// reference's product) and reduced modulo 2π there (Cody-Waite, two constants), so the float
// sincosf sees |r| ≤ π whatever the position: the error stays at float's own (~1e-7 absolute)
// at position 1e5, where a float product alone would be off by ~5e-3 radians.
// Statements declaring float `sn` and `cs`, the sine and cosine of the angle (turned the other way
// when `inverse`), each line starting with `indent`.
std::string ropeSinCos(const std::string& angle, bool inverse, const std::string& indent) {
  return indent + "const double angle = " + angle + ";\n" +
         indent + "const double turns = rint(angle * 0.15915494309189535);\n" +
         indent + "double r = fma(-turns, 6.283185307179586, angle);\n" +
         indent + "r = fma(-turns, 2.4492935982947064e-16, r);\n" +
         indent + "float sn, cs;\n" +
         indent + "sincosf((float)r, &sn, &cs);\n" +
         (inverse ? indent + "sn = -sn;  // inverse: the other way\n" : std::string());
}

std::string ropeTurn(const std::string& angle, const std::string& a, const std::string& b, bool inverse) {
  return "    {\n" + ropeSinCos(angle, inverse, "      ") +
         "      const float a0 = " + a + ", b0 = " + b + ";\n"
         "      " + a + " = a0 * cs - b0 * sn;\n"
         "      " + b + " = a0 * sn + b0 * cs; }\n";
}

NodeKernels emitRope(const Ctx& c) {
  const Shape& x = c.in(0);
  const AttrMap& a = c.n.attrs;
  const bool bshd = a.get<attr::Layout>() == "bshd";
  const int64_t d = x[3], heads = bshd ? x[2] : x[1], seq = bshd ? x[1] : x[2];
  const int64_t dims = a.get<attr::RopeDims>() ? a.get<attr::RopeDims>() : d, half = dims / 2;
  const bool interleaved = a.get<attr::Interleaved>();
  // The CPU reference's inverse frequencies, the same double expression, printed exactly.
  std::string freqs;
  for (int64_t j = 0; j < half; ++j) {
    const double invFreq = std::pow(a.get<attr::RopeBase>(), -2.0 * static_cast<double>(j) / static_cast<double>(dims));
    if (!std::isfinite(invFreq)) throw std::invalid_argument("rope node '" + c.n.name + "': base " + exactDouble(a.get<attr::RopeBase>()) +
                                                             " gives an infinite frequency");
    freqs += (j ? ", " : "") + exactDouble(invFreq);
  }
  if (half == 0) freqs = "0.0";
  const int64_t items = half + (d - dims), rows = numel(x) / std::max<int64_t>(d, 1);
  const int64_t count = rows * items;
  // Rows are [B, H, S] (bhsd) or [B, S, H] (bshd) in memory order; the position is s.
  const std::string pos = bshd ? "(row / " + ll(heads) + ") % " + ll(seq) : "row % " + ll(seq);
  // Heads from `turnHeads` on (a packed QKV's V) pass unchanged: the pair is stored as read.
  const int64_t turnHeads = a.get<attr::RopeHeads>();
  const std::string head = bshd ? "row % " + ll(heads) : "(row / " + ll(seq) + ") % " + ll(heads);
  const std::string passHead =
      turnHeads > 0 && turnHeads < heads ? "    if (" + head + " >= " + ll(turnHeads) + ") {\n      out0[i0] = a;\n      out0[i1] = b;\n      continue;\n    }\n" : "";
  // The chunked kernel where the pairs split in halves and both the half and the copied tail
  // come in chunks of n = 4 features (8 bytes of bf16, 16 of fp32; 8 would hold too many
  // registers for enough threads at once): a thread turns one chunk of pairs of up to four heads
  // at its position.
  constexpr int64_t n = 4;
  if (!interleaved && half > 0 && half % n == 0 && (d - dims) % n == 0) {
    const int64_t groups = rows / std::max<int64_t>(heads, 1), chunks = half / n + (d - dims) / n;
    // Head h of group g: bshd rows [B, S, H] (g = b·S + s), bhsd rows [B, H, S].
    const std::string row = bshd ? "group * " + ll(heads) + " + h"
                                 : "(group / " + ll(seq) + " * " + ll(heads) + " + h) * " + ll(seq) + " + group % " + ll(seq);
    const int64_t turn = turnHeads > 0 && turnHeads < heads ? turnHeads : heads;
    const int64_t hb = std::min<int64_t>(4, std::max<int64_t>(heads, 1)), batches = (heads + hb - 1) / hb;
    const int64_t count = groups * batches * chunks;
    NodeKernels nk;
    nk.kernels.push_back(finish(c, "", kRopeChunks,
                                {{"FREQCOUNT", std::to_string(std::max<int64_t>(half, 1))}, {"INVFREQ", freqs},
                                 {"VEC", std::to_string(n)}, {"HEADS", ll(heads)}, {"TURNHEADS", ll(turn)},
                                 {"POS", "group % " + ll(seq)}, {"ROW", row}, {"D", ll(d)}, {"DIMS", ll(dims)},
                                 {"HALF", ll(half)}, {"HC", ll(half / n)}, {"CHUNKS", ll(chunks)}, {"HB", ll(hb)},
                                 {"BATCHES", ll(batches)}, {"COUNT", ll(count)},
                                 {"SINCOS", ropeSinCos("(double)pos * " + c.kernelName() + "_invFreq[item]", a.get<attr::Inverse>(), "      ") +
                                                "      cosv[e] = cs;\n      sinv[e] = sn;\n"},
                                 {"ARGS", argNames(allArgs(c.n))}},
                                {gridFor(count), 1, 1}, kThreads, allArgs(c.n), {"kernels/norm.cuh"}));
    return nk;
  }
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kRope,
                              {{"FREQCOUNT", std::to_string(std::max<int64_t>(half, 1))}, {"INVFREQ", freqs},
                               {"COUNT", ll(count)}, {"ITEMS", ll(std::max<int64_t>(items, 1))}, {"D", ll(d)},
                               {"HALF", ll(half)}, {"DIMS", ll(dims)}, {"POS", pos}, {"PASSHEAD", passHead},
                               {"TURN", ropeTurn("(double)pos * " + c.kernelName() + "_invFreq[item]", "a", "b", a.get<attr::Inverse>())},
                               {"I0", interleaved ? "2 * item" : "item"},
                               {"I1", interleaved ? "2 * item + 1" : "item + " + ll(half)}},
                              {gridFor((count + 3) / 4), 1, 1}, kThreads, allArgs(c.n)));  // four items a thread
  return nk;
}

}  // namespace pa::codegen::detail
