// The fusion passes and CSE. Each is registered by name in pass_manager.cpp.
#pragma once

#include <memory>

#include "passes/pass_manager.h"
#include "passes/rewrite.h"

namespace pa {

// A linear map without activation, as fuse-linear leaves it: FusedLinear (activation none, w not
// transposed) or a MatMul of x by a plain weight matrix. asLinearMap says whether `v`, used once,
// is one, and which.
struct LinearMap {
  ValueId x = kNoValue, w = kNoValue, bias = kNoValue;
  NodeId node = 0;
};
bool asLinearMap(RewriteContext& ctx, ValueId v, LinearMap& out);

std::unique_ptr<RewritePattern> makeFuseLinearPattern();
std::unique_ptr<RewritePattern> makeFuseLinearGradPattern();
// After autodiff: MseLoss and its gradient's Sub, Scale, Mul become one MseLossGrad.
std::unique_ptr<RewritePattern> makeFuseLossGradPattern();
// After autodiff: a weight-gradient MatMul and the SumTo of the same layer's bias gradient become
// one MatMulBiasGrad.
std::unique_ptr<RewritePattern> makeFuseBiasGradPattern();
// Mul(Silu(x·Wg + bg), x·Wu + bu) becomes FusedLinear(x, interleave(Wg, Wu)[, interleave(bg, bu)])
// with activation swiglu (after the linear pattern has fused each projection with its bias).
std::unique_ptr<RewritePattern> makeFuseSwigluPattern();
// Add -> LayerNorm | RmsNorm becomes one norm node with a residual input and the sum as an output.
std::unique_ptr<RewritePattern> makeFuseNormPattern();
// Builds a FlashAttention node only where every target runs it (common/flash_attention_limits.h);
// a subgraph left unfused for that reason gets a line in `notes`, when given.
std::unique_ptr<RewritePattern> makeFuseAttentionPattern(const PassTarget& target = {},
                                                         std::vector<std::string>* notes = nullptr);
// Permute([0, 2, 1, 3]) around a FlashAttention folded into its layout attribute ("bshd").
std::unique_ptr<RewritePattern> makeFoldAttentionLayoutPattern();
// The rotary embedding of a FlashAttention's Q and K, each Rope(Reshape(x·W [+ b])), folded into
// their projections' epilogues (FusedLinear, activation rope).
std::unique_ptr<RewritePattern> makeFoldRopePattern();
// A FlashAttention's Q, K and V, three projections of one input (with rope on Q and K or not),
// become one GEMM over the concatenated weights and a FlashAttentionQkv reading the packed result.
std::unique_ptr<RewritePattern> makeFuseQkvPattern();
// A chain of FusedLinear layers (relu, none, or none then Tanh | Sigmoid) whose widths are at
// most kMlpMaxWidth becomes one FusedMlp, under every precision (fp32 arithmetic throughout),
// where its rows are at most mlpMaxRows for the target (common/mlp_limits.h); a chain left to its
// layers for that reason gets a line in `notes`, when given.
std::unique_ptr<RewritePattern> makeFuseMlpPattern(const PassTarget& target = {}, std::vector<std::string>* notes = nullptr);

// After autodiff and fuse-loss: a FusedMlp, the MseLossGrad of its output and their FusedMlpGrad
// become one FusedMlpTrain where nothing else reads the values it keeps inside.
std::unique_ptr<RewritePattern> makeFuseMlpTrainPattern();

// Fuses chains of elementwise and broadcast ops into FusedElementwise nodes; returns the number
// of fused nodes made and adds the number of ops absorbed to `absorbed`.
int64_t fuseElementwise(Graph& g, int64_t& absorbed);
// precision: bf16. Gives every value its storage type: bf16, except parameters, inputs,
// constants, graph outputs (loss, prediction, gradients) and the attention kernels' fp32 side
// outputs (log-sum-exp, sink-logit gradients). Each GEMM and attention operand that is not bf16
// gets a Cast to bf16 (one per value), and an attention output that is a graph output a Cast to
// fp32 after it; returns how many casts.
int64_t lowerToBf16(Graph& g);
// Common-subexpression elimination; returns the number of nodes removed.
int64_t eliminateCommonSubexpressions(Graph& g);

}  // namespace pa
