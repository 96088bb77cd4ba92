// The generated GEMM kernels (MatMul, FusedLinear) on the GPU against a float64 CPU reference:
// every tile variant and split-K, fp32 and TF32, every transpose combination, batches, every epilogue, on
// awkward sizes (1, 7, 33, 127, 129, 255, 1000; K = 1) and one large product. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "codegen/kernel_cache.h"
#include "runtime/cuda/cublaslt.h"
#include "tests/gpu/gemm_harness.h"
#include "tests/gpu/gpu_test_util.h"

namespace pa {
namespace {

using gemmtest::GemmProblem;

cuda::Device& device() { return test::gpuDevice(); }

struct GemmCase {
  std::string name;
  GemmProblem problem;
  codegen::EmitOptions opt;
};

const char* tileName(codegen::GemmTile t) {
  switch (t) {
  case codegen::GemmTile::Auto: return "auto";
  case codegen::GemmTile::Large: return "large";
  case codegen::GemmTile::Medium: return "medium";
  case codegen::GemmTile::Small: return "small";
  case codegen::GemmTile::PingPong: return "pingpong";
  }
  return "?";
}

std::string dims(const Shape& s) {
  std::string r;
  for (int64_t d : s) r += (r.empty() ? "" : "x") + std::to_string(d);
  return r;
}
std::string dims(const std::array<int64_t, 3>& mnk) { return dims(Shape(mnk.begin(), mnk.end())); }

std::vector<GemmCase> allCases() {
  using codegen::GemmTile;
  std::vector<GemmCase> cases;
  auto add = [&](const std::string& base, const GemmProblem& p, bool tf32, GemmTile tile, int splits = 0) {
    GemmCase c;
    c.problem = p;
    c.opt.tf32 = tf32;
    c.opt.gemmTile = tile;
    c.opt.gemmSplits = splits;
    c.name = base + "_" + (tf32 ? "tf32" : "fp32") + "_" + tileName(tile) + (splits ? "_split" + std::to_string(splits) : "");
    cases.push_back(c);
  };
  // fp32 large tiles with a tail split of `tail` ways, as on a device of `sms` SMs: the last
  // (tiles mod sms) tiles are split along K, or the last `sms` tiles where the waves are whole.
  auto addTail = [&](const std::string& base, const GemmProblem& p, int tail, int sms) {
    GemmCase c;
    c.problem = p;
    c.opt.gemmTile = GemmTile::Large;
    c.opt.gemmTailSplits = tail;
    c.opt.sms = sms;
    c.name = base + "_fp32_large_tail" + std::to_string(tail) + "_sms" + std::to_string(sms);
    cases.push_back(c);
  };
  // (M, N, K): every awkward size in every position, K = 1 (the outer product: 8192×256 in 16-byte
  // stores, 7×33 one value at a time), N = 1 (Aᵀ·B of one column, the column product: M = 256
  // and 1000 in 16-byte loads, 1 not; M = 3 over K = 5000 below), and sizes whose leading dimensions
  // are multiples of 4 (the float4 / 16-byte cp.async paths) next to ones that are not. The last
  // two give every tile interior blocks (the fp32 path's unchecked loads: tile inside both
  // operands, K a multiple of the slice), alone and beside edge blocks. 130×516×200: Aᵀ·B with
  // M < N, which TF32 wgmma computes transposed, over several tiles (and A·B, A·Bᵀ, Aᵀ·Bᵀ with an
  // M-major A whose rows are not whole 16-byte chunks).
  const int64_t mnk[][3] = {{1, 1, 1},       {7, 33, 1},     {33, 7, 127},   {127, 129, 255}, {129, 255, 33},
                            {255, 1000, 7},  {1000, 127, 129}, {1, 1000, 255}, {1000, 1, 1000}, {132, 260, 36},
                            {256, 64, 64},   {1000, 1000, 1000}, {384, 256, 96}, {300, 260, 80}, {130, 516, 200},
                            {8192, 256, 1},  {256, 1, 8192}};
  for (const auto& s : mnk) {
    const int64_t m = s[0], n = s[1], k = s[2];
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const GemmProblem p = gemmtest::matmulProblem(m, n, k, ta, tb);
      const std::string base = "MatMul_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                               (ta ? "_tA" : "") + (tb ? "_tB" : "");
      for (bool tf32 : {false, true}) {
        for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) add(base, p, tf32, tile);
        if (k >= 33) add(base, p, tf32, GemmTile::Large, 3);  // split-K, uneven shares
        if (k >= 129) add(base, p, tf32, GemmTile::Medium, 3);  // the same on medium tiles
        if (k == 7) add(base, p, tf32, GemmTile::Large, 5);   // more splits than K slices
        if (k == 96) add(base, p, tf32, GemmTile::Large, 8);  // the same beside interior tiles (6 slices of 16)
      }
      // Tail splits: uneven shares, and more splits than K slices (k = 1, 7, 33: 1 to 3 slices).
      // On 2 SMs a product of an odd number of tiles splits its last one, of an even number its
      // last two (of one tile: that tile alone); on 5 SMs 1000×1000 computes 60 tiles whole and
      // splits 4.
      addTail(base, p, 3, 2);
      if (m * n >= 1000 * 127) addTail(base, p, 5, 5);
    }
  }
  // The column product of a narrow A over many rows (three columns, 5000 rows: 8 lanes of one
  // column each, many parts).
  for (bool tf32 : {false, true}) add("MatMul_3x1x5000_tA", gemmtest::matmulProblem(3, 1, 5000, true, false), tf32, GemmTile::Large);
  // Batches: both batched (strides), batched A with a shared B (one taller GEMM, or strided when
  // A is transposed), shared A with batched B.
  struct Batched {
    Shape a, b;
    bool ta, tb;
  };
  const Batched batched[] = {{{3, 33, 129}, {3, 129, 65}, false, false}, {{3, 129, 33}, {3, 65, 129}, true, true},
                             {{2, 3, 36, 20}, {20, 44}, false, false},    {{3, 129, 33}, {129, 65}, true, false},
                             {{33, 129}, {4, 129, 65}, false, false},     {{4, 64, 128}, {4, 96, 128}, false, true}};
  for (const Batched& bt : batched) {
    GemmProblem p;
    p.a = bt.a, p.b = bt.b, p.ta = bt.ta, p.tb = bt.tb;
    const std::string base = "MatMulBatched_" + dims(bt.a) + (bt.ta ? "T" : "") + "_" + dims(bt.b) + (bt.tb ? "T" : "");
    for (bool tf32 : {false, true})
      for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) add(base, p, tf32, tile);
  }
  // FusedLinear: every activation, with and without bias, plain and transposed weight.
  const Shape xs[] = {{5, 7, 129}, {64, 256}};
  const int64_t units[] = {255, 1000};
  for (int s = 0; s < 2; ++s)
    for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"})
      for (bool bias : {false, true})
        for (bool tw : {false, true}) {
          GemmProblem p;
          p.fused = true;
          p.a = xs[s];
          const int64_t k = xs[s].back();
          const bool pairs = std::string(act) == "swiglu" || std::string(act) == "rope";
          const int64_t nu = pairs ? units[s] + units[s] % 2 : units[s];  // column pairs (rope: heads of 8)
          p.b = tw ? Shape{nu, k} : Shape{k, nu};
          p.tb = tw, p.act = act, p.bias = bias;
          p.ropeDims = s == 1 ? 6 : 0;  // some features of each head left unturned
          const std::string base = std::string("FusedLinear_") + act + (bias ? "_bias" : "") + (tw ? "_tW" : "") + "_" +
                                   dims(p.a) + "_" + std::to_string(nu);
          for (bool tf32 : {false, true}) {
            for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) add(base, p, tf32, tile);
            add(base, p, tf32, GemmTile::Large, 2);  // the epilogue in the split-K reduce
          }
          addTail(base, p, 2, 3);  // the epilogue in the tail split's reduce and in whole tiles
        }
  // MatMulActGrad (a layer's dX: dY·Wᵀ times the activation's derivative at x), the epilogue in the
  // product and in the split-K reduce.
  for (const char* act : {"relu", "gelu"})
    for (const auto& s : {std::array<int64_t, 3>{127, 129, 255}, std::array<int64_t, 3>{300, 260, 80}}) {
      GemmProblem p = gemmtest::matmulProblem(s[0], s[1], s[2], false, true);
      p.gradAct = act;
      const std::string base = std::string("MatMulActGrad_") + act + "_" + dims(s) + "_tB";
      for (bool tf32 : {false, true}) {
        for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) add(base, p, tf32, tile);
        add(base, p, tf32, GemmTile::Large, 3);
      }
    }
  // FusedLinear to one output (activation none or relu): the row dot, a warp a row, 16-byte loads
  // where K is a multiple of 4 (256), one value at a time where not (129).
  for (const Shape& x : {Shape{5, 7, 129}, Shape{8191, 256}})
    for (const char* act : {"none", "relu"})
      for (bool bias : {false, true})
        for (bool tw : {false, true}) {
          GemmProblem p;
          p.fused = true;
          p.a = x;
          p.b = tw ? Shape{1, x.back()} : Shape{x.back(), 1};
          p.tb = tw, p.act = act, p.bias = bias;
          const std::string base = std::string("FusedLinear_") + act + (bias ? "_bias" : "") + (tw ? "_tW" : "") + "_" + dims(p.a) + "_1";
          for (bool tf32 : {false, true}) add(base, p, tf32, GemmTile::Large);
        }
  // The large case: a weight gradient of a batch-8192 layer (Xᵀ·dY, K = 8192), tiles and K
  // splits from the shape (split-K).
  for (bool tf32 : {false, true}) {
    GemmProblem p;
    p.a = {8192, 1024}, p.b = {8192, 1024}, p.ta = true;
    add("MatMul_1024x1024x8192_tA", p, tf32, GemmTile::Auto);
  }
  // Every TF32 case again with EmitOptions::wgmma (an sm_90a device): the wgmma kernel on TF32
  // where K is a multiple of 4 (an M-major A read into registers or copied transposed first), the
  // mma.sync TF32 kernel elsewhere. A B stored N-major is transposed by the product kernel as it
  // loads it (EmitOptions::tf32BLoad; the cost model's choice where the tile is too), and those
  // cases run once more with B copied transposed first instead.
  // Every fp32 case but the tail splits (the SIMT kernel's) again on the FP64 tensor cores
  // (EmitOptions::fp32Gemm; the default on full-rate FP64 devices): "_f64" in place of "_fp32".
  const size_t fp32Count = cases.size();
  for (size_t i = 0; i < fp32Count; ++i) {
    if (cases[i].opt.tf32 || cases[i].opt.gemmTailSplits != 0) continue;
    GemmCase c = cases[i];
    c.opt.fp32Gemm = codegen::Fp32Gemm::F64Mma;
    c.name.replace(c.name.find("_fp32_"), 6, "_f64_");
    cases.push_back(c);
  }
  const size_t count = cases.size();
  for (size_t i = 0; i < count; ++i) {
    if (!cases[i].opt.tf32) continue;
    GemmCase c = cases[i];
    c.opt.wgmma = true;
    c.name += "_wgmma";
    if (!c.problem.tb && c.opt.gemmTile != GemmTile::Auto) c.opt.tf32BLoad = codegen::Tf32BLoad::InKernel;
    cases.push_back(c);
    if (c.problem.tb) continue;
    c.opt.tf32BLoad = codegen::Tf32BLoad::Copy;
    c.name += "_bcopy";
    cases.push_back(c);
  }
  return cases;
}

