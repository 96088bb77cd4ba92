// Host launcher of the flash attention templates (see flash_attention.h and docs/flash_attention.md).
#include "kernels/flash_attention.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "codegen/embedded_kernels.h"
#include "codegen/nvrtc_compiler.h"
#include "common/debug.h"
#include "common/flash_attention_limits.h"

namespace pa {

namespace {

constexpr int kPreprocessRows = 64;  // mirrors flash::kPreprocessRows

int elemBytes(FlashDType t) {
  switch (t) {
    case kFlashF32: return 4;
    case kFlashF16: return 2;
    case kFlashBF16: return 2;
  }
  return 0;
}
const char* dtypeName(FlashDType t) {
  switch (t) {
    case kFlashF32: return "f32";
    case kFlashF16: return "f16";
    case kFlashBF16: return "bf16";
  }
  return "?";
}
const char* dtypeTag(FlashDType t) {
  switch (t) {
    case kFlashF32: return "pa::flash::F32Tag";
    case kFlashF16: return "pa::flash::F16Tag";
    case kFlashBF16: return "pa::flash::BF16Tag";
  }
  return "?";
}
int padHeadDim(int d) {
  for (int p : {32, 64, 96, 128, 256})
    if (d <= p) return p;
  return 0;
}
int ceilDiv(long long a, long long b) { return (int)((a + b - 1) / b); }

// GQA with 16-bit types: dK/dV blocks per query head (partials + reduce) instead of per KV head.
// PA_FLASH_SPLIT_KV=0 turns it off (tuning runs and tests; common/debug.h).
bool splitKvHeads(const FlashAttentionConfig& c) {
  return c.dtype != kFlashF32 && c.heads != c.kvHeads && envSwitch("PA_FLASH_SPLIT_KV", true);
}

// PA_FLASH_WGMMA=0 (or off/false): the sm_90a kernels fall back to mma.sync. Read at every
// choice, so tests can compare both kernels in one process.
bool wgmmaSwitchedOff() { return !envSwitch("PA_FLASH_WGMMA", true); }

// Whether an fp32 product kernel runs on the FP64 tensor cores (FlashFp64Mma). kAuto: the
// forward where DMMA runs at full rate, at head dims <= 64 (its limit) and on grids of at least
// kFp64MmaForwardMinBlocks 64-row blocks; the backward stays on FFMA, which measured faster there
// (bench/RESULTS_flash.md: at S = 4096 the FFMA backward 2.7 ms, DMMA's 2.8 ms).
bool usesFp64Mma(FlashKernelKind kind, const FlashAttentionConfig& c, const FlashTarget& target) {
  if (c.tf32) return false;  // TF32 wins (with kOn, validate() refuses the problem)
  switch (c.fp64Mma) {
    case FlashFp64Mma::kOn: return true;
    case FlashFp64Mma::kOff: return false;
    case FlashFp64Mma::kAuto:
      return kind == FlashKernelKind::kForward && target.fullRateFp64 && c.headDim <= 64 &&
             (long long)c.batch * c.heads * ceilDiv(c.qLen, 64) >= kFp64MmaForwardMinBlocks;
  }
  return false;
}

// The largest wgmma forward the variant list holds (an H100 allows 227 KB a block).
constexpr int kMaxWgmmaSharedBytes = 227 * 1024;

[[noreturn]] void fail(const std::string& what) { throw FlashAttentionError("flash attention: " + what); }

void checkTensor(const char* name, const FlashTensor& t, FlashDType dtype) {
  if (!t.ptr) fail(std::string(name) + " is null");
  const int perVec = 16 / elemBytes(dtype);
  if (t.ptr % 16) fail(std::string(name) + " must be 16-byte aligned (cp.async loads 16 bytes)");
  if (t.seqStride % perVec || t.headStride % perVec || t.batchStride % perVec)
    fail(std::string(name) + " strides must be multiples of " + std::to_string(perVec) +
         " elements (16 bytes); got batch/head/seq strides " + std::to_string(t.batchStride) + "/" +
         std::to_string(t.headStride) + "/" + std::to_string(t.seqStride));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Specs and generated sources.

int FlashKernelSpec::threads() const {
  switch (kind) {
    case FlashKernelKind::kBwdDqConvert:
    case FlashKernelKind::kBwdDkDvReduce:
    case FlashKernelKind::kBwdDqReduce:
    case FlashKernelKind::kBwdPreprocess:
    case FlashKernelKind::kBwdSinkReduce: return 256;
    case FlashKernelKind::kForward:
    case FlashKernelKind::kBwdDkDv:
    case FlashKernelKind::kBwdDq: return ffma() ? 128 : 32 * warps + (wgmma ? 128 : 0);
  }
  return 0;
}

int FlashKernelSpec::sharedBytes() const {
  // Must match the shared-memory carve-up at the top of each kernel in flash_attention_{fwd,bwd}.cuh.
  const bool f32 = ffma();  // the FFMA kernels
  // mma.sync kernels: bytes of a shared row of head dim (16 bytes of padding) and of a dS^T row.
  const int row = f32Mma() ? (dpad + 4) * 4 : (dpad + 8) * 2, dsRow = f32Mma() ? (tile + 4) * 4 : (tile + 8) * 2;
  switch (kind) {
    case FlashKernelKind::kBwdDqConvert:
    case FlashKernelKind::kBwdDkDvReduce:
    case FlashKernelKind::kBwdDqReduce:
    case FlashKernelKind::kBwdPreprocess:
    case FlashKernelKind::kBwdSinkReduce: return 0;
    case FlashKernelKind::kForward:
      // wgmma: Q, the stages of K and V tiles, 1024-byte alignment slack (WgmmaForwardConfig).
      if (wgmma) return 16 * warps * dpad * 2 + 2 * stages * tile * dpad * 2 + 1024;
      // fp32: mtiles is R, the query rows per thread (16 * R rows per block).
      return f32 ? (16 * mtiles * (dpad + 4) + 2 * 64 * (dpad + 4) + 16 * mtiles * 68) * 4
                 : (16 * mtiles * warps + 2 * tile) * row;
    case FlashKernelKind::kBwdDkDv:
      // wgmma: K and V of 16·warps keys, per stage Q, dO and the query statistics (20 bytes a row,
      // rounded to 1 KB), alignment slack (WgmmaDkDvConfig).
      if (wgmma) return 2 * 16 * warps * dpad * 2 + stages * (2 * tile * dpad * 2 + (20 * tile + 1023) / 1024 * 1024) + 1024;
      return f32 ? (2 * 16 * mtiles * (dpad + 4) + 2 * 64 * (dpad + 4) + 2 * 16 * mtiles * 68 + 2 * 64) * 4
                 : (2 * 16 * warps + 4 * tile) * row + 4 * tile * 4 + 6 * tile * 4 + (atomicDq ? 16 * warps * dsRow : 0);
    case FlashKernelKind::kBwdDq:
      if (wgmma) return 2 * 16 * warps * dpad * 2 + stages * 2 * tile * dpad * 2 + 1024;  // WgmmaDqConfig
      return f32 ? (2 * 16 * mtiles * (dpad + 4) + 2 * 64 * (dpad + 4) + 16 * mtiles * 68) * 4
                 : (2 * 16 * mtiles * warps + 4 * tile) * row;
  }
  return 0;
}

std::string FlashKernelSpec::name() const {
  std::ostringstream os;
  os << "pa_flash_";
  switch (kind) {
    case FlashKernelKind::kForward: os << "fwd"; break;
    case FlashKernelKind::kBwdPreprocess: os << "bwd_pre"; break;
    case FlashKernelKind::kBwdSinkReduce: os << "bwd_sink"; return os.str();
    case FlashKernelKind::kBwdDkDv: os << "bwd_dkdv"; break;
    case FlashKernelKind::kBwdDq: os << "bwd_dq"; break;
    case FlashKernelKind::kBwdDqConvert: os << "bwd_dqconv"; break;
    case FlashKernelKind::kBwdDkDvReduce: os << "bwd_dkdvsum"; break;
    case FlashKernelKind::kBwdDqReduce: os << "bwd_dqsum_" << dtypeName(dtype) << "_m" << mtiles; return os.str();
  }
  os << "_" << (tf32 ? "tf32" : f64 ? "f64mma" : dtypeName(dtype));
  if (kind == FlashKernelKind::kBwdPreprocess || kind == FlashKernelKind::kBwdDqConvert ||
      kind == FlashKernelKind::kBwdDkDvReduce)
    return os.str();
  os << "_d" << dpad;
  if (!ffma()) os << "_w" << warps << "_t" << tile;
  if (mtiles != 1) os << "_m" << mtiles;
  if (atomicDq) os << "_adq";
  if (wgmma) os << "_wg_s" << stages;
  if (dqPartial) os << "_dqp";
  return os.str();
}

int FlashKernelSpec::rowsPerBlock() const {
  if (ffma()) return 16 * mtiles;  // R rows (or keys) per thread, 16 R per block
  return 16 * warps * (kind == FlashKernelKind::kForward || kind == FlashKernelKind::kBwdDq ? mtiles : 1);
}

std::string FlashKernelSpec::source() const {
  std::string call;
  const std::string d = std::to_string(dpad), w = std::to_string(warps), t = std::to_string(tile);
  const bool f32 = ffma();  // the FFMA kernels
  const std::string tag = tf32 ? "pa::flash::TF32Tag" : f64 ? "pa::flash::F64Tag" : dtypeTag(dtype);  // of the mma.sync kernels
  switch (kind) {
    case FlashKernelKind::kForward:
      if (wgmma) {
        call = "flashForwardWgmma<" + std::string(dtypeTag(dtype)) + ", " + d + ", " + t + ", " + std::to_string(warps / 4) + ", " +
               std::to_string(stages) + ">";
        break;
      }
      call = f32 ? "flashForwardF32<" + d + ", " + std::to_string(mtiles) + ">"
                 : "flashForwardMma<" + tag + ", " + d + ", " + w + ", " + t + ", " +
                       std::to_string(mtiles) + ">";
      break;
    case FlashKernelKind::kBwdPreprocess:
      call = "flashBackwardPreprocess<" + std::string(dtypeTag(dtype)) + ">";
      break;
    case FlashKernelKind::kBwdSinkReduce: call = "flashBackwardSinkReduce"; break;
    case FlashKernelKind::kBwdDkDv:
      if (wgmma) {
        call = "flashBackwardDkDvWgmma<" + std::string(dtypeTag(dtype)) + ", " + d + ", " + t + ", " +
               std::to_string(warps / 4) + ", " + std::to_string(stages) + ">";
        break;
      }
      call = f32 ? "flashBackwardDkDvF32<" + d + ", " + std::to_string(mtiles) + ", " +
                       (dqPartial ? "pa::flash::kDqPartial" : atomicDq ? "pa::flash::kDqAtomic" : "pa::flash::kDqSeparate") + ">"
                 : "flashBackwardDkDvMma<" + tag + ", " + d + ", " + w + ", " + t + ", " +
                       (atomicDq ? "true" : "false") + ">";
      break;
    case FlashKernelKind::kBwdDqConvert:
      call = "flashBackwardDqConvert<" + std::string(dtypeTag(dtype)) + ">";
      break;
    case FlashKernelKind::kBwdDkDvReduce:
      call = "flashBackwardDkDvReduce<" + std::string(dtypeTag(dtype)) + ">";
      break;
    case FlashKernelKind::kBwdDqReduce: call = "flashBackwardDqReduceF32<" + std::to_string(mtiles) + ">"; break;
    case FlashKernelKind::kBwdDq:
      if (wgmma) {
        call = "flashBackwardDqWgmma<" + std::string(dtypeTag(dtype)) + ", " + d + ", " + t + ", " +
               std::to_string(warps / 4) + ", " + std::to_string(stages) + ">";
        break;
      }
      call = f32 ? "flashBackwardDqF32<" + d + ", " + std::to_string(mtiles) + ">"
                 : "flashBackwardDqMma<" + tag + ", " + d + ", " + w + ", " + t + ", " +
                       std::to_string(mtiles) + ">";
      break;
  }
  std::ostringstream os;
  os << "// Generated flash attention instantiation " << name() << "\n"
     << "#include \"kernels/" << (wgmma ? "flash_attention_bwd_wgmma.cuh" : "flash_attention_bwd.cuh") << "\"\n"
     << "extern \"C\" __global__ void __launch_bounds__(" << threads() << ") " << name()
     << "(const pa::FlashKernelParams p) {\n  pa::flash::" << call << "(p);\n}\n";
  return os.str();
}

std::vector<FlashKernelSpec> allFlashKernelSpecs() {
  std::vector<FlashKernelSpec> specs;
  FlashAttentionConfig cfg;
  for (FlashDType dt : {kFlashF32, kFlashF16, kFlashBF16}) {
    cfg.dtype = dt;
    for (int d : {32, 64, 96, 128, 256}) {
      cfg.headDim = d;
      specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg));
      if (dt == kFlashF32) {  // every rows-per-thread variant the launcher may pick
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
      specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg));
      specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDq, cfg));
      if (dt == kFlashF32) {  // the smaller-block variants of the fp32 backward (R = 1, 2)
        const FlashKernelSpec bases[2] = {specs[specs.size() - 2], specs[specs.size() - 1]};
        for (const FlashKernelSpec& base : bases) {
          for (int r : {1, 2}) {
            FlashKernelSpec v = base;
            v.mtiles = r;
            specs.push_back(v);
          }
        }
        // dK/dV in the parts in dQ (Fp32DqMode) chooseSpec did not return above, and the reduce.
        for (int r : {1, 2, 4}) {
          for (int mode = 0; mode < 3; ++mode) {
            FlashKernelSpec v = bases[0];
            v.mtiles = r;
            v.dqPartial = mode == 1;
            v.atomicDq = mode == 2;
            if (v.dqPartial != bases[0].dqPartial || v.atomicDq != bases[0].atomicDq) specs.push_back(v);
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
        specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg));
        cfg.atomicDq = false;
      }
    }
    specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdPreprocess, cfg));
    specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDqConvert, cfg));
    if (dt != kFlashF32) specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDvReduce, cfg));
  }
  specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdSinkReduce, cfg));
  // fp32 on TF32 tensor cores: the mma.sync forward, dK/dV (both dQ schemes) and dQ kernels.
  cfg.dtype = kFlashF32;
  cfg.tf32 = true;
  for (int d : {32, 64, 96, 128, 256}) {
    cfg.headDim = d;
    // Each with the smaller blocks of short sequences (one m-tile, or 2 dK/dV warps) beside it.
    const FlashKernelSpec fwd = FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg);
    specs.push_back(fwd);
    if (fwd.mtiles == 2) {
      FlashKernelSpec v = fwd;
      v.mtiles = 1;
      specs.push_back(v);
    }
    if (d > 128) continue;  // the fp32 backward's limit
    const FlashKernelSpec dkdv = FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg);
    const FlashKernelSpec dq = FlashAttention::chooseSpec(FlashKernelKind::kBwdDq, cfg);
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
    specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg));
    cfg.atomicDq = false;
  }
  cfg.tf32 = false;
  // fp32 on the FP64 tensor cores (head dims <= 64): forward, dK/dV with atomic dQ, and for the
  // deterministic backward dK/dV without it (4 warps, and the 2 of short sequences) and dQ.
  cfg.fp64Mma = FlashFp64Mma::kOn;
  for (int d : {32, 64}) {
    cfg.headDim = d;
    FlashKernelSpec fwd = FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg);
    specs.push_back(fwd);
    fwd.warps = 8;  // PA_FLASH_F64_FWD_WARPS=8
    specs.push_back(fwd);
    specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg));
    cfg.deterministic = true;
    FlashKernelSpec dkdv = FlashAttention::chooseSpec(FlashKernelKind::kBwdDkDv, cfg);
    specs.push_back(dkdv);
    dkdv.warps = 2;
    specs.push_back(dkdv);
    specs.push_back(FlashAttention::chooseSpec(FlashKernelKind::kBwdDq, cfg));
    cfg.deterministic = false;
  }
  cfg.fp64Mma = FlashFp64Mma::kAuto;
  // sm_90a forwards: the launcher's choice and the tile / warpgroup variants its overrides reach.
  for (FlashDType dt : {kFlashF16, kFlashBF16}) {
    cfg.dtype = dt;
    for (int d : {64, 128}) {
      cfg.headDim = d;
      for (FlashKernelKind k : {FlashKernelKind::kBwdDkDv, FlashKernelKind::kBwdDq})
        for (int tile : {64, 128}) {
          FlashKernelSpec v = FlashAttention::chooseSpec(k, cfg, {0, true});
          v.tile = tile;
          if (v.sharedBytes() <= kMaxWgmmaSharedBytes) specs.push_back(v);
        }
      const FlashKernelSpec chosen = FlashAttention::chooseSpec(FlashKernelKind::kForward, cfg, {0, true});
      for (int tile : {64, 128})
        for (int consumers : {1, 2, 3})
          for (int stages : {2, 3}) {
            FlashKernelSpec v = chosen;
            v.tile = tile;
            v.warps = 4 * consumers;
            v.stages = stages;
            if (v.sharedBytes() <= kMaxWgmmaSharedBytes) specs.push_back(v);
          }
    }
  }
  return specs;
}

