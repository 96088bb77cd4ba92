// Emitters of the fused MLP: FusedMlp (one forward kernel), FusedMlpGrad (one backward kernel
// with the weight and bias gradients' reduction inside) and FusedMlpTrain (the two and the MSE
// gradient between them in one kernel), from codegen/templates/mlp.h over
// kernels/fused_mlp.cuh. Every width and tiling choice is a compile-time constant of the source.
//
// Note on the tiling. A block has kThreads threads and takes tiles of R rows, R the smallest power
// of two (1 to 32) that cuts the batch into at most half the SMs' worth of tiles (the backward:
// the grid it wants, below): enough blocks that each has little to do per layer, few enough that
// the weights each block copies in stay cheap to serve from L2. Shared memory holds the
// tile's rows (the forward: its input and two activation buffers; the backward: every layer's
// input, dy and y, two dz buffers), then every layer's weights ("resident": copied once per
// block) or, where they do not all fit, one layer's at a time ("streamed"), then in the backward
// the block's partial sums where they fit (else the scratch). The budget is the target's opt-in
// maximum less 1 KB: 227 KB on sm_90a, 163 KB (sm_80's) otherwise; R is halved until the rows fit
// beside streamed weights. Per layer the emitter picks the micro-tile of a dot-product lane (TM
// rows × V columns, V = 4, 2 or 1 as the width allows) and the lanes that split one dot product
// (KS forward, NS for dz·Wᵀ: a power of two ≤ 32 and ≤ the dot product's steps), minimising an
// estimate of the layer's cycles: per-scheduler issue slots (loads, FMAs, the reduce-scatter's
// shuffles, the stores) against shared-memory wavefronts, plus 30 cycles a shuffle level. Weight
// rows in shared memory get the smallest stride (≥ N, a multiple of V) whose first warp read
// takes the fewest wavefronts. The dW micro-tile is TK rows × V columns, TK the largest of 4, 2, 1
// that still gives every thread an element. The forward grid is min(tiles, SMs), twice the SMs
// where two blocks fit in an SM's shared memory; blocks stride over the tiles. The backward grid
// is C blocks, a multiple of the cluster size G (8 on sm_90a, else 1), at most the SMs and at
// most what keeps the reduction's reads small (P: the partial sums' floats). With clusters C·P ≤
// 2^21 (a rank reads P floats of its members and C·P / G² of the cluster slots), and C is the
// tiles (about half the SMs' worth) rounded up to G. Without, the last block reads all C·P ≤
// 2^18 floats, a cost that grows with C while a block's share of the rows shrinks with it (both
// ∝ P): C is about √(rows / 2), and so are the tiles where R allows. Everything is
// fp32 FFMA (precision tf32 and bf16 too: no tensor cores), summed in a fixed order, so results are
// bit-identical run to run for a given C and target (kernels/fused_mlp.cuh).
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "codegen/emit_internal.h"
#include "codegen/templates/mlp.h"
#include "common/mlp_limits.h"
#include "graph/node_attrs.h"

