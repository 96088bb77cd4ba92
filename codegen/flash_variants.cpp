// The FlashAttention instantiations NVRTC CI compiles: production's (the choosers over the configs
// and targets a graph reaches) and the sweep's (what only tuning and bench-only options reach).
#include <set>
#include <utility>

#include "codegen/flash_spec.h"

namespace pa {

namespace {

// Appends the specs whose names are new.
void addUnique(std::vector<FlashKernelSpec>& specs, std::set<std::string>& names, const FlashKernelSpec& s) {
  if (names.insert(s.name()).second) specs.push_back(s);
}

// Every variant the tuning overrides and the bench's options (atomicDq, fp64Mma = kOn, fp16)
// reach, production's picks among them.
std::vector<FlashKernelSpec> tunableKernelSpecs() {
  std::vector<FlashKernelSpec> specs;
  FlashAttentionConfig cfg;
  for (FlashDType dt : {kFlashF32, kFlashF16, kFlashBF16}) {
    cfg.dtype = dt;
    for (int d : {32, 64, 96, 128, 256}) {
      cfg.headDim = d;
      specs.push_back(chooseFlashSpec(FlashKernelKind::kForward, cfg));
      if (dt == kFlashF32) {  // every rows-per-thread variant (FlashTuning::f32FwdRows)
        const FlashKernelSpec base = specs.back();
        specs.pop_back();
        for (int r : {1, 2, 4, 8}) {
          if (r == 8 && d > 64) continue;
          FlashKernelSpec v = base;
          v.mtiles = r;
          specs.push_back(v);
        }
      }
      if (dt == kFlashF32 && d > 128) continue;  // fp32 backward tiles do not fit shared memory
      specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg));
      specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg));
      if (dt == kFlashF32) {  // the smaller-block variants of the fp32 backward (R = 1, 2)
        const FlashKernelSpec bases[2] = {specs[specs.size() - 2], specs[specs.size() - 1]};
        for (const FlashKernelSpec& base : bases) {
          for (int r : {1, 2}) {
            FlashKernelSpec v = base;
            v.mtiles = r;
            specs.push_back(v);
          }
        }
        // dK/dV in every part in dQ (Fp32DqMode), and the reduce.
        for (int r : {1, 2, 4}) {
          for (int mode = 0; mode < 3; ++mode) {
            FlashKernelSpec v = bases[0];
            v.mtiles = r;
            v.dqPartial = mode == 1;
            v.atomicDq = mode == 2;
            if (v.dqPartial != bases[0].dqPartial || v.atomicDq != bases[0].atomicDq) specs.push_back(v);
            for (int parts : {2, 4}) {  // FlashTuning::f32BwdSplit
              if (r == 1) continue;
              v.querySplit = parts;
              specs.push_back(v);
            }
          }
          if (d == 32) {
            FlashKernelSpec red;
            red.kind = FlashKernelKind::kBwdDqReduce;
            red.dtype = kFlashF32;
            red.dpad = 0;
            red.mtiles = r;
            specs.push_back(red);
          }
        }
      }
      if (dt != kFlashF32) {
        cfg.atomicDq = true;
        specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg));
        cfg.atomicDq = false;
      }
    }
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdPreprocess, cfg));
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDqConvert, cfg));
    if (dt != kFlashF32) specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDvReduce, cfg));
  }
  specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdSinkReduce, cfg));
  // fp32 on TF32 tensor cores: the mma.sync forward, dK/dV (both dQ schemes) and dQ kernels.
  cfg.dtype = kFlashF32;
  cfg.tf32 = true;
  for (int d : {32, 64, 96, 128, 256}) {
    cfg.headDim = d;
    // Each with the smaller blocks of short sequences (one m-tile, or 2 dK/dV warps) beside it.
    const FlashKernelSpec fwd = chooseFlashSpec(FlashKernelKind::kForward, cfg);
    specs.push_back(fwd);
    if (fwd.mtiles == 2) {
      FlashKernelSpec v = fwd;
      v.mtiles = 1;
      specs.push_back(v);
    }
    if (d > 128) continue;  // the fp32 backward's limit
    const FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg);
    const FlashKernelSpec dq = chooseFlashSpec(FlashKernelKind::kBwdDq, cfg);
    specs.push_back(dkdv);
    specs.push_back(dq);
    FlashKernelSpec dkdv2 = dkdv;
    dkdv2.warps = 2;
    specs.push_back(dkdv2);
    if (dq.mtiles == 2) {
      FlashKernelSpec v = dq;
      v.mtiles = 1;
      specs.push_back(v);
    }
    cfg.atomicDq = true;
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg));
    cfg.atomicDq = false;
  }
  cfg.tf32 = false;
  // fp32 on the FP64 tensor cores (head dims <= 64): forward (4 warps, and 8: f64FwdWarps),
  // dK/dV with dQ shares (short keys) and their reduce, with atomic dQ, and for the deterministic
  // backward of long keys dK/dV without either (4 warps, and the 2 of small grids) and dQ.
  cfg.fp64Mma = FlashFp64Mma::kOn;
  for (int d : {32, 64}) {
    cfg.headDim = d;
    FlashKernelSpec fwd = chooseFlashSpec(FlashKernelKind::kForward, cfg);
    specs.push_back(fwd);
    fwd.warps = 8;
    specs.push_back(fwd);
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg));  // (lengths 0: dQ shares)
    if (d == 32) specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDqReduce, cfg));
    cfg.atomicDq = true;
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg));
    cfg.atomicDq = false;
    cfg.deterministic = true;
    cfg.qLen = cfg.kLen = 4096;
    FlashKernelSpec dkdv = chooseFlashSpec(FlashKernelKind::kBwdDkDv, cfg);
    specs.push_back(dkdv);
    dkdv.warps = 2;
    specs.push_back(dkdv);
    specs.push_back(chooseFlashSpec(FlashKernelKind::kBwdDq, cfg));
    cfg.deterministic = false;
    cfg.qLen = cfg.kLen = 0;
  }
  cfg.fp64Mma = FlashFp64Mma::kAuto;
  // sm_90a: the wgmma backward's tiles and the forward's tile / warpgroup / stage variants that
  // fit shared memory (the forward's key tiles: 64, 128 and the wide 160, 176, 192).
  const FlashTarget sm90a{0, true, false};
  for (FlashDType dt : {kFlashF16, kFlashBF16}) {
    cfg.dtype = dt;
    for (int d : {64, 128}) {
      cfg.headDim = d;
      for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
        for (int tile : {64, 128})
          for (int stages : {2, 3})  // FlashTuning::bwdStages
            for (bool persistent : {false, true}) {  // FlashTuning::bwdPersistent, where the SM count is known
              FlashKernelSpec v = chooseFlashSpec(k, cfg, sm90a);
              v.tile = tile;
              v.stages = stages;
              v.persistent = persistent;
              if (v.sharedBytes() <= kSm90MaxSharedBytes) specs.push_back(v);
            }
      const FlashKernelSpec chosen = chooseFlashSpec(FlashKernelKind::kForward, cfg, sm90a);
      for (int tile : {64, 128, 160, 176, 192})
        for (int consumers : {1, 2, 3})
          for (int stages : {2, 3}) {
            if (tile > 128 && (consumers == 1 || stages == 3)) continue;  // the wide tiles: two stages, 2-3 warpgroups
            FlashKernelSpec v = chosen;
            v.tile = tile;
            v.warps = 4 * consumers;
            v.stages = stages;
            v.pingpong = chosen.pingpong && consumers >= 2;  // turns need two warpgroups
            for (bool persistent : {false, true}) {  // FlashTuning::fwdPersistent, where the SM count is known
              v.persistent = persistent;
              if (v.sharedBytes() <= kSm90MaxSharedBytes) specs.push_back(v);
            }
          }
      // The chosen tile and stages with the warpgroups' turns the other way than above.
      for (int consumers : {2, 3})
        for (bool persistent : {false, true}) {
          FlashKernelSpec v = chosen;
          v.warps = 4 * consumers;
          v.pingpong = !chosen.pingpong;
          v.persistent = persistent;
          specs.push_back(v);
        }
    }
  }
  return specs;
}

}  // namespace