// bf16 operands on the wgmma kernel (sm_90a): every tile and split, every transpose, batches and
// shared operands, FusedLinear epilogues, bf16 and fp32 outputs. Contiguous extents are multiples
// of 8 (the kernel's requirement); the other extents are awkward (1, 33, 129, 1000), K from 8 (a
// partial slice) up.
struct Bf16Case {
  std::string name;
  GemmProblem problem;
  codegen::EmitOptions opt;
  bool bf16Out = true;
  const char* special = nullptr;  // a product with an extent of 1: the kernel of its own it runs
};

std::vector<Bf16Case> bf16Cases() {
  using codegen::GemmTile;
  std::vector<Bf16Case> cases;
  auto add = [&](const std::string& base, const GemmProblem& p, GemmTile tile, bool bf16Out, int splits = 0, int sms = 0) {
    Bf16Case c;
    c.problem = p, c.bf16Out = bf16Out;
    c.opt.wgmma = true, c.opt.gemmTile = tile, c.opt.gemmSplits = splits;
    if (sms > 0) c.opt.sms = sms;
    c.name = base + "_" + tileName(tile) + (splits ? "_split" + std::to_string(splits) : "") + (bf16Out ? "_bf16out" : "_f32out") +
             (sms > 0 ? "_" + std::to_string(sms) + "sms" : "");
    cases.push_back(c);
  };
  const int64_t mnk[][3] = {{8, 8, 8}, {40, 136, 8}, {200, 264, 72}, {1000, 1000, 1000}, {136, 520, 4096}};
  for (const auto& s : mnk)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      // The non-contiguous extent of each operand made awkward where the shape allows.
      const int64_t m = ta ? s[0] : s[0] + 1, n = tb ? s[1] + 1 : s[1], k = s[2];
      const GemmProblem p = gemmtest::matmulProblem(m, n, k, ta, tb);
      const std::string base = "MatMul_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + (ta ? "_tA" : "") +
                               (tb ? "_tB" : "");
      for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) add(base, p, tile, t != 3);
      if (k >= 72) add(base, p, GemmTile::Small, true, 3);  // uneven split shares
      add(base, p, GemmTile::Auto, false);
      // Ping-pong consumers (see below) on the full grid and on 2 and 5 SMs.
      add(base, p, GemmTile::PingPong, t != 3);
      add(base, p, GemmTile::PingPong, t == 3, 0, 2);
      if (k >= 72) add(base, p, GemmTile::PingPong, true, 3, 5);
    }
  struct Batched {
    Shape a, b;
    bool ta, tb;
  };
  const Batched batched[] = {{{3, 33, 128}, {3, 128, 72}, false, false}, {{3, 136, 40}, {3, 72, 136}, true, true},
                             {{2, 3, 33, 64}, {64, 48}, false, false},    {{3, 136, 40}, {136, 72}, true, false},
                             {{33, 128}, {4, 128, 64}, false, false}};
  for (const Batched& bt : batched) {
    GemmProblem p;
    p.a = bt.a, p.b = bt.b, p.ta = bt.ta, p.tb = bt.tb;
    const std::string base = "MatMulBatched_" + dims(bt.a) + (bt.ta ? "T" : "") + "_" + dims(bt.b) + (bt.tb ? "T" : "");
    for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) add(base, p, tile, true);
    add(base, p, GemmTile::PingPong, true, 0, 3);
  }
  for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"})
    for (bool tw : {false, true}) {
      GemmProblem p;
      p.fused = true, p.act = act, p.bias = true, p.tb = tw;
      p.a = {5, 7, 136};
      p.b = tw ? Shape{1000, 136} : Shape{136, 1000};
      const std::string base = std::string("FusedLinear_") + act + (tw ? "_tW" : "") + "_35x1000x136";
      for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) add(base, p, tile, tile == GemmTile::Large);
      add(base, p, GemmTile::Small, true, 2);  // the epilogue in the split-K reduce
      // ... four elements a reduce thread (a grid that covers 2 SMs takes them; pairs: swiglu, rope)
      add(base, p, GemmTile::Small, true, 2, 2);
    }
  // MatMulActGrad on awkward and on whole tiles (x in bf16 with bf16 outputs, fp32 with fp32 ones;
  // N = 265: the staged epilogue's chunks of 4 columns one value at a time, x too), the epilogue
  // in the split-K reduce.
  for (const char* act : {"relu", "gelu"})
    for (const auto& s :
         {std::array<int64_t, 3>{201, 265, 72}, std::array<int64_t, 3>{200, 264, 72}, std::array<int64_t, 3>{256, 512, 64}}) {
      GemmProblem p = gemmtest::matmulProblem(s[0], s[1], s[2], false, true);
      p.gradAct = act;
      const std::string base = std::string("MatMulActGrad_") + act + "_" + dims(s) + "_tB";
      for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) add(base, p, tile, tile != GemmTile::Medium);
      add(base, p, GemmTile::Small, true, 3);
      add(base, p, GemmTile::PingPong, true, 0, 3);
      add(base, p, GemmTile::PingPong, false, 0, 2);
      add(base + "_fragments", p, GemmTile::PingPong, true, 0, 5);
      cases.back().opt.wgmmaEpilogue = codegen::WgmmaEpilogue::Fragments;
    }
  // Where the functor runs (EmitOptions::wgmmaEpilogue): every epilogue again with the placement
  // Auto does not pick for it (staged for none, relu and rope; on the fragments for gelu, swiglu
  // and the activation gradients), on awkward and whole tiles, bf16 and fp32 outputs.
  {
    for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"})
      for (const Shape& a : {Shape{5, 7, 136}, Shape{2, 128, 72}}) {
        GemmProblem p;
        p.fused = true, p.act = act, p.bias = true;
        p.a = a, p.b = {a.back(), a[1] == 7 ? int64_t{1000} : int64_t{512}};
        const bool staged = std::string(act) == "none" || std::string(act) == "relu" || std::string(act) == "rope";
        const std::string base = std::string("FusedLinear_") + act + "_" + dims(a) + (staged ? "_staged" : "_fragments");
        for (GemmTile tile : {GemmTile::Large, GemmTile::Medium}) {
          add(base, p, tile, tile == GemmTile::Large);
          cases.back().opt.wgmmaEpilogue = staged ? codegen::WgmmaEpilogue::Staged : codegen::WgmmaEpilogue::Fragments;
        }
      }
    for (const char* act : {"relu", "gelu"}) {
      GemmProblem p = gemmtest::matmulProblem(201, 265, 72, false, true);
      p.gradAct = act;
      for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) {
        add(std::string("MatMulActGrad_") + act + "_201x265x72_tB_fragments", p, tile, tile == GemmTile::Large);
        cases.back().opt.wgmmaEpilogue = codegen::WgmmaEpilogue::Fragments;
      }
    }
  }
  // Products with an extent of 1 on bf16 operands (kernels of their own, emit_gemm.cpp): a layer
  // to one output (the row dot), its weight gradient (the column product, with the bias's sum
  // too) and its input gradient (K = 1, the outer product: 16-byte stores of 8 values where the
  // rows hold whole ones), wide extents of whole 8s and not.
  for (const int64_t k : {136, 36})
    for (const char* act : {"none", "relu"}) {
      GemmProblem p;
      p.fused = true, p.act = act, p.bias = true;
      p.a = {3, 11, k}, p.b = {k, 1};
      add(std::string("FusedLinear_") + act + "_33x1x" + std::to_string(k), p, GemmTile::Auto, true);
      cases.back().special = "_rowdot";
    }
  for (const int64_t n : {264, 33}) {  // K = 1: the outer product, bf16 out (8 values a 16-byte store where n allows)
    add("MatMul_100x" + std::to_string(n) + "x1", gemmtest::matmulProblem(100, n, 1, false, false), GemmTile::Auto, true);
    cases.back().special = "_outer";
  }
  for (const int64_t m : {264, 33})
    for (const bool bias : {false, true}) {
      GemmProblem p = gemmtest::matmulProblem(m, 1, 1000, true, false);
      if (bias) p.biasGrad = "b";
      add("MatMul" + std::string(bias ? "BiasGrad" : "") + "_" + std::to_string(m) + "x1x1000_tA", p, GemmTile::Auto, false);
      cases.back().special = "_colprod";
    }
  // Weight gradients with the bias's sums (MatMulBiasGrad): the summed operand MN-major (A
  // transposed, or B as stored) summed inside the product, whole and split (the reduce kernel adds
  // the splits' fp64 partials), every tile, awkward and whole tiles, K with a partial slice; with
  // bf16 outputs the column-sum kernels after the product sum it instead.
  for (const char* operand : {"a", "b"})
    for (const auto& s : {std::array<int64_t, 3>{136, 264, 4000}, std::array<int64_t, 3>{256, 512, 2048}}) {
      GemmProblem p = gemmtest::matmulProblem(s[0], s[1], s[2], true, false);
      p.biasGrad = operand;
      const std::string base = std::string("MatMulBiasGrad_") + operand + "_" + dims(s) + "_tA";
      add(base, p, GemmTile::Auto, false);
      for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) add(base, p, tile, tile == GemmTile::Medium);
      add(base, p, GemmTile::Large, true, 3);
      add(base, p, GemmTile::Small, false, 7);
      // Ping-pong (see below): the sums by the item's consumer, on the full grid and on 2 and 3 SMs.
      add(base, p, GemmTile::PingPong, false);
      add(base, p, GemmTile::PingPong, false, 0, 3);
      add(base, p, GemmTile::PingPong, false, 3, 2);
      add(base, p, GemmTile::PingPong, true, 2);
    }
  {  // mlp_wide's last layer as training runs it (1024 × 256 over 8192 rows, tiles and splits from the shape)
    GemmProblem p = gemmtest::matmulProblem(1024, 256, 8192, true, false);
    p.biasGrad = "b";
    add("MatMulBiasGrad_b_1024x256x8192_tA", p, GemmTile::Auto, false);
  }
  // C stored by the consumers' threads (EmitOptions::wgmmaTmaStores off) where the default stores
  // it by TMA (rows of whole 16-byte chunks): awkward and whole tiles, split products (their
  // partial sums stored either way), a bias and ReLU epilogue, both output types.
  for (const auto& s : {std::array<int64_t, 3>{201, 264, 72}, std::array<int64_t, 3>{256, 512, 64}})
    for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) {
      const std::string base = "MatMul_" + dims(s) + "_threadstores";
      add(base, gemmtest::matmulProblem(s[0], s[1], s[2], false, false), tile, tile == GemmTile::Large);
      cases.back().opt.wgmmaTmaStores = false;
      add(base, gemmtest::matmulProblem(s[0], s[1], s[2], false, false), tile, true, 3);
      cases.back().opt.wgmmaTmaStores = false;
    }
  {
    GemmProblem p;
    p.fused = true, p.act = "relu", p.bias = true;
    p.a = {5, 7, 136}, p.b = {136, 1000};
    for (GemmTile tile : {GemmTile::Large, GemmTile::Medium}) {
      add("FusedLinear_relu_35x1000x136_threadstores", p, tile, tile == GemmTile::Large);
      cases.back().opt.wgmmaTmaStores = false;
    }
  }
  // Whole tiles (M and N multiples of every tile's; the epilogue's bounds tests compile away),
  // every epilogue, two batch entries of 128 rows.
  for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"}) {
    GemmProblem p;
    p.fused = true, p.act = act, p.bias = true;
    p.a = {2, 128, 72}, p.b = {72, 512};
    const std::string base = std::string("FusedLinear_") + act + "_256x512x72";
    for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) add(base, p, tile, tile != GemmTile::Medium);
  }
  {
    GemmProblem p;
    p.a = {2, 128, 64}, p.b = {2, 64, 256};
    for (GemmTile tile : {GemmTile::Large, GemmTile::Medium}) add("MatMulBatched_2x128x64_2x64x256", p, tile, true);
  }
  // The kernel is persistent: with the grid of a 2-SM device every block walks many work items,
  // and the ring's stages and phases carry on across tiles, batch entries and K splits.
  {
    GemmProblem p;
    p.a = {1001, 1000}, p.b = {1000, 1000};
    for (GemmTile tile : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) add("MatMul_1001x1000x1000", p, tile, true, 0, 2);
    GemmProblem dw;  // a weight gradient's shape: transposed A, long K
    dw.ta = true, dw.a = {4096, 136}, dw.b = {4096, 520};
    add("MatMul_136x520x4096_tA", dw, GemmTile::Large, false, 4, 2);
    add("MatMul_136x520x4096_tA", dw, GemmTile::Small, false, 3, 2);
    GemmProblem b;
    b.a = {3, 136, 200}, b.b = {3, 264, 136}, b.ta = true, b.tb = true;
    for (GemmTile tile : {GemmTile::Large, GemmTile::Small}) add("MatMulBatched_3x136x200T_3x264x136T", b, tile, true, 0, 2);
  }
  // Ping-pong consumers (GemmTile::PingPong: each consumer multiplies whole tiles, taking turns;
  // the transposes, batches, activation gradients and bias gradients above too): every epilogue
  // (staged and on the fragments), C by TMA and by the threads. On a grid of 2, 3 or 5
  // SMs the blocks take many items, even and odd numbers of them, so both consumers turn many
  // times and one of them may have an item less; on the full grid most blocks take one item (the
  // second consumer idles).
  for (const char* act : {"none", "relu", "gelu", "swiglu", "rope"})
    for (const Shape& a : {Shape{5, 7, 136}, Shape{2, 128, 72}, Shape{4, 250, 64}}) {
      GemmProblem p;
      p.fused = true, p.act = act, p.bias = true, p.tb = a[0] == 2;
      p.a = a;
      p.b = p.tb ? Shape{a[1] == 128 ? int64_t{512} : int64_t{1000}, a.back()} : Shape{a.back(), int64_t{1000}};
      const std::string base = std::string("FusedLinear_") + act + (p.tb ? "_tW_" : "_") + dims(a);
      add(base, p, GemmTile::PingPong, a[0] != 4, 0, a[0] == 5 ? 0 : 3);
      add(base + "_fragments", p, GemmTile::PingPong, a[0] == 4, 0, 2);
      cases.back().opt.wgmmaEpilogue = codegen::WgmmaEpilogue::Fragments;
      add(base + "_staged", p, GemmTile::PingPong, true, 0, 5);
      cases.back().opt.wgmmaEpilogue = codegen::WgmmaEpilogue::Staged;
      add(base, p, GemmTile::PingPong, true, 2, 2);  // the epilogue in the split-K reduce
    }
  for (const auto& s : {std::array<int64_t, 3>{201, 264, 72}, std::array<int64_t, 3>{256, 512, 64}}) {
    add("MatMul_" + dims(s) + "_threadstores", gemmtest::matmulProblem(s[0], s[1], s[2], false, false), GemmTile::PingPong, true, 0, 2);
    cases.back().opt.wgmmaTmaStores = false;
  }
  {
    GemmProblem p;
    p.a = {1001, 1000}, p.b = {1000, 1000};
    add("MatMul_1001x1000x1000", p, GemmTile::PingPong, true, 0, 2);
    add("MatMul_1001x1000x1000", p, GemmTile::PingPong, false, 0, 3);
  }
  return cases;
}