// ---------------------------------------------------------------------------------------------

FlashAttention::FlashAttention(const cuda::Device& device)
    : device_(device), target_(FlashTarget::of(device.info())) {}

FlashTarget FlashTarget::of(const cuda::DeviceInfo& info) {
  FlashTarget t;
  t.multiprocessors = info.multiprocessors;
  t.wgmma = info.arch() == "sm_90a";
  // The data-centre parts of Ampere and Hopper (A100, H100, H200: compute capability 8.0 / 9.0)
  // run FP64 FMAs at the FP32 rate; the others at 1/64 or less (and Blackwell's DMMA at half).
  t.fullRateFp64 = info.minor == 0 && (info.major == 8 || info.major == 9);
  return t;
}

FlashAttention::~FlashAttention() {
  for (auto& kv : loaded_)
    if (kv.second.module) cuda::Driver::instance().api().cuModuleUnload(kv.second.module);
}

FlashKernelSpec FlashAttention::chooseSpec(FlashKernelKind kind, const FlashAttentionConfig& cfg,
                                           const FlashTarget& target) {
  const int multiprocessors = target.multiprocessors;
  FlashKernelSpec s;
  s.kind = kind;
  s.dtype = cfg.dtype;
  s.dpad = padHeadDim(cfg.headDim);
  // fp32 products run on the exact FFMA kernels, or with tf32 / fp64Mma on the mma.sync kernels
  // of the 16-bit types (the wgmma kernels stay 16-bit). `ffma` is read for product kernels only.
  const bool products =
      kind == FlashKernelKind::kForward || kind == FlashKernelKind::kBwdDkDv || kind == FlashKernelKind::kBwdDq;
  s.tf32 = cfg.dtype == kFlashF32 && cfg.tf32 && products;
  s.f64 = cfg.dtype == kFlashF32 && products && usesFp64Mma(kind, cfg, target);
  const bool ffma = s.ffma();
  // Tile sizes per head dim (tunable; bench/RESULTS_flash.md has the measurements behind them).
  s.warps = 4;
  s.tile = 64;
  // Forward: 128-row blocks (2 m-tiles per warp) as FlashAttention-2 does, except at head dim 256
  // where two m-tiles of accumulators would not fit the register file.
  s.mtiles = kind == FlashKernelKind::kForward && !ffma && s.dpad <= 128 ? 2 : 1;
  // Measured on the H100 (bench/RESULTS_flash.md, tile sweep): 64 keys per tile at head dim <= 64,
  // 32 above, where S of 2 x 64 keys beside O would exceed the register file.
  if (kind == FlashKernelKind::kForward && s.mtiles == 2 && s.dpad > 64) s.tile = 32;
  // Debug knobs for tuning runs (docs/flash_attention.md): PA_FLASH_FWD_TILE, PA_FLASH_FWD_MT.
  // fp32 forward: R query rows per thread (16 R per block). Large R loads shared memory less per
  // FFMA; small R makes more blocks, which short sequences need to fill the GPU (their blocks are
  // latency bound), but every block streams all of K and V, so R = 1 pays only for q_len <= 128.
  // Rule from the R sweep in bench/RESULTS_flash.md (B=1, H=8, D=64): the largest R whose grid
  // has >= 1.9 blocks per multiprocessor (two fit at R = 8, head dim <= 64), else R = 2.
  if (kind == FlashKernelKind::kForward && ffma) {
    s.mtiles = 4;
    if (multiprocessors > 0) {
      const long long slices = (long long)cfg.batch * cfg.heads;
      s.mtiles = cfg.qLen <= 128 ? 1 : 2;
      for (int r : {8, 4, 2})
        if ((r < 8 || s.dpad <= 64) && 10 * slices * ceilDiv(cfg.qLen, 16 * r) >= 19LL * multiprocessors) {
          s.mtiles = r;
          break;
        }
    }
    if (const int r = tuningOverride("PA_FLASH_F32_FWD_R")) s.mtiles = r;
  }
  // fp32 backward: the same trade and rule with R in {4, 2, 1} keys (dK/dV) or rows (dQ) per
  // thread (sweep in bench/RESULTS_flash.md).
  if ((kind == FlashKernelKind::kBwdDkDv || kind == FlashKernelKind::kBwdDq) && ffma) {
    s.mtiles = 4;
    if (multiprocessors > 0) {
      const bool dkdv = kind == FlashKernelKind::kBwdDkDv;
      const long long slices = (long long)cfg.batch * (dkdv ? cfg.kvHeads : cfg.heads);
      const int len = dkdv ? cfg.kLen : cfg.qLen;
      s.mtiles = len <= 128 ? 1 : 2;
      for (int r : {4, 2})
        if (10 * slices * ceilDiv(len, 16 * r) >= 19LL * multiprocessors) {
          s.mtiles = r;
          break;
        }
    }
    if (const int r = tuningOverride("PA_FLASH_F32_BWD_R")) s.mtiles = r;
  }
  // fp32 dQ (Fp32DqMode in flash_attention_bwd.cuh): up to kMaxDqPartialBlocks key blocks, their
  // per-block shares summed in order; beyond, atomics unless the backward must be deterministic,
  // then the separate dQ kernel (two recomputed products). `atomicDq` asks for atomics always.
  if (kind == FlashKernelKind::kBwdDkDv && ffma) {
    s.dqPartial = !cfg.atomicDq && ceilDiv(cfg.kLen, 16 * s.mtiles) <= kMaxDqPartialBlocks;
    s.atomicDq = cfg.atomicDq || (!s.dqPartial && !cfg.deterministic);
  }
  if (kind == FlashKernelKind::kBwdDqReduce) {  // the dK/dV kernel's key blocks decide it
    s.mtiles = chooseSpec(FlashKernelKind::kBwdDkDv, cfg, target).mtiles;
    s.dpad = 0;
  }
  // FP64 fragments take twice TF32's registers: at head dims <= 64 (validate() allows no more)
  // the tiles that fit 255 registers without spills (ptxas -v on sm_90) are one m-tile of 64-key
  // tiles in the forward (228 registers with its fp64 S and O), 4 warps over 32-row query tiles in dK/dV (atomic dQ 254,
  // without 214) and one m-tile over 32 keys in dQ (216; set below). Its dK/dV kernel adds dQ with atomics
  // (5 products a tile pair, as the fp32 FFMA path beyond a few key blocks) unless the backward
  // must be deterministic.
  if (s.f64 && kind != FlashKernelKind::kBwdDq) {
    s.mtiles = 1;
    s.warps = 4;
    s.tile = kind == FlashKernelKind::kForward ? 64 : 32;
    if (kind == FlashKernelKind::kBwdDkDv) s.atomicDq = cfg.atomicDq || !cfg.deterministic;
    // 8 warps (128 rows, 230 registers) make half the blocks, one an SM: a tuning knob until
    // measured (S = 4096, B 1, H 8: 512 blocks of 64 rows, 2 an SM, or 256 of 128, one an SM).
    if (const int w = tuningOverride("PA_FLASH_F64_FWD_WARPS"); w && kind == FlashKernelKind::kForward) s.warps = w;
  }
  if (kind == FlashKernelKind::kForward && !ffma) {
    if (const int t = tuningOverride("PA_FLASH_FWD_TILE")) s.tile = t;
    if (const int m = tuningOverride("PA_FLASH_FWD_MT")) s.mtiles = m;
  }
  // dQ kernel: the forward's 128-row blocks; S and dP of 2 x 32 keys beside dQ above head dim 64.
  // TF32 fragments take twice the registers of 16-bit ones, so its backward takes the tiles that
  // fit 255 registers without spills (ptxas -v): dQ over 32 keys, 2 m-tiles at head dim <= 64 and
  // 1 above; dK/dV over 64 query rows at head dim <= 64, 32 above and with atomic dQ.
  if (kind == FlashKernelKind::kBwdDq && !ffma) {
    if (const int m = tuningOverride("PA_FLASH_DQ_MT")) s.mtiles = m;
    else s.mtiles = !s.f64 && s.dpad <= (s.tf32 ? 64 : 128) ? 2 : 1;
    if (s.f32Mma() || (s.mtiles == 2 && s.dpad > 64)) s.tile = 32;
    if (const int t = tuningOverride("PA_FLASH_DQ_TILE")) s.tile = t;
  }
  if (kind == FlashKernelKind::kBwdDkDv && s.tf32) s.tile = cfg.atomicDq || s.dpad > 64 ? 32 : 64;
  // Backward, FlashAttention-2 scheme: 8 warps x 16 keys share each Q/dO tile; 4 at head dim 256,
  // where the key tiles of 128 rows would not fit shared memory. TF32: 8 at head dim 64 only (its
  // 4-byte rows do not fit above; below, the dQ product's column split needs 16 columns a warp).
  if (kind == FlashKernelKind::kBwdDkDv && !ffma && !s.f64 && cfg.atomicDq) {
    s.atomicDq = true;
    s.warps = s.tf32 ? (s.dpad == 64 ? 8 : 4) : (s.dpad <= 128 ? 8 : 4);
  }
  // TF32 on short sequences: a grid of fewer blocks than multiprocessors leaves most of the GPU
  // idle, and each block is latency bound; halve the rows of a block there (forward and dQ: one
  // m-tile unless a tuning override set it; dK/dV: 2 warps = 32 keys, default dQ scheme).
  // Measured in bench/RESULTS_flash.md.
  if (s.f32Mma() && multiprocessors > 0) {
    const bool dkdv = kind == FlashKernelKind::kBwdDkDv;
    const long long slices = (long long)cfg.batch * (dkdv ? cfg.kvHeads : cfg.heads);
    if (slices * ceilDiv(dkdv ? cfg.kLen : cfg.qLen, s.rowsPerBlock()) < multiprocessors) {
      const char* mtKnob = kind == FlashKernelKind::kForward ? "PA_FLASH_FWD_MT" : "PA_FLASH_DQ_MT";
      if (!dkdv && s.mtiles == 2 && !tuningOverride(mtKnob)) s.mtiles = 1;
      if (dkdv && !s.atomicDq && s.warps == 4) s.warps = 2;
    }
  }
  // sm_90a, 16-bit forward at padded head dims 64 and 128 (head dims 33-64 and 97-128 pad up):
  // wgmma with a producer warpgroup, 128-key tiles in a two-stage ring, and three consumer
  // warpgroups (192 query rows) at head dim 64 from 2048 queries on, two (128 rows) otherwise: the
  // fastest of the sweeps in bench/RESULTS_flash.md (shorter sequences waste more of a 192-row
  // block on the partial last tile and on causal imbalance). PA_FLASH_WGMMA=0 keeps the mma.sync kernel; PA_FLASH_FWD_TILE,
  // PA_FLASH_FWD_WG and PA_FLASH_FWD_STAGES override tile, consumer warpgroups and stages.
  if (kind == FlashKernelKind::kForward && cfg.dtype != kFlashF32 && target.wgmma && (s.dpad == 64 || s.dpad == 128) &&
      !wgmmaSwitchedOff()) {
    s.wgmma = true;
    s.mtiles = 1;
    s.tile = 128;
    s.warps = s.dpad == 64 && cfg.qLen >= 2048 ? 12 : 8;
    s.stages = 2;
    if (const int t = tuningOverride("PA_FLASH_FWD_TILE")) s.tile = t;
    if (const int w = tuningOverride("PA_FLASH_FWD_WG")) s.warps = 4 * w;
    if (const int st = tuningOverride("PA_FLASH_FWD_STAGES")) s.stages = st;
  }
  // sm_90a backward at the same head dims, default scheme (no atomic dQ): the wgmma dK/dV and dQ
  // kernels (flash_attention_bwd_wgmma.cuh), two consumer warpgroups (128 keys / query rows) and
  // streamed tiles of 128 rows at head dim 64, 64 at 128 (128 spills heavily there), two stages:
  // the fastest of the sweep in bench/RESULTS_flash.md. PA_FLASH_BWD_TILE / PA_FLASH_BWD_WG
  // override tile and warpgroups for tuning runs.
  if ((kind == FlashKernelKind::kBwdDkDv || kind == FlashKernelKind::kBwdDq) && cfg.dtype != kFlashF32 && target.wgmma &&
      !cfg.atomicDq && (s.dpad == 64 || s.dpad == 128) && !wgmmaSwitchedOff()) {
    s.wgmma = true;
    s.mtiles = 1;
    s.tile = s.dpad == 64 ? 128 : 64;
    s.warps = 8;
    s.stages = 2;
    if (const int t = tuningOverride("PA_FLASH_BWD_TILE")) s.tile = t;
    if (const int w = tuningOverride("PA_FLASH_BWD_WG")) s.warps = 4 * w;
  }
  if (kind == FlashKernelKind::kBwdPreprocess || kind == FlashKernelKind::kBwdSinkReduce ||
      kind == FlashKernelKind::kBwdDqConvert || kind == FlashKernelKind::kBwdDkDvReduce)
    s.dpad = 0;
  if (kind == FlashKernelKind::kBwdSinkReduce) s.dtype = kFlashF32;
  return s;
}

