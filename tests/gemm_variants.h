// The generated GEMM variants the GEMM tests walk: every tile, transpose, batch, split, tail
// split and FusedLinear epilogue (fp32 SIMT and TF32; a subset on FP64), MatMulBiasGrad on the
// mma.sync kernels, the kernels that follow a cuBLASLt
// product, and the bf16 wgmma kernels. gemm_emit_test.cpp checks what each emits (CPU);
// nvrtc/gemm_nvrtc_test.cpp compiles them (NVRTC).
#pragma once

#include <string>
#include <vector>

#include "tests/gpu/gemm_harness.h"

namespace pa::gemmtest {

using codegen::GemmTile;

struct Variant {
  std::string name;
  codegen::Kernel kernel;
};

inline std::vector<Variant> allVariants() {
  std::vector<Variant> out;
  // tail: a tail split of that many ways, on a device of 2 SMs (so that the problems below have
  // tiles computed whole beside split ones).
  auto add = [&](const std::string& name, const GemmProblem& p, bool tf32, GemmTile tile, int splits = 0, int tail = 0) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    codegen::EmitOptions opt;
    opt.tf32 = tf32;
    opt.gemmTile = tile;
    opt.gemmSplits = splits;
    if (tail > 0) opt.gemmTailSplits = tail, opt.sms = 2;
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      out.push_back({name + (tf32 ? "_tf32" : "_fp32") + "_" + std::to_string(static_cast<int>(tile)) + "_" + k.name, k});
  };
  for (bool tf32 : {false, true})
    for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) {
      for (int t = 0; t < 4; ++t) {
        const GemmProblem p = gemmtest::matmulProblem(33, 100, 129, t & 1, t & 2);
        add("MatMul_t" + std::to_string(t), p, tf32, tile);
        if (tile == GemmTile::Large) add("MatMul_split_t" + std::to_string(t), p, tf32, tile, 3);
        if (tile == GemmTile::Large && !tf32) add("MatMul_tail_t" + std::to_string(t), p, tf32, tile, 0, 3);
      }
      GemmProblem batched;
      batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
      add("MatMul_batched", batched, tf32, tile);
      if (tile == GemmTile::Medium) continue;
      for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"})
        for (bool bias : {false, true})
          for (bool tw : {false, true}) {
            GemmProblem p;
            p.fused = true, p.act = act, p.bias = bias, p.tb = tw;
            p.a = {4, 7, 36};
            p.b = tw ? Shape{40, 36} : Shape{36, 40};
            const std::string name = std::string("FusedLinear_") + act + (bias ? "_bias" : "") + (tw ? "_tW" : "");
            add(name, p, tf32, tile);
            if (tile == GemmTile::Large) add(name + "_split", p, tf32, tile, 2);
            if (tile == GemmTile::Large && !tf32) add(name + "_tail", p, tf32, tile, 0, 2);
          }
    }
  // fp32 on the FP64 tensor cores (EmitOptions::fp32Gemm, the default where FP64 runs at full
  // rate): every tile's transposes and batch, one split product, and four epilogues on large
  // tiles (one of them split).
  auto addF64 = [&](const std::string& name, const GemmProblem& p, GemmTile tile, int splits = 0) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    codegen::EmitOptions opt;
    opt.fp32Gemm = codegen::Fp32Gemm::F64Mma;
    opt.gemmTile = tile;
    opt.gemmSplits = splits;
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      out.push_back({name + "_f64_" + std::to_string(static_cast<int>(tile)) + "_" + k.name, k});
  };
  for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) {
    for (int t = 0; t < 4; ++t) addF64("MatMul_t" + std::to_string(t), gemmtest::matmulProblem(33, 100, 129, t & 1, t & 2), tile);
    GemmProblem batched;
    batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
    addF64("MatMul_batched", batched, tile);
  }
  addF64("MatMul_split_t1", gemmtest::matmulProblem(33, 100, 129, true, false), GemmTile::Large, 3);
  for (const char* act : {"relu", "gelu", "swiglu", "rope"}) {
    GemmProblem p;
    p.fused = true, p.act = act, p.bias = true;
    p.a = {4, 7, 36};
    p.b = {36, 40};
    addF64(std::string("FusedLinear_") + act + "_bias", p, GemmTile::Large);
    if (std::string(act) == "gelu") addF64(std::string("FusedLinear_") + act + "_bias_split", p, GemmTile::Large, 2);
  }
  // MatMulBiasGrad on the mma.sync kernels (FP64, and TF32 where wgmma is off), which sum the
  // bias operand inside the product: either operand, whole and split products, every tile.
  for (const char* operand : {"a", "b"})
    for (bool tf32 : {false, true})
      for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small})
        for (int splits : {0, 3}) {
          if (splits > 0 && tile != GemmTile::Large) continue;
          Graph g;
          const ValueId a = g.addParam("a", {129, 33}, "xavier"), b = g.addParam("b", {129, 100}, "xavier");
          AttrMap attrs;
          attrs.set<attr::TransposeA>(true).set<attr::BiasOperand>(std::string(operand));
          const NodeId id = g.producer(g.add(OpKind::MatMulBiasGrad, {a, b}, attrs)).id;
          codegen::EmitOptions opt;
          opt.tf32 = tf32;
          if (!tf32) opt.fp32Gemm = codegen::Fp32Gemm::F64Mma;
          opt.gemmTile = tile;
          opt.gemmSplits = splits;
          const std::string name = std::string("MatMulBiasGrad_") + operand + (splits ? "_split" : "") + (tf32 ? "_tf32_" : "_f64_") +
                                   std::to_string(static_cast<int>(tile));
          for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels) out.push_back({name + "_" + k.name, k});
        }
  return out;
}

