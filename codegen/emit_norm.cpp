// Emitters of the row-normalisation and rotary-embedding families: LayerNorm, RmsNorm (each
// optionally fused with a residual add) and their gradients; Rope. Shapes are compile-time
// constants of the source; every value is read and written through its storage type's view
// (finish()'s argType), so any mix of fp32 and bf16 operands that lower-bf16 makes compiles.
//
// Note on the row layout. A row of F features is held in registers by T threads, thread `lane`
// owning features lane + k·T (k < V = ⌈F/T⌉): one warp per row up to F = 512 (8 rows per
// 256-thread block), above that the whole block (T = 256, 512 or 1024, so V stays ≤ 16 up to
// F = 16384; beyond, V grows and the arrays leave the registers, which is slow but correct).
// Row statistics are fp32 sums over the row (pa::norm::rowSum2 (kernels/norm.cuh), a fixed-order tree). The gradients'
// d gain and d bias are column sums over the rows: each block adds its rows' terms per feature
// and writes a partial row to scratch; a second kernel adds the partial rows in a fixed order
// (in double). No atomics, so every run gives the same bits.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "codegen/emit_internal.h"
#include "codegen/templates/norm.h"
#include "graph/node_attrs.h"

namespace pa::codegen::detail {

using namespace templates;

namespace {

struct RowLayout {
  int threads;  // T: threads per row
  int block;    // threads per block (T, or 256 rows of a warp each)
  int perThread;  // V = ⌈F / T⌉ (at least 1, so that F = 0 still compiles)
};

RowLayout rowLayout(int64_t f) {
  if (f <= 512) return {32, static_cast<int>(kThreads), static_cast<int>(std::max<int64_t>(1, (f + 31) / 32))};
  const int t = f <= 4096 ? 256 : f <= 8192 ? 512 : 1024;
  return {t, t, static_cast<int>((f + t - 1) / t)};
}

// Rows and features of a norm's (or its gradient's) input [..., F].
std::pair<int64_t, int64_t> rowsOf(const Ctx& c) {
  const Shape& x = c.in(0);
  const int64_t f = x.back();
  return {f ? numel(x) / f : 0, f};
}

std::string unrollOf(const RowLayout& l) { return l.perThread <= 32 ? "" : "1"; }

// `v` rounded to the storage type of output `i` (the fused sum is normalised as stored).
std::string roundedTo(const Ctx& c, int i, const std::string& v) {
  argType(c.outType(i), true);  // throws for a type the CUDA backend does not store
  return c.outType(i) == DType::BF16 ? "pa::storage::bf16ToFloat(pa::storage::floatToBf16(" + v + "))" : v;
}

// LayerNorm (params = 2: gain, bias) and RmsNorm (params = 1: gain).
NodeKernels normForward(const Ctx& c, int params) {
  const auto [rows, f] = rowsOf(c);
  const RowLayout l = rowLayout(f);
  const bool layer = params == 2;
  const bool fused = static_cast<int>(c.n.inputs.size()) == params + 2;
  const int stats = layer ? 2 : 1;
  std::string load;
  if (fused) {
    const std::string r = "in" + std::to_string(params + 1), s = "out" + std::to_string(1 + stats);
    load = "      const float s = in0[base + j] + " + r + "[base + j];\n      " + s + "[base + j] = s;\n      v[k] = " +
           roundedTo(c, 1 + stats, "s") + ";\n";
  } else {
    load = "      v[k] = in0[base + j];\n";
  }
  const int64_t rowsPerBlock = l.block / l.threads;
  const int64_t blocks = std::max<int64_t>(1, (rows + rowsPerBlock - 1) / rowsPerBlock);
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kNormForward,
                              {{"BLOCK", std::to_string(l.block)}, {"TPR", std::to_string(l.threads)},
                               {"VPT", std::to_string(l.perThread)}, {"F", ll(f)}, {"ROWS", ll(rows)}, {"UNROLL", unrollOf(l)},
                               {"LOAD", load}, {"CENTER", layer ? "1" : "0"}, {"EPS", num(c.n.attrs.get<attr::Eps>())},
                               {"BIAS", layer ? " + in2[j]" : ""},
                               {"STATS", layer ? "    out1[row] = mu;\n    out2[row] = rs;\n" : "    out1[row] = rs;\n"}},
                              {static_cast<unsigned>(blocks), 1, 1}, static_cast<unsigned>(l.block), allArgs(c.n), {"kernels/norm.cuh"}));
  return nk;
}

