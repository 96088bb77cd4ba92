// The GEMM plan's heuristics: tile variants, K splits, the tail split and the TF32 wgmma choice.
#include "codegen/gemm_plan.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace pa::codegen {

using namespace h100;

GemmVariant simtVariant(int bm, int bn, int bk, int tm, int tn, int minBlocks) {
  const std::string config = "SimtConfig<" + std::to_string(bm) + ", " + std::to_string(bn) + ", " + std::to_string(bk) + ", " +
                             std::to_string(tm) + ", " + std::to_string(tn) + ", " + std::to_string(kBlockedSumK / bk) + ">";
  return GemmVariant{config, bm, bn, (bm / tm) * (bn / tn), minBlocks, static_cast<unsigned>(2 * bk * (bm + 4 + bn + 4) * 4)};
}

GemmVariant gemmVariant(bool tf32, GemmTile tile) {
  // tf32: Tf32Config<BM, BN, BK, warps along M, warps along N, pipeline stages>.
  switch (tile) {
  case GemmTile::Large:
    // fp32: BK = 16 (fewer barriers than 8), one 256-thread block an SM with 8×8 micro-tiles.
    // TF32: two blocks an SM (≤ 128 registers), so that one's barrier overlaps the other's
    // products. (bench/RESULTS.md, "The GEMM plan's constants".)
    return tf32 ? GemmVariant{"Tf32Config<128, 128, 16, 2, 4, 2>", 128, 128, 256, 2} : simtVariant(128, 128, 16, 8, 8, 1);
  case GemmTile::Medium:
    return tf32 ? GemmVariant{"Tf32Config<64, 64, 16, 2, 2, 4>", 64, 64, 128, 1} : simtVariant(64, 64, 16, 4, 4, 1);
  case GemmTile::Small:
    return tf32 ? GemmVariant{"Tf32Config<32, 32, 16, 1, 2, 2>", 32, 32, 64, 1} : simtVariant(32, 32, 16, 4, 4, 1);
  case GemmTile::PingPong:  // (the emitter takes Medium for these kernels)
  case GemmTile::Auto: break;
  }
  assert(false && "GemmTile::Auto is resolved by chooseGemm, PingPong by the emitter");
  return {};
}

// The TF32 tiles read the same fragments; fp64 accumulators double a warp tile's registers (large:
// 128 of them a thread), so no config asks for two blocks an SM. Tiles and splits come from
// chooseF64Gemm (the SIMT plan's tiles, splits that fill one wave): one block an SM at large
// tiles; no tail split (simtGemmTail is the SIMT kernel's). The runner's tile autotuning measures
// the other tiles in training (medium tiles, several blocks an SM, can be the faster:
// bench/RESULTS.md, "fp32 GEMMs on the FP64 tensor cores").
GemmVariant f64Variant(GemmTile tile) {
  GemmVariant v = gemmVariant(true, tile);
  v.minBlocks = 1;
  return v;
}

int64_t tilesOf(int64_t m, int64_t n, int64_t t) { return ((m + t - 1) / t) * ((n + t - 1) / t); }

int64_t tilesOf(int64_t m, int64_t n, int64_t bm, int64_t bn) { return ((m + bm - 1) / bm) * ((n + bn - 1) / bn); }

// Note on the SIMT / mma.sync choice. A large block wants the whole SM (fp32: ~210 registers a
// thread) or half of it (TF32). Large tiles from ~90% of a wave. A single product with K ≥ 1024
// that large tiles cannot fill is split along K, with the tile and the number of splits from
// splitCost(); otherwise medium tiles while they give half a wave, else small ones.
//
// splitCost estimates a split product's time as (waves of blocks) × (one block's products at its
// share of an SM) + the reduce kernel's traffic. Per tile: blocks resident per SM and the SM
// throughput they reach relative to large tiles (large measured; medium and small estimated). It
// keeps at least 128 of K per split.
double splitCost(bool tf32, GemmTile tile, int64_t m, int64_t n, int64_t k, int64_t splits) {
  const int64_t bm = tile == GemmTile::Large ? 128 : tile == GemmTile::Medium ? 64 : 32;
  const double perSm = tile == GemmTile::Large ? (tf32 ? 2 : 1) : tile == GemmTile::Medium ? 2 : 8;
  const double relRate = tile == GemmTile::Large ? 1.0 : tile == GemmTile::Medium ? 0.8 : 0.45;
  const double smFlops = (tf32 ? kTf32MmaFlops : kSimtFlops) / static_cast<double>(kSms);
  const int64_t blocks = tilesOf(m, n, bm) * splits;
  const double waves = std::ceil(static_cast<double>(blocks) / (static_cast<double>(kSms) * perSm));
  const double blockFlops = 2.0 * static_cast<double>(bm * bm) * std::ceil(static_cast<double>(k) / static_cast<double>(splits));
  const double reduce =
      splits > 1 ? 2.0 * static_cast<double>(splits * m * n) * 4.0 / kMemoryBytesPerSecond + kSplitReduceStart : 0.0;
  return waves * blockFlops * perSm / (relRate * smFlops) + reduce;
}

