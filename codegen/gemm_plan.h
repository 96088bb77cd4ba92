// The GEMM plan: which generated kernel, tile variant and K splits a product gets from its shape.
// Pure heuristics (no source text, no NVRTC); codegen/emit_gemm.cpp turns a plan into kernels.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace pa::codegen {

// The tile variant of a generated GEMM (MatMul, FusedLinear); Auto picks one from the shape.
// Tests and benchmarks force the others. PingPong: the bf16 wgmma kernel's 128 × 128 tiles, each
// multiplied by one consumer warpgroup while the other runs its epilogue (kernels/gemm_wgmma.cuh);
// elsewhere (the other kernels) Medium. The runner's tile autotuning measures it beside the
// others; Auto does not pick it.
enum class GemmTile { Auto, Large, Medium, Small, PingPong };

// Which kernel multiplies fp32 operands under precision fp32 (EmitOptions::fp32Gemm): the SIMT
// kernel (kernels/gemm_simt.cuh) or the FP64 tensor cores (kernels/gemm_tf32.cuh, "Note on the
// FP64 path"); Auto: FP64 where the target runs it at full rate.
enum class Fp32Gemm { Auto, Simt, F64Mma };

// How a TF32 wgmma GEMM gets an N-major B into the K-major layout it reads (EmitOptions::tf32BLoad).
enum class Tf32BLoad { Auto, Copy, InKernel };

// Where the wgmma GEMM runs its epilogue functor (EmitOptions::wgmmaEpilogue; kernels/gemm_common.cuh,
// "Where the wgmma kernel runs the functor"): on the fragments in registers, or on the staged raw
// sums; Auto: staged for the epilogues that read or write more than C (codegen/emit_gemm.cpp's
// GemmEpilogue::moreThanC).
enum class WgmmaEpilogue { Auto, Fragments, Staged };

// A GEMM node's product in row-major terms: C[b] = op(A[b])·op(B[b]), M×N over K, where A is the
// node's input 0 and B its input 1; a stride of 0 shares one matrix across the batch.
struct GemmGeometry {
  int64_t batch = 1, m = 0, n = 0, k = 0, strideA = 0, strideB = 0;
  bool transA = false, transB = false;
};

// The device the cost models assume: an H100 SXM. The choices need only the right magnitudes (the
// runner's autotuner measures the tile variants where it matters); the rates are whole-GPU
// throughputs measured on that device, listed with their measurements in bench/RESULTS.md ("The
// GEMM plan's constants").
namespace h100 {
constexpr int64_t kSms = 132;
constexpr int64_t kFullWave = kSms * 9 / 10;  // blocks that count as a wave (~90% of the SMs)
constexpr double kSimtFlops = 40e12;          // fp32 SIMT, large tiles filling the GPU
constexpr double kSimtTailFlops = 45e12;      // fp32 SIMT, one large tile as the tail model times it
constexpr double kTf32MmaFlops = 110e12;      // TF32 mma.sync, large tiles filling the GPU
constexpr double kTf32MmaSplitFlops = 45e12;  // TF32 mma.sync on split weight gradients (small M×N, long K)
constexpr double kWgmmaLargeFlops = 768e12;   // bf16 wgmma, large tiles (one block an SM)
constexpr double kWgmmaMediumFlops = 582e12;  // bf16 wgmma, medium tiles (one block an SM)
constexpr double kWgmmaSmallFlops = 502e12;   // bf16 wgmma, small tiles (two blocks an SM)
constexpr double kTf32WgmmaFlops = 365e12;    // TF32 wgmma, both operands read by TMA
constexpr double kTf32WgmmaTransposingFlops = 160e12;  // TF32 wgmma whose producer transposes B
constexpr double kMemoryBytesPerSecond = 2.5e12;  // what a reduce or copy kernel streams
constexpr double kSplitReduceStart = 2e-6;        // a split-K reduce kernel's fixed cost (SIMT / mma.sync model)
constexpr double kKernelStart = 3e-6;             // a reduce or copy kernel's fixed cost (tail, wgmma, copies)
constexpr double kTailPieceStart = 3e-6;          // a tail piece's start and store
constexpr double kWgmmaBlockStart = 2e-6;         // a wgmma block's pipeline fill and epilogue
}  // namespace h100