// LayerNormGrad (layer: inputs dy, x, gain, mean, rstd[, dsum]; outputs dx, dgain, dbias) and
// RmsNormGrad (dy, x, gain, rstd[, dsum]; dx, dgain).
NodeKernels normGrad(const Ctx& c, bool layer) {
  const auto [rows, f] = rowsOf(c);
  const RowLayout l = rowLayout(f);
  const int stats = layer ? 2 : 1;
  const bool dsum = static_cast<int>(c.n.inputs.size()) == 4 + stats;
  // About 256 blocks' worth of rows or fewer (tiny_gpt's 8192 rows of 512: 4 rows per warp), so
  // the partial rows stay a small fraction of the traffic.
  const int64_t groups = l.block / l.threads;
  const int64_t rowsPerGroup = std::max<int64_t>(1, (rows + groups * 256 - 1) / (groups * 256));
  const int64_t blocks = std::max<int64_t>(1, (rows + groups * rowsPerGroup - 1) / (groups * rowsPerGroup));
  const std::string dsumIn = "in" + std::to_string(3 + stats);
  std::vector<KernelArg> rowArgs;
  for (size_t i = 0; i < c.n.inputs.size(); ++i) rowArgs.push_back({KernelArg::Input, static_cast<int>(i)});
  rowArgs.push_back({KernelArg::Output, 0});
  rowArgs.push_back({KernelArg::Scratch, 0});
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "rows", kNormGradRows,
                              {{"BLOCK", std::to_string(l.block)}, {"TPR", std::to_string(l.threads)},
                               {"VPT", std::to_string(l.perThread)}, {"F", ll(f)}, {"ROWS", ll(rows)}, {"UNROLL", unrollOf(l)},
                               {"RPG", std::to_string(rowsPerGroup)}, {"MEAN", layer ? "in3[row]" : "0.0f"},
                               {"RSTD", layer ? "in4[row]" : "in3[row]"}, {"CENTER", layer ? "1" : "0"},
                               {"DSUM", dsum ? " + " + dsumIn + "[base + j]" : ""}},
                              {static_cast<unsigned>(blocks), 1, 1}, static_cast<unsigned>(l.block), rowArgs, {"kernels/norm.cuh"}));
  std::vector<KernelArg> colArgs{{KernelArg::Output, 1}};
  if (layer) colArgs.push_back({KernelArg::Output, 2});
  colArgs.push_back({KernelArg::Scratch, 0});
  const int64_t colBlocks = std::max<int64_t>(1, (f + 31) / 32);
  nk.kernels.push_back(finish(c, "columns", kNormGradColumns,
                              {{"F", ll(f)}, {"PARTS", ll(blocks)},
                               {"STORE", layer ? "    if (blockIdx.y == 0) out1[j] = (float)s;\n    else out2[j] = (float)s;\n"
                                               : "    out1[j] = (float)s;\n"}},
                              {static_cast<unsigned>(colBlocks), static_cast<unsigned>(stats), 1}, kThreads, colArgs));
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
std::string ropeTurn(const std::string& angle, const std::string& a, const std::string& b, bool inverse) {
  return "    { const double angle = " + angle + ";\n"
         "      const double turns = rint(angle * 0.15915494309189535);\n"
         "      double r = fma(-turns, 6.283185307179586, angle);\n"
         "      r = fma(-turns, 2.4492935982947064e-16, r);\n"
         "      float sn, cs;\n"
         "      sincosf((float)r, &sn, &cs);\n" +
         std::string(inverse ? "      sn = -sn;  // inverse: the other way\n" : "") +
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
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kRope,
                              {{"FREQCOUNT", std::to_string(std::max<int64_t>(half, 1))}, {"INVFREQ", freqs},
                               {"COUNT", ll(count)}, {"ITEMS", ll(std::max<int64_t>(items, 1))}, {"D", ll(d)},
                               {"HALF", ll(half)}, {"DIMS", ll(dims)}, {"POS", pos},
                               {"TURN", ropeTurn("(double)pos * " + c.kernelName() + "_invFreq[item]", "a", "b", a.get<attr::Inverse>())},
                               {"I0", interleaved ? "2 * item" : "item"},
                               {"I1", interleaved ? "2 * item + 1" : "item + " + ll(half)}},
                              {gridFor(count), 1, 1}, kThreads, allArgs(c.n)));
  return nk;
}

}  // namespace pa::codegen::detail