NodeId buildBf16Graph(Graph& g, const Bf16Case& c) {
  const NodeId id = gemmtest::buildGraph(g, c.problem);
  gemmtest::storeOperandsInBf16(g, id, c.bf16Out);
  return id;
}

// The parameter names of the tests of `suite` that run (gtest applies --gtest_filter before the
// environments' SetUp).
std::set<std::string> runningCases(const std::string& suite) {
  std::set<std::string> names;
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < u.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& ts = *u.GetTestSuite(i);
    if (suite != ts.name()) continue;
    for (int j = 0; j < ts.total_test_count(); ++j)
      if (ts.GetTestInfo(j)->should_run()) {
        const std::string name = ts.GetTestInfo(j)->name();
        names.insert(name.substr(name.rfind('/') + 1));
      }
  }
  return names;
}

// Compiles the kernels of every case that runs on all cores up front (through the same kernel
// cache request that CudaModule makes), so that the tests themselves only hit the in-memory cache.
class PrecompileEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    if (!cuda::Driver::instance().available()) return;
    std::vector<std::string> sources;
    const std::string arch = device().info().arch();
    const std::set<std::string> generated = runningCases("Variants/GemmOnGpu"), wgmma = runningCases("Wgmma/GemmBf16OnGpu");
    for (const GemmCase& c : allCases()) {
      if ((c.opt.wgmma && arch != "sm_90a") || !generated.count(c.name)) continue;
      Graph g;
      const NodeId id = gemmtest::buildGraph(g, c.problem);
      for (const codegen::Kernel& k : codegen::emitNode(g, id, c.opt).kernels) sources.push_back(codegen::selfContainedSource(k));
    }
    if (arch == "sm_90a")
      for (const Bf16Case& c : bf16Cases()) {
        if (!wgmma.count(c.name)) continue;
        Graph g;
        const NodeId id = buildBf16Graph(g, c);
        for (const codegen::Kernel& k : codegen::emitNode(g, id, c.opt).kernels) sources.push_back(codegen::selfContainedSource(k));
      }
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::vector<std::thread> pool;
    const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (size_t i = next++; i < sources.size(); i = next++) {
          codegen::CompileRequest req;
          req.kernelName = "module";
          req.source = sources[i];
          req.arch = arch;
          try {
            codegen::KernelCache::instance().compile(req);
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(mu);
            std::fprintf(stderr, "precompile: %s\n", e.what());  // the test itself reports it again
          }
        }
      });
    for (std::thread& t : pool) t.join();
  }
};
[[maybe_unused]] const auto* const kPrecompile = ::testing::AddGlobalTestEnvironment(new PrecompileEnvironment);