std::pair<GemmTile, int> chooseGemm(bool tf32, int64_t batch, int64_t m, int64_t n, int64_t k) {
  const int64_t large = batch * tilesOf(m, n, 128);
  if (large >= kFullWave) return {GemmTile::Large, 1};
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
  if (batch * tilesOf(m, n, 64) >= kSms / 2) return {GemmTile::Medium, 1};
  return {GemmTile::Small, 1};
}

// The FP64 kernel runs one large block an SM (its fp64 accumulators), so a split product's time
// is (waves of blocks) × (a block's share of K): the splits that fill one wave, ⌊SMs / tiles⌋, do
// best. The SIMT plan's powers of two overshoot where the tiles do not divide the SMs (attn_block's
// 256×768×8192 weight gradient: 12 tiles, 32 splits make 3 waves of 256-deep blocks and 25 MB of
// partial sums; 11 splits one wave of 745-deep blocks and 8.6 MB).
std::pair<GemmTile, int> chooseF64Gemm(int64_t batch, int64_t m, int64_t n, int64_t k) {
  const std::pair<GemmTile, int> simt = chooseGemm(false, batch, m, n, k);
  if (simt.first != GemmTile::Large || simt.second <= 1) return simt;
  const int64_t splits = std::min<int64_t>({kSms / tilesOf(m, n, 128), k / 128, 64});
  return splits >= 2 ? std::pair<GemmTile, int>{GemmTile::Large, static_cast<int>(splits)} : simt;
}

// Note on the tail split. A large fp32 block fills an SM (its registers), so T tiles run as
// ⌈T/SMs⌉ waves of equal blocks, and the last wave is partial: 8192×4096 has 2048 tiles, 15 waves
// on 132 SMs and a 16th of 68 tiles during which half the GPU idles (1/16 of the product). Split
// along K S ways, that wave's r tiles become S·r pieces of 1/S of a tile each, which run in
// ⌈S·r/SMs⌉ rounds after the whole tiles in the same launch; a second kernel adds each tail
// tile's S partial sums in split order (deterministic) and applies the epilogue. tailTime
// models the last wave's time: rounds × (a piece's products + its start and store) + the
// reduce's traffic and launch. The split is taken where it saves at least 1% of the product.
// Pieces are whole blocked-sum chunks (tailPieceK): pieces cut at any slice ran no faster than
// the unsplit product (bench/RESULTS.md, "Tail split").
int64_t tailPieceK(int64_t k, int64_t splits) {
  return ((k + splits - 1) / splits + kBlockedSumK - 1) / kBlockedSumK * kBlockedSumK;
}

double tailTime(int64_t tailTiles, int64_t k, int64_t bm, int64_t bn, int64_t slots, int64_t splits) {
  const double tile = 2.0 * static_cast<double>(bm * bn * k) / (kSimtTailFlops / static_cast<double>(kSms));
  if (splits == 1) return tile;
  const int64_t pieceK = tailPieceK(k, splits), pieces = (k + pieceK - 1) / pieceK;
  const double rounds = std::ceil(static_cast<double>(tailTiles * pieces) / static_cast<double>(slots));
  const double reduce = static_cast<double>((pieces + 1) * tailTiles * bm * bn) * 4.0 / kMemoryBytesPerSecond + kKernelStart;
  return rounds * (tile * static_cast<double>(pieceK) / static_cast<double>(k) + kTailPieceStart) + reduce;
}

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
  case GemmTile::PingPong:
    assert(!tf32 && "ping-pong consumers are bf16's (the emitter takes Medium for TF32)");
    return make("WgmmaConfig<128, 2, 6, false, true>", 128, 128, 2, 6, 1);
  case GemmTile::Auto: break;
  }
  assert(false && "GemmTile::Auto is resolved by chooseWgmma");
  return {};
}