// One generated GEMM kernel's tile variant.
struct GemmVariant {
  std::string config;  // the kernels/gemm_{simt,tf32,wgmma}.cuh config type
  int bm, bn, threads, minBlocks;  // minBlocks: __launch_bounds__'s blocks per SM
  // Dynamic shared memory: fp32, the config's kDynamicShared (checked in the kernel); wgmma, its
  // ring and staging; TF32 and FP64 mma.sync, none (static tiles).
  unsigned sharedBytes = 0;
};

// K of one blocked-summation chunk in every fp32 SIMT config (kernels/gemm_simt.cuh, "Blocked
// summation"): SimtConfig's slices per chunk are this over BK.
constexpr int64_t kBlockedSumK = 64;

// SimtConfig<BM, BN, BK, TM, TN, slices per chunk> with its dynamic shared memory as
// SimtConfig::kDynamicShared computes it.
GemmVariant simtVariant(int bm, int bn, int bk, int tm, int tn, int minBlocks);
// The fp32 SIMT (tf32: TF32 mma.sync) variant of `tile` (not Auto).
GemmVariant gemmVariant(bool tf32, GemmTile tile);
// The FP64 mma.sync variant of `tile` (not Auto): the TF32 tiles and ring, one block an SM's worth
// of registers.
GemmVariant f64Variant(GemmTile tile);
// The wgmma variant of `tile` (not Auto): bf16 operands, or fp32 ones on TF32 with `tf32`.
GemmVariant wgmmaVariant(GemmTile tile, bool tf32);

// Output tiles of an M×N product with t×t (bm×bn) tiles.
int64_t tilesOf(int64_t m, int64_t n, int64_t t);
int64_t tilesOf(int64_t m, int64_t n, int64_t bm, int64_t bn);

// The SIMT / mma.sync choice: tile variant and K splits (1: none) of a product. See the note in
// gemm_plan.cpp.
std::pair<GemmTile, int> chooseGemm(bool tf32, int64_t batch, int64_t m, int64_t n, int64_t k);
// The FP64 mma.sync choice: chooseGemm's SIMT plan, except that a product split on large tiles
// takes the split count that fills one wave of one block an SM (any count, not only powers of
// two), keeping at least 128 of K a split. See the note in gemm_plan.cpp.
std::pair<GemmTile, int> chooseF64Gemm(int64_t batch, int64_t m, int64_t n, int64_t k);
// The estimated time of a SIMT / mma.sync product with `tile` tiles and K split `splits` ways.
double splitCost(bool tf32, GemmTile tile, int64_t m, int64_t n, int64_t k, int64_t splits);

// The wgmma choice: tile variant and K splits of a product (kernel geometry: M, N of the product
// the kernel computes).
std::pair<GemmTile, int> chooseWgmma(int64_t batch, int64_t m, int64_t n, int64_t k);
double wgmmaSplitCost(GemmTile tile, int64_t m, int64_t n, int64_t k, int64_t splits);

// Tail split of a large-tile fp32 product (see the note in gemm_plan.cpp).
struct TailSplit {
  int64_t tiles = 0;  // the last `tiles` tiles (tileOf order) ...
  int splits = 1;     // ... split this many ways along K; 1: none
};
// K of one tail piece: whole blocked-sum chunks, so S splits give ⌈K / piece⌉ pieces a tile, which
// may be fewer than S.
int64_t tailPieceK(int64_t k, int64_t splits);
// The modelled time of the last wave's `tailTiles` tiles split `splits` ways (1: whole).
double tailTime(int64_t tailTiles, int64_t k, int64_t bm, int64_t bn, int64_t slots, int64_t splits);
// `tiles` tiles of bm×bn over K on `slots` resident blocks (SMs × blocks an SM); `forced`:
// EmitOptions::gemmTailSplits (0: from the model, 1: none, S > 1: S splits of the last wave).
TailSplit chooseTailSplit(int64_t tiles, int64_t k, int64_t bm, int64_t bn, int64_t slots, int forced);

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
Tf32Plan tf32Plan(const GemmGeometry& q, Tf32BLoad bLoad);
// The estimated time of a TF32 product on the wgmma kernel with plan p, copies included.
double tf32WgmmaTime(const GemmGeometry& q, const Tf32Plan& p);
// Whether a TF32 product is faster on the wgmma kernel than on the mma.sync TF32 kernel.
bool tf32WgmmaPays(const GemmGeometry& q, Tf32BLoad bLoad);

}  // namespace pa::codegen
