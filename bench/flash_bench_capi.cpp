// C API over the flash attention launcher for bench/attention_vs_torch.py (ctypes, torch tensors);
// the PA_FLASH_* variables of docs/flash_attention.md set its options and tuning overrides.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/flash_attention.h"

namespace {

std::unique_ptr<pa::cuda::Device> gDevice;
std::unique_ptr<pa::FlashAttention> gFlash;

// The launcher's tuning overrides from the environment, read at every call so that a sweep can
// change them between calls (docs/flash_attention.md lists them); unset or empty: the rule.
int knob(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}
bool onOff(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0 && std::strcmp(v, "off") != 0;
}
// -1 (the rule) when unset or empty, else onOff's 0 / 1.
int onOffOrRule(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? onOff(name, true) : -1;
}
pa::FlashTuning tuningFromEnvironment() {
  pa::FlashTuning t;
  t.fwdTile = knob("PA_FLASH_FWD_TILE");
  t.fwdMtiles = knob("PA_FLASH_FWD_MT");
  t.fwdWarpgroups = knob("PA_FLASH_FWD_WG");
  t.fwdStages = knob("PA_FLASH_FWD_STAGES");
  t.fwdPingPong = onOffOrRule("PA_FLASH_FWD_PINGPONG");
  t.fwdPersistent = onOffOrRule("PA_FLASH_FWD_PERSISTENT");
  t.bwdPersistent = onOffOrRule("PA_FLASH_BWD_PERSISTENT");
  t.sinkTile = onOffOrRule("PA_FLASH_SINK_TILE");
  t.tma = onOffOrRule("PA_FLASH_TMA");
  t.bwdTile = knob("PA_FLASH_BWD_TILE");
  t.bwdWarpgroups = knob("PA_FLASH_BWD_WG");
  t.bwdStages = knob("PA_FLASH_BWD_STAGES");
  t.wgmma = onOff("PA_FLASH_WGMMA", true);
  t.splitKv = onOffOrRule("PA_FLASH_SPLIT_KV");
  t.dqTile = knob("PA_FLASH_DQ_TILE");
  t.dqMtiles = knob("PA_FLASH_DQ_MT");
  t.f32FwdRows = knob("PA_FLASH_F32_FWD_R");
  t.f32BwdRows = knob("PA_FLASH_F32_BWD_R");
  t.f32BwdSplit = knob("PA_FLASH_F32_BWD_SPLIT");
  t.f64FwdWarps = knob("PA_FLASH_F64_FWD_WARPS");
  return t;
}

int report(const std::exception& e, char* err, int errLen) {
  if (err && errLen > 0) {
    std::strncpy(err, e.what(), errLen - 1);
    err[errLen - 1] = 0;
  }
  return 1;
}

pa::FlashAttentionConfig config(int dtype, int b, int hq, int hkv, int sq, int sk, int d, float scale, int causal,
                                int bottomRight, int wl, int wr, int sinks, int sinkLogits) {
  pa::FlashAttentionConfig c;
  c.dtype = (pa::FlashDType)dtype;
  c.batch = b, c.heads = hq, c.kvHeads = hkv, c.qLen = sq, c.kLen = sk, c.headDim = d, c.scale = scale;
  c.mask.causal = causal, c.mask.alignBottomRight = bottomRight, c.mask.windowLeft = wl, c.mask.windowRight = wr;
  c.mask.sinks = sinks;
  c.sinkLogits = sinkLogits != 0;
  // The benchmark compares both backward schemes without a second entry point.
  const char* det = std::getenv("PA_FLASH_DETERMINISTIC");
  c.deterministic = det && det[0] == '1';
  const char* atomic = std::getenv("PA_FLASH_ATOMIC_DQ");
  c.atomicDq = atomic && atomic[0] == '1';
  const char* tf32 = std::getenv("PA_FLASH_TF32");  // fp32 inputs on the TF32 tensor cores
  c.tf32 = tf32 && tf32[0] == '1' && c.dtype == pa::kFlashF32;
  // fp32 on the FP64 tensor cores: unset = the default (kAuto), 0 = FFMA throughout, 1 = forward
  // and backward on DMMA.
  const char* f64 = std::getenv("PA_FLASH_FP64MMA");
  if (f64 && f64[0] == '0') c.fp64Mma = pa::FlashFp64Mma::kOff;
  if (f64 && f64[0] == '1' && c.dtype == pa::kFlashF32 && !c.tf32) c.fp64Mma = pa::FlashFp64Mma::kOn;
  if (gFlash) gFlash->setTuning(tuningFromEnvironment());
  return c;
}

pa::FlashTensor contiguous(void* p, int heads, int seq, int d) {
  return pa::FlashTensor::contiguous((unsigned long long)p, heads, seq, d);
}

}  // namespace

