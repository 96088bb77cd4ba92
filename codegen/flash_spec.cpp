// FlashKernelSpec: the name, generated source, block size and shared memory of one instantiation.
#include "codegen/flash_spec.h"

#include <sstream>

namespace pa {

namespace {

const char* dtypeTag(FlashDType t) {
  switch (t) {
    case kFlashF32: return "pa::flash::F32Tag";
    case kFlashF16: return "pa::flash::F16Tag";
    case kFlashBF16: return "pa::flash::BF16Tag";
  }
  return "?";
}

// The one kernels/ header a generated instantiation includes: its family's.
const char* headerOf(const FlashKernelSpec& s) {
  switch (s.kind) {
    case FlashKernelKind::kForward: return s.wgmma ? "flash_attention_fwd_wgmma.cuh" : "flash_attention_fwd.cuh";
    case FlashKernelKind::kBwdDkDv:
    case FlashKernelKind::kBwdDq:
      return s.wgmma ? "flash_attention_bwd_wgmma.cuh" : s.ffma() ? "flash_attention_bwd_ffma.cuh" : "flash_attention_bwd_mma.cuh";
    case FlashKernelKind::kBwdDqReduce: return "flash_attention_bwd_ffma.cuh";
    case FlashKernelKind::kBwdPreprocess:
    case FlashKernelKind::kBwdSinkReduce:
    case FlashKernelKind::kBwdDqConvert:
    case FlashKernelKind::kBwdDkDvReduce: return "flash_attention_bwd_common.cuh";
  }
  return "?";
}

}  // namespace

const char* flashDTypeName(FlashDType t) {
  switch (t) {
    case kFlashF32: return "f32";
    case kFlashF16: return "f16";
    case kFlashBF16: return "bf16";
  }
  return "?";
}

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
  // Must match the shared-memory carve-up at the top of each kernel in flash_attention_{fwd,bwd_mma,bwd_ffma}.cuh
  // and their wgmma versions.
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
      if (wgmma) return (persistent ? 2 : 1) * 16 * warps * dpad * 2 + 2 * stages * tile * dpad * 2 + 1024;
      // fp32: mtiles is R, the query rows per thread (16 * R rows per block).
      return f32 ? (16 * mtiles * (dpad + 4) + 2 * 64 * (dpad + 4) + 16 * mtiles * 68) * 4
                 : (16 * mtiles * warps + 2 * tile) * row;
    case FlashKernelKind::kBwdDkDv:
      // wgmma: K and V of the block's keys, per stage Q, dO and the query statistics (20 bytes a
      // row, rounded to 1 KB), above 128 the fp32 Pᵀ one warpgroup hands the other (64 keys × the
      // tile), alignment slack (WgmmaDkDvConfig).
      if (wgmma)
        return (persistent ? 2 : 1) * 2 * rowsPerBlock() * dpad * 2 + stages * (2 * tile * dpad * 2 + (20 * tile + 1023) / 1024 * 1024) +
               flashDkDvExchangeBytes(dpad, tile) + 1024;
      return f32 ? (2 * 16 * mtiles * (dpad + 4) + 2 * 64 * (dpad + 4) + 2 * 16 * mtiles * 68 + 2 * 64) * 4
                 : (2 * 16 * warps + 4 * tile) * row + 4 * tile * 4 + 6 * tile * 4 + (atomicDq || dqPartial ? 16 * warps * dsRow : 0);
    case FlashKernelKind::kBwdDq:
      if (wgmma) return (persistent ? 2 : 1) * 2 * 16 * warps * dpad * 2 + stages * 2 * tile * dpad * 2 + 1024;  // WgmmaDqConfig
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
    case FlashKernelKind::kBwdDqReduce:
      os << "bwd_dqsum_" << flashDTypeName(dtype) << "_m" << mtiles;
      if (tile != 64) os << "_q" << tile;  // the dK/dV kernel's query tile, where not FFMA's 64
      return os.str();
  }
  os << "_" << (tf32 ? "tf32" : f64 ? "f64mma" : flashDTypeName(dtype));
  if (kind == FlashKernelKind::kBwdPreprocess || kind == FlashKernelKind::kBwdDqConvert ||
      kind == FlashKernelKind::kBwdDkDvReduce)
    return os.str();
  os << "_d" << dpad;
  if (!ffma()) os << "_w" << warps << "_t" << tile;
  if (mtiles != 1) os << "_m" << mtiles;
  if (atomicDq) os << "_adq";
  if (wgmma) os << "_wg_s" << stages;
  if (pingpong) os << "_pp";
  if (persistent) os << "_ps";
  if (sinkTile) os << "_sk";
  if (tma) os << "_tma";
  if (dqPartial) os << "_dqp";
  if (querySplit > 1) os << "_qs" << querySplit;
  return os.str();
}