namespace pa::codegen::detail {

using namespace templates;

namespace {

constexpr int64_t kMaxTileRows = 32;
constexpr int kClusterSize = 8;  // the portable maximum
constexpr int64_t kSharedSm90 = 227 * 1024, kSharedOther = 163 * 1024;
// The partial-sum floats C·P the reduction reads, at most: without clusters the last block reads
// them all; with clusters a rank reads P / G of each of the C / G cluster slots, C·P / G².
constexpr int64_t kReduceFloats = int64_t{1} << 18, kReduceFloatsClustered = int64_t{1} << 21;
constexpr int kWarps = static_cast<int>(kThreads) / 32;

int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }
int64_t roundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
int64_t ceilDiv(int64_t n, int64_t m) { return (n + m - 1) / m; }
int log2Of(int64_t n) {
  int l = 0;
  while ((int64_t{1} << l) < n) ++l;
  return l;
}
// The widest vector (4, 2 or 1 floats) that rows of `n` floats keep aligned.
int vecWidth(int64_t n) { return n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1; }

const char* activationCode(MlpActivation a) {
  switch (a) {
  case MlpActivation::None: return "pa::mlp::kNone";
  case MlpActivation::Relu: return "pa::mlp::kRelu";
  case MlpActivation::Tanh: return "pa::mlp::kTanh";
  case MlpActivation::Sigmoid: return "pa::mlp::kSigmoid";
  }
  return "pa::mlp::kNone";
}

std::string str(int64_t v) { return std::to_string(v); }
// kMlpCopyRows for the tile's rows (from tile * R, `rows` of them) of `src` [batch, width] into
// shared memory at `off`.
std::string tileRowsCopy(int64_t off, const std::string& src, int64_t width) {
  return fillTemplate(kMlpCopyRows, {{"OFF", str(off)}, {"SRC", src}, {"ROW0", "tile * R"}, {"ROWS", "rows"}, {"WIDTH", str(width)}});
}
std::string layerNote(const MlpLayer& l) { return l.bias ? ", bias" : ""; }

// ---- the dot-product micro-tile ----------------------------------------------------------------

// How the threads of a layer split R × `cols` dot products of length `len` (forward: cols N,
// len K, V-wide weight reads along N; dz·Wᵀ: cols K, len N / V chunks): TM rows × V columns (the
// forward) or TM rows of one column (dz·Wᵀ) per lane, `slices` lanes per dot product.
struct Split {
  int tm = 1, v = 1, slices = 1;
  int64_t cost = 0;
};

// The reduce-scatter of `nv` values over `slices` lanes: shuffles (and adds) it issues.
int shufflesOf(int nv, int slices) {
  int n = 0;
  for (int m = slices / 2, c = nv; m >= 1; m /= 2) {
    n += c > 1 ? c / 2 : 1;
    c = c > 1 ? c / 2 : 1;
  }
  return n;
}

// The estimate of note "the tiling": per-scheduler issue slots against shared wavefronts, plus
// 30 cycles a shuffle level. `forward`: a step reads one V-wide weight vector and TM scalar
// inputs for TM·V FMAs; else one V-wide weight vector and TM V-wide dz vectors for TM·V FMAs.
int64_t splitCost(bool forward, int64_t rowsPerTile, int64_t cols, int64_t len, int tm, int v, int slices) {
  const int64_t items = rowsPerTile / tm * cols, threads = items * slices;
  const int64_t rounds = ceilDiv(threads, kThreads), warps = std::min<int64_t>(kWarps, ceilDiv(threads, 32));
  const int64_t steps = ceilDiv(len, slices);
  const int nv = forward ? tm * v : tm;
  const int64_t shuffles = shufflesOf(nv, slices);
  const int64_t stores = std::max(1, nv / slices);
  const int64_t perThread = steps * (1 + tm + int64_t{tm} * v) + 4 * shuffles + 6 * stores;
  const int64_t issue = rounds * perThread * ceilDiv(warps, 4);
  // Wavefronts a warp's step takes: the weight vector (v), the inputs (forward: TM broadcasts;
  // dz·Wᵀ: TM vectors, one wavefront per 128 bytes of distinct chunks).
  const int64_t inputs = forward ? tm : tm * std::max<int64_t>(1, slices * v / 32);
  const int64_t wavefronts = rounds * warps * (steps * (v + inputs) + shuffles + stores);
  return std::max(issue, wavefronts) + rounds * 30 * log2Of(slices);
}

Split pickSplit(bool forward, int64_t rowsPerTile, int64_t cols, int64_t len, int v) {
  Split best;
  best.cost = INT64_MAX;
  for (int tm = 1; tm <= 8 && tm <= rowsPerTile; tm *= 2) {
    if ((forward ? tm * v : tm) > 16) break;  // registers
    for (int slices = 1; slices <= 32 && slices <= len; slices *= 2) {
      const int64_t cost = splitCost(forward, rowsPerTile, cols, len, tm, v, slices);
      if (cost < best.cost) best = {tm, v, slices, cost};
    }
  }
  return best;
}

// Shared-memory wavefronts of one warp's V-wide read of the word addresses `addr`: the hardware
// serves a vector access in phases of 128 bytes (32 / V lanes), each taking as many wavefronts
// as the most distinct words one bank holds among them.
int wavefrontsOf(const std::array<int64_t, 32>& addr, int v) {
  const int phase = 32 / v;
  int total = 0;
  for (int p0 = 0; p0 < 32; p0 += phase) {
    std::map<int64_t, std::set<int64_t>> bank;
    for (int l = p0; l < p0 + phase; ++l)
      for (int w = 0; w < v; ++w) bank[(addr[static_cast<size_t>(l)] + w) % 32].insert(addr[static_cast<size_t>(l)] + w);
    size_t worst = 1;
    for (const auto& b : bank) worst = std::max(worst, b.second.size());
    total += static_cast<int>(worst);
  }
  return total;
}

// The weight row stride for a split: the smallest ≥ n, a multiple of V, whose first warp read
// (lane = slice · 32/slices + item, as kernels/fused_mlp.cuh lays lanes out) takes the fewest
// wavefronts. `address(item, slice, stride)` is the word a lane reads.
template <class Address>
int64_t weightStride(int64_t n, const Split& sp, int64_t items, Address address) {
  const int lanesPerSlice = 32 / sp.slices;
  int64_t best = roundUp(n, sp.v);
  int bestCost = INT_MAX;
  for (int64_t s = roundUp(n, sp.v); s <= roundUp(n, sp.v) + 32; s += sp.v) {
    std::array<int64_t, 32> addr{};
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t item = lane % lanesPerSlice < items ? lane % lanesPerSlice : 0;
      addr[static_cast<size_t>(lane)] = address(item, lane / lanesPerSlice, s);
    }
    const int cost = wavefrontsOf(addr, sp.v);
    if (cost < bestCost) bestCost = cost, best = s;
  }
  return best;
}