extern "C" {

// Opens device 0 (its primary context, shared with PyTorch). 0 on success.
int paFlashInit(char* err, int errLen) {
  try {
    if (!gFlash) {
      gDevice = std::make_unique<pa::cuda::Device>(0);
      gFlash = std::make_unique<pa::FlashAttention>(*gDevice);
    }
    return 0;
  } catch (const std::exception& e) {
    return report(e, err, errLen);
  }
}

// Contiguous [batch, heads, seq, dim] tensors; dtype 0 = fp32, 1 = fp16, 2 = bf16.
int paFlashForward(int dtype, int b, int hq, int hkv, int sq, int sk, int d, float scale, int causal,
                   int bottomRight, int wl, int wr, int sinks, void* q, void* k, void* v, void* o, void* lse,
                   void* sinkLogits, void* stream, char* err, int errLen) {
  try {
    const auto c = config(dtype, b, hq, hkv, sq, sk, d, scale, causal, bottomRight, wl, wr, sinks, sinkLogits != nullptr);
    pa::FlashForwardArgs a;
    a.q = contiguous(q, hq, sq, d), a.k = contiguous(k, hkv, sk, d), a.v = contiguous(v, hkv, sk, d);
    a.o = contiguous(o, hq, sq, d);
    a.lse = (unsigned long long)lse, a.sinkLogits = (unsigned long long)sinkLogits;
    gFlash->forward(c, a, (pa::cuda::CUstream)stream);
    return 0;
  } catch (const std::exception& e) {
    return report(e, err, errLen);
  }
}

// The mask as paFlashBackward's: GQA's dK/dV scheme (and so the workspace) depends on it.
unsigned long long paFlashBackwardWorkspace(int dtype, int b, int hq, int hkv, int sq, int sk, int d, int causal,
                                            int bottomRight, int wl, int wr, int sinks) {
  return gFlash->backwardWorkspaceBytes(config(dtype, b, hq, hkv, sq, sk, d, 0.f, causal, bottomRight, wl, wr, sinks, 0));
}

int paFlashBackward(int dtype, int b, int hq, int hkv, int sq, int sk, int d, float scale, int causal,
                    int bottomRight, int wl, int wr, int sinks, void* q, void* k, void* v, void* o, void* dO,
                    void* dQ, void* dK, void* dV, void* lse, void* sinkLogits, void* dSinkLogits, void* workspace,
                    void* stream, char* err, int errLen) {
  try {
    const auto c = config(dtype, b, hq, hkv, sq, sk, d, scale, causal, bottomRight, wl, wr, sinks, sinkLogits != nullptr);
    pa::FlashBackwardArgs a;
    a.q = contiguous(q, hq, sq, d), a.k = contiguous(k, hkv, sk, d), a.v = contiguous(v, hkv, sk, d);
    a.o = contiguous(o, hq, sq, d), a.dO = contiguous(dO, hq, sq, d), a.dQ = contiguous(dQ, hq, sq, d);
    a.dK = contiguous(dK, hkv, sk, d), a.dV = contiguous(dV, hkv, sk, d);
    a.lse = (unsigned long long)lse, a.sinkLogits = (unsigned long long)sinkLogits;
    a.dSinkLogits = (unsigned long long)dSinkLogits, a.workspace = (unsigned long long)workspace;
    gFlash->backward(c, a, (pa::cuda::CUstream)stream);
    return 0;
  } catch (const std::exception& e) {
    return report(e, err, errLen);
  }
}

}  // extern "C"
