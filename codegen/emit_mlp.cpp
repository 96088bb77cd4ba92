// Emitters of the fused MLP: FusedMlp (one forward kernel) and FusedMlpGrad (one backward kernel
// with the weight and bias gradients' reduction inside), from codegen/templates/mlp.h over
// kernels/fused_mlp.cuh. Every width is a compile-time constant of the source.
//
// Note on the tiling. A block of kThreads threads takes tiles of R rows: R = 32 when the batch
// has at least one tile per SM, else 16, so that small batches (mlp_tiny's 256 rows, sine_mlp's
// 64) still spread over several SMs. Output columns are dealt to threads with TM = 4 rows each
// (each weight read from shared memory serves four FMAs); dW rows with TK = 4 each. The forward
// grid is one block per tile (block-strided beyond 65535). The backward grid is C blocks, each
// owning a slot of P floats (every layer's dW and db) in the node's scratch: C is the tile count,
// at most one block per SM and at most kReduceFloats / P, because the last block reads all C·P
// partial sums alone. Everything is fp32 FFMA (precision tf32 too: no tensor cores), summed in a
// fixed order, so results are bit-identical run to run for a given C (kernels/fused_mlp.cuh).
#include <algorithm>

#include "codegen/emit_internal.h"
#include "codegen/templates/mlp.h"
#include "common/mlp_limits.h"
#include "graph/node_attrs.h"

namespace pa::codegen::detail {

using namespace templates;

namespace {

constexpr int kMlpRowsPerThread = 4;  // TM
constexpr int kMlpKPerThread = 4;     // TK
// The most partial-sum floats the backward's last block adds (1 MiB).
constexpr int64_t kReduceFloats = int64_t{1} << 18;

// The padded shared-memory row of a weight [K, N]: odd, so that threads walking k hit distinct banks.
int64_t strideOf(int64_t n) { return n % 2 == 0 ? n + 1 : n; }

const char* activationCode(MlpActivation a) {
  switch (a) {
  case MlpActivation::None: return "pa::mlp::kNone";
  case MlpActivation::Relu: return "pa::mlp::kRelu";
  case MlpActivation::Tanh: return "pa::mlp::kTanh";
  case MlpActivation::Sigmoid: return "pa::mlp::kSigmoid";
  }
  return "pa::mlp::kNone";
}

struct Tiling {
  int64_t rowsPerTile = 32, tiles = 0, maxWidth = 1, weightFloats = 1;
};

Tiling tilingOf(const MlpSpec& s, const EmitOptions& opt) {
  Tiling t;
  const int64_t sms = std::max(1, opt.sms);
  t.rowsPerTile = (s.rows + 31) / 32 >= sms ? 32 : 16;
  t.tiles = (s.rows + t.rowsPerTile - 1) / t.rowsPerTile;
  for (const MlpLayer& l : s.layers) {
    t.maxWidth = std::max({t.maxWidth, l.in, l.out});
    t.weightFloats = std::max(t.weightFloats, l.in * strideOf(l.out));
  }
  return t;
}

std::string layerNote(const MlpLayer& l) { return l.bias ? ", bias" : ""; }

}  // namespace

NodeKernels emitFusedMlp(const Ctx& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const Tiling t = tilingOf(s, *c.opt);
  std::string layers;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const MlpLayer& l = s.layers[i];
    const std::string out = i + 1 == s.layers.size() ? "out0" : "out" + std::to_string(i + 1);
    layers += fillTemplate(kMlpForwardLayer,
                           {{"LAYER", std::to_string(i + 1)}, {"K", std::to_string(l.in)}, {"N", std::to_string(l.out)},
                            {"S", std::to_string(strideOf(l.out))}, {"ACTNAME", mlpActivationName(l.act)}, {"BIASNOTE", layerNote(l)},
                            {"W", "in" + std::to_string(l.weightInput)}, {"ACT", activationCode(l.act)},
                            {"HASBIAS", l.bias ? "true" : "false"},
                            {"BIAS", l.bias ? "in" + std::to_string(l.biasInput) : "(const float*)nullptr"}, {"OUT", out}});
  }
  const int64_t smemFloats = t.weightFloats + 2 * t.rowsPerTile * t.maxWidth;
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(t.tiles, 65535));
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kMlpForward,
                              {{"T", std::to_string(kThreads)}, {"R", std::to_string(t.rowsPerTile)},
                               {"TM", std::to_string(kMlpRowsPerThread)}, {"TILES", ll(t.tiles)}, {"WFLOATS", ll(t.weightFloats)},
                               {"MAXW", std::to_string(t.maxWidth)}, {"ROWS", ll(s.rows)}, {"K0", std::to_string(s.layers[0].in)},
                               {"LAYERS", layers}},
                              {static_cast<unsigned>(grid), 1, 1}, kThreads, allArgs(c.n), {"kernels/fused_mlp.cuh"},
                              static_cast<unsigned>(smemFloats * 4)));
  return nk;
}