struct Errors {
  double worst = 0, scale = 0;
  bool finite = true;
};

Errors compare(const std::vector<float>& got, const std::vector<double>& want) {
  Errors e;
  for (size_t i = 0; i < want.size(); ++i) {
    e.finite &= std::isfinite(got[i]);
    e.worst = std::max(e.worst, std::fabs(got[i] - want[i]));
    e.scale = std::max(e.scale, std::fabs(want[i]));
  }
  return e;
}

// MatMulActGrad's output carries its product's error times the derivative (|relu'|, |gelu'| ≤ 1.1
// for |x| ≤ 1): its bar is relative to 1.1 × the largest |product| (reference()'s last vector),
// which may exceed the largest |output| (the derivative shrinks or zeroes many elements).
Errors actGradErrors(Errors e, const std::vector<double>& product) {
  for (double v : product) e.scale = std::max(e.scale, 1.1 * std::fabs(v));
  return e;
}

// Output `o` of case `name` within `bar` × its largest |reference|, every element written; the
// large products print their error for the logs.
void expectWithin(const Errors& e, double bar, size_t o, const std::string& name, bool report) {
  EXPECT_TRUE(e.finite) << "output " << o << " has NaN/inf (unwritten elements?)";
  EXPECT_LE(e.worst, bar * std::max(e.scale, 1e-30)) << "output " << o << ": max |err| " << e.worst << ", max |ref| " << e.scale
                                                     << ", relative " << e.worst / std::max(e.scale, 1e-30);
  if (report) std::printf("  %s output %zu: relative error %.2e (bar %.0e)\n", name.c_str(), o, e.worst / e.scale, bar);
}

