// The GEMM plan's rules (codegen/gemm_plan.h), without NVRTC or a GPU: every choice is a valid
// variant for any shape, K splits keep their minimum share of K, the cost models grow with the
// work, and the tail split only splits a partial last wave into non-empty pieces.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codegen/gemm_plan.h"

namespace pa::codegen {
namespace {

// Awkward extents: 1, odd, primes, around the tile sizes, and a few large ones.
const std::vector<int64_t> kExtents = {1, 3, 7, 31, 33, 64, 100, 127, 129, 255, 1000, 1024, 4097, 8192};
const std::vector<int64_t> kDepths = {1, 5, 64, 129, 1000, 1024, 2047, 4096, 8192, 65536};

std::string shapeName(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return std::to_string(batch) + "x" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

bool powerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }

TEST(GemmPlan, TilesOfCoversTheOutput) {
  for (int64_t m : kExtents)
    for (int64_t n : kExtents) {
      for (int64_t t : {32, 64, 128}) {
        const int64_t tiles = tilesOf(m, n, t);
        EXPECT_GE(tiles * t * t, m * n);
        EXPECT_EQ(tiles, tilesOf(m, n, t, t));
        EXPECT_LT((tilesOf(m, 1, t) - 1) * t, m);  // no tile row wholly outside
      }
      EXPECT_EQ(tilesOf(m, n, 128, 256), ((m + 127) / 128) * ((n + 255) / 256));
    }
}

TEST(GemmPlan, ChooseGemmGivesAValidVariantForEveryShape) {
  int splitChoices = 0;
  for (bool tf32 : {false, true})
    for (int64_t batch : {1, 3})
      for (int64_t m : kExtents)
        for (int64_t n : kExtents)
          for (int64_t k : kDepths) {
            const auto [tile, splits] = chooseGemm(tf32, batch, m, n, k);
            const std::string at = shapeName(batch, m, n, k) + (tf32 ? " tf32" : " fp32");
            ASSERT_NE(tile, GemmTile::Auto) << at;
            ASSERT_TRUE(powerOfTwo(splits) && splits <= 64) << at << ": " << splits;
            if (splits > 1) {
              ++splitChoices;
              EXPECT_EQ(batch, 1) << at;  // batched products split by batch, never along K
              EXPECT_GE(k, 1024) << at;
              EXPECT_GE(k / splits, 128) << at;  // every split keeps at least 128 of K
            }
            const GemmVariant v = gemmVariant(tf32, tile);
            EXPECT_GT(v.threads, 0) << at;
            EXPECT_LE(v.threads, 1024) << at;
            // The fp32 variants' dynamic and the TF32 ones' static tiles stay within the 48 KB a
            // block gets without an opt-in.
            EXPECT_LE(v.sharedBytes, 48u * 1024) << at;
          }
  EXPECT_GT(splitChoices, 0);  // (the grid reaches the split rule)
}

TEST(GemmPlan, LargeTilesWhereTheyFillAWaveAndOnceChosenStayForLargerOutputs) {
  for (bool tf32 : {false, true})
    for (int64_t k : {64, 4096}) {
      for (int64_t m : kExtents)
        for (int64_t n : kExtents) {
          const bool fills = tilesOf(m, n, 128) >= h100::kFullWave;
          const auto choice = chooseGemm(tf32, 1, m, n, k);
          EXPECT_EQ(fills, choice.first == GemmTile::Large && choice.second == 1) << shapeName(1, m, n, k);
          if (!fills) continue;
          for (int64_t grow : {2, 3}) {
            EXPECT_EQ(chooseGemm(tf32, 1, m * grow, n, k), choice) << shapeName(1, m * grow, n, k);
            EXPECT_EQ(chooseGemm(tf32, 1, m, n * grow, k), choice) << shapeName(1, m, n * grow, k);
            EXPECT_EQ(chooseGemm(tf32, grow, m, n, k), choice) << shapeName(grow, m, n, k);
          }
        }
    }
}

TEST(GemmPlan, ShortProductsAreNeverSplit) {
  for (int64_t k : {1, 64, 129, 1023})
    for (int64_t m : kExtents)
      for (int64_t n : kExtents) EXPECT_EQ(chooseGemm(false, 1, m, n, k).second, 1) << shapeName(1, m, n, k);
}

TEST(GemmPlan, CostsGrowWithTheWork) {
  for (bool tf32 : {false, true})
    for (GemmTile t : {GemmTile::Large, GemmTile::Medium, GemmTile::Small})
      for (int64_t splits : {1, 2, 8})
        for (int64_t m : {33, 256, 1000})
          for (int64_t n : {100, 256}) {
            double last = 0;
            for (int64_t k : {1024, 2048, 4096, 8192, 16384}) {
              const double cost = splitCost(tf32, t, m, n, k, splits);
              EXPECT_GT(cost, 0.0);
              EXPECT_GE(cost, last) << shapeName(1, m, n, k);
              last = cost;
              EXPECT_LE(splitCost(tf32, t, m, n, k, splits), splitCost(tf32, t, m * 2, n, k, splits));
              EXPECT_LE(wgmmaSplitCost(t, m, n, k, splits), wgmmaSplitCost(t, m, n * 2, k, splits));
              EXPECT_LE(wgmmaSplitCost(t, m, n, k, splits), wgmmaSplitCost(t, m, n, k * 2, splits));
            }
          }
}

TEST(GemmPlan, ChooseWgmmaGivesAValidVariantForEveryShape) {
  for (int64_t batch : {1, 3})
    for (int64_t m : kExtents)
      for (int64_t n : kExtents)
        for (int64_t k : kDepths) {
          const auto [tile, splits] = chooseWgmma(batch, m, n, k);
          const std::string at = shapeName(batch, m, n, k);
          ASSERT_NE(tile, GemmTile::Auto) << at;
          ASSERT_TRUE(powerOfTwo(splits) && splits <= 64) << at;
          if (splits > 1) {
            EXPECT_EQ(batch, 1) << at;
            EXPECT_GE(k / splits, 128) << at;
          }
          if (tilesOf(m, n, 128, 256) * batch >= h100::kFullWave) {
            EXPECT_EQ(tile, GemmTile::Large) << at;
          }
        }
  for (bool tf32 : {false, true})
    for (GemmTile t : {GemmTile::Large, GemmTile::Medium, GemmTile::Small}) {
      const GemmVariant v = wgmmaVariant(t, tf32);
      EXPECT_EQ(v.threads % 128, 0);  // whole warpgroups: a producer and its consumers
      EXPECT_LE(v.threads, 1024);
      EXPECT_LE(v.sharedBytes * static_cast<unsigned>(v.minBlocks), 227u * 1024);  // an H100 SM's shared memory
      EXPECT_GT(v.sharedBytes, 48u * 1024);  // (the launcher opts in above 48 KB)
    }
}

TEST(GemmPlan, TailPiecesAreWholeChunksCoveringK) {
  for (int64_t k : kDepths)
    for (int64_t s = 1; s <= 16; ++s) {
      const int64_t piece = tailPieceK(k, s);
      EXPECT_EQ(piece % kBlockedSumK, 0) << k << " / " << s;
      EXPECT_GE(piece * s, k) << k << " / " << s;
      EXPECT_LT(piece - kBlockedSumK, (k + s - 1) / s) << k << " / " << s;  // no more than one chunk over the share
    }
}

TEST(GemmPlan, TailSplitOnlyWhereTheLastWaveIsPartial) {
  const int64_t bm = 128, bn = 128;
  int splitChoices = 0;
  for (int64_t slots : {2, 132})
    for (int64_t m : kExtents)
      for (int64_t n : kExtents)
        for (int64_t k : kDepths) {
          const int64_t tiles = tilesOf(m, n, bm, bn);
          const std::string at = shapeName(1, m, n, k) + " on " + std::to_string(slots);
          const TailSplit t = chooseTailSplit(tiles, k, bm, bn, slots, 0);
          if (t.splits == 1) {
            EXPECT_EQ(t.tiles, 0) << at;
            continue;
          }
          ++splitChoices;
          EXPECT_GE(tiles, slots) << at;              // a whole wave before the tail
          EXPECT_NE(tiles % slots, 0) << at;          // the last wave is partial ...
          EXPECT_EQ(t.tiles, tiles % slots) << at;    // ... and exactly it is split
          EXPECT_LE(t.splits, 16) << at;
          EXPECT_LT(tailPieceK(k, t.splits) * (t.splits - 1), k) << at;  // every piece non-empty
          EXPECT_LT(tailTime(t.tiles, k, bm, bn, slots, t.splits), tailTime(t.tiles, k, bm, bn, slots, 1)) << at;
        }
  EXPECT_GT(splitChoices, 0);  // (the grid reaches the tail split)
}

TEST(GemmPlan, ForcedTailSplitsAreHonouredWithinTheTiles) {
  for (int64_t tiles : {1, 2, 5, 132, 133, 300})
    for (int forced : {1, 2, 3, 7}) {
      const TailSplit t = chooseTailSplit(tiles, 4096, 128, 128, 132, forced);
      if (forced == 1) {
        EXPECT_EQ(t.splits, 1);
        continue;
      }
      EXPECT_EQ(t.splits, forced);
      EXPECT_GT(t.tiles, 0);
      EXPECT_LE(t.tiles, std::min<int64_t>(tiles, 132));
    }
  EXPECT_EQ(chooseTailSplit(0, 4096, 128, 128, 132, 3).splits, 1);  // nothing to split
}

TEST(GemmPlan, Tf32PlanKeepsTheProductAndReadsBKMajor) {
  for (Tf32BLoad load : {Tf32BLoad::Copy, Tf32BLoad::InKernel, Tf32BLoad::Auto})
    for (int t = 0; t < 4; ++t)
      for (int64_t batch : {1, 3})
        for (int64_t m : {1, 7, 64, 100, 4096})
          for (int64_t n : {4, 36, 256, 1000})
            for (int64_t k : {4, 64, 8192}) {
              GemmGeometry q;
              q.batch = batch, q.m = m, q.n = n, q.k = k, q.transA = t & 1, q.transB = t & 2;
              q.strideA = batch > 1 ? m * k : 0, q.strideB = batch > 1 ? k * n : 0;
              const Tf32Plan p = tf32Plan(q, load);
              const std::string at = shapeName(batch, m, n, k) + " t" + std::to_string(t);
              const GemmGeometry& g = p.product;
              EXPECT_EQ(g.k, q.k) << at;
              EXPECT_EQ(g.batch, q.batch) << at;
              EXPECT_EQ(p.swap ? g.n : g.m, q.m) << at;
              EXPECT_EQ(p.swap ? g.m : g.n, q.n) << at;
              EXPECT_EQ(p.input[0] + p.input[1], 1) << at;  // each operand once
              if (p.swap) {
                EXPECT_TRUE(batch == 1 && q.transA && !q.transB) << at;
              }
              // B reaches the kernel K-major: stored so, copied so, or transposed by the producer.
              EXPECT_TRUE(g.transB || p.transposeB) << at;
              EXPECT_FALSE(p.copy[1] && p.transposeB) << at;
              if (load == Tf32BLoad::Copy) {
                EXPECT_FALSE(p.transposeB) << at;
              }
              if (load == Tf32BLoad::InKernel) {
                EXPECT_FALSE(p.copy[1]) << at;
              }
              // An M-major A read from registers needs 16-byte rows; else it is copied K-major.
              if (g.transA) {
                EXPECT_TRUE(g.m % 4 == 0 && g.strideA % 4 == 0) << at;
              }
              if (p.copy[0]) {
                EXPECT_FALSE(g.transA) << at;
              }
              EXPECT_GT(tf32WgmmaTime(q, p), 0.0) << at;
            }
}

TEST(GemmPlan, Tf32WgmmaPaysForLargeProductsNotTinyOnes) {
  GemmGeometry big;
  big.m = 8192, big.n = 4096, big.k = 4096, big.transB = true;
  EXPECT_TRUE(tf32WgmmaPays(big, Tf32BLoad::Auto));
  GemmGeometry tiny;
  tiny.m = 4, tiny.n = 4, tiny.k = 4;  // B N-major: a copy's launch dominates
  EXPECT_FALSE(tf32WgmmaPays(tiny, Tf32BLoad::Copy));
}

}  // namespace
}  // namespace pa::codegen