// The epilogue kernels that follow a cuBLASLt product: every FusedLinear epilogue with each part
// cuBLASLt may or may not have applied, and matmul-act-grad's two derivatives.
inline std::vector<Variant> libraryEpilogues() {
  std::vector<Variant> out;
  for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"})
    for (bool bias : {false, true})
      for (int applied = 0; applied < 4; ++applied) {
        GemmProblem p;
        p.fused = true, p.act = act, p.bias = bias;
        p.a = {4, 7, 36};
        p.b = {36, 40};
        Graph g;
        const NodeId id = gemmtest::buildGraph(g, p);
        const std::string name = std::string("lib_") + act + (bias ? "_bias" : "") + "_" + std::to_string(applied);
        int part = 0;  // swiglu with a bias left: the bias pass, then the pairs ("_2")
        for (const codegen::Kernel& k : codegen::libraryGemmEpilogue(g, id, applied & 1, applied & 2).kernels)
          out.push_back({name + (part++ ? "_" + std::to_string(part) : std::string()), k});
      }
  for (const char* act : {"relu", "gelu"}) {
    Graph g;
    const ValueId a = g.addParam("a", {33, 17}, "xavier"), b = g.addParam("b", {17, 9}, "xavier");
    const ValueId x = g.addParam("x", {33, 9}, "xavier");
    AttrMap t;
    t.set<attr::GradActivation>(act);
    const ValueId y = g.add(OpKind::MatMulActGrad, {a, b, x}, t);
    for (const codegen::Kernel& k : codegen::libraryGemmEpilogue(g, g.producer(y).id, false, false).kernels)
      out.push_back({std::string("lib_actgrad_") + act, k});
  }
  {  // the copy of a transposed B that lets cuBLASLt run the product untransposed
    GemmProblem p;
    p.a = {100, 33}, p.b = {70, 33}, p.tb = true;
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    for (const codegen::Kernel& k : codegen::libraryGemmTransposeB(g, id).kernels) out.push_back({"lib_transpose_b", k});
  }
  return out;
}