// SwiGLU's h = silu(g)·u from (gate, up) pre-activations `pre` (float64 reference): the products
// carry the bar of their GEMM (bar × max |pre| each), which h inherits through its derivatives,
// |Δh| ≤ (|∂h/∂g| + |∂h/∂u|) · bar · max |pre| element by element; relative to max |h| alone that
// can exceed the bar (h is a product of two sums).
void expectSwigluWithin(const std::vector<float>& got, const std::vector<double>& pre, double bar) {
  double maxPre = 0, worst = 0;
  for (double v : pre) maxPre = std::max(maxPre, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    const double gt = pre[2 * i], u = pre[2 * i + 1], s = 1.0 / (1.0 + std::exp(-gt));
    const double h = gt * s * u, dg = std::fabs(u * s * (1.0 + gt * (1.0 - s))), du = std::fabs(gt * s);
    ASSERT_TRUE(std::isfinite(got[i])) << "h[" << i << "] is not finite (unwritten?)";
    worst = std::max(worst, std::fabs(got[i] - h) / ((dg + du) * bar * maxPre + 1e-30));
  }
  EXPECT_LE(worst, 1.0) << "swiglu output: worst error in units of the propagated bar";
}

// Rope turns column pairs, which keeps each pair's Euclidean norm: an error within bar·max|pre| per
// element is at most √2·bar·max|pre| per pair after the turn, and max|pre| ≤ √2·max|out| (a
// pair's larger element is at least its norm/√2), so the bar relative to max|out| doubles.
double ropeFactor(const Node& n) {
  return n.op == OpKind::FusedLinear && n.attrs.get<attr::Activation>() == "rope" ? 2.0 : 1.0;
}

// Uploads fresh random inputs (seeds `seed` + input index) to a one-node graph's runner, runs
// it, and returns every output's errors against the float64 reference.
std::vector<Errors> runAgainstReference(CudaGraphRunner& runner, const Graph& g, NodeId id, uint64_t seed) {
  const Node& n = g.node(id);
  std::vector<std::vector<float>> in;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    in.push_back(gemmtest::randomValues(numel(g.shape(n.inputs[i])), seed + i));
    runner.upload(n.inputs[i], in.back().data());
  }
  runner.run();
  const auto want = gemmtest::reference(g, id, in);
  std::vector<Errors> errors;
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    std::vector<float> got(want[o].size());
    runner.download(n.outputs[o], got.data());
    errors.push_back(n.op == OpKind::MatMulActGrad ? actGradErrors(compare(got, want[o]), want[1]) : compare(got, want[o]));
  }
  return errors;
}

class GemmOnGpu : public ::testing::TestWithParam<GemmCase> {};

