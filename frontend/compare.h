// --compare: train the fused and the unfused graph side by side and check they agree.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "frontend/config.h"
#include "frontend/trainer.h"

namespace pa {

// Note on what is compared. Each step, the unfused graph is evaluated from exactly the fused
// run's parameters (lockstep), and that step's loss must agree within the tolerance: this
// checks the fused graph at every point of the trajectory. Every parameter's gradient must
// agree at the first step; later steps' gradients are shown as ‖Δg‖/‖g‖ but not gated, because
// ReLU's derivative jumps at 0: a pre-activation within rounding distance of zero flips in one
// graph and moves that step's gradients. A parameter's gradient difference is measured against
// its own largest element, floored at 1% of the model's largest gradient: some gradients are
// zero in exact arithmetic (a key bias without sink logits: softmax ignores a shift shared by a
// whole row) and come out as rounding noise in both graphs, whose ratio means nothing. A
// free-running unfused run from the same initial weights is shown beside it, for information
// only: in float32 any two programs' free runs separate after some steps, because Adam
// normalises each gradient element and so turns the rounding noise of elements with tiny
// gradients into full-size updates (bench/RESULTS.md, "Fused against unfused on the CPU").
//
// Note on bf16. There the two graphs round at different places by design (the unfused graph
// stores every intermediate in bf16, the fused one only what its fused nodes write), so their
// difference is no test of either. Each is judged instead against the unfused graph in fp32, run
// in lockstep (the same parameters every step): at every step the fused graph's error (loss, and
// ‖Δg‖/‖g‖ over all gradients) must be at most twice the unfused bf16 graph's own, or one bf16
// unit 2^-8 where that is larger; the verdict is the median over the steps. A ReLU pre-activation
// within bf16 rounding of 0 lands on either side independently in each graph and moves the
// gradients beyond that allowance, so in a model with ReLUs the gradient ratio is shown but only
// the losses decide. Errors far below 2^-8 (a 1% scale error, say) are invisible to any
// end-to-end bf16 comparison: the fp32 --compare, whose passes are the same, checks gradients
// at 1e-5. The measurements behind this rule: bench/RESULTS.md, the paragraph "bf16 `--compare`"
// of its reliability section.
struct CompareResult {
  double maxLossRelDiff = 0;                     // lockstep, over every step
  double maxGradRelDiff = 0;                     // lockstep ‖Δg‖/‖g‖, over every step (information)
  double maxFreeLossRelDiff = 0;                 // free-running, for information
  std::map<std::string, double> gradRelDiff;     // first step, max |Δ| / max |g| per parameter
  double tolerance = 0;
  // bf16: the fp32 reference's verdicts, first step's gradients and every step's loss: the
  // fused and the unfused bf16 graphs' errors against it (see the note above).
  bool againstFp32 = false;
  std::map<std::string, std::pair<double, double>> gradErrVsFp32;  // parameter -> (fused, unfused), information
  std::pair<double, double> gradErrFp32;  // ‖g − g_fp32‖₂ / ‖g_fp32‖₂ over every parameter: (fused, unfused)
  double lossErrRatio = 0;  // median over steps of fused loss error / max(2 x unfused loss error, 2^-8)
  double gradErrRatio = 0;  // the same for ‖Δg‖/‖g‖ over every parameter
  bool gradientsGated = true;  // false where a ReLU makes the gradient ratio a matter of chance
  bool agree = true;
  TrainResult fused, unfused;                    // nodes, memory, time per step, losses
};

// Relative tolerance the two must meet: 1e-5 in float32 (DESIGN.md's fp32 bar for CPU
// comparisons), 1e-10 in float64; in bf16 the unit 2^-8 of the rule in the note above.
double compareTolerance(const Config& cfg);

// Builds both sessions from the same initial weights, trains them on the same batches, prints
// the table to `out` and returns the figures.
// The bf16 rule: a fused error within twice the unfused one, or within `floor`.
inline bool bf16ErrorAcceptable(double fusedErr, double unfusedErr, double floor) {
  return fusedErr <= std::max(2.0 * unfusedErr, floor);
}

CompareResult compareFusedUnfused(const Config& cfg, const RunOptions& opt, std::FILE* out);

}  // namespace pa
