// The fusion passes and CSE. Each is registered by name in pass_manager.cpp.
#pragma once

#include <memory>

#include "passes/pass_manager.h"
#include "passes/rewrite.h"

namespace pa {

std::unique_ptr<RewritePattern> makeFuseLinearPattern();
std::unique_ptr<RewritePattern> makeFuseLinearGradPattern();
std::unique_ptr<RewritePattern> makeFuseAttentionPattern();
// Permute([0, 2, 1, 3]) around a FlashAttention folded into its layout attribute ("bshd").
std::unique_ptr<RewritePattern> makeFoldAttentionLayoutPattern();

// Fuses chains of elementwise and broadcast ops into FusedElementwise nodes; returns the number
// of fused nodes made and adds the number of ops absorbed to `absorbed`.
int64_t fuseElementwise(Graph& g, int64_t& absorbed);
// Common-subexpression elimination; returns the number of nodes removed.
int64_t eliminateCommonSubexpressions(Graph& g);

}  // namespace pa