// The FP64 kernel's bar (relative to the largest |output|): its products are exact and its sums
// fp64, so what is left is fp32 rounding after the sums: each of S split partial sums rounded, the
// reduce's S additions, the output's rounding and the epilogue's operations (the bias, an
// activation: a few ulp), (2·S + 4)·2^-24 relative to the values involved, doubled because a
// partial sum may exceed the largest output. Far below the SIMT kernel's 1e-5, and a SIMT kernel
// in its place would miss it on the large products.
double f64Bar(const GemmCase& c, const Graph& g, NodeId id) {
  int splits = c.opt.gemmSplits > 0 ? c.opt.gemmSplits : 1;
  if (c.opt.gemmTile == codegen::GemmTile::Auto) {
    const codegen::LibraryGemm lg = codegen::libraryGemmOf(g, id);
    splits = codegen::chooseF64Gemm(lg.geometry.batch, lg.geometry.m, lg.geometry.n, lg.geometry.k).second;
  }
  return 2.0 * (2.0 * splits + 4.0) * std::ldexp(1.0, -24);
}

// fp32 arithmetic with blocked sums lands far below 1e-5 of the largest |output| (K ≤ 8192:
// (64 + K/64)·2^-24 ≈ 1e-5 in the worst case of same-signed terms; random signs give ~1e-7).
// TF32 rounds every operand to 11 significant bits (relative 2^-12 each), ~2e-4 of the
// largest output for these random sums; the bar is 1e-3.
TEST_P(GemmOnGpu, MatchesFloat64Reference) {
  PA_REQUIRE_GPU();
  const GemmCase& c = GetParam();
  if (c.opt.wgmma && device().info().arch() != "sm_90a") GTEST_SKIP() << "the wgmma kernel needs an sm_90a device";
  Graph g;
  const NodeId id = gemmtest::buildGraph(g, c.problem);
  gemmtest::NodeOnGpu gpu(g, id, c.opt, device());
  // Products with an extent of 1 run kernels of their own on every path (emit_gemm.cpp): Aᵀ·B of
  // one column the column product, K = 1 the outer product, a FusedLinear to one output (none or
  // relu) the row dot; every other case runs the kernel its options name.
  const Node& node = g.node(id);
  const Shape& out0 = g.shape(node.outputs[0]);
  const Shape& a0 = g.shape(node.inputs[0]);
  const bool fused = node.op == OpKind::FusedLinear;
  const bool columnProduct = !fused && c.problem.ta && !c.problem.tb && out0.back() == 1 && out0.size() == 2;
  const bool outerProduct = !fused && !columnProduct && (c.problem.ta ? a0[a0.size() - 2] : a0.back()) == 1 && a0.size() == 2;
  const bool rowDot = fused && out0.back() == 1 && (c.problem.act == "none" || c.problem.act == "relu");
  const char* special = columnProduct ? "_colprod" : outerProduct ? "_outer" : rowDot ? "_rowdot" : nullptr;
  if (special) {
    ASSERT_EQ(gpu.kernels().kernels.size(), 1u);
    EXPECT_NE(gpu.kernels().kernels[0].name.find(special), std::string::npos) << gpu.kernels().kernels[0].name;
  }
  if (c.opt.wgmma && !special) {  // K a multiple of 4: the TF32 wgmma kernel, else the mma.sync one
    const Shape& a = g.shape(g.node(id).inputs[0]);
    const int64_t k = c.problem.ta ? a[a.size() - 2] : a.back();
    bool wgmma = false;
    for (const codegen::Kernel& kk : gpu.kernels().kernels) wgmma |= kk.source.find("pa::gemm::wgmmaGemm<") != std::string::npos;
    EXPECT_EQ(wgmma, k % 4 == 0) << "K = " << k;
  }
  const bool f64 = c.opt.fp32Gemm == codegen::Fp32Gemm::F64Mma;
  if (f64 && !special) {
    bool found = false;
    for (const codegen::Kernel& kk : gpu.kernels().kernels) found |= kk.source.find("pa::gemm::f64Gemm<") != std::string::npos;
    EXPECT_TRUE(found) << "the case should run the FP64 kernel";
  }
  const Node& n = g.node(id);
  std::vector<std::vector<float>> in;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    in.push_back(gemmtest::randomValues(numel(g.shape(n.inputs[i])), std::hash<std::string>{}(c.name) + i));
    gpu.inputs[i].upload(in.back().data(), in.back().size() * sizeof(float));
  }
  for (cuda::DeviceBuffer& o : gpu.outputs) o.fill32(0x7fc00000u);  // NaN: catches unwritten elements
  gpu.launch();
  PA_CU_CHECK(cuCtxSynchronize());
  const auto want = gemmtest::reference(g, id, in);
  const double bar = c.opt.tf32 ? 1e-3 : f64 ? f64Bar(c, g, id) : 1e-5;
  const bool swiglu = n.op == OpKind::FusedLinear && n.attrs.get<attr::Activation>() == "swiglu";
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    std::vector<float> got(want[o].size());
    gpu.outputs[o].download(got.data(), got.size() * sizeof(float));
    if (swiglu && o == 0) expectSwigluWithin(got, want[1], bar);
    else if (n.op == OpKind::MatMulActGrad) expectWithin(actGradErrors(compare(got, want[o]), want[1]), bar, o, c.name, false);
    else expectWithin(compare(got, want[o]), bar * ropeFactor(n), o, c.name, numel(g.shape(n.outputs[0])) >= (1 << 20));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmOnGpu, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<GemmCase>& i) { return i.param.name; });

// The wgmma kernel against float64 products of the same bf16 inputs. Every product of two bf16
// values is exact in fp32 and the tensor cores sum in fp32, so fp32 outputs carry only the
// summation's rounding (K ≤ 4096 terms; even a truncating accumulator stays below K·2^-23 of the
// sum of |terms|, ~1e-4 of the largest output for these random inputs): bar 1e-3. bf16 outputs
// add one rounding to 8 bits (2^-9 relative): the bf16 bar, 1e-2.
class GemmBf16OnGpu : public ::testing::TestWithParam<Bf16Case> {};