void FlashAttention::validate(const FlashAttentionConfig& c, bool backward) const {
  if (c.batch < 1 || c.heads < 1 || c.kvHeads < 1)
    fail("batch, heads and kvHeads must be >= 1 (got " + std::to_string(c.batch) + ", " +
         std::to_string(c.heads) + ", " + std::to_string(c.kvHeads) + ")");
  if (c.heads % c.kvHeads != 0)
    fail("query heads (" + std::to_string(c.heads) + ") must be a multiple of kv heads (" +
         std::to_string(c.kvHeads) + ")");
  if (c.qLen < 0 || c.kLen < 0) fail("sequence lengths must be >= 0");
  // The shape limits fuse-attention also reads (common/flash_attention_limits.h).
  const std::string cannot = flashCudaCannotRun(c.batch, c.heads, c.headDim, backward && c.dtype == kFlashF32);
  if (!cannot.empty()) fail(cannot);
  if (c.mask.windowLeft < -1 || c.mask.windowRight < -1 || c.mask.sinks < 0)
    fail("window offsets must be >= -1 (-1 = unbounded) and sinks >= 0");
  if (!(c.scale >= 0.f) || !std::isfinite(c.scale)) fail("scale must be finite and >= 0 (0 = 1/sqrt(head dim))");
  if (c.tf32 && c.dtype != kFlashF32)
    fail(std::string("tf32 applies to fp32 inputs only; these are ") + dtypeName(c.dtype) +
         " (their products already run on the tensor cores)");
  const bool fp64MmaOn = c.fp64Mma == FlashFp64Mma::kOn;  // kAuto falls back to FFMA where DMMA cannot run
  if (fp64MmaOn && c.dtype != kFlashF32)
    fail(std::string("fp64Mma applies to fp32 inputs only; these are ") + dtypeName(c.dtype));
  if (fp64MmaOn && c.tf32) fail("tf32 and fp64Mma both set: choose one way to run fp32 on the tensor cores");
  if (fp64MmaOn && c.headDim > 64)
    fail("fp64Mma supports head dim <= 64 (got " + std::to_string(c.headDim) +
         "): above, its fp64 fragments spill registers; use the default FFMA kernels or tf32");
  if (backward && c.deterministic && c.atomicDq)
    fail("deterministic and atomicDq both set: fp32 atomics make dQ's summation order vary from run to "
         "run, so a deterministic backward cannot use them; drop atomicDq");
  const int limit = device_.info().maxSharedBytesOptin;
  const FlashKernelKind kinds[2] = {backward ? FlashKernelKind::kBwdDkDv : FlashKernelKind::kForward,
                                    backward ? FlashKernelKind::kBwdDq : FlashKernelKind::kForward};
  for (FlashKernelKind k : kinds) {
    const FlashKernelSpec s = specFor(k, c);
    if (s.sharedBytes() > limit)
      fail(s.name() + " needs " + std::to_string(s.sharedBytes()) + " bytes of shared memory; " +
           device_.info().name + " allows " + std::to_string(limit));
  }
}