// ---- tiles, layouts ---------------------------------------------------------------------------

int64_t sharedBudget(const EmitOptions& opt) { return (opt.wgmma ? kSharedSm90 : kSharedOther) - 1024; }  // static shared: a flag

// R: the smallest power of two (1 .. kMaxTileRows) that cuts the batch into at most `tiles` tiles.
int64_t tileRowsOf(int64_t rows, int64_t tiles) {
  const int64_t want = ceilDiv(std::max<int64_t>(rows, 1), std::max<int64_t>(tiles, 1));
  int64_t r = 1;
  while (r < want && r < kMaxTileRows) r *= 2;
  return r;
}

struct LayerPlan {
  Split split;           // the dot products (forward, or dz·Wᵀ in the backward)
  int64_t stride = 0;    // of the weight rows in shared memory
  int64_t weights = 0;   // offset of the weights (and then the bias, forward)
  int64_t bias = -1;     // offset of the bias (forward), -1: none
  int64_t floats = 0;    // the layer's weight (and bias) floats in shared memory
};

std::string tilingNote(const Split& sp, int64_t stride, const char* slices) {
  return "TM " + str(sp.tm) + ", V " + str(sp.v) + ", " + slices + " " + str(sp.slices) + ", weight stride " + str(stride);
}

struct ForwardPlan {
  int64_t r = 1, tiles = 0, x = 0, buf[2] = {0, 0}, smemFloats = 0;
  bool resident = true;
  std::vector<LayerPlan> layers;
};

ForwardPlan planForward(const MlpSpec& s, const EmitOptions& opt) {
  int64_t maxWidth = 1;
  for (const MlpLayer& l : s.layers) maxWidth = std::max({maxWidth, l.in, l.out});
  for (int64_t r = tileRowsOf(s.rows, std::max(1, opt.sms / 2));; r /= 2) {
    ForwardPlan p;
    p.r = r;
    p.tiles = ceilDiv(s.rows, r);
    p.x = 0;
    p.buf[0] = pad4(r * s.layers[0].in);
    p.buf[1] = p.buf[0] + pad4(r * maxWidth);
    const int64_t base = p.buf[1] + pad4(r * maxWidth);
    int64_t all = 0, widest = 0;
    for (const MlpLayer& l : s.layers) {
      LayerPlan lp;
      const int v = vecWidth(l.out);
      lp.split = pickSplit(true, r, l.out / v, l.in, v);
      const int64_t ng = l.out / v, items = r / lp.split.tm * ng;
      lp.stride = weightStride(l.out, lp.split, items,
                               [&](int64_t item, int64_t slice, int64_t stride) { return slice * stride + item % ng * v; });
      lp.floats = pad4(l.in * lp.stride) + (l.bias ? pad4(l.out) : 0);
      all += lp.floats;
      widest = std::max(widest, lp.floats);
      p.layers.push_back(lp);
    }
    p.resident = (base + all) * 4 <= sharedBudget(opt);
    int64_t at = base;
    for (size_t i = 0; i < s.layers.size(); ++i) {
      LayerPlan& lp = p.layers[i];
      lp.weights = p.resident ? at : base;
      lp.bias = s.layers[i].bias ? lp.weights + pad4(s.layers[i].in * lp.stride) : -1;
      at += lp.floats;
    }
    p.smemFloats = base + (p.resident ? all : widest);
    if (p.smemFloats * 4 <= sharedBudget(opt) || r == 1) return p;
  }
}

// The backward's partial sums: every layer's dW [K, N] then db [N], each padded to 4 floats.
struct Partials {
  std::vector<int64_t> w, b;
  int64_t floats = 0;
};

Partials partialsOf(const MlpSpec& s) {
  Partials p;
  for (const MlpLayer& l : s.layers) {
    p.w.push_back(p.floats);
    p.floats += pad4(l.in * l.out);
    p.b.push_back(p.floats);
    if (l.bias) p.floats += pad4(l.out);
  }
  return p;
}

struct BackwardPlan {
  int64_t r = 1, tiles = 0, dy = 0, y = 0, dz[2] = {0, 0}, part = -1, smemFloats = 0;
  std::vector<int64_t> bias;  // fused-mlp-train: each layer's bias (after the resident weights), -1: none
  std::vector<int64_t> h;  // each layer's input rows
  bool resident = true;
  std::vector<LayerPlan> layers;
  std::vector<int> tk, vw;  // the dW micro-tile: TK rows × VW columns
};

