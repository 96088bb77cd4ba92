// Emitters of the FlashAttention nodes: the launcher's problem description of a node, and the
// instantiations the launcher would pick for it (listed for --dump-kernels and the CI compile).
#include "codegen/emit_internal.h"
#include "graph/node_attrs.h"
#include "codegen/flash_spec.h"

namespace pa::codegen {

using detail::Ctx;

bool flashLayoutBshd(const Node& n) { return n.attrs.get<attr::Layout>() == "bshd"; }

bool flashPackedQkv(const Node& n) { return n.op == OpKind::FlashAttentionQkv || n.op == OpKind::FlashAttentionQkvGrad; }

FlashAttentionConfig flashConfigOf(const Graph& g, const Node& n, bool tf32) {
  const Ctx c{g, n};
  Shape q, k;
  if (flashPackedQkv(n)) {  // [B, S, Hq + 2 Hk, D]: the [B, H, S, D] views of its Q and K
    const Shape& x = c.in(0);
    const int64_t hk = n.attrs.get<attr::KvHeads>();
    q = {x[0], x[2] - 2 * hk, x[1], x[3]};
    k = {x[0], hk, x[1], x[3]};
  } else {
    q = c.in(0), k = c.in(1);
    if (flashLayoutBshd(n)) std::swap(q[1], q[2]), std::swap(k[1], k[2]);  // the [B, H, S, D] view
  }
  FlashAttentionConfig f;
  f.dtype = c.inType(0) == DType::BF16 ? kFlashBF16 : kFlashF32;
  f.batch = static_cast<int>(q[0]);
  f.heads = static_cast<int>(q[1]);
  f.kvHeads = static_cast<int>(k[1]);
  f.qLen = static_cast<int>(q[2]);
  f.kLen = static_cast<int>(k[2]);
  f.headDim = static_cast<int>(q[3]);
  f.scale = static_cast<float>(c.n.attrs.get<attr::AttnScale>());
  f.mask = maskSpecOf(c.n.attrs);
  // The sink logits are the last input, when the node has its op's largest arity.
  f.sinkLogits = static_cast<int>(c.n.inputs.size()) == opInfo(c.n.op).maxInputs;
  f.tf32 = tf32 && f.dtype == kFlashF32;
  return f;
}

namespace detail {

// FlashAttention nodes run through the launcher; these are the instantiations it would pick (the
// wgmma ones for sm_90a targets; the fp32 rows-per-thread rule, which needs the device's SM count,
// takes its default here).

namespace {

FlashTarget flashTargetOf(const EmitOptions& opt) {
  FlashTarget t;
  t.wgmma = opt.wgmma;
  t.fullRateFp64 = opt.fullRateFp64;
  return t;
}

NodeKernels flashKernels(const Ctx& c, const std::vector<FlashKernelKind>& kinds) {
  NodeKernels nk;
  nk.external = true;
  const FlashAttentionConfig cfg = flashConfigOf(c.g, c.n, c.opt->tf32);
  for (FlashKernelKind kind : kinds) {
    FlashKernelSpec spec;
    try {
      spec = chooseFlashSpec(kind, cfg, flashTargetOf(*c.opt));
    } catch (const std::exception&) {
      continue;  // a kind this configuration does not use
    }
    Kernel k;
    k.name = spec.name();
    k.source = "// PureAttention: FlashAttention instantiation for node '" + c.n.name + "' (" + opName(c.n.op) +
               "), launched by runtime/flash_attention.cpp\n" + spec.source();
    k.block = {static_cast<unsigned>(spec.threads()), 1, 1};
    k.sharedBytes = static_cast<unsigned>(spec.sharedBytes());
    nk.kernels.push_back(std::move(k));
  }
  return nk;
}

}  // namespace

NodeKernels emitFlashAttention(const Ctx& c) { return flashKernels(c, {FlashKernelKind::kForward}); }
NodeKernels emitFlashAttentionQkv(const Ctx& c) { return emitFlashAttention(c); }
NodeKernels emitFlashAttentionGrad(const Ctx& c) {
  // dQ from the dK/dV kernel's per-key-block shares (fp32, short keys), from its atomics (fp32
  // beyond; the default, non-deterministic backward), or from its own kernel.
  const FlashKernelSpec dkdv =
      chooseFlashSpec(FlashKernelKind::kBwdDkDv, flashConfigOf(c.g, c.n, c.opt->tf32), flashTargetOf(*c.opt));
  std::vector<FlashKernelKind> kinds = {FlashKernelKind::kBwdPreprocess, FlashKernelKind::kBwdSinkReduce,
                                        FlashKernelKind::kBwdDkDv};
  if (dkdv.dqPartial)
    kinds.push_back(FlashKernelKind::kBwdDqReduce);
  else if (!dkdv.atomicDq)
    kinds.push_back(FlashKernelKind::kBwdDq);
  kinds.push_back(FlashKernelKind::kBwdDqConvert);
  kinds.push_back(FlashKernelKind::kBwdDkDvReduce);
  return flashKernels(c, kinds);
}
NodeKernels emitFlashAttentionQkvGrad(const Ctx& c) { return emitFlashAttentionGrad(c); }

}  // namespace detail

}  // namespace pa::codegen