NodeKernels emitFusedMlpGrad(const Ctx& c) {
  const MlpSpec s = mlpSpecOf(c.g, c.n);
  const Tiling t = tilingOf(s, *c.opt);
  const int layers = static_cast<int>(s.layers.size());
  // The workspace slot: every layer's dW [K, N] then db [N], in layer order.
  std::vector<int64_t> wOff(static_cast<size_t>(layers)), bOff(static_cast<size_t>(layers));
  int64_t p = 0;
  for (int i = 0; i < layers; ++i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    wOff[static_cast<size_t>(i)] = p;
    p += l.in * l.out;
    bOff[static_cast<size_t>(i)] = p;
    if (l.bias) p += l.out;
  }
  const int64_t blocks =
      std::max<int64_t>(1, std::min({t.tiles, static_cast<int64_t>(std::max(1, c.opt->sms)), std::max<int64_t>(1, kReduceFloats / p)}));
  std::string body, final;
  for (int i = layers - 1; i >= 0; --i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    std::string dx;
    if (i > 0 || s.inputGrad)
      dx = fillTemplate(kMlpInputGrad, {{"K", std::to_string(l.in)}, {"N", std::to_string(l.out)}, {"S", std::to_string(strideOf(l.out))},
                                        {"LOWER", i > 0 ? activationCode(s.layers[static_cast<size_t>(i - 1)].act) : "-1"},
                                        {"DX", i > 0 ? "next" : "out0"}});
    body += fillTemplate(kMlpBackwardLayer,
                         {{"LAYER", std::to_string(i + 1)}, {"K", std::to_string(l.in)}, {"N", std::to_string(l.out)},
                          {"S", std::to_string(strideOf(l.out))}, {"ACTNAME", mlpActivationName(l.act)}, {"BIASNOTE", layerNote(l)},
                          {"H", "in" + std::to_string(1 + i)}, {"W", "in" + std::to_string(layers + 2 + i)},
                          {"HASBIAS", l.bias ? "true" : "false"}, {"WOFF", ll(wOff[static_cast<size_t>(i)])},
                          {"BOFF", ll(bOff[static_cast<size_t>(i)])}, {"DXSTEP", dx}});
  }
  for (int i = 0; i < layers; ++i) {
    const MlpLayer& l = s.layers[static_cast<size_t>(i)];
    final += fillTemplate(kMlpFinalSum, {{"COUNT", ll(l.in * l.out)}, {"OUT", "out" + std::to_string(l.weightGradOutput)},
                                         {"C", std::to_string(blocks)}, {"P", ll(p)}, {"OFF", ll(wOff[static_cast<size_t>(i)])}});
    if (l.bias)
      final += fillTemplate(kMlpFinalSum, {{"COUNT", ll(l.out)}, {"OUT", "out" + std::to_string(l.biasGradOutput)},
                                           {"C", std::to_string(blocks)}, {"P", ll(p)}, {"OFF", ll(bOff[static_cast<size_t>(i)])}});
  }
  std::vector<KernelArg> args = allArgs(c.n);
  args.push_back({KernelArg::Scratch, 0});
  const int64_t smemFloats = t.weightFloats + 3 * t.rowsPerTile * t.maxWidth;
  NodeKernels nk;
  nk.kernels.push_back(finish(c, "", kMlpBackward,
                              {{"T", std::to_string(kThreads)}, {"R", std::to_string(t.rowsPerTile)},
                               {"TM", std::to_string(kMlpRowsPerThread)}, {"TK", std::to_string(kMlpKPerThread)},
                               {"WFLOATS", ll(t.weightFloats)}, {"MAXW", std::to_string(t.maxWidth)}, {"P", ll(p)},
                               {"TILES", ll(t.tiles)}, {"ROWS", ll(s.rows)}, {"LASTACT", activationCode(s.layers.back().act)},
                               {"Y", "in" + std::to_string(layers + 1)}, {"NL", std::to_string(s.layers.back().out)},
                               {"LAYERS", body}, {"C", std::to_string(blocks)}, {"FINAL", final}},
                              {static_cast<unsigned>(blocks), 1, 1}, kThreads, args, {"kernels/fused_mlp.cuh"},
                              static_cast<unsigned>(smemFloats * 4)));
  // The slots, then the last-block counter (unsigned; zeroScratch has the runner zero it at allocation).
  nk.scratchBytes = static_cast<size_t>(blocks * p + 4) * sizeof(float);
  nk.zeroScratch = true;  // the last-block counter starts at 0; the kernel returns it there
  return nk;
}

}  // namespace pa::codegen::detail