// `tiles`: the tiles wanted (the grid the reduction allows). `biases` (fused-mlp-train): the
// layers' biases also go in shared memory, after the weights, and R is halved until the weights
// are resident.
BackwardPlan planBackward(const MlpSpec& s, const EmitOptions& opt, int64_t partialFloats, int64_t tiles, bool biases = false) {
  int64_t maxWidth = 1;
  for (const MlpLayer& l : s.layers) maxWidth = std::max({maxWidth, l.in, l.out});
  const int64_t nl = s.layers.back().out;
  for (int64_t r = tileRowsOf(s.rows, tiles);; r /= 2) {
    BackwardPlan p;
    p.r = r;
    p.tiles = ceilDiv(s.rows, r);
    int64_t at = 0;
    for (const MlpLayer& l : s.layers) {
      p.h.push_back(at);
      at += pad4(r * l.in);
    }
    p.dy = at;
    p.y = p.dy + pad4(r * nl);
    p.dz[0] = p.y + pad4(r * nl);
    p.dz[1] = p.dz[0] + pad4(r * maxWidth);
    const int64_t base = p.dz[1] + pad4(r * maxWidth);
    int64_t all = 0, widest = 0;
    for (const MlpLayer& l : s.layers) {
      LayerPlan lp;
      const int v = vecWidth(l.out);
      const int64_t chunks = l.out / v;
      lp.split = pickSplit(false, r, l.in, chunks, v);
      const int64_t items = r / lp.split.tm * l.in;
      lp.stride = weightStride(l.out, lp.split, items,
                               [&](int64_t item, int64_t slice, int64_t stride) { return item % l.in * stride + slice * v; });
      lp.floats = pad4(l.in * lp.stride);
      all += lp.floats;
      widest = std::max(widest, lp.floats);
      p.layers.push_back(lp);
      // dW: TK rows of V columns a thread, TK halved (from 4) while the threads outnumber the items.
      int tk = 4;
      while (tk > 1 && ceilDiv(l.in, tk) * (l.out / v) < int64_t{kThreads}) tk /= 2;
      p.vw.push_back(v);
      p.tk.push_back(tk);
    }
    int64_t biasFloats = 0;
    for (const MlpLayer& l : s.layers) {
      p.bias.push_back(biases && l.bias ? base + all + biasFloats : -1);
      if (biases && l.bias) biasFloats += pad4(l.out);
    }
    // Resident weights (and biases) first, then the partial sums in shared memory, each where it fits.
    const int64_t budget = sharedBudget(opt) / 4;
    p.resident = base + all + biasFloats <= budget;
    const int64_t weights = p.resident ? all + biasFloats : widest;
    if (base + weights + partialFloats <= budget) p.part = base + weights;
    int64_t w = base;
    for (LayerPlan& lp : p.layers) {
      lp.weights = w;
      if (p.resident) w += lp.floats;
    }
    p.smemFloats = base + weights + (p.part >= 0 ? partialFloats : 0);
    if ((p.resident || !biases) && p.smemFloats <= budget) return p;  // fused-mlp-train: resident or nothing
    if (r == 1) return p;
  }
}

// The backward's grid (fused-mlp-grad, fused-mlp-train): with clusters (sm_90a, g = 8) at most
// the SMs and C·P ≤ 2^21, about half the SMs' worth of tiles; without, the last block's reads
// (∝ C) against a block's share of the work (∝ rows / C): C ≈ √(rows / 2), at most the SMs and
// C·P ≤ 2^18.
struct Grid {
  int g = 1;
  int64_t maxBlocks = 0, wantBlocks = 0;
  int64_t blocks(int64_t tiles) const {
    return g > 1 ? std::max<int64_t>(g, std::min(roundUp(tiles, g), maxBlocks)) : std::max<int64_t>(1, std::min(tiles, wantBlocks));
  }
};

Grid backwardGrid(const MlpSpec& s, const EmitOptions& opt, int64_t partialFloats) {
  Grid r;
  r.g = opt.wgmma ? kClusterSize : 1;
  const int64_t sms = std::max(1, opt.sms);
  if (r.g > 1) {
    r.maxBlocks = std::max<int64_t>(r.g, std::min(sms / r.g * r.g, kReduceFloatsClustered / partialFloats / r.g * r.g));
    r.wantBlocks = std::min(sms / 2, r.maxBlocks);
  } else {
    r.maxBlocks = std::max<int64_t>(1, std::min(sms, kReduceFloats / partialFloats));
    r.wantBlocks = std::min(r.maxBlocks, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(s.rows) / 2))));
  }
  return r;
}

// kMlpReduction for `blocks` blocks' partial sums (in shared memory or the scratch), every
// layer's dW and db segment summed into its output (`outOf(output, input)` names what takes a
// gradient output's final values, `input` being its parameter's node input); `afterWait` runs
// once the members' shared memory is complete. Scratch: the blocks' partial sums (where not in
// shared memory), the cluster slots (C of them: as many as there are clusters where every block
// is its own), then the counters; scratchFloats in all.
struct Reduction {
  std::string code;
  int64_t scratchFloats = 0;
};