// Note on the production grid. The choosers read the dtype (fp32 on FFMA, TF32 or, through kAuto,
// DMMA; bf16: `precision` has no fp16), `deterministic`, the padded head dim, the grid's size
// against the SM count (batch x heads or kvHeads x blocks: the FFMA rows-per-thread rule, the
// DMMA forward's kFp64MmaForwardMinBlocks, TF32's small-grid blocks), the key blocks against
// kMaxDqPartialBlocks, q_len >= 2048 (the wgmma forward's warpgroups), k_len >= 8192 (its wide
// key tiles), GQA and, on sm_90a, the
// mask (GQA's dK/dV per query head with a reduce, or per KV head and persistent: an estimate over
// the mask's visible tiles), sinks beside a window (the sink tile) and sink logits (their
// reduce). The grid below crosses every one of
// those thresholds on each target a graph may run on or be dumped for: the SM counts of an A100,
// H100 and L40 and 0 (codegen's dumps, which do not know the device), with and without wgmma and
// full-rate FP64 as those parts have them. The graph never sets atomicDq or fp64Mma.
std::vector<FlashKernelSpec> flashProductionKernelSpecs() {
  const FlashTarget targets[] = {{0, false, false},   {0, false, true},    {0, true, true},
                                 {108, false, true},  {132, true, true},   {142, false, false}};
  const int heads[][2] = {{1, 1}, {4, 1}, {8, 8}, {64, 64}, {64, 8}};  // query heads, KV heads
  // (q_len, k_len): equal lengths across the thresholds, and a few unequal ones (a short side
  // with a long one: the dQ kernel's small blocks beside the dK/dV kernel's large ones).
  std::vector<std::pair<int, int>> lengths;
  for (int len : {1, 64, 128, 129, 192, 256, 257, 512, 513, 1024, 2048, 4096, 8192}) lengths.push_back({len, len});
  for (int shortLen : {64, 128, 256})
    for (int longLen : {1024, 4096}) {
      lengths.push_back({shortLen, longLen});
      lengths.push_back({longLen, shortLen});
    }
  // No mask (every key block alike), causal (the first key blocks the heaviest), and a causal
  // window with sinks (tiny_gpt's kind: the sink tile).
  AttentionMaskSpec masks[3];
  masks[1].causal = 1;
  masks[2].causal = 1, masks[2].windowLeft = 128, masks[2].sinks = 4;
  std::vector<FlashKernelSpec> specs;
  std::set<std::string> names;
  FlashAttentionConfig c;
  c.sinkLogits = true;
  // The backward's small kernels of both dtypes: codegen lists them for every backward node.
  for (FlashDType dt : {kFlashF32, kFlashBF16}) {
    c.dtype = dt;
    for (FlashKernelKind k : {FlashKernelKind::kBwdPreprocess, FlashKernelKind::kBwdSinkReduce,
                              FlashKernelKind::kBwdDqConvert, FlashKernelKind::kBwdDkDvReduce})
      addUnique(specs, names, chooseFlashSpec(k, c));
  }
  for (const FlashTarget& target : targets)
    for (int mode = 0; mode < 3; ++mode)  // fp32, tf32, bf16
      for (bool deterministic : {false, true})
        for (int d = 8; d <= 256; d += 8)
          for (const auto& h : heads)
            for (const auto& [qLen, kLen] : lengths) {
              c.dtype = mode == 2 ? kFlashBF16 : kFlashF32;
              c.tf32 = mode == 1;
              c.deterministic = deterministic;
              c.headDim = d;
              c.heads = h[0], c.kvHeads = h[1];
              c.qLen = qLen, c.kLen = kLen;
              for (const AttentionMaskSpec& mask : masks) {
                c.mask = mask;
                for (bool backward : {false, true}) {
                  if (backward && c.dtype == kFlashF32 && d > 128) continue;  // validation refuses it
                  for (const FlashKernelSpec& s : flashKernelsOf(c, backward, target)) {
                    addUnique(specs, names, s);
                    if (s.tma) {  // the launcher's fallback where the driver rejects a tensor map
                      FlashKernelSpec v = s;
                      v.tma = false;
                      addUnique(specs, names, v);
                    }
                  }
                }
              }
            }
  return specs;
}

std::vector<FlashKernelSpec> flashSweepKernelSpecs() {
  std::set<std::string> names;
  for (const FlashKernelSpec& s : flashProductionKernelSpecs()) names.insert(s.name());
  std::vector<FlashKernelSpec> specs;
  for (const FlashKernelSpec& s : tunableKernelSpecs()) addUnique(specs, names, s);
  return specs;
}

}  // namespace pa
