// Which passes run for which settings: the training step's pipeline and the validation graph's.
#pragma once

#include <string>
#include <vector>

#include "common/settings.h"
#include "passes/pass_manager.h"

namespace pa {

struct TrainPipeline {
  std::vector<std::string> forward;     // on the forward graph, before autodiff
  std::vector<std::string> training;    // on the whole step, after autodiff
  std::vector<std::string> validation;  // on the forward-only validation graph
};

// The forward passes are the configured ones (compiler.fuse, then compiler.passes), less the
// fusions under `noFuse`. After autodiff, with elementwise fusion, the loss and its gradient
// become one node (fuse-loss: the chain fuse-elementwise would otherwise make, with the loss in
// the same kernel); with linear fusion, the backward's matmul + activation-derivative pairs fuse
// (fuse-linear-grad) and the weight-gradient products take their bias gradients
// (fuse-bias-grad, unless `biasGradInProduct` is false: A/B runs); elementwise fusion
// again when it is enabled (the backward has chains of its own); CSE, DCE; bf16 lowers the
// finished graph to bf16 storage; the verifier last. The validation graph runs the forward
// passes and, under bf16, the same lowering, so it computes what the training step's forward does.
TrainPipeline trainPipeline(const std::vector<std::string>& configured, Precision precision, bool noFuse,
                            bool biasGradInProduct = true);

// What the passes may assume of the targets under `precision`: the width of the operands that
// attention and the layers' products read.
PassTarget passTargetOf(Precision precision);

}  // namespace pa