Reduction reductionOf(const MlpSpec& s, const Partials& parts, bool sharedParts, int64_t blocks, const std::string& afterWait,
                      const std::function<std::string(int, int)>& outOf) {
  std::string level1, level2;
  auto segment = [&](int64_t off, int64_t count, int output, int input) {
    level1 += fillTemplate(kMlpSumMembers, {{"SHARED", sharedParts ? "true" : "false"}, {"OFF", ll(off)}, {"COUNT", str(count)},
                                            {"OUT", outOf(output, input)}});
    level2 += fillTemplate(kMlpSumSlots, {{"OFF", ll(off)}, {"COUNT", str(count)}, {"OUT", outOf(output, input)}});
  };
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const MlpLayer& l = s.layers[i];
    segment(parts.w[i], l.in * l.out, l.weightGradOutput, l.weightInput);
    if (l.bias) segment(parts.b[i], l.out, l.biasGradOutput, l.biasInput);
  }
  const int64_t memberFloats = sharedParts ? 0 : blocks * parts.floats;
  const int64_t slotFloats = blocks > 1 ? blocks * parts.floats : 0;
  Reduction r;
  r.code = fillTemplate(kMlpReduction, {{"FENCE", sharedParts ? "" : "  __threadfence();\n"},
                                        {"MEMBER", sharedParts ? "pa::mlp::memberShared(part, m)" : "scratch + (cluster * G + m) * P"},
                                        {"SLOTS", ll(memberFloats)}, {"COUNTERS", ll(memberFloats + slotFloats)},
                                        {"LEVEL1", level1}, {"LEVEL2", level2}, {"AFTERWAIT", afterWait}});
  r.scratchFloats = memberFloats + slotFloats + kClusterSize;
  return r;
}

// The backward's layers from the last down, one kMlpBackwardLayer each: `before(i)` opens layer
// i (its copies, waits, barrier); dz·Wᵀ makes the lower layer's dz, and at the first layer dx
// into out0 where the node computes it.
std::string backwardLayers(const MlpSpec& s, const BackwardPlan& p, const Partials& parts,
                           const std::function<std::string(int)>& before) {
  std::string body;
  for (int i = static_cast<int>(s.layers.size()) - 1; i >= 0; --i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const LayerPlan& lp = p.layers[static_cast<size_t>(i)];
    std::string dx;
    if (i > 0 || s.inputGrad)
      dx = fillTemplate(kMlpInputGrad, {{"K", str(l.in)}, {"N", str(l.out)}, {"S", str(lp.stride)}, {"TM", str(lp.split.tm)},
                                        {"V", str(lp.split.v)}, {"NS", str(lp.split.slices)},
                                        {"LOWER", i > 0 ? activationCode(s.layers[static_cast<size_t>(i - 1)].act) : "-1"},
                                        {"DZ", str(p.dz[i % 2])}, {"WOFF", str(lp.weights)}, {"H", str(p.h[static_cast<size_t>(i)])},
                                        {"NEXT", i > 0 ? "sm + " + str(p.dz[(i + 1) % 2]) : "(float*)nullptr"},
                                        {"DX", i > 0 ? "(float*)nullptr" : "out0"}});
    body += fillTemplate(kMlpBackwardLayer,
                         {{"LAYER", str(i + 1)}, {"K", str(l.in)}, {"N", str(l.out)}, {"ACTNAME", mlpActivationName(l.act)},
                          {"BIASNOTE", layerNote(l)},
                          {"TILING", "dW TK " + str(p.tk[static_cast<size_t>(i)]) + " × V " + str(p.vw[static_cast<size_t>(i)]) +
                                         (dx.empty() ? "" : "; dz·Wᵀ " + tilingNote(lp.split, lp.stride, "NS"))},
                          {"BEFORE", before(i)},
                          {"TK", str(p.tk[static_cast<size_t>(i)])}, {"VW", str(p.vw[static_cast<size_t>(i)])},
                          {"HASBIAS", l.bias ? "true" : "false"}, {"H", str(p.h[static_cast<size_t>(i)])}, {"DZ", str(p.dz[i % 2])},
                          {"WOFF", ll(parts.w[static_cast<size_t>(i)])}, {"BOFF", ll(parts.b[static_cast<size_t>(i)])}, {"DXSTEP", dx}});
  }
  return body;
}

// fused-mlp-grad's and fused-mlp-train's kernel (kMlpBackward): the plan's and the grid's
// placeholders, and `vars`, the node's own (PROLOGUE, TOP, LAYERS, SEED, LOSSDECL, LOSS, REDUCTION).
Kernel backwardKernel(const Ctx& c, const MlpSpec& s, const BackwardPlan& p, int64_t partialFloats, int g, int64_t blocks,
                      TemplateVars vars, bool adam = false) {
  vars.insert({{"T", str(kThreads)}, {"R", str(p.r)}, {"G", str(g)}, {"C", str(blocks)},
               {"CLUSTER", g > 1 ? "PA_MLP_CLUSTER_DIMS(" + str(g) + ") " : ""}, {"P", ll(partialFloats)},
               {"PART", p.part >= 0 ? "sm + " + str(p.part) : "scratch + (long long)blockIdx.x * P"}, {"TILES", ll(p.tiles)},
               {"ROWS", ll(s.rows)}});
  std::vector<KernelArg> args = allArgs(c.n);
  args.push_back({KernelArg::Scratch, 0});
  if (adam) args.push_back({KernelArg::AdamBinding, 0});
  return finish(c, "", kMlpBackward, std::move(vars), {static_cast<unsigned>(blocks), 1, 1}, kThreads, args, {"kernels/fused_mlp.cuh"},
                static_cast<unsigned>(p.smemFloats * 4));
}

}  // namespace

