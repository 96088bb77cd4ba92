// FlashAttention on a device: validation against the device, NVRTC loading, launches and the
// backward's workspace (see flash_attention.h and docs/flash_attention.md).
#include "runtime/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>

#include "codegen/embedded_kernels.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "runtime/cuda/tensor_map.h"

namespace pa {

namespace {

constexpr int kPreprocessRows = 64;  // mirrors flash::kPreprocessRows
constexpr int kDqReduceRows = 16;    // mirrors flash::kDqReduceRows
// The persistent forward's groups of (batch, head) slices read at most this many bytes of K and V
// (a share of the 50 MB L2 of an H100 / H200): their items run side by side and share them there.
constexpr long long kPersistentL2Bytes = 16ll << 20;

int elemBytes(FlashDType t) {
  switch (t) {
    case kFlashF32: return 4;
    case kFlashF16: return 2;
    case kFlashBF16: return 2;
  }
  return 0;
}
int ceilDiv(long long a, long long b) { return (int)((a + b - 1) / b); }

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

// The TMA maps of Q, K, V, (backward) dO and the outputs a kernel stores by TMA (O; dK, dV; dQ)
// for a kernel whose spec.tma is set: [batch, heads, seq, head dim] with the views' strides,
// boxes of 64 columns by the rows the kernel moves at a time (its block's rows of the resident
// operands, its tile of the streamed ones, the store rows of an output). False where the driver
// rejects one (a stride TMA cannot express): the caller runs the cp.async kernel.
bool encodeFlashMaps(const FlashKernelSpec& spec, const FlashKernelParams& p, FlashTensorMaps& maps) {
  auto encode = [&](const FlashTensorView& t, int heads, int len, int rows, FlashTensorMap& out) {
    codegen::TensorMapSpec m;
    m.rank = 4;
    m.elementBytes = 2;
    const long long extent[3] = {len, heads, p.batch}, stride[3] = {t.seqStride, t.headStride, t.batchStride};
    m.dims[0] = static_cast<uint64_t>(p.headDim);
    for (int i = 0; i < 3; ++i) {
      m.dims[i + 1] = static_cast<uint64_t>(std::max(1LL, extent[i]));
      m.strideBytes[i] = extent[i] > 1 ? static_cast<uint64_t>(stride[i]) * 2 : 16;  // one element never steps
    }
    m.box[0] = 64;
    m.box[1] = static_cast<uint32_t>(rows);
    const cuda::TensorMap map = cuda::encodeTensorMap(m, t.ptr);
    static_assert(sizeof(map) == sizeof(out), "a tensor map is 128 bytes");
    std::memcpy(&out, &map, sizeof out);
  };
  const bool keyBlocks = spec.kind == FlashKernelKind::kBwdDkDv;  // resident K, V; streamed Q, dO
  const int qRows = keyBlocks ? spec.tile : spec.rowsPerBlock(), kRows = keyBlocks ? spec.rowsPerBlock() : spec.tile;
  try {
    encode(p.q, p.heads, p.qLen, qRows, maps.q);
    encode(p.k, p.kvHeads, p.kLen, kRows, maps.k);
    encode(p.v, p.kvHeads, p.kLen, kRows, maps.v);
    if (spec.kind != FlashKernelKind::kForward) encode(p.dO, p.heads, p.qLen, qRows, maps.dO);
    // The outputs a kernel stores by TMA, in boxes of the kernels' store rows (flashForwardStoreRows
    // and its kin), for every launch of the kind whose rule stores by TMA; not dK and dV where the
    // dK/dV kernel writes split GQA's fp32 partials (from registers).
    auto encodeOutput = [&](const FlashTensorView& t, int heads, int len, int rows, FlashTensorMap& out) {
      if (rows > 0) encode(t, heads, len, rows, out);
    };
    if (spec.kind == FlashKernelKind::kForward)
      encodeOutput(p.o, p.heads, p.qLen, flashForwardStoreRows(spec.dpad, spec.warps / 4), maps.o);
    if (spec.kind == FlashKernelKind::kBwdDq) encodeOutput(p.dQ, p.heads, p.qLen, flashDqStoreRows(spec.dpad), maps.dQ);
    if (keyBlocks && p.dKVPartial == 0) {
      encodeOutput(p.dK, p.kvHeads, p.kLen, flashDkDvStoreRows(spec.dpad), maps.dK);
      encodeOutput(p.dV, p.kvHeads, p.kLen, flashDkDvStoreRows(spec.dpad), maps.dV);
    }
  } catch (const cuda::CudaError&) {
    return false;
  }
  return true;
}

// The tensor maps a launch of `spec` passes: `maps`, encoded, for a TMA kernel; null for the
// others, and for a TMA kernel whose maps the driver rejects, whose spec then falls back to
// cp.async (spec.tma cleared).
const FlashTensorMaps* mapsOrFallBack(FlashKernelSpec& spec, const FlashKernelParams& p, FlashTensorMaps& maps) {
  if (spec.tma && !encodeFlashMaps(spec, p, maps)) spec.tma = false;
  return spec.tma ? &maps : nullptr;
}

}  // namespace

FlashAttention::FlashAttention(const cuda::Device& device)
    : device_(device), target_(flashTargetOf(device.info())), workCounter_(3 * 8) {
  workCounter_.fill32(0);
}

FlashTarget flashTargetOf(const cuda::DeviceInfo& info) {
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

void FlashAttention::validate(const FlashAttentionConfig& c, bool backward) const {
  validateFlashConfig(c, backward);
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
  return chooseFlashSpec(kind, c, target_, tuning_);
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

codegen::CompileRequest FlashAttention::requestOf(const FlashKernelSpec& spec) const {
  codegen::CompileRequest req;
  req.kernelName = spec.name();
  req.source = spec.source();
  req.headers = codegen::embeddedKernelHeaders();
  req.arch = device_.info().arch();
  return req;
}

// Call with mutex_ held.
const FlashAttention::Loaded& FlashAttention::loadCompiled(unsigned long long key, const FlashKernelSpec& spec,
                                                           const codegen::CompileResult& res) {
  device_.makeCurrent();
  Loaded l;
  PA_CU_CHECK(cuModuleLoadData(&l.module, res.cubin.data()));
  PA_CU_CHECK(cuModuleGetFunction(&l.function, l.module, spec.name().c_str()));
  if (spec.sharedBytes() > 48 * 1024)
    PA_CU_CHECK(cuFuncSetAttribute(l.function, cuda::kFuncAttrMaxDynamicSharedSizeBytes, spec.sharedBytes()));
  return loaded_.emplace(key, l).first->second;
}

const FlashAttention::Loaded& FlashAttention::load(const FlashKernelSpec& spec) {
  const unsigned long long key = spec.key();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = loaded_.find(key);
  if (it != loaded_.end()) return it->second;
  return loadCompiled(key, spec, codegen::KernelCache::instance().compile(requestOf(spec)));
}

void FlashAttention::prepare(const std::vector<std::pair<FlashAttentionConfig, bool>>& problems) {
  std::vector<FlashKernelSpec> specs;
  std::vector<unsigned long long> keys;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [cfg, backward] : problems)
      for (const FlashKernelSpec& spec : flashKernelsOf(cfg, backward, target_, tuning_)) {
        const unsigned long long key = spec.key();
        if (loaded_.count(key) || std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
        specs.push_back(spec);
        keys.push_back(key);
      }
  }
  std::vector<codegen::CompileResult> results(specs.size());
  codegen::compileEach(specs.size(), [&](size_t i) { results[i] = codegen::KernelCache::instance().compile(requestOf(specs[i])); });
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < specs.size(); ++i)
    if (!loaded_.count(keys[i])) loadCompiled(keys[i], specs[i], results[i]);
}

void FlashAttention::launch(const FlashKernelSpec& spec, unsigned gridX, unsigned gridY,
                            const FlashKernelParams& params, cuda::CUstream stream, cuda::LaunchMode mode,
                            const FlashTensorMaps* maps) {
  if (gridX == 0 || gridY == 0) return;
  if (spec.tma != (maps != nullptr)) fail(spec.name() + ": TMA kernels take tensor maps, the others none");
  const Loaded& l = load(spec);
  FlashKernelParams copy = params;
  FlashTensorMaps mapsCopy{};
  if (maps) mapsCopy = *maps;
  void* args[] = {&copy, &mapsCopy};
  ++launches_;
  cuda::LaunchShape shape;
  shape.grid = {gridX, gridY, 1};
  shape.block = {static_cast<unsigned>(spec.threads()), 1, 1};
  shape.sharedBytes = static_cast<unsigned>(spec.sharedBytes());
  cuda::launchKernel(l.function, shape, stream, args, mode);
}

// K and V bytes of one query head's slice (a KV head's shared by its group).
long long FlashAttention::kvBytesPerSlice(const FlashAttentionConfig& c) {
  return 2LL * c.kLen * c.headDim * elemBytes(c.dtype) * c.kvHeads / c.heads;
}

// Slices per group of a work list or a grid's issue order (kernels/flash_attention_common.cuh,
// WorkList and gridItem): as many as keep their shared data (`sliceBytes` each) within
// kPersistentL2Bytes.
int FlashAttention::sliceGroup(long long slices, long long sliceBytes) {
  return (int)std::max<long long>(1, std::min<long long>(slices, kPersistentL2Bytes / std::max(1LL, sliceBytes)));
}

// A persistent kernel: one block an SM over `items` (slice, tile) items, in groups of slices whose
// shared data (`sliceBytes` each) fit kPersistentL2Bytes; `counter` picks the kernel's pair of ints
// in workCounter_ (kernels/flash_attention_common.cuh, WorkList).
void FlashAttention::launchPersistent(const FlashKernelSpec& spec, long long items, long long slices, long long sliceBytes,
                                      int counter, FlashKernelParams p, cuda::CUstream stream, cuda::LaunchMode mode,
                                      const FlashTensorMaps* maps) {
  p.workHeads = sliceGroup(slices, sliceBytes);
  p.workCounter = workCounter_.ptr() + 8 * counter;
  launch(spec, (unsigned)std::min<long long>(items, target_.multiprocessors), 1, p, stream, mode, maps);
}

void FlashAttention::forward(const FlashAttentionConfig& c, const FlashForwardArgs& a, cuda::CUstream stream,
                             cuda::LaunchMode mode) {
  validate(c, false);
  for (auto [n, t] : {std::make_pair("q", a.q), std::make_pair("k", a.k), std::make_pair("v", a.v), std::make_pair("o", a.o)})
    checkTensor(n, t, c.dtype);
  if (!a.lse) fail("lse is null");
  if (c.sinkLogits && !a.sinkLogits) fail("config.sinkLogits is set but sinkLogits is null");
  FlashKernelParams p = baseParams(c);
  p.q = view(a.q), p.k = view(a.k), p.v = view(a.v), p.o = view(a.o);
  p.lse = a.lse;
  p.sinkLogits = c.sinkLogits ? a.sinkLogits : 0;
  FlashKernelSpec spec = specFor(FlashKernelKind::kForward, c);
  FlashTensorMaps maps{};
  const FlashTensorMaps* tma = mapsOrFallBack(spec, p, maps);
  const int qTiles = ceilDiv(c.qLen, spec.rowsPerBlock()), slices = c.batch * c.heads;
  if (!spec.persistent) {
    p.workHeads = sliceGroup(slices, kvBytesPerSlice(c));  // the grid's order: heaviest query tiles first
    launch(spec, qTiles, slices, p, stream, mode, tma);
    return;
  }
  launchPersistent(spec, (long long)qTiles * slices, slices, kvBytesPerSlice(c), 0, p, stream, mode, tma);
}

int FlashAttention::dkvPartials(const FlashAttentionConfig& c, const FlashKernelSpec& dkdv) const {
  if (flashSplitKvHeads(c, target_, tuning_)) return c.heads;
  return dkdv.querySplit > 1 ? c.kvHeads * dkdv.querySplit : 0;
}

size_t FlashAttention::backwardWorkspaceBytes(const FlashAttentionConfig& c) const {
  // delta [batch, heads, qLen] + sink partials [heads, batch * qTiles], each 16-byte aligned.
  const size_t delta = ((size_t)c.batch * c.heads * c.qLen * 4 + 15) / 16 * 16;
  const size_t partial = ((size_t)c.heads * c.batch * ceilDiv(c.qLen, kPreprocessRows) * 4 + 15) / 16 * 16;
  const size_t dqAccum = (size_t)c.batch * c.heads * c.qLen * c.headDim * 4;  // atomic-dQ path only
  const FlashKernelSpec dkdv = specFor(FlashKernelKind::kBwdDkDv, c);
  const size_t dkvPartial = 2 * (size_t)c.batch * dkvPartials(c, dkdv) * c.kLen * c.headDim * 4;
  const size_t dqPartial = dkdv.dqPartial ? (size_t)ceilDiv(c.kLen, dkdv.rowsPerBlock()) * dqAccum + 16 : 0;
  return delta + partial + (dkdv.atomicDq ? dqAccum : 0) + dkvPartial + dqPartial + 16;
}

void FlashAttention::backward(const FlashAttentionConfig& c, const FlashBackwardArgs& a, cuda::CUstream stream,
                              cuda::LaunchMode mode) {
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
  FlashKernelSpec dkdv = specFor(FlashKernelKind::kBwdDkDv, c);
  unsigned long long next = p.sinkPartial + ((size_t)c.heads * c.batch * p.qTiles * 4 + 15) / 16 * 16;
  if (dkdv.atomicDq) {
    p.dQAccum = next;
    next += ((size_t)c.batch * c.heads * c.qLen * c.headDim * 4 + 15) / 16 * 16;
  }
  const int parts = dkvPartials(c, dkdv);
  const bool perQueryHead = parts > 0 && dkdv.querySplit == 1;  // split GQA: a dK/dV block per query head
  if (parts) {
    p.dKVPartial = next;
    next += (2 * (size_t)c.batch * parts * c.kLen * c.headDim * 4 + 15) / 16 * 16;
  }
  if (dkdv.dqPartial) p.dQPartial = next;
  FlashTensorMaps dkdvMaps{};
  const FlashTensorMaps* dkdvTma = mapsOrFallBack(dkdv, p, dkdvMaps);  // reads p.dKVPartial

  launch(specFor(FlashKernelKind::kBwdPreprocess, c), p.qTiles, c.batch * c.heads, p, stream, mode);
  // With qLen == 0 there are no partials and the reduce kernel writes the empty sum, 0.
  if (c.sinkLogits) launch(specFor(FlashKernelKind::kBwdSinkReduce, c), c.heads, 1, p, stream, mode);
  const int dkdvSlices = c.batch * (perQueryHead ? c.heads : c.kvHeads);
  // A slice's Q and dO: one query head's, or a KV head's group's.
  const long long qBytes = 2LL * c.qLen * c.headDim * elemBytes(c.dtype) * (perQueryHead ? 1 : c.heads / c.kvHeads);
  if (dkdv.persistent) {
    // The key blocks holding sink keys (every query sees them when a window hides the rest) first
    // (the kernels after it ignore workLead).
    if (c.mask.sinks > 0 && c.mask.windowLeft >= 0) p.workLead = ceilDiv(std::min(c.mask.sinks, c.kLen), dkdv.rowsPerBlock());
    launchPersistent(dkdv, (long long)ceilDiv(c.kLen, dkdv.rowsPerBlock()) * dkdvSlices, dkdvSlices, qBytes, 1, p, stream, mode,
                     dkdvTma);
  } else {
    p.workHeads = sliceGroup(dkdvSlices, qBytes);  // the grid's order: heaviest key blocks first
    launch(dkdv, ceilDiv(c.kLen, dkdv.rowsPerBlock()) * dkdv.querySplit, dkdvSlices, p, stream, mode, dkdvTma);
  }
  if (parts) {
    FlashKernelParams sum = p;  // the reduce sums heads / kvHeads partials a KV head
    sum.heads = parts;
    launch(specFor(FlashKernelKind::kBwdDkDvReduce, c), ceilDiv(c.kLen, 64), c.batch * c.kvHeads, sum, stream, mode);
  }
  if (dkdv.atomicDq) {
    launch(specFor(FlashKernelKind::kBwdDqConvert, c), p.qTiles, c.batch * c.heads, p, stream, mode);
  } else if (dkdv.dqPartial) {
    launch(specFor(FlashKernelKind::kBwdDqReduce, c), ceilDiv(c.qLen, kDqReduceRows), c.batch * c.heads, p, stream, mode);
  } else {
    FlashKernelSpec dq = specFor(FlashKernelKind::kBwdDq, c);
    FlashTensorMaps dqMaps{};
    const FlashTensorMaps* maps = mapsOrFallBack(dq, p, dqMaps);
    if (dq.persistent)
      launchPersistent(dq, (long long)ceilDiv(c.qLen, dq.rowsPerBlock()) * c.batch * c.heads, c.batch * c.heads, kvBytesPerSlice(c),
                       2, p, stream, mode, maps);
    else {
      p.workHeads = sliceGroup(c.batch * c.heads, kvBytesPerSlice(c));
      launch(dq, ceilDiv(c.qLen, dq.rowsPerBlock()), c.batch * c.heads, p, stream, mode, maps);
    }
  }
}

}  // namespace pa
