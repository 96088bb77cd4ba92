// The op cases shared by the CPU finite-difference checks and the GPU comparisons: every
// differentiable op on awkward shapes (broadcasting, transposes, batched matmuls, masks with
// q_len != kv_len and fully masked rows, GQA, sink logits).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ostream>

#include "graph/graph.h"
#include "passes/autodiff.h"
#include "passes/fusion.h"
#include "tests/test_util.h"

namespace pa::test {

struct OpCase {
  std::string name;
  OpKind op;  // the op under test (the case's graph contains it)
  std::function<ValueId(Graph&)> build;
  std::map<std::string, std::pair<double, double>> ranges = {};
};
// GoogleTest prints a parameter in --gtest_list_tests, which ctest's test names carry: the case's
// name, not its bytes (which hold addresses and change from run to run).
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

using V = std::vector<int64_t>;

inline ValueId P(Graph& g, const std::string& n, Shape s) { return g.addParam(n, s, "xavier"); }

inline OpCase matmulCase(const std::string& name, Shape a, Shape b, bool ta, bool tb) {
  return {name, OpKind::MatMul, [=](Graph& g) {
            return g.add(OpKind::MatMul, {P(g, "a", a), P(g, "b", b)}, AttrMap().set<attr::TransposeA>(ta).set<attr::TransposeB>(tb));
          }};
}

inline OpCase binaryCase(const std::string& name, OpKind op, Shape a, Shape b) {
  std::map<std::string, std::pair<double, double>> r;
  if (op == OpKind::Div) r["b"] = {0.5, 1.5};  // keep the denominator away from zero
  return {name, op, [=](Graph& g) { return g.add(op, {P(g, "a", a), P(g, "b", b)}); }, r};
}

inline OpCase unaryCase(const std::string& name, OpKind op) {
  return {name, op, [=](Graph& g) { return g.add(op, {P(g, "x", {2, 3, 4})}); }};
}

// softmax(mask(x)) over [2, q, k]: the mask alone would put -inf into the loss.
inline OpCase maskCase(const std::string& name, int64_t q, int64_t k, AttrMap mask) {
  return {name, OpKind::AttentionMask, [=](Graph& g) {
            ValueId m = g.add(OpKind::AttentionMask, {P(g, "x", {2, q, k})}, mask);
            return g.add(OpKind::Softmax, {m}, AttrMap().set<attr::Axis>(-1));
          }};
}

inline std::vector<OpCase> allCases() {
  std::vector<OpCase> c;
  c.push_back(matmulCase("MatMul_plain", {3, 4}, {4, 5}, false, false));
  c.push_back(matmulCase("MatMul_transA", {4, 3}, {4, 5}, true, false));
  c.push_back(matmulCase("MatMul_transB", {3, 4}, {5, 4}, false, true));
  c.push_back(matmulCase("MatMul_transAB", {4, 3}, {5, 4}, true, true));
  c.push_back(matmulCase("MatMul_batched", {2, 3, 4}, {2, 4, 5}, false, false));
  c.push_back(matmulCase("MatMul_batchedTransB", {2, 2, 3, 4}, {2, 2, 5, 4}, false, true));
  c.push_back(matmulCase("MatMul_batchedA_sharedB", {2, 3, 4}, {4, 5}, false, false));
  c.push_back(matmulCase("MatMul_batchedA_sharedBT", {2, 3, 4}, {5, 4}, false, true));
  c.push_back(matmulCase("MatMul_batchedAT_sharedB", {2, 4, 3}, {4, 5}, true, false));
  c.push_back(matmulCase("MatMul_sharedA_batchedB", {3, 4}, {2, 4, 5}, false, false));
  c.push_back(matmulCase("MatMul_K1", {3, 1}, {1, 5}, false, false));
  for (auto op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div}) {
    const std::string n = opName(op);
    c.push_back(binaryCase(n + "_same", op, {2, 3, 4}, {2, 3, 4}));
    c.push_back(binaryCase(n + "_rowVector", op, {2, 3, 4}, {4}));
    c.push_back(binaryCase(n + "_bothBroadcast", op, {2, 1, 4}, {3, 1}));
    c.push_back(binaryCase(n + "_scalarLeft", op, {}, {2, 3}));
  }
  // To f32: the identity on fp32 values, so finite differences see its rule (a cast back); a
  // cast to bf16 rounds, which the bf16 GPU tests and lower-bf16's tests cover.
  c.push_back({"Cast", OpKind::Cast, [](Graph& g) { return g.add(OpKind::Cast, {P(g, "x", {2, 3})}, AttrMap().set<attr::DType>("f32")); }});
  c.push_back({"Scale", OpKind::Scale, [](Graph& g) { return g.add(OpKind::Scale, {P(g, "x", {2, 3})}, AttrMap().set<attr::ScaleFactor>(0.7)); }});
  c.push_back(unaryCase("Relu", OpKind::Relu));
  c.push_back(unaryCase("Gelu", OpKind::Gelu));
  c.push_back(unaryCase("Tanh", OpKind::Tanh));
  c.push_back(unaryCase("Sigmoid", OpKind::Sigmoid));
  c.push_back(unaryCase("Exp", OpKind::Exp));
  c.push_back(unaryCase("Silu", OpKind::Silu));
  c.push_back(unaryCase("GeluTanh", OpKind::GeluTanh));
  // Norms over the last axis: odd widths and a single feature (the GPU kernels move them one
  // feature at a time), 12 (chunks of 4 features) and 64 (chunks of 8 in bf16, 4 in fp32); fused
  // with a residual, the loss reads both the normalised output and the sum, so both gradients
  // flow into the node.
  for (int64_t f : {int64_t{5}, int64_t{1}, int64_t{33}, int64_t{12}, int64_t{64}}) {
    for (bool fused : {false, true}) {
      const std::string tail = "_f" + std::to_string(f) + (fused ? "_residual" : "");
      c.push_back({"LayerNorm" + tail, OpKind::LayerNorm, [=](Graph& g) {
                     std::vector<ValueId> ins{P(g, "x", {2, 3, f}), P(g, "gain", {f}), P(g, "bias", {f})};
                     if (fused) ins.push_back(P(g, "r", {2, 3, f}));
                     const ValueId y = g.add(OpKind::LayerNorm, ins, AttrMap().set<attr::Eps>(1e-3));
                     if (!fused) return y;
                     const Node& n = g.producer(y);
                     return g.add(OpKind::Add, {y, g.add(OpKind::Scale, {n.outputs[3]}, AttrMap().set<attr::ScaleFactor>(0.5))});
                   }});
      c.push_back({"RmsNorm" + tail, OpKind::RmsNorm, [=](Graph& g) {
                     std::vector<ValueId> ins{P(g, "x", {2, 3, f}), P(g, "gain", {f})};
                     if (fused) ins.push_back(P(g, "r", {2, 3, f}));
                     const ValueId y = g.add(OpKind::RmsNorm, ins, AttrMap().set<attr::Eps>(1e-3));
                     if (!fused) return y;
                     const Node& n = g.producer(y);
                     return g.add(OpKind::Add, {y, g.add(OpKind::Scale, {n.outputs[2]}, AttrMap().set<attr::ScaleFactor>(0.5))});
                   }});
    }
  }
  // The GPU kernels' other row layouts (kernels/norm.cuh): 512 features (a warp per row, chunks
  // of 8 in bf16, 4 in fp32), 513 (two warps per row, one feature at a time), 700 and 1000 (two
  // warps per row, four rows per block, the last chunks on some lanes only), 4104 (a block of 288
  // threads per row, likewise), and many rows (a warp per row, the last block partial), so the
  // gradients' per-block partial sums of d gain and d bias have several blocks to add.
  struct NormCase {
    const char* name;
    Shape x;
    bool residual;
  };
  for (const NormCase& n : {NormCase{"f512", {3, 512}, false}, NormCase{"f512_residual", {3, 512}, true},
                            NormCase{"f513_residual", {2, 513}, true}, NormCase{"f700_residual", {2, 700}, true},
                            NormCase{"f700", {2, 700}, false}, NormCase{"f1000_residual", {2, 1000}, true},
                            NormCase{"f4104", {2, 4104}, false}, NormCase{"f4104_residual", {2, 4104}, true},
                            NormCase{"rows2100_f2", {2100, 2}, false}, NormCase{"rows2100_f2_residual", {2100, 2}, true}}) {
    const int64_t f = n.x.back();
    c.push_back({std::string("LayerNorm_") + n.name, OpKind::LayerNorm, [=](Graph& g) {
                   std::vector<ValueId> ins{P(g, "x", n.x), P(g, "gain", {f}), P(g, "bias", {f})};
                   if (n.residual) ins.push_back(P(g, "r", n.x));
                   const ValueId y = g.add(OpKind::LayerNorm, ins, AttrMap().set<attr::Eps>(1e-3));
                   if (!n.residual) return y;
                   const Node& node = g.producer(y);
                   return g.add(OpKind::Add, {y, g.add(OpKind::Scale, {node.outputs[3]}, AttrMap().set<attr::ScaleFactor>(0.5))});
                 }});
    c.push_back({std::string("RmsNorm_") + n.name, OpKind::RmsNorm, [=](Graph& g) {
                   std::vector<ValueId> ins{P(g, "x", n.x), P(g, "gain", {f})};
                   if (n.residual) ins.push_back(P(g, "r", n.x));
                   const ValueId y = g.add(OpKind::RmsNorm, ins, AttrMap().set<attr::Eps>(1e-3));
                   if (!n.residual) return y;
                   const Node& node = g.producer(y);
                   return g.add(OpKind::Add, {y, g.add(OpKind::Scale, {node.outputs[2]}, AttrMap().set<attr::ScaleFactor>(0.5))});
                 }});
  }
  struct RopeCase {
    const char* name;
    Shape x;
    const char* layout;
    int64_t dims;
    bool interleaved;
  };
  // heads: only the first turn (a packed QKV's Q and K), the rest pass unchanged.
  for (const char* layout : {"bshd", "bhsd"})
    c.push_back({std::string("Rope_firstHeads_") + layout, OpKind::Rope, [=](Graph& g) {
                   const bool bshd = std::string(layout) == "bshd";
                   return g.add(OpKind::Rope, {P(g, "x", bshd ? Shape{2, 5, 4, 8} : Shape{2, 4, 5, 8})},
                                AttrMap().set<attr::Layout>(std::string(layout)).set<attr::RopeHeads>(3).set<attr::RopeBase>(100.0));
                 }});
  for (const RopeCase& r : {RopeCase{"halfSplit_bhsd", {2, 3, 5, 8}, "bhsd", 0, false},
                            RopeCase{"interleaved_bhsd", {2, 3, 5, 8}, "bhsd", 0, true},
                            RopeCase{"halfSplit_bshd_partialDims", {2, 7, 3, 10}, "bshd", 4, false},
                            RopeCase{"interleaved_bshd_partialDims", {1, 9, 2, 6}, "bshd", 2, true},
                            RopeCase{"halfSplit_bhsd_longSeq", {1, 2, 300, 6}, "bhsd", 4, false},
                            // the chunked kernel (emitRope): a copied tail of whole chunks, a short
                            // last batch of heads (5 = 4 + 1), positions to 299
                            RopeCase{"halfSplit_bshd_chunkedTail", {2, 3, 5, 16}, "bshd", 8, false},
                            RopeCase{"halfSplit_bhsd_chunkedLongSeq", {1, 5, 300, 12}, "bhsd", 8, false}}) {
    c.push_back({std::string("Rope_") + r.name, OpKind::Rope, [=](Graph& g) {
                   return g.add(OpKind::Rope, {P(g, "x", r.x)},
                                AttrMap().set<attr::Layout>(std::string(r.layout)).set<attr::RopeDims>(r.dims)
                                    .set<attr::Interleaved>(r.interleaved).set<attr::RopeBase>(100.0));
                 }});
  }
  c.push_back({"Softmax_lastAxis", OpKind::Softmax, [](Graph& g) {
                 return g.add(OpKind::Softmax, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Axis>(-1));
               }});
  c.push_back({"Softmax_middleAxis", OpKind::Softmax, [](Graph& g) {
                 return g.add(OpKind::Softmax, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Axis>(1));
               }});
  c.push_back({"Softmax_sinkLogits", OpKind::Softmax, [](Graph& g) {
                 return g.add(OpKind::Softmax, {P(g, "x", {2, 3, 4}), P(g, "sink", {3, 1})}, AttrMap().set<attr::Axis>(-1));
               }});
  c.push_back({"Softmax_sinkLogitsMaskedRows", OpKind::Softmax, [](Graph& g) {
                 // Bottom-right causal with q > k hides rows 0 and 1 entirely: the sink takes all mass.
                 ValueId m = g.add(OpKind::AttentionMask, {P(g, "x", {2, 4, 2})},
                                   AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right"));
                 return g.add(OpKind::Softmax, {m, P(g, "sink", {2, 1, 1})}, AttrMap().set<attr::Axis>(-1));
               }});
  c.push_back({"Permute", OpKind::Permute, [](Graph& g) {
                 return g.add(OpKind::Permute, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Perm>({2, 0, 1}));
               }});
  c.push_back({"Reshape", OpKind::Reshape, [](Graph& g) {
                 return g.add(OpKind::Reshape, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Shape>({-1, 4}));
               }});
  c.push_back({"BroadcastTo", OpKind::BroadcastTo, [](Graph& g) {
                 return g.add(OpKind::BroadcastTo, {P(g, "x", {3, 1})}, AttrMap().set<attr::Shape>({2, 3, 4}));
               }});
  c.push_back({"Sum_axis", OpKind::Sum, [](Graph& g) { return g.add(OpKind::Sum, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Axes>({1})); }});
  c.push_back({"Sum_all", OpKind::Sum, [](Graph& g) { return g.add(OpKind::Sum, {P(g, "x", {2, 3, 4})}); }});
  c.push_back({"Sum_keepdims", OpKind::Sum, [](Graph& g) {
                 return g.add(OpKind::Sum, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Axes>({0, -1}).set<attr::KeepDims>(true));
               }});
  c.push_back({"Mean_axes", OpKind::Mean, [](Graph& g) { return g.add(OpKind::Mean, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Axes>({0, 2})); }});
  c.push_back({"SumTo", OpKind::SumTo, [](Graph& g) { return g.add(OpKind::SumTo, {P(g, "x", {2, 3, 4})}, AttrMap().set<attr::Shape>({3, 1})); }});
  // Leading axes summed (the one-launch column sums): whole 16-byte groups over an odd number
  // of rows (of a ReLU, so that bf16 lowering makes the input bf16), columns one at a time
  // across two leading axes, and a single column.
  c.push_back({"SumTo_columns", OpKind::SumTo, [](Graph& g) {
                 return g.add(OpKind::SumTo, {g.add(OpKind::Relu, {P(g, "x", {37, 24})})}, AttrMap().set<attr::Shape>({24}));
               }});
  c.push_back({"SumTo_columnsOdd", OpKind::SumTo, [](Graph& g) {
                 return g.add(OpKind::SumTo, {P(g, "x", {30, 2, 13})}, AttrMap().set<attr::Shape>({1, 13}));
               }});
  c.push_back({"SumTo_oneColumn", OpKind::SumTo, [](Graph& g) {
                 return g.add(OpKind::SumTo, {g.add(OpKind::Relu, {P(g, "x", {501, 1})})}, AttrMap().set<attr::Shape>({1}));
               }});
  c.push_back(maskCase("AttentionMask_causalTopLeft", 3, 5, AttrMap().set<attr::Causal>(true)));
  c.push_back(maskCase("AttentionMask_causalBottomRight", 3, 5, AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right")));
  c.push_back(maskCase("AttentionMask_fullyMaskedRows", 5, 3, AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right")));
  c.push_back(maskCase("AttentionMask_window", 6, 6, AttrMap().set<attr::WindowLeft>(1).set<attr::WindowRight>(1)));
  c.push_back(maskCase("AttentionMask_causalWindowSinks", 6, 6,
                       AttrMap().set<attr::Causal>(true).set<attr::WindowLeft>(1).set<attr::Sinks>(2)));
  c.push_back({"RepeatHeads", OpKind::RepeatHeads, [](Graph& g) {
                 return g.add(OpKind::RepeatHeads, {P(g, "x", {2, 2, 3, 4})}, AttrMap().set<attr::RepeatAxis>(1).set<attr::Repeats>(3));
               }});
  c.push_back({"MseLoss", OpKind::MseLoss, [](Graph& g) {
                 return g.add(OpKind::MseLoss, {P(g, "p", {3, 4}), P(g, "t", {3, 4})});
               }});
  for (const char* act : {"none", "relu", "gelu"}) {
    for (bool bias : {false, true}) {
      for (bool tw : {false, true}) {
        const std::string name = std::string("FusedLinear_") + act + (bias ? "_bias" : "") + (tw ? "_transposedW" : "");
        c.push_back({name, OpKind::FusedLinear, [=](Graph& g) {
                       std::vector<ValueId> ins{P(g, "x", {2, 3, 4}), P(g, "w", tw ? Shape{5, 4} : Shape{4, 5})};
                       if (bias) ins.push_back(P(g, "b", {5}));
                       return g.add(OpKind::FusedLinear, ins, AttrMap().set<attr::Activation>(std::string(act)).set<attr::TransposeW>(tw));
                     }});
      }
    }
  }
  for (bool bias : {false, true}) {
    c.push_back({std::string("FusedLinear_swiglu") + (bias ? "_bias" : ""), OpKind::FusedLinear, [=](Graph& g) {
                   std::vector<ValueId> ins{P(g, "x", {2, 3, 4}), P(g, "w", {4, 6})};
                   if (bias) ins.push_back(P(g, "b", {6}));
                   return g.add(OpKind::FusedLinear, ins, AttrMap().set<attr::Activation>("swiglu"));
                 }});
  }
  struct RopeLinear {
    const char* name;
    Shape x, w;
    int64_t headDim, dims;
    bool bias, tw;
  };
  for (const RopeLinear& r : {RopeLinear{"heads2", {2, 7, 5}, {5, 12}, 6, 0, false, false},
                              RopeLinear{"heads2_bias_someDims", {2, 7, 5}, {5, 12}, 6, 4, true, false},
                              RopeLinear{"transposedW", {3, 4, 3}, {8, 3}, 4, 0, true, true},
                              RopeLinear{"rank2", {5, 4}, {4, 4}, 2, 0, false, false},
                              RopeLinear{"longSeq", {1, 300, 4}, {4, 8}, 8, 6, true, false}}) {
    c.push_back({std::string("FusedLinear_rope_") + r.name, OpKind::FusedLinear, [=](Graph& g) {
                   std::vector<ValueId> ins{P(g, "x", r.x), P(g, "w", r.w)};
                   if (r.bias) ins.push_back(P(g, "b", {r.tw ? r.w[0] : r.w[1]}));
                   return g.add(OpKind::FusedLinear, ins,
                                AttrMap().set<attr::Activation>("rope").set<attr::TransposeW>(r.tw).set<attr::HeadDim>(r.headDim)
                                    .set<attr::RopeDims>(r.dims).set<attr::RopeBase>(100.0));
                 }});
  }
  c.push_back({"Interleave", OpKind::Interleave, [](Graph& g) { return g.add(OpKind::Interleave, {P(g, "a", {3, 5}), P(g, "b", {3, 5})}); }});
  for (int part : {0, 1})
    c.push_back({"Deinterleave_part" + std::to_string(part), OpKind::Deinterleave, [=](Graph& g) {
                   return g.add(OpKind::Deinterleave, {P(g, "x", {2, 3, 6})}, AttrMap().set<attr::Part>(part));
                 }});
  struct Flash {
    const char* name;
    int64_t hq, hk, sq, sk;
    AttrMap mask;
    bool sink;
  };
  const Flash flashes[] = {
      {"plain", 2, 2, 5, 5, AttrMap(), false},
      {"causalTopLeft_qShorter", 2, 2, 3, 6, AttrMap().set<attr::Causal>(true), false},
      {"causalBottomRight_qShorter", 2, 2, 3, 6, AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right"), false},
      {"causalBottomRight_fullyMaskedRows", 2, 2, 6, 3, AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right"), false},
      {"fullyMaskedRowsWithSinkLogits", 2, 2, 6, 3, AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right"), true},
      {"window", 2, 2, 7, 7, AttrMap().set<attr::WindowLeft>(1).set<attr::WindowRight>(2), false},
      {"causalWindowSinks", 2, 2, 9, 9, AttrMap().set<attr::Causal>(true).set<attr::WindowLeft>(2).set<attr::Sinks>(2), false},
      {"gqa4_causalWindowSinksSinkLogits", 4, 1, 8, 8, AttrMap().set<attr::Causal>(true).set<attr::WindowLeft>(1).set<attr::Sinks>(1), true},
      {"gqa2_sinkLogits_windowRightOnly", 4, 2, 6, 9, AttrMap().set<attr::WindowLeft>(0).set<attr::WindowRight>(1).set<attr::Sinks>(3), true},
      {"longerThanOneKeyTile", 1, 1, 70, 130, AttrMap().set<attr::Causal>(true).set<attr::Align>("bottom-right").set<attr::WindowLeft>(80), false},
  };
  for (const Flash& f : flashes) {
    c.push_back({std::string("FlashAttention_") + f.name, OpKind::FlashAttention, [f](Graph& g) {
                   AttrMap a = f.mask;
                   a.set<attr::AttnScale>(0.6);
                   std::vector<ValueId> ins{P(g, "q", {2, f.hq, f.sq, 8}), P(g, "k", {2, f.hk, f.sk, 8}), P(g, "v", {2, f.hk, f.sk, 8})};
                   if (f.sink) ins.push_back(P(g, "sink", {f.hq}));
                   return g.add(OpKind::FlashAttention, ins, a);
                 }});
  }
  // Layout "bshd": q, k, v, o and their gradients as [B, S, H, D] (strided on the GPU).
  for (const Flash& f : {flashes[2], flashes[7], flashes[8]}) {
    c.push_back({std::string("FlashAttention_bshd_") + f.name, OpKind::FlashAttention, [f](Graph& g) {
                   AttrMap a = f.mask;
                   a.set<attr::AttnScale>(0.6);
                   a.set<attr::Layout>("bshd");
                   std::vector<ValueId> ins{P(g, "q", {2, f.sq, f.hq, 8}), P(g, "k", {2, f.sk, f.hk, 8}), P(g, "v", {2, f.sk, f.hk, 8})};
                   if (f.sink) ins.push_back(P(g, "sink", {f.hq}));
                   return g.add(OpKind::FlashAttention, ins, a);
                 }});
  }
  // Packed QKV [B, S, Hq + 2 Hk, D]: heads 0..Hq-1 are Q, then Hk of K, then Hk of V.
  for (const Flash& f : {flashes[0], flashes[7], flashes[6]}) {
    for (const char* layout : {"bshd", "bhsd"}) {
      if (f.sq != f.sk) continue;
      c.push_back({std::string("FlashAttentionQkv_") + layout + "_" + f.name, OpKind::FlashAttentionQkv, [f, layout](Graph& g) {
                     AttrMap a = f.mask;
                     a.set<attr::AttnScale>(0.6).set<attr::Layout>(std::string(layout)).set<attr::KvHeads>(f.hk);
                     std::vector<ValueId> ins{P(g, "qkv", {2, f.sq, f.hq + 2 * f.hk, 8})};
                     if (f.sink) ins.push_back(P(g, "sink", {f.hq}));
                     return g.add(OpKind::FlashAttentionQkv, ins, a);
                   }});
    }
  }
  c.push_back({"Concat_three", OpKind::Concat, [](Graph& g) {
                 return g.add(OpKind::Concat, {P(g, "a", {2, 3, 4}), P(g, "b", {2, 3, 1}), P(g, "c", {2, 3, 5})});
               }});
  c.push_back({"Concat_vectors", OpKind::Concat, [](Graph& g) { return g.add(OpKind::Concat, {P(g, "a", {3}), P(g, "b", {6})}); }});
  for (int64_t start : {0, 2, 5})
    c.push_back({"Slice_start" + std::to_string(start), OpKind::Slice, [=](Graph& g) {
                   return g.add(OpKind::Slice, {P(g, "x", {2, 3, 7})}, AttrMap().set<attr::Start>(start).set<attr::Length>(2));
                 }});
  c.push_back({"FusedElementwise_reluOfBroadcastAdd", OpKind::FusedElementwise, [](Graph& g) {
                 return g.add(OpKind::FusedElementwise, {P(g, "x", {2, 3, 4}), P(g, "b", {4})},
                              AttrMap().set<attr::Expr>("relu(add($0, $1))").set<attr::Shape>({2, 3, 4}));
               }});
  c.push_back({"FusedElementwise_mixed", OpKind::FusedElementwise, [](Graph& g) {
                 return g.add(OpKind::FusedElementwise, {P(g, "x", {3, 4}), P(g, "y", {3, 1}), P(g, "z", {3, 4})},
                              AttrMap().set<attr::Expr>("mul(sigmoid(sub($0, $1)), scale[0.5](div(tanh($2), exp($0))))").set<attr::Shape>({3, 4}));
               }});
  c.push_back({"FusedElementwise_sameInputTwice", OpKind::FusedElementwise, [](Graph& g) {
                 return g.add(OpKind::FusedElementwise, {P(g, "x", {2, 5})},
                              AttrMap().set<attr::Expr>("mul(gelu($0), $0)").set<attr::Shape>({2, 5}));
               }});
  // FusedMlp on awkward shapes: one row, odd widths and rows, batched rows, layers with and
  // without bias, every activation; the GPU runs its forward and backward kernels on them.
  struct Mlp {
    const char* name;
    Shape x;
    std::vector<int64_t> widths;
    const char* acts;
    std::vector<int64_t> biases;
  };
  const Mlp mlps[] = {{"FusedMlp_reluOneRow", {1, 3}, {5, 1}, "relu,none", {1, 1}},
                      {"FusedMlp_relu7Rows", {7, 3}, {5, 4}, "relu,none", {1, 1}},
                      {"FusedMlp_tanhSigmoidBatched", {2, 3, 5}, {4, 3, 2}, "tanh,sigmoid,none", {0, 1, 1}},
                      {"FusedMlp_reluTanhNoBiases", {17, 1}, {9, 6}, "relu,tanh", {0, 0}}};
  for (const Mlp& m : mlps)
    c.push_back({m.name, OpKind::FusedMlp, [=](Graph& g) {
                   std::vector<ValueId> ins{P(g, "x", m.x)};
                   int64_t k = m.x.back();
                   for (size_t i = 0; i < m.widths.size(); ++i) {
                     ins.push_back(P(g, "w" + std::to_string(i + 1), {k, m.widths[i]}));
                     if (m.biases[i]) ins.push_back(P(g, "b" + std::to_string(i + 1), {m.widths[i]}));
                     k = m.widths[i];
                   }
                   return g.add(OpKind::FusedMlp, ins, AttrMap().set<attr::MlpActivations>(m.acts).set<attr::MlpBiases>(m.biases));
                 }});
  return c;
}

// The case's graph as a training step runs it: a weighted-sum loss and the backward, lowered to
// bf16 when asked (the op's output kept as the graph output "op" there).
inline Graph opCaseTrainingGraph(const OpCase& oc, bool bf16) {
  Graph g;
  const ValueId out = oc.build(g);
  if (bf16) g.setOutput("op", out);
  addWeightedSumLoss(g, out);
  appendBackward(g, g.output("loss"), g.params());
  if (bf16) lowerToBf16(g);
  return g;
}

}  // namespace pa::test