NodeKernels emitFusedMlp(const Ctx& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const ForwardPlan p = planForward(s, *c.opt);
  const int layers = static_cast<int>(s.layers.size());
  std::string prologue, body;
  const std::string xCopy = tileRowsCopy(p.x, "in0", s.layers[0].in);
  auto weightCopies = [&](int i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const LayerPlan& lp = p.layers[static_cast<size_t>(i)];
    std::string copies = fillTemplate(kMlpCopyWeights, {{"K", str(l.in)}, {"N", str(l.out)}, {"S", str(lp.stride)},
                                                        {"OFF", str(lp.weights)}, {"W", "in" + str(l.weightInput)}});
    if (l.bias) copies += fillTemplate(kMlpCopyBias, {{"OFF", str(lp.bias)}, {"B", "in" + str(l.biasInput)}, {"N", str(l.out)}});
    return copies;
  };
  const std::string prefetch = fillTemplate(kMlpPrefetchRows, {{"OFF", str(p.x)}, {"SRC", "in0"}, {"WIDTH", str(s.layers[0].in)}});
  if (p.resident) {
    // Group 0: the first tile's rows and layer 1; group i: layer i + 1.
    prologue = xCopy;
    for (int i = 0; i < layers; ++i) prologue += weightCopies(i) + kMlpCommit;
  }
  for (int i = 0; i < layers; ++i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const LayerPlan& lp = p.layers[static_cast<size_t>(i)];
    std::string before, after;
    if (p.resident) {
      // Groups after layer i + 1's: the later layers', and from layer 3 on the next tile's rows
      // (committed at layer 2); a later tile waits for its rows (the newest group) at layer 1.
      if (i == 0) before = fillTemplate(kMlpWaitTile, {{"COUNT", str(layers - 1)}});
      else before = fillTemplate(kMlpWait, {{"COUNT", str(layers - i - 1 + (i >= 2 ? 1 : 0))}});
      before += kMlpBarrier;
      if (i == 1) before += prefetch;  // every thread is past layer 1, the only reader of the rows
      if (layers == 1) after = std::string(kMlpBarrier) + prefetch;
    } else {
      before = kMlpBarrier;  // the previous layer is done with the weights
      if (i == 0) before += xCopy;
      before += weightCopies(i) + kMlpCommit + fillTemplate(kMlpWait, {{"COUNT", "0"}}) + kMlpBarrier;
    }
    const bool last = i + 1 == layers;
    const int64_t in = i == 0 ? p.x : p.buf[(i - 1) % 2], out = p.buf[i % 2];
    body += fillTemplate(kMlpForwardLayer,
                         {{"LAYER", str(i + 1)}, {"K", str(l.in)}, {"N", str(l.out)}, {"S", str(lp.stride)},
                          {"ACTNAME", mlpActivationName(l.act)}, {"BIASNOTE", layerNote(l)},
                          {"TILING", tilingNote(lp.split, lp.stride, "KS")}, {"BEFORE", before}, {"AFTER", after},
                          {"TM", str(lp.split.tm)}, {"V", str(lp.split.v)}, {"KS", str(lp.split.slices)},
                          {"ACT", activationCode(l.act)}, {"HASBIAS", l.bias ? "true" : "false"}, {"KEEP", last ? "false" : "true"},
                          {"IN", str(in)}, {"WOFF", str(lp.weights)},
                          {"BIAS", l.bias ? "sm + " + str(lp.bias) : "(const float*)nullptr"},
                          {"KEEPTO", last ? "(float*)nullptr" : "sm + " + str(out)}, {"OUT", last ? "out0" : "out" + str(i + 1)}});
  }
  const int64_t perSm = p.smemFloats * 4 <= sharedBudget(*c.opt) / 2 ? 2 : 1;
  const int64_t grid = std::max<int64_t>(1, std::min(p.tiles, perSm * std::max(1, c.opt->sms)));
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kMlpForward,
                              {{"T", str(kThreads)}, {"R", str(p.r)}, {"TILES", ll(p.tiles)}, {"ROWS", ll(s.rows)},
                               {"PROLOGUE", prologue}, {"LOOP", p.resident ? kMlpLoopResident : kMlpLoopStreamed}, {"LAYERS", body}},
                              {static_cast<unsigned>(grid), 1, 1}, kThreads, allArgs(c.n), {"kernels/fused_mlp.cuh"},
                              static_cast<unsigned>(p.smemFloats * 4)));
  return nk;
}