// Note on choosing wgmma tiles. The largest tile that still gives ~90% of a wave. A single product
// that not even medium tiles fill (weight gradients: small M×N, long K) is split along K, tile and
// splits from wgmmaSplitCost(): waves × one block's time (its products at the block's measured
// rate, plus its pipeline fill and epilogue) + the reduce kernel's traffic (the fp32 partial sums
// read once, the result written) and start. Splits keep at least 128 of K.
double wgmmaSplitCost(GemmTile tile, int64_t m, int64_t n, int64_t k, int64_t splits) {
  const int64_t bm = tile == GemmTile::Small ? 64 : 128, bn = tile == GemmTile::Large ? 256 : 128;
  const double perSm = tile == GemmTile::Small ? 2 : 1;
  const double gpuRate = tile == GemmTile::Large ? kWgmmaLargeFlops : tile == GemmTile::Medium ? kWgmmaMediumFlops : kWgmmaSmallFlops;
  const double blockRate = gpuRate / (static_cast<double>(kSms) * perSm);
  const double waves = std::ceil(static_cast<double>(tilesOf(m, n, bm, bn) * splits) / (static_cast<double>(kSms) * perSm));
  const double sliceK = std::ceil(static_cast<double>(k) / static_cast<double>(splits) / 64.0) * 64.0;
  const double block = 2.0 * static_cast<double>(bm * bn) * sliceK / blockRate + kWgmmaBlockStart;
  const double reduce =
      splits > 1 ? static_cast<double>((splits + 1) * m * n) * 4.0 / kMemoryBytesPerSecond + kKernelStart : 0.0;
  return waves * block + reduce;
}

std::pair<GemmTile, int> chooseWgmma(int64_t batch, int64_t m, int64_t n, int64_t k) {
  if (batch * tilesOf(m, n, 128, 256) >= kFullWave) return {GemmTile::Large, 1};
  if (batch * tilesOf(m, n, 128, 128) >= kFullWave) return {GemmTile::Medium, 1};
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

// The products at the TF32 wgmma rates (the producer's 4-byte transposing copies bind where it
// transposes B), each transposed copy read and written at memory speed plus a kernel start. Small
// products are memory-bound: there the copy's traffic is what the in-kernel transpose saves.
double tf32WgmmaTime(const GemmGeometry& q, const Tf32Plan& p) {
  const double flops = 2.0 * static_cast<double>(q.batch * q.m) * static_cast<double>(q.n * q.k);
  double copies = 0, launches = 0;
  const int64_t rows[2] = {p.product.m, p.product.n}, strides[2] = {p.product.strideA, p.product.strideB};
  for (int i = 0; i < 2; ++i)
    if (p.copy[i]) copies += static_cast<double>((strides[i] != 0 ? q.batch : 1) * rows[i] * q.k), ++launches;
  return flops / (p.transposeB ? kTf32WgmmaTransposingFlops : kTf32WgmmaFlops) + copies * 8.0 / kMemoryBytesPerSecond +
         launches * kKernelStart;
}

// Against the mma.sync TF32 kernel's rate: its large-tile rate where large tiles fill the GPU, its
// split weight-gradient rate elsewhere. Tiny products keep mma.sync where a copy's launch dominates.
bool tf32WgmmaPays(const GemmGeometry& q, Tf32BLoad bLoad) {
  const double flops = 2.0 * static_cast<double>(q.batch * q.m) * static_cast<double>(q.n * q.k);
  const bool fills = q.batch * tilesOf(q.m, q.n, 128) >= kFullWave;
  return tf32WgmmaTime(q, tf32Plan(q, bLoad)) < flops / (fills ? kTf32MmaFlops : kTf32MmaSplitFlops);
}

}  // namespace pa::codegen
