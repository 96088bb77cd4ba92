// The lower-bf16 pass (precision: bf16): storage types per value and casts for tensor-core operands.
//
// Note on what stays fp32. The parameters are fp32 master weights (Adam updates them and keeps
// its moments in fp32); their gradients, the loss and the prediction are graph outputs, written
// in fp32 by the node that produces them (a weight gradient's GEMM accumulates in fp32 and stores
// fp32, where PyTorch's autocast rounds it to bf16 first). Inputs and constants stay fp32, and
// every kernel converts what it reads, so a bf16 activation added to an fp32 constant costs
// nothing extra. What the GEMMs and the attention kernels multiply on the tensor cores must be
// bf16: a parameter or input used there gets one Cast node per step (a bf16 copy of the weight).
// The attention kernels also write their outputs in bf16; one that is a graph output is cast to
// fp32 after it. What a kernel reads as fp32 whatever the precision (ops.def's fp32Inputs: the
// sink logits, the log-sum-exp) gets an fp32 operand, by a Cast where the value is bf16. A
// Reshape keeps its input's storage type: it has no arithmetic to round for, and the sink logits
// reach the attention kernels as reshapes of their fp32 parameter, which so stay unrounded, as
// under PyTorch's autocast.
#include <map>
#include <set>
#include <stdexcept>

#include "passes/fusion.h"

namespace pa {

int64_t lowerToBf16(Graph& g) {
  if (g.storageTypes()) throw std::logic_error("lower-bf16 runs once");
  std::set<ValueId> outputs;
  for (const auto& kv : g.outputs()) outputs.insert(kv.second);
  const std::vector<NodeId> order = g.topoOrder();
  const std::vector<std::vector<NodeId>> users = g.users();
  // Every user of v reads it as a tensor-core operand (an interleaved weight pair, say): storing v
  // in bf16 then takes the place of each user's cast and rounds the same way.
  auto feedsTensorCoresOnly = [&](ValueId v) {
    for (NodeId u : users[v])
      for (size_t i = 0; i < g.node(u).inputs.size(); ++i)
        if (g.node(u).inputs[i] == v && !opInfo(g.node(u).op).isTensorCoreInput(i)) return false;
    return !users[v].empty();
  };
  for (NodeId id : order) {
    const Node& n = g.node(id);
    const bool leaf = opInfo(n.op).grad == GradKind::Leaf;  // params, inputs, constants
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ValueId v = n.outputs[i];
      DType t = DType::BF16;
      if (leaf || outputs.count(v) || opInfo(n.op).isFp32Output(i)) t = DType::F32;
      if (n.op == OpKind::Cast) t = g.value(v).type.dtype;
      if (n.op == OpKind::Reshape && !outputs.count(v)) t = g.value(n.inputs[0]).type.dtype;  // set: topological order
      if ((n.op == OpKind::Interleave || n.op == OpKind::Concat) && !outputs.count(v) && !feedsTensorCoresOnly(v)) {
        t = DType::BF16;
        for (ValueId in : n.inputs)
          if (g.value(in).type.dtype == DType::F32) t = DType::F32;
      }
      g.setDtype(v, t);
    }
  }
  // A weight gradient split back into its parts (the swiglu pair's dW, the packed QKV's dW and
  // d bias) is stored fp32 by its GEMM, as an unsplit one is: the parts are fp32 graph outputs.
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if ((n.op != OpKind::Deinterleave && n.op != OpKind::Slice) || g.value(n.outputs[0]).type.dtype != DType::F32) continue;
    const ValueId in = n.inputs[0];
    if (opInfo(g.producer(in).op).grad != GradKind::Leaf) g.setDtype(in, DType::F32);
  }
  g.setStorageTypes();
  int64_t casts = 0;
  // The attention kernels write o, dQ, dK and dV in q's dtype: where one of them is a graph
  // output (a gradient of q, k or v as parameters), it stays bf16 and a Cast gives the fp32 output.
  for (NodeId id : order) {
    const OpKind op = g.node(id).op;
    if (op != OpKind::FlashAttention && op != OpKind::FlashAttentionGrad && op != OpKind::FlashAttentionQkv &&
        op != OpKind::FlashAttentionQkvGrad)
      continue;
    for (size_t i = 0; i < g.node(id).outputs.size(); ++i) {
      const ValueId v = g.node(id).outputs[i];
      if (opInfo(g.node(id).op).isFp32Output(i) || g.value(v).type.dtype == DType::BF16) continue;
      g.setDtype(v, DType::BF16);
      AttrMap a;
      a.set<attr::DType>("f32");
      const ValueId c = g.add(OpKind::Cast, {v}, a, g.value(v).name + ".f32");
      ++casts;
      for (const auto& [name, out] : std::map<std::string, ValueId>(g.outputs()))
        if (out == v) g.setOutput(name, c);
    }
  }
  // The inputs the tensor cores read (ops.def's tensorCoreInputs column: GEMM operands A and B;
  // attention's q, k, v, o, dO) in bf16, those of the fp32Inputs column in fp32: one Cast per
  // value and dtype. Reshapes share their input's bytes, so a reshaped value is cast as its
  // reshape's source and reshaped after (one Cast of the input serves both the first layer's
  // product and its weight gradient, which reads the input as a matrix).
  std::map<std::pair<ValueId, DType>, ValueId> castOf, reshapedCastOf;
  auto reshapeSource = [&](ValueId v) {
    while (g.producer(v).op == OpKind::Reshape && g.value(g.producer(v).inputs[0]).type.dtype == g.value(v).type.dtype)
      v = g.producer(v).inputs[0];
    return v;
  };
  for (NodeId id : order) {
    for (size_t slot = 0; slot < g.node(id).inputs.size(); ++slot) {
      const OpInfo& info = opInfo(g.node(id).op);
      if (!info.isTensorCoreInput(slot) && !info.isFp32Input(slot)) continue;
      const DType want = info.isTensorCoreInput(slot) ? DType::BF16 : DType::F32;
      const ValueId v = g.node(id).inputs[slot];
      if (g.value(v).type.dtype == want) continue;
      const ValueId source = reshapeSource(v);
      auto it = castOf.find({source, want});
      if (it == castOf.end()) {
        AttrMap a;
        a.set<attr::DType>(want == DType::BF16 ? "bf16" : "f32");
        const ValueId c = g.add(OpKind::Cast, {source}, a, g.value(source).name + (want == DType::BF16 ? ".bf16" : ".f32"));
        it = castOf.emplace(std::make_pair(source, want), c).first;
        ++casts;
      }
      ValueId operand = it->second;
      if (source != v) {
        auto r = reshapedCastOf.find({v, want});
        if (r == reshapedCastOf.end()) {
          const Shape s = g.shape(v);
          const ValueId reshaped = g.add(OpKind::Reshape, {operand}, AttrMap().set<attr::Shape>(std::vector<int64_t>(s.begin(), s.end())),
                                         g.value(v).name + (want == DType::BF16 ? ".bf16" : ".f32"));
          r = reshapedCastOf.emplace(std::make_pair(v, want), reshaped).first;
        }
        operand = r->second;
      }
      g.node(id).inputs[slot] = operand;  // g.add may move nodes: index again
    }
  }
  // A reshape whose readers all take the reshaped cast is left dead: the pipeline's dce follows.
  return casts;
}

}  // namespace pa