NodeKernels emitFusedMlpGrad(const Ctx& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const int layers = static_cast<int>(s.layers.size());
  const Partials parts = partialsOf(s);
  const int64_t pf = parts.floats;
  const Grid grid = backwardGrid(s, *c.opt, pf);
  const int g = grid.g;
  const BackwardPlan p = planBackward(s, *c.opt, pf, grid.wantBlocks);
  const int64_t blocks = grid.blocks(p.tiles);
  const bool sharedParts = p.part >= 0;

  // The tile's inputs: every layer's input rows, dy and y.
  std::string inputs;
  for (int i = 0; i < layers; ++i)
    inputs += tileRowsCopy(p.h[static_cast<size_t>(i)], "in" + str(1 + i), s.layers[static_cast<size_t>(i)].in);
  const std::string nl = str(s.layers.back().out);
  inputs += tileRowsCopy(p.dy, "in0", s.layers.back().out);
  inputs += tileRowsCopy(p.y, "in" + str(layers + 1), s.layers.back().out);
  auto weightCopy = [&](int i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const LayerPlan& lp = p.layers[static_cast<size_t>(i)];
    if (i == 0 && !s.inputGrad) return std::string();  // read only for dx
    return fillTemplate(kMlpCopyWeights, {{"K", str(l.in)}, {"N", str(l.out)}, {"S", str(lp.stride)}, {"OFF", str(lp.weights)},
                                          {"W", "in" + str(layers + 2 + i)}});
  };
  std::string prologue, top;
  if (p.resident) {
    // Group 0: the first tile's inputs and the last layer's weights; then one group per layer down.
    prologue = inputs + weightCopy(layers - 1) + kMlpCommit;
    for (int i = layers - 2; i >= 0; --i) prologue += weightCopy(i) + kMlpCommit;
    top = fillTemplate(kMlpLaterTileCopies, {{"COPIES", inputs}}) + fillTemplate(kMlpWaitTile, {{"COUNT", str(layers - 1)}});
  } else {
    top = std::string(kMlpBarrier) + inputs + weightCopy(layers - 1) + kMlpCommit + fillTemplate(kMlpWait, {{"COUNT", "0"}});
  }
  top += kMlpBarrier;
  top += fillTemplate(kMlpOutputGrad, {{"ACT", activationCode(s.layers.back().act)}, {"DY", str(p.dy)}, {"Y", str(p.y)},
                                       {"DZ", str(p.dz[(layers - 1) % 2])}, {"N", nl}});

  const std::string body = backwardLayers(s, p, parts, [&](int i) {
    std::string before;
    if (p.resident) {
      // Groups after layer i + 1's weights: the lower layers' (i of them).
      if (i < layers - 1) before = fillTemplate(kMlpWait, {{"COUNT", str(i)}});
    } else if (i < layers - 1) {
      before = std::string(kMlpBarrier) + weightCopy(i) + kMlpCommit + fillTemplate(kMlpWait, {{"COUNT", "0"}});
    }
    return before + kMlpBarrier;
  });
  const Reduction red = reductionOf(s, parts, sharedParts, blocks, "", [](int output, int) { return "out" + str(output); });
  NodeKernels nk;
  nk.kernels.push_back(backwardKernel(c, s, p, pf, g, blocks,
                                      {{"PROLOGUE", prologue}, {"TOP", top}, {"LAYERS", body}, {"SEED", ""}, {"LOSSDECL", ""},
                                       {"LOSS", ""}, {"REDUCTION", red.code}}));
  nk.scratchBytes = static_cast<size_t>(red.scratchFloats) * sizeof(float);
  nk.zeroScratch = true;  // the counters start at 0; the kernel returns them there
  return nk;
}