TEST_P(GemmBf16OnGpu, MatchesFloat64Reference) {
  PA_REQUIRE_GPU();
  if (device().info().arch() != "sm_90a") GTEST_SKIP() << "the wgmma kernel needs an sm_90a device";
  const Bf16Case& c = GetParam();
  Graph g;
  const NodeId id = buildBf16Graph(g, c);
  gemmtest::NodeOnGpu gpu(g, id, c.opt, device());
  if (c.special) {
    ASSERT_EQ(gpu.kernels().kernels.size(), 1u);
    EXPECT_NE(gpu.kernels().kernels[0].name.find(c.special), std::string::npos) << gpu.kernels().kernels[0].name;
  } else {
    bool wgmma = false;
    for (const codegen::Kernel& k : gpu.kernels().kernels) wgmma |= k.source.find("pa::gemm::wgmmaGemm<") != std::string::npos;
    ASSERT_TRUE(wgmma) << "the case should run the wgmma kernel";
  }
  const Node& n = g.node(id);
  std::vector<std::vector<float>> in;  // the values the GPU sees: operands rounded to bf16
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    in.push_back(gemmtest::randomValues(numel(g.shape(n.inputs[i])), std::hash<std::string>{}(c.name) + i));
    gemmtest::uploadStored(gpu.inputs[i], in.back(), g.value(n.inputs[i]).type.dtype);
  }
  const auto want = gemmtest::reference(g, id, in);
  // Twice, with the outputs poisoned before each: a launch leaves nothing behind that the next
  // depends on (the persistent blocks' barriers, the split-K partial sums), and the outputs are
  // bit-identical.
  std::vector<std::vector<float>> first(n.outputs.size());
  for (int launch = 0; launch < 2; ++launch) {
    for (cuda::DeviceBuffer& o : gpu.outputs) o.fill32(0x7fc07fc0u);  // NaN in fp32 and in bf16: catches unwritten elements
    gpu.launch();
    PA_CU_CHECK(cuCtxSynchronize());
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      std::vector<float> got(want[o].size());
      if (g.value(n.outputs[o]).type.dtype == DType::BF16) {
        std::vector<uint16_t> bits(got.size());
        gpu.outputs[o].download(bits.data(), bits.size() * sizeof(uint16_t));
        for (size_t j = 0; j < bits.size(); ++j) got[j] = bf16Value(bits[j]);
      } else {
        gpu.outputs[o].download(got.data(), got.size() * sizeof(float));
      }
      const double bar = g.value(n.outputs[o]).type.dtype == DType::BF16 ? 1e-2 : 1e-3;
      const Errors e = n.op == OpKind::MatMulActGrad ? actGradErrors(compare(got, want[o]), want[1]) : compare(got, want[o]);
      expectWithin(e, bar * ropeFactor(n), o, c.name + (launch ? " (second launch)" : ""), numel(g.shape(n.outputs[0])) >= (1 << 19));
      if (launch == 0) first[o] = got;
      else EXPECT_EQ(std::memcmp(got.data(), first[o].data(), got.size() * sizeof(float)), 0) << "output " << o << " differs between launches";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wgmma, GemmBf16OnGpu, ::testing::ValuesIn(bf16Cases()),
                         [](const ::testing::TestParamInfo<Bf16Case>& i) { return i.param.name; });

// The default (fp32, tiles from the shape) through the graph runner, as training uses it.
TEST(GemmOnGpuRunner, DefaultKernelsThroughCudaGraphRunner) {
  PA_REQUIRE_GPU();
  GemmProblem mm;
  mm.a = {257, 1000}, mm.b = {129, 1000}, mm.tb = true;
  GemmProblem fl;
  fl.fused = true, fl.a = {4, 33, 64}, fl.b = {64, 100}, fl.act = "gelu", fl.bias = true;
  for (const GemmProblem& p : {mm, fl}) {
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    const Node& n = g.node(id);
    CudaGraphRunner runner(g, device());
    const Errors e = runAgainstReference(runner, g, id, 77)[0];
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.worst, 1e-5 * e.scale) << opName(n.op);
  }
}

// The cuBLASLt provider (compiler.gemm: cublaslt) on every problem of the generated kernels'
// list, once per precision: the row-major to column-major mapping, batches and shared operands,
// the bias and ReLU it applies, and the GELU / saved pre-activation kernel after it. Same
// float64 reference and bars (cuBLASLt's fp32 is exact fp32; its TF32 rounds like ours).
class GemmOnCublasLt : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmOnCublasLt, MatchesFloat64Reference) {
  PA_REQUIRE_GPU();
  if (!cuda::CublasLt::instance().available()) GTEST_SKIP() << cuda::CublasLt::instance().unavailableReason();
  const GemmCase& c = GetParam();
  Graph g;
  const NodeId id = gemmtest::buildGraph(g, c.problem);
  CudaRunnerOptions opt;
  opt.tf32 = c.opt.tf32;
  opt.gemm = GemmProvider::Cublaslt;
  CudaGraphRunner runner(g, device(), opt);
  ASSERT_EQ(runner.gemmProviderOf(id), "cublaslt");
  const std::vector<Errors> errors = runAgainstReference(runner, g, id, std::hash<std::string>{}(c.name));
  const double bar = (c.opt.tf32 ? 1e-3 : 1e-5) * ropeFactor(g.node(id));
  for (size_t o = 0; o < errors.size(); ++o) {
    const Errors& e = errors[o];
    EXPECT_TRUE(e.finite) << "output " << o;
    EXPECT_LE(e.worst, bar * std::max(e.scale, 1e-30)) << "output " << o << ": max |err| " << e.worst << ", max |ref| "
                                                       << e.scale << ", relative " << e.worst / std::max(e.scale, 1e-30);
  }
}

std::vector<GemmCase> cublasLtCases() {
  std::vector<GemmCase> out;
  for (GemmCase c : allCases())
    if (c.opt.gemmTile == codegen::GemmTile::Large && c.opt.gemmSplits == 0 && c.opt.gemmTailSplits == 0 && !c.opt.wgmma &&
        c.opt.fp32Gemm != codegen::Fp32Gemm::F64Mma) {
      c.name = c.name.substr(0, c.name.rfind("_large"));
      out.push_back(c);
    }
  return out;
}

// The transposed-B products again with B copied untransposed first (the autotuner's other
// layout; forced here, measured in training).
TEST(GemmOnCublasLtTransposedB, MatchesFloat64Reference) {
  PA_REQUIRE_GPU();
  if (!cuda::CublasLt::instance().available()) GTEST_SKIP() << cuda::CublasLt::instance().unavailableReason();
  int ran = 0;
  for (const GemmCase& c : cublasLtCases()) {
    if (!c.problem.tb) continue;
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, c.problem);
    const codegen::LibraryGemm lg = codegen::libraryGemmOf(g, id);
    if (lg.geometry.batch != 1 || lg.geometry.k * 4 > lg.geometry.m) continue;  // no copy variant
    SCOPED_TRACE(c.name);
    CudaRunnerOptions opt;
    opt.tf32 = c.opt.tf32;
    opt.gemm = GemmProvider::Cublaslt;
    opt.forceTransposedB = true;
    CudaGraphRunner runner(g, device(), opt);
    ASSERT_EQ(runner.gemmChoices().size(), 1u);
    EXPECT_TRUE(runner.gemmChoices()[0].transposedB);
    const std::vector<Errors> errors = runAgainstReference(runner, g, id, std::hash<std::string>{}(c.name) + 5);
    const double bar = (c.opt.tf32 ? 1e-3 : 1e-5) * ropeFactor(g.node(id));
    for (size_t o = 0; o < errors.size(); ++o) {
      const Errors& e = errors[o];
      EXPECT_TRUE(e.finite);
      EXPECT_LE(e.worst, bar * std::max(e.scale, 1e-30)) << "output " << o << " relative " << e.worst / e.scale;
    }
    ++ran;
  }
  EXPECT_GE(ran, 4);
  std::printf("  %d transposed-B problems through the copy variant\n", ran);
}