unsigned long long FlashKernelSpec::key() const {
  unsigned long long k = (unsigned long long)kind * 4 + dtype;
  k = (k * 1024 + dpad) * 64 + warps;
  k = (k * 1024 + tile) * 16 + mtiles;
  k = ((k * 4 + atomicDq * 2 + dqPartial) * 2 + wgmma) * 16 + stages;
  k = (k * 2 + tf32) * 2 + f64;
  k = (((k * 2 + pingpong) * 2 + persistent) * 2 + sinkTile) * 2 + tma;
  return k * 8 + querySplit;  // 52 bits so far
}

int FlashKernelSpec::rowsPerBlock() const {
  if (ffma()) return 16 * mtiles;  // R rows (or keys) per thread, 16 R per block
  if (wgmma && kind == FlashKernelKind::kBwdDkDv) return flashDkDvKeys(dpad, warps / 4);
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
               std::to_string(stages) + ", " + (pingpong ? "true" : "false") + ", " + (persistent ? "true" : "false") +
               (sinkTile || tma ? (sinkTile ? ", true" : ", false") : "") + (tma ? ", true" : "") + ">";
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
               std::to_string(warps / 4) + ", " + std::to_string(stages) + ", " + (persistent ? "true" : "false") +
               (tma ? ", true" : "") + ">";
        break;
      }
      call = f32 ? "flashBackwardDkDvF32<" + d + ", " + std::to_string(mtiles) + ", " +
                       (dqPartial ? "pa::flash::kDqPartial" : atomicDq ? "pa::flash::kDqAtomic" : "pa::flash::kDqSeparate") +
                       (querySplit > 1 ? ", " + std::to_string(querySplit) : "") + ">"
                 : "flashBackwardDkDvMma<" + tag + ", " + d + ", " + w + ", " + t + ", " +
                       (atomicDq ? "true" : "false") + (dqPartial ? ", true" : "") + ">";
      break;
    case FlashKernelKind::kBwdDqConvert:
      call = "flashBackwardDqConvert<" + std::string(dtypeTag(dtype)) + ">";
      break;
    case FlashKernelKind::kBwdDkDvReduce:
      call = "flashBackwardDkDvReduce<" + std::string(dtypeTag(dtype)) + ">";
      break;
    case FlashKernelKind::kBwdDqReduce:
      call = "flashBackwardDqReduceF32<" + std::to_string(mtiles) + (tile != 64 ? ", " + t : "") + ">";
      break;
    case FlashKernelKind::kBwdDq:
      if (wgmma) {
        call = "flashBackwardDqWgmma<" + std::string(dtypeTag(dtype)) + ", " + d + ", " + t + ", " +
               std::to_string(warps / 4) + ", " + std::to_string(stages) + ", " + (persistent ? "true" : "false") +
               (sinkTile || tma ? (sinkTile ? ", true" : ", false") : "") + (tma ? ", true" : "") + ">";
        break;
      }
      call = f32 ? "flashBackwardDqF32<" + d + ", " + std::to_string(mtiles) + ">"
                 : "flashBackwardDqMma<" + tag + ", " + d + ", " + w + ", " + t + ", " +
                       std::to_string(mtiles) + ">";
      break;
  }
  std::ostringstream os;
  os << "// Generated flash attention instantiation " << name() << "\n"
     << "#include \"kernels/pdl.cuh\"\n"
     << "#include \"kernels/" << headerOf(*this) << "\"\n"
     << "extern \"C\" __global__ void __launch_bounds__(" << threads() << ") " << name()
     << (tma ? "(const pa::FlashKernelParams p, const __grid_constant__ pa::FlashTensorMaps maps) {\n"
             : "(const pa::FlashKernelParams p) {\n")
     << "  pa::pdlBegin();\n  pa::flash::" << call << (tma ? "(p, &maps);\n}\n" : "(p);\n}\n");
  return os.str();
}

}  // namespace pa