// fused-mlp-train: the backward's plan (tiles, grid, clusters, the partial sums' reduction) with
// every layer's weights and biases resident, a tile's forward run in front of its backward. Each
// layer's weights are kept once, in the backward's stride (a multiple of the forward's V), which
// the forward reads them at. The hidden outputs stay in shared memory (the backward's layer
// inputs); y is also stored (the node's output 1), the targets take dy's buffer.
NodeKernels emitFusedMlpTrain(const Ctx& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const int layers = static_cast<int>(s.layers.size());
  const Partials parts = partialsOf(s);
  const int64_t pf = parts.floats;
  Grid grid = backwardGrid(s, *c.opt, pf);
  const int g = grid.g;
  // One cluster where its blocks take the batch in tiles of at most kMaxTileRows: its partial sums
  // and losses are then added from the members' shared memory, with no second level through the
  // scratch (bench/RESULTS.md, "one kernel for the small MLPs' step").
  if (g > 1 && s.rows <= g * kMaxTileRows) grid.wantBlocks = g;
  const BackwardPlan p = planBackward(s, *c.opt, pf, grid.wantBlocks, true);
  if (!p.resident)  // shape inference bounds the weights (common/mlp_limits.h)
    throw std::logic_error("fused-mlp-train '" + c.n.name + "': the weights do not fit in shared memory");
  const int64_t blocks = grid.blocks(p.tiles);
  const bool sharedParts = p.part >= 0;
  const int64_t nl = s.layers.back().out, count = s.rows * nl;

  std::string prologue;
  for (int i = 0; i < layers; ++i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const LayerPlan& lp = p.layers[static_cast<size_t>(i)];
    prologue += fillTemplate(kMlpCopyWeights, {{"K", str(l.in)}, {"N", str(l.out)}, {"S", str(lp.stride)}, {"OFF", str(lp.weights)},
                                               {"W", "in" + str(l.weightInput)}});
    if (l.bias)
      prologue += fillTemplate(kMlpCopyBias, {{"OFF", str(p.bias[static_cast<size_t>(i)])}, {"B", "in" + str(l.biasInput)}, {"N", str(l.out)}});
  }
  prologue += kMlpCommit;
  const std::string copies = tileRowsCopy(p.h[0], "in0", s.layers[0].in) + tileRowsCopy(p.dy, "in1", nl);
  const std::string top = fillTemplate(kMlpTrainTop, {{"COPIES", copies}});

  std::string forward;
  for (int i = 0; i < layers; ++i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    const LayerPlan& lp = p.layers[static_cast<size_t>(i)];
    const int v = vecWidth(l.out);
    const Split sp = pickSplit(true, p.r, l.out / v, l.in, v);
    const bool last = i + 1 == layers;
    forward += fillTemplate(kMlpTrainForwardLayer,
                            {{"LAYER", str(i + 1)}, {"K", str(l.in)}, {"N", str(l.out)}, {"S", str(lp.stride)},
                             {"ACTNAME", mlpActivationName(l.act)}, {"BIASNOTE", layerNote(l)}, {"TILING", tilingNote(sp, lp.stride, "KS")},
                             {"TM", str(sp.tm)}, {"V", str(sp.v)}, {"KS", str(sp.slices)}, {"ACT", activationCode(l.act)},
                             {"HASBIAS", l.bias ? "true" : "false"}, {"IN", str(p.h[static_cast<size_t>(i)])}, {"WOFF", str(lp.weights)},
                             {"BIAS", l.bias ? "sm + " + str(p.bias[static_cast<size_t>(i)]) : "(const float*)nullptr"},
                             {"KEEPTO", str(last ? p.y : p.h[static_cast<size_t>(i + 1)])}, {"OUT", last ? "out1" : "pa::mlp::Discard{}"}});
  }
  const std::string output =
      fillTemplate(kMlpTrainOutputGrad, {{"ACT", activationCode(s.layers.back().act)}, {"Y", str(p.y)}, {"TGT", str(p.dy)},
                                         {"DZ", str(p.dz[(layers - 1) % 2])}, {"N", str(nl)},
                                         {"SCALE", num(count ? 2.0 / static_cast<double>(count) : 0.0)}});

  const std::string body = backwardLayers(s, p, parts, [](int) { return std::string(kMlpBarrier); });

  const std::string denom = std::to_string(std::max<int64_t>(count, 1)) + ".0";
  // With the session's Adam: each parameter's final gradient values update it (kernels/fused_mlp.cuh
  // AdamOut) and the loss is copied into the session's ring, so that the step needs no Adam kernel.
  const bool adam = c.opt->adamInTrainNode;
  const std::string ring = adam ? kMlpTrainRing : "";
  const Reduction red = reductionOf(s, parts, sharedParts, blocks, fillTemplate(kMlpTrainClusterLoss, {{"DENOM", denom}, {"RING", ring}}),
                                    [&](int output, int input) {
                                      const std::string out = "out" + str(output);
                                      return adam ? "pa::mlp::adamOut(" + out + ", adam, " + str(input) + ", hyper)" : out;
                                    });
  // Scratch: the reduction's, then the loss's counter and, 8-byte aligned, the blocks' sums of squares.
  const int64_t lossCounter = red.scratchFloats, lossSums = roundUp(lossCounter + 1, 2);
  const std::string loss =
      fillTemplate(kMlpTrainLoss, {{"LOSSSUMS", ll(lossSums)}, {"LOSSCOUNTER", ll(lossCounter)}, {"DENOM", denom}, {"RING", ring}});
  NodeKernels nk;
  nk.kernels.push_back(backwardKernel(c, s, p, pf, g, blocks,
                                      {{"PROLOGUE", prologue}, {"TOP", top + forward + output}, {"LAYERS", body},
                                       {"SEED", std::string(kMlpTrainSeed) + (adam ? kMlpTrainAdamDecl : "")},
                                       {"LOSSDECL", kMlpTrainLossDecl}, {"LOSS", loss}, {"REDUCTION", red.code}},
                                      adam));
  nk.scratchBytes = static_cast<size_t>(lossSums + 2 * blocks) * sizeof(float);
  nk.zeroScratch = true;  // the counters start at 0; the kernel returns them there
  return nk;
}

}  // namespace pa::codegen::detail