FlashKernelSpec FlashAttention::specFor(FlashKernelKind kind, const FlashAttentionConfig& c) const {
  return chooseSpec(kind, c, target_);
}

FlashKernelParams FlashAttention::baseParams(const FlashAttentionConfig& c) const {
  FlashKernelParams p{};
  p.batch = c.batch;
  p.heads = c.heads;
  p.kvHeads = c.kvHeads;
  p.qLen = c.qLen;
  p.kLen = c.kLen;
  p.headDim = c.headDim;
  p.scale = c.scale > 0.f ? c.scale : 1.f / std::sqrt((float)c.headDim);
  p.scaleLog2 = p.scale * 1.4426950408889634f;
  p.mask = c.mask;
  p.qTiles = ceilDiv(c.qLen, kPreprocessRows);
  return p;
}

static FlashTensorView view(const FlashTensor& t) {
  return FlashTensorView{t.ptr, t.batchStride, t.headStride, t.seqStride};
}

const FlashAttention::Loaded& FlashAttention::load(const FlashKernelSpec& spec) {
  // Integer key: launches happen every training step, so the hit path builds no strings.
  // Every field of the spec that changes the source has its own digits (mtiles < 16).
  unsigned long long key = (unsigned long long)spec.kind * 4 + spec.dtype;
  key = (key * 1024 + spec.dpad) * 64 + spec.warps;
  key = (key * 1024 + spec.tile) * 16 + spec.mtiles;
  key = ((key * 4 + spec.atomicDq * 2 + spec.dqPartial) * 2 + spec.wgmma) * 16 + spec.stages;
  key = (key * 2 + spec.tf32) * 2 + spec.f64;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = loaded_.find(key);
  if (it != loaded_.end()) return it->second;
  const std::string name = spec.name();
  codegen::CompileRequest req;
  req.kernelName = name;
  req.source = spec.source();
  req.headers = codegen::embeddedKernelHeaders();
  req.arch = device_.info().arch();
  const codegen::CompileResult res = codegen::Nvrtc::instance().compile(req);
  device_.makeCurrent();
  Loaded l;
  PA_CU_CHECK(cuModuleLoadData(&l.module, res.cubin.data()));
  PA_CU_CHECK(cuModuleGetFunction(&l.function, l.module, name.c_str()));
  if (spec.sharedBytes() > 48 * 1024)
    PA_CU_CHECK(cuFuncSetAttribute(l.function, cuda::kFuncAttrMaxDynamicSharedSizeBytes, spec.sharedBytes()));
  return loaded_.emplace(key, l).first->second;
}