// bf16 operands with EmitOptions::wgmma (an sm_90a device): the wgmma kernel for every tile,
// transpose, batch, split and epilogue, with bf16 and fp32 outputs, C stored by TMA and by the
// threads, and the bias gradient's operand sums.
inline std::vector<Variant> wgmmaVariants() {
  std::vector<Variant> out;
  auto add = [&](const std::string& name, const GemmProblem& p, GemmTile tile, bool bf16Out, int splits = 0,
                 codegen::WgmmaEpilogue epilogue = codegen::WgmmaEpilogue::Auto, bool tmaStores = true) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    gemmtest::storeOperandsInBf16(g, id, bf16Out);
    codegen::EmitOptions opt;
    opt.wgmma = true;
    opt.gemmTile = tile;
    opt.gemmSplits = splits;
    opt.wgmmaEpilogue = epilogue;
    opt.wgmmaTmaStores = tmaStores;
    for (const codegen::Kernel& k : codegen::emitNode(g, id, opt).kernels)
      out.push_back({name + (bf16Out ? "_bf16out_" : "_f32out_") + std::to_string(static_cast<int>(tile)) + "_" + k.name, k});
  };
  for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small})
    for (bool bf16Out : {true, false}) {
      for (int t = 0; t < 4; ++t) {
        const GemmProblem p = gemmtest::matmulProblem(40, 104, 136, t & 1, t & 2);
        add("MatMul_t" + std::to_string(t), p, tile, bf16Out);
        if (tile == GemmTile::Small) add("MatMul_split_t" + std::to_string(t), p, tile, bf16Out, 3);
      }
      GemmProblem batched;
      batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
      add("MatMul_batched", batched, tile, bf16Out);
      for (const char* act : {"none", "relu", "gelu"}) {
        GemmProblem p;
        p.fused = true, p.act = act, p.bias = true;
        p.a = {4, 7, 32}, p.b = {32, 40};
        add(std::string("FusedLinear_") + act, p, tile, bf16Out);
      }
      // The functor on the staged raw sums (Auto's choice for gelu and the activation gradients)
      // and on the fragments, each forced where Auto picks the other.
      for (const char* act : {"relu", "gelu"}) {
        GemmProblem p = gemmtest::matmulProblem(40, 104, 136, false, true);
        p.gradAct = act;
        add(std::string("MatMulActGrad_") + act, p, tile, bf16Out);
      }
      GemmProblem fused;
      fused.fused = true, fused.act = "relu", fused.bias = true;
      fused.a = {4, 7, 32}, fused.b = {32, 40};
      add("FusedLinear_relu_staged", fused, tile, bf16Out, 0, codegen::WgmmaEpilogue::Staged);
      fused.act = "gelu";
      add("FusedLinear_gelu_fragments", fused, tile, bf16Out, 0, codegen::WgmmaEpilogue::Fragments);
      // C stored by the threads: forced, and where C's rows are not whole 16-byte chunks (N = 100
      // in bf16; in fp32 they are).
      add("MatMul_t0_threadstores", gemmtest::matmulProblem(40, 104, 136, false, false), tile, bf16Out, 0,
          codegen::WgmmaEpilogue::Auto, false);
      add("MatMul_n100_t2", gemmtest::matmulProblem(40, 100, 136, false, true), tile, bf16Out);
    }
  // Ping-pong consumers: every transpose, a split, a batch, the epilogues on the fragments and
  // staged (the activation gradients), C by the threads.
  for (int t = 0; t < 4; ++t)
    add("MatMul_t" + std::to_string(t), gemmtest::matmulProblem(40, 104, 136, t & 1, t & 2), GemmTile::PingPong, t != 3);
  add("MatMul_split_t1", gemmtest::matmulProblem(40, 104, 136, true, false), GemmTile::PingPong, false, 3);
  {
    GemmProblem batched;
    batched.a = {3, 64, 128}, batched.b = {3, 128, 96};
    add("MatMul_batched", batched, GemmTile::PingPong, true);
    for (const char* act : {"relu", "gelu"}) {
      GemmProblem p;
      p.fused = true, p.act = act, p.bias = true;
      p.a = {4, 7, 32}, p.b = {32, 40};
      add(std::string("FusedLinear_") + act, p, GemmTile::PingPong, true);
    }
    GemmProblem p = gemmtest::matmulProblem(40, 104, 136, false, true);
    p.gradAct = "relu";
    add("MatMulActGrad_relu", p, GemmTile::PingPong, true);
    add("MatMul_t0_threadstores", gemmtest::matmulProblem(40, 104, 136, false, false), GemmTile::PingPong, false, 0,
        codegen::WgmmaEpilogue::Auto, false);
    for (const char* operand : {"a", "b"}) {  // the bias gradient's sums by the item's consumer
      GemmProblem bg = gemmtest::matmulProblem(40, 104, 136, true, false);
      bg.biasGrad = operand;
      if (*operand == 'a') add("MatMulBiasGrad_a", bg, GemmTile::PingPong, false);
      else add("MatMulBiasGrad_split_b", bg, GemmTile::PingPong, false, 3);
    }
  }
  // The bias gradient summed inside the product (MatMulBiasGrad, either operand MN-major; fp32
  // outputs, as lower-bf16 leaves gradients), whole and split.
  for (const char* operand : {"a", "b"}) {
    GemmProblem p = gemmtest::matmulProblem(40, 104, 136, true, false);
    p.biasGrad = operand;
    add(std::string("MatMulBiasGrad_") + operand, p, GemmTile::Large, false);
    add(std::string("MatMulBiasGrad_split_") + operand, p, GemmTile::Small, false, 3);
  }
  return out;
}

}  // namespace pa::gemmtest
