// FlashAttention kernel choice: the problem (config), the target, the instantiation (spec, its
// name and generated source), one chooser per kernel path, and the variant lists NVRTC compiles.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/flash_attention_params.h"

namespace pa {

// A problem the kernels cannot run (bad shape, stride, alignment, unsupported combination).
class FlashAttentionError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Where fp32 attention runs on the FP64 tensor cores (FlashAttentionConfig::fp64Mma).
enum class FlashFp64Mma {
  // The forward, where the device runs FP64 at full rate (FlashTarget::fullRateFp64: sm_80 and
  // sm_90, A100 / H100 / H200), the head dim is at most 64 and the grid is large enough
  // (kFp64MmaForwardMinBlocks); the backward on the FFMA kernels, which measured faster on the
  // H100 (bench/RESULTS_flash.md). Everywhere else the FFMA kernels.
  kAuto,
  kOff,  // the exact FFMA kernels throughout
  kOn,   // forward and backward (head dim <= 64; an error otherwise, or with tf32)
};

// What is computed; shared by forward and backward.
struct FlashAttentionConfig {
  FlashDType dtype = kFlashBF16;
  int batch = 1;
  int heads = 1;    // query heads
  int kvHeads = 1;  // heads % kvHeads == 0 (GQA / MQA)
  int qLen = 0;
  int kLen = 0;
  int headDim = 0;   // multiple of 8, at most 256 (fp32 backward: at most 128)
  float scale = 0.f;  // 0 selects 1/sqrt(headDim)
  AttentionMaskSpec mask;
  bool sinkLogits = false;  // learnable per-head sink logits (float [heads]) take part
  // Bit-reproducible backward: no atomics anywhere, and an error if atomicDq asks for them. The
  // 16-bit backward never uses atomics unless atomicDq; the fp32 backward beyond
  // kMaxDqPartialBlocks key blocks adds dQ with atomics unless this is set (then dQ has its own
  // kernel, 7 products per tile pair instead of 5), as PyTorch's memory-efficient backward does.
  bool deterministic = false;
  // FlashAttention-2's scheme: the dK/dV kernel also adds dQ into an fp32 buffer with atomics (5
  // products per tile pair instead of 7), whatever the length. fp16/bf16: measured slower than the
  // separate dQ kernel on the H100 (bench/RESULTS_flash.md), hence off there. Not bit-reproducible.
  bool atomicDq = false;
  // fp32 only: the products on the tensor cores with operands rounded to TF32 (10-bit mantissa,
  // fp32 accumulation; the mma.sync kernels of the 16-bit types), as torch.backends.cuda.matmul.
  // allow_tf32 does for matmuls. Off: the exact FFMA kernels. Errors for fp16/bf16 inputs.
  bool tf32 = false;
  // fp32 only: where the products run on the FP64 tensor cores (DMMA: the mma.sync kernels with
  // MmaStep<F64Tag>). Operands widen to fp64 exactly and the sums are fp64 (the forward keeps S and
  // O in fp64; the backward adds each 16-term partial product to fp32 accumulators), so the
  // result is no less accurate than the FFMA path's. See FlashFp64Mma; ignored where tf32 is set
  // unless kOn (then an error).
  FlashFp64Mma fp64Mma = FlashFp64Mma::kAuto;
};

enum class FlashKernelKind {
  kForward,
  kBwdPreprocess,
  kBwdSinkReduce,
  kBwdDkDv,
  kBwdDq,
  kBwdDqConvert,
  kBwdDkDvReduce,
  kBwdDqReduce  // fp32: dQ from the dK/dV kernel's per-key-block shares (dqPartial)
};

// "f32", "f16" or "bf16": kernel names and messages.
const char* flashDTypeName(FlashDType t);

// One template instantiation: what NVRTC compiles and the launcher launches.
struct FlashKernelSpec {
  FlashKernelKind kind = FlashKernelKind::kForward;
  FlashDType dtype = kFlashBF16;
  int dpad = 64;   // padded head dim of the instantiation (32, 64, 96, 128, 192, 256)
  int warps = 4;   // warps per block
  int tile = 64;   // the streamed tile (keys for forward/dQ, queries for dK/dV)
  int mtiles = 1;  // 16-bit: 16-row m-tiles per warp (rows per block = 16 * warps * mtiles);
                   // fp32 forward: query rows per thread R (rows per block = 16 * R)
  bool atomicDq = false;  // dK/dV kernel also accumulates dQ with atomics (non-deterministic path)
  // fp32 dK/dV kernel (FFMA, or the FP64 tensor cores) also writes each key block's share of dQ
  // (deterministic, summed by kBwdDqReduce): chosen when there are at most kMaxDqPartialBlocks key
  // blocks. kBwdDqReduce: `mtiles` R (16 R keys a block) and `tile` the query tile of the dK/dV
  // kernel whose shares it sums.
  bool dqPartial = false;
  // Forward / dK,dV / dQ on sm_90a with wgmma (flash_attention_{fwd,bwd}_wgmma.cuh): `warps`
  // counts the consumer warps (4 per warpgroup, 64 rows each; a producer warpgroup more), `tile`
  // the streamed tile's rows, `stages` the depth of its ring.
  bool wgmma = false;
  int stages = 2;
  // The wgmma forward's consumer warpgroups take turns issuing S = Q·Kᵀ (flash_attention_fwd_wgmma.cuh).
  bool pingpong = false;
  // The wgmma forward, dK/dV or dQ kernel as a persistent kernel: one block an SM walks a work
  // list of (slice, tile) items, heaviest tiles first, loading the next item's resident tiles (Q;
  // K and V; Q and dO) under the current one's work.
  bool persistent = false;
  // The wgmma forward / dQ kernel runs a first key tile whose only visible keys are sinks (below
  // kFlashSinkTileKeys) as kFlashSinkTileKeys-key products; chosen where the mask has such sinks
  // and a left window, so kernels of other masks keep the plain loop.
  bool sinkTile = false;
  // The wgmma forward, dK/dV and dQ kernels load their tiles (Q, K, V, dO) with TMA copies issued
  // by one producer thread, from tensor maps the launcher encodes (FlashTensorMaps, a second
  // kernel argument), instead of the producer warpgroup's cp.async (the dK/dV producer still
  // writes the query statistics); the launcher falls back to cp.async where the driver rejects a
  // map.
  bool tma = false;
  // fp32 on the tensor cores (FlashAttentionConfig::tf32): the forward / dK,dV / dQ kernels are
  // the 16-bit types' mma.sync kernels with TF32 operands; `warps`, `tile`, `mtiles` as there.
  bool tf32 = false;
  // fp32 on the FP64 tensor cores (FlashAttentionConfig::fp64Mma): the same mma.sync kernels with
  // fp64 fragments (MmaStep<F64Tag>); the tiles are chosen to fit their registers.
  bool f64 = false;
  // The exact fp32 dK/dV kernel (FFMA): blocks per key block, each over every querySplit-th of
  // its (query head, query tile) items, writing fp32 partials of dK and dV that kBwdDkDvReduce
  // sums in a fixed order (flashBackwardDkDvF32). 1: one block a key block, dK and dV stored.
  int querySplit = 1;
  bool f32Mma() const { return tf32 || f64; }  // fp32 inputs on an mma.sync kernel
  bool ffma() const { return dtype == kFlashF32 && !f32Mma(); }  // the exact FFMA kernels
  int rowsPerBlock() const;
  std::string name() const;      // C identifier of the generated kernel
  // An integer as unique as name() (launches look kernels up every training step, so the hit path
  // builds no strings): every field that changes the source has its own digits.
  unsigned long long key() const;
  std::string source() const;    // generated NVRTC translation unit
  int threads() const;
  int sharedBytes() const;       // dynamic shared memory
};

// The fp32 backward computes dQ from per-key-block shares (5 products per tile pair, no separate
// dQ kernel) up to this many key blocks; beyond, the shares' workspace (blocks × the size of dQ)
// would outgrow what it saves, and the dK/dV kernel adds its shares with atomics instead (or,
// with `deterministic`, the separate dQ kernel runs).
constexpr int kMaxDqPartialBlocks = 8;

// kAuto runs the fp32 forward on the FP64 tensor cores from this many blocks of 64 query rows
// (batch x heads x ceil(qLen / 64)): from there DMMA measured faster than FFMA or within a few
// percent, below FFMA's smaller blocks fill more of the GPU (forward sweep on the H100 in
// bench/RESULTS_flash.md).
constexpr long long kFp64MmaForwardMinBlocks = 24;
// kAuto runs the fp32 backward on the FP64 tensor cores up to this many keys (the dK/dV kernel's
// 64-key blocks then stay within kMaxDqPartialBlocks: dQ from shares summed in order, as FFMA's)
// and from this many 32-key blocks (batch x kvHeads x ceil(kLen / 32)): there it measured 6-23 %
// faster than FFMA, at 256 blocks -2..+8 %, below up to 38 % slower (grid in
// bench/RESULTS_flash.md, H200, both engines with heavy-first grids).
constexpr int kFp64MmaBackwardMaxKeys = 512;
constexpr long long kFp64MmaBackwardMinBlocks = 512;

// The most dynamic shared memory an sm_90 block may have (H100, H200): the wgmma kernels' variants
// and the persistent forward's second Q buffer are chosen within it.
constexpr int kSm90MaxSharedBytes = 227 * 1024;

// What the choice of kernels depends on in the device (runtime/flash_attention.h makes one from
// a device: flashTargetOf).
struct FlashTarget {
  int multiprocessors = 0;    // 0: unknown (the fp32 blocks then take their default sizes)
  bool wgmma = false;         // sm_90a code: the 16-bit forward and default backward at padded head
                              // dims 64 and 128 use flash_attention_{fwd,bwd}_wgmma.cuh
  bool fullRateFp64 = false;  // FP64 at the FP32 rate (sm_80, sm_90): FlashFp64Mma::kAuto may use DMMA
};

// Overrides of the choosers' rules, for tuning sweeps: only bench/ and tests/ fill one. Every
// field's default means "the rule"; docs/flash_attention.md lists what each reaches (the bench
// library reads them from PA_FLASH_* variables of the same names, bench/flash_bench_capi.cpp).
struct FlashTuning {
  int fwdTile = 0;        // fp16/bf16 forward: keys per tile (mma.sync and wgmma)
  int fwdMtiles = 0;      // fp16/bf16 / TF32 / DMMA mma.sync forward: m-tiles per warp
  int fwdWarpgroups = 0;  // sm_90a wgmma forward: consumer warpgroups
  int fwdStages = 0;      // sm_90a wgmma forward: depth of the K/V ring
  int fwdPingPong = -1;   // sm_90a wgmma forward: -1 the rule, 0 / 1 warpgroups take turns off / on
  int fwdPersistent = -1; // sm_90a wgmma forward: -1 the rule, 0 / 1 persistent off / on (needs the SM count)
  int bwdPersistent = -1; // sm_90a wgmma dK/dV and dQ: the same (the rule: on where the SM count is known)
  int sinkTile = -1;      // sm_90a wgmma forward and dQ: -1 the rule (FlashKernelSpec::sinkTile), 0 off
  int tma = -1;           // sm_90a wgmma kernels: -1 the rule (TMA loads), 0 cp.async (FlashKernelSpec::tma)
  int bwdTile = 0;        // sm_90a wgmma backward: streamed tile rows
  int bwdWarpgroups = 0;  // sm_90a wgmma backward: consumer warpgroups
  int bwdStages = 0;      // sm_90a wgmma backward: depth of the streamed tiles' ring (dK/dV: Q, dO; dQ: K, V)
  bool wgmma = true;      // false: the sm_90a fp16/bf16 kernels on mma.sync instead of wgmma
  int splitKv = -1;       // fp16/bf16 GQA dK/dV: -1 the rule (sm_90a: an estimate; else per query head),
                          // 1 per query head (fp32 partials + reduce), 0 per KV head
  int dqTile = 0;         // dQ kernel: keys per tile (mma.sync; wgmma: 64 / 128, over bwdTile)
  int dqMtiles = 0;       // mma.sync dQ kernel: m-tiles per warp
  int f32FwdRows = 0;     // fp32 FFMA forward: query rows per thread (1, 2, 4, 8)
  int f32BwdRows = 0;     // fp32 FFMA backward: keys (dK/dV) / query rows (dQ) per thread (1, 2, 4)
  int f32BwdSplit = 0;    // fp32 FFMA dK/dV: blocks per key block (FlashKernelSpec::querySplit; 1 none)
  int f64FwdWarps = 0;    // fp32 forward on the FP64 tensor cores: warps per block (4, 8)
};

// The instantiation the launcher runs for one kernel of a problem on a target (exposed for tests,
// codegen's dumps and the benchmark's report); the default target is an sm_80-class device of
// unknown size without full-rate FP64. A dispatcher over the per-path choosers of flash_spec.cpp.
FlashKernelSpec chooseFlashSpec(FlashKernelKind kind, const FlashAttentionConfig& cfg, const FlashTarget& target = {},
                                const FlashTuning& tuning = {});

// GQA with 16-bit types: dK/dV blocks per query head (partials + reduce) instead of per KV head.
bool flashSplitKvHeads(const FlashAttentionConfig& cfg, const FlashTarget& target = {}, const FlashTuning& tuning = {});

// Every kernel the launcher runs for a problem (forward, or the backward's kernels in launch
// order) on a target.
std::vector<FlashKernelSpec> flashKernelsOf(const FlashAttentionConfig& cfg, bool backward, const FlashTarget& target = {},
                                            const FlashTuning& tuning = {});

// Throws FlashAttentionError for a problem the kernels cannot run whatever the device (message
// names the offending field); the launcher adds the device's shared-memory limit.
void validateFlashConfig(const FlashAttentionConfig& cfg, bool backward);

// Every instantiation production code can run: the choosers' picks over the configs and targets
// the graph reaches (flash_variants.cpp lists the grid), deduplicated by name. NVRTC CI compiles
// these.
std::vector<FlashKernelSpec> flashProductionKernelSpecs();
// The instantiations only tuning overrides and bench-only options reach (atomic dQ, DMMA
// throughout, fp16, the tile / warpgroup / rows-per-thread sweeps), none of them in the
// production list; compiled by the `sweep` ctest label.
std::vector<FlashKernelSpec> flashSweepKernelSpecs();

}  // namespace pa
