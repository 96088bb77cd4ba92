// The emitter table: one function per op of graph/ops.def, by family:
//   elementwise  every elementwise/broadcast op and FusedElementwise, from its expression;
//   gather       Permute, Reshape, RepeatHeads (an output index mapped to one input offset);
//   reduce       Sum, Mean, SumTo (a thread per output element, double accumulation);
//   rows         Softmax and its gradients (a thread per row);
//   mask         AttentionMask (the shared predicate of common/attention_mask.h);
//   mse          MseLoss (one block, a fixed-order tree: deterministic);
//                (these in codegen/emit_pointwise.cpp, templates in codegen/templates/pointwise.h)
//   gemm         MatMul, FusedLinear and MatMulActGrad (codegen/emit_gemm.cpp: kernels/gemm_*.cuh,
//                tiles from codegen/gemm_plan.h, bias/activation epilogue functor);
//   flash        FlashAttention and its gradient: the launcher's instantiations (codegen/emit_flash.cpp);
//   mlp          FusedMlp and its gradient: whole layer chains on chip (codegen/emit_mlp.cpp).
// Shapes are baked into the source as constants, so each kernel is specialised to its node
// and the generated text is byte-identical from run to run.
#include "codegen/emit.h"

#include "codegen/emit_internal.h"

namespace pa::codegen {

namespace {

using EmitFn = NodeKernels (*)(const detail::Ctx&);
const EmitFn kEmit[] = {
#define PA_OP(Name, Kebab, MinIn, MaxIn, Fusion, Grad, Attrs, ...) &detail::emit##Name,
#include "graph/ops.def"
};

}  // namespace

NodeKernels emitNode(const Graph& g, NodeId id) { return emitNode(g, id, detail::kDefaultOptions); }

NodeKernels emitNode(const Graph& g, NodeId id, const EmitOptions& opt) {
  const detail::Ctx c{g, g.node(id), &opt};
  return kEmit[static_cast<int>(c.n.op)](c);
}

}  // namespace pa::codegen