void FlashAttention::launch(const FlashKernelSpec& spec, unsigned gridX, unsigned gridY,
                            const FlashKernelParams& params, cuda::CUstream stream) {
  if (gridX == 0 || gridY == 0) return;
  const Loaded& l = load(spec);
  FlashKernelParams copy = params;
  void* args[] = {&copy};
  ++launches_;
  PA_CU_CHECK(cuLaunchKernel(l.function, gridX, gridY, 1, spec.threads(), 1, 1, spec.sharedBytes(), stream, args, nullptr));
}

void FlashAttention::forward(const FlashAttentionConfig& c, const FlashForwardArgs& a, cuda::CUstream stream) {
  validate(c, false);
  for (auto [n, t] : {std::make_pair("q", a.q), std::make_pair("k", a.k), std::make_pair("v", a.v), std::make_pair("o", a.o)})
    checkTensor(n, t, c.dtype);
  if (!a.lse) fail("lse is null");
  if (c.sinkLogits && !a.sinkLogits) fail("config.sinkLogits is set but sinkLogits is null");
  FlashKernelParams p = baseParams(c);
  p.q = view(a.q), p.k = view(a.k), p.v = view(a.v), p.o = view(a.o);
  p.lse = a.lse;
  p.sinkLogits = c.sinkLogits ? a.sinkLogits : 0;
  const FlashKernelSpec spec = specFor(FlashKernelKind::kForward, c);
  launch(spec, ceilDiv(c.qLen, spec.rowsPerBlock()), c.batch * c.heads, p, stream);
}