INSTANTIATE_TEST_SUITE_P(Problems, GemmOnCublasLt, ::testing::ValuesIn(cublasLtCases()),
                         [](const ::testing::TestParamInfo<GemmCase>& i) { return i.param.name; });

// compiler.gemm: auto measures both providers per node and keeps the faster; either way the
// result is the product, and a second runner takes the choice from the autotune cache.
TEST(GemmOnGpuRunner, AutoChoosesAProviderAndCachesIt) {
  PA_REQUIRE_GPU();
  if (!cuda::CublasLt::instance().available()) GTEST_SKIP() << cuda::CublasLt::instance().unavailableReason();
  GemmProblem p;
  p.fused = true, p.a = {1024, 512}, p.b = {512, 768}, p.act = "relu", p.bias = true;
  Graph g;
  const NodeId id = gemmtest::buildGraph(g, p);
  CudaRunnerOptions opt;
  opt.gemm = GemmProvider::Auto;
  std::string first;
  for (int round = 0; round < 2; ++round) {
    CudaGraphRunner runner(g, device(), opt);
    const CudaGraphRunner::GemmStats& st = runner.gemmStats();
    EXPECT_EQ(st.library + st.generated, 1);
    if (round == 0) first = runner.gemmProviderOf(id);
    else {
      EXPECT_EQ(st.cached, 1) << "the second runner should reuse the first one's choice";
      EXPECT_EQ(runner.gemmProviderOf(id), first);
    }
    const Errors e = runAgainstReference(runner, g, id, 91)[0];
    EXPECT_LE(e.worst, 1e-5 * e.scale) << runner.gemmProviderOf(id);
    std::printf("  auto chose %s for 1024x768x512 bias+relu\n", runner.gemmProviderOf(id).c_str());
  }
}

// Tile tuning (CudaRunnerOptions::tuneGemmTiles, on by default): the runner times the emitter's
// tiles against the other variants, runs the fastest, and a second runner takes the choice from
// the autotune cache. Either way the node computes the product: fp32 on any GPU, and bf16
// operands (the wgmma kernel's variants on an sm_90a device) against the float64 product of the
// unrounded inputs (bf16 rounding of both operands: ~2^-9 relative each, bar 1e-2).
TEST(GemmOnGpuRunner, TileTuningRunsTheFastestVariantAndCachesIt) {
  PA_REQUIRE_GPU();
  for (bool bf16 : {false, true}) {
    GemmProblem p;
    p.fused = true, p.a = {2048, 512}, p.b = {512, 776}, p.act = "gelu", p.bias = true;
    Graph g;
    const NodeId id = gemmtest::buildGraph(g, p);
    if (bf16) gemmtest::storeOperandsInBf16(g, id, false);
    CudaRunnerOptions opt;
    opt.gemm = GemmProvider::Generated;
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " round " + std::to_string(round));
      CudaGraphRunner runner(g, device(), opt);
      const CudaGraphRunner::GemmStats& st = runner.gemmStats();
      EXPECT_EQ(st.tilesMeasured + st.tilesCached, 1);
      if (round == 1) {
        EXPECT_EQ(st.tilesCached, 1) << "the second runner should reuse the first one's tiles";
      }
      const std::vector<Errors> errors = runAgainstReference(runner, g, id, 123);
      for (size_t o = 0; o < errors.size(); ++o) {
        EXPECT_TRUE(errors[o].finite) << "output " << o;
        EXPECT_LE(errors[o].worst, (bf16 ? 1e-2 : 1e-5) * errors[o].scale) << "output " << o;
      }
      std::printf("  %s round %d: tiles %s\n", bf16 ? "bf16" : "fp32", round,
                  st.tilesChanged ? "changed from the shape's default" : "the shape's default");
    }
  }
  // A weight gradient Aᵀ·B (K = 8192 on 16 large tiles, split by default): whichever variant wins
  // computes the product.
  Graph g;
  const NodeId id = gemmtest::buildGraph(g, gemmtest::matmulProblem(256, 1024, 8192, true, false));
  CudaRunnerOptions opt;
  opt.gemm = GemmProvider::Generated;
  CudaGraphRunner runner(g, device(), opt);
  EXPECT_EQ(runner.gemmStats().tilesMeasured + runner.gemmStats().tilesCached, 1);
  const Errors e = runAgainstReference(runner, g, id, 131)[0];
  EXPECT_TRUE(e.finite);
  EXPECT_LE(e.worst, 1e-5 * e.scale);
  std::printf("  weight gradient 256x1024x8192: tiles %s\n", runner.gemmStats().tilesChanged ? "changed from the shape's default" : "the shape's default");
}

// compiler.gemm auto: cuBLASLt's candidates are timed (the product alone) while the kernels
// compile, and the provider choice times the fastest as the whole node; a second runner takes
// the choice from the cache and times nothing beside. Either way the node computes the product.
TEST(GemmOnGpuRunner, CublasLtCandidatesAreTimedBesideTheCompile) {
  PA_REQUIRE_GPU();
  if (!cuda::CublasLt::instance().available()) GTEST_SKIP() << cuda::CublasLt::instance().unavailableReason();
  GemmProblem p;
  p.fused = true, p.a = {1000, 384}, p.b = {384, 520}, p.act = "relu", p.bias = true;
  Graph g;
  const NodeId id = gemmtest::buildGraph(g, p);
  CudaRunnerOptions opt;
  opt.gemm = GemmProvider::Auto;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    CudaGraphRunner runner(g, device(), opt);
    const CudaGraphRunner::GemmStats& st = runner.gemmStats();
    EXPECT_EQ(st.measured + st.cached, 1);
    if (round == 0 && st.cached == 0) {
      EXPECT_EQ(st.timedBeside, 1) << "the provider choice was measured, so its candidates should have been timed beside";
      ASSERT_EQ(runner.gemmChoices().size(), 1u);
      EXPECT_GT(runner.gemmChoices()[0].libraryMs, 0);
      EXPECT_GT(runner.gemmChoices()[0].generatedMs, 0);
    } else if (round == 0) {
      std::printf("  the choice was cached by an earlier run: the timing beside is not exercised\n");
    }
    if (round == 1) {
      EXPECT_EQ(st.cached, 1);
      EXPECT_EQ(st.timedBeside, 0) << "a cached choice needs no timing";
    }
    const std::vector<Errors> errors = runAgainstReference(runner, g, id, 83 + static_cast<uint64_t>(round));
    for (size_t o = 0; o < errors.size(); ++o) {
      EXPECT_TRUE(errors[o].finite) << "output " << o;
      EXPECT_LE(errors[o].worst, 1e-5 * errors[o].scale) << "output " << o;
    }
  }
}

}  // namespace
}  // namespace pa