size_t FlashAttention::backwardWorkspaceBytes(const FlashAttentionConfig& c) const {
  // delta [batch, heads, qLen] + sink partials [heads, batch * qTiles], each 16-byte aligned.
  const size_t delta = ((size_t)c.batch * c.heads * c.qLen * 4 + 15) / 16 * 16;
  const size_t partial = ((size_t)c.heads * c.batch * ceilDiv(c.qLen, kPreprocessRows) * 4 + 15) / 16 * 16;
  const size_t dqAccum = (size_t)c.batch * c.heads * c.qLen * c.headDim * 4;  // atomic-dQ path only
  const size_t dkvPartial = splitKvHeads(c) ? 2 * (size_t)c.batch * c.heads * c.kLen * c.headDim * 4 : 0;
  const FlashKernelSpec dkdv = specFor(FlashKernelKind::kBwdDkDv, c);
  const size_t dqPartial = dkdv.dqPartial ? (size_t)ceilDiv(c.kLen, dkdv.rowsPerBlock()) * dqAccum + 16 : 0;
  return delta + partial + (dkdv.atomicDq ? dqAccum : 0) + dkvPartial + dqPartial + 16;
}

void FlashAttention::backward(const FlashAttentionConfig& c, const FlashBackwardArgs& a, cuda::CUstream stream) {
  validate(c, true);
  for (auto [n, t] : {std::make_pair("q", a.q), std::make_pair("k", a.k), std::make_pair("v", a.v),
                      std::make_pair("o", a.o), std::make_pair("dO", a.dO), std::make_pair("dQ", a.dQ),
                      std::make_pair("dK", a.dK), std::make_pair("dV", a.dV)})
    checkTensor(n, t, c.dtype);
  if (!a.lse) fail("lse is null");
  if (!a.workspace) fail("workspace is null (size: backwardWorkspaceBytes)");
  if (c.sinkLogits && (!a.sinkLogits || !a.dSinkLogits))
    fail("config.sinkLogits is set but sinkLogits or dSinkLogits is null");
  FlashKernelParams p = baseParams(c);
  p.q = view(a.q), p.k = view(a.k), p.v = view(a.v), p.o = view(a.o);
  p.dO = view(a.dO), p.dQ = view(a.dQ), p.dK = view(a.dK), p.dV = view(a.dV);
  p.lse = a.lse;
  p.sinkLogits = c.sinkLogits ? a.sinkLogits : 0;
  p.dSinkLogits = c.sinkLogits ? a.dSinkLogits : 0;
  p.delta = a.workspace;
  p.sinkPartial = a.workspace + ((size_t)c.batch * c.heads * c.qLen * 4 + 15) / 16 * 16;
  const FlashKernelSpec dkdv = specFor(FlashKernelKind::kBwdDkDv, c);
  unsigned long long next = p.sinkPartial + ((size_t)c.heads * c.batch * p.qTiles * 4 + 15) / 16 * 16;
  if (dkdv.atomicDq) {
    p.dQAccum = next;
    next += ((size_t)c.batch * c.heads * c.qLen * c.headDim * 4 + 15) / 16 * 16;
  }
  if (splitKvHeads(c)) {
    p.dKVPartial = next;
    next += (2 * (size_t)c.batch * c.heads * c.kLen * c.headDim * 4 + 15) / 16 * 16;
  }
  if (dkdv.dqPartial) p.dQPartial = next;

  launch(chooseSpec(FlashKernelKind::kBwdPreprocess, c), p.qTiles, c.batch * c.heads, p, stream);
  // With qLen == 0 there are no partials and the reduce kernel writes the empty sum, 0.
  if (c.sinkLogits) launch(chooseSpec(FlashKernelKind::kBwdSinkReduce, c), c.heads, 1, p, stream);
  launch(dkdv, ceilDiv(c.kLen, dkdv.rowsPerBlock()), c.batch * (p.dKVPartial ? c.heads : c.kvHeads), p, stream);
  if (p.dKVPartial) launch(chooseSpec(FlashKernelKind::kBwdDkDvReduce, c), ceilDiv(c.kLen, 64), c.batch * c.kvHeads, p, stream);
  if (dkdv.atomicDq) {
    launch(chooseSpec(FlashKernelKind::kBwdDqConvert, c), p.qTiles, c.batch * c.heads, p, stream);
  } else if (dkdv.dqPartial) {
    launch(chooseSpec(FlashKernelKind::kBwdDqReduce, c, target_), ceilDiv(c.qLen, 64),
           c.batch * c.heads, p, stream);
  } else {
    const FlashKernelSpec dq = specFor(FlashKernelKind::kBwdDq, c);
    launch(dq, ceilDiv(c.qLen, dq.rowsPerBlock()), c.batch * c.heads, p, stream);
  }
}

}  // namespace pa
