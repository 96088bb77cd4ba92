// The training step's own kernels, outside the model's graph: gathering a batch by row index,
// the global gradient norm for clipping, one multi-tensor Adam step over every parameter, and
// recording the step's loss. They read the step's changing values (learning rate, bias
// corrections, row indices, loss slot) from a device block, so a CUDA graph that captured them
// once replays every step unchanged.
#pragma once

#include <cstdint>
#include <string>

namespace pa::codegen {

// The layout of the step block that the host refreshes before every step (one async copy).
// Mirrored as pa::adam::StepHeader (kernels/adam.cuh); the batch's row indices follow it, uint16
// where the training set has at most kNarrowRowLimit rows, else int32 (pa_gather_rows' `narrow`).
struct StepHeader {
  double lrOverC1 = 0, invSqrtC2 = 1, decay = 1, pad0 = 0;  // Adam's step scalars (cpu::AdamScalars)
  int64_t lossSlot = 0;                      // where the step's loss goes in the ring
  int64_t pad[3] = {0, 0, 0};
};
static_assert(sizeof(StepHeader) == 64, "StepHeader is mirrored in the kernel source");
// The session copies the step block up with one cuMemcpyHtoDAsync per step. A copy of at most
// kInlineCopyBytes costs the step nothing beside the kernels; a larger one measured 6-7 µs more a
// step on the H100 (bench/RESULTS.md, "the step block's copy"), so the indices are 16-bit where
// they can be: a batch of up to 480 rows then fits.
constexpr int64_t kInlineCopyBytes = 1024;
constexpr int64_t kNarrowRowLimit = 65536;

// A slice of one parameter that one block of the multi-tensor kernels handles. Mirrored as
// `PaChunk` in the kernel source.
struct AdamChunk {
  uint64_t param = 0;  // device pointer to the slice's first value
  uint64_t grad = 0;   // device pointer to its gradient
  int64_t state = 0;   // offset (floats) of the slice in the flat m and v buffers
  int64_t count = 0;   // values in the slice
  uint64_t mirror = 0;  // device pointer to the slice's copy (CudaRunnerOptions::mirrorParamCasts), or 0
  int64_t first = 0;    // index of the slice's first value in its parameter (the packed places read it)
  // A packed copy (CudaGraphRunner::packedMirror; mirrorStep > 0): `mirror` is the parameter's
  // base in it, and its value `first` + i goes to mirror[(j / mirrorCols) * mirrorRowStride +
  // (j % mirrorCols) * mirrorStep], j = first + i. mirrorStep 0: the slice's copy is contiguous.
  int64_t mirrorCols = 0, mirrorRowStride = 0, mirrorStep = 0;
  // A gradient read in its packed gradient (CudaGraphRunner::packedGrad; gradStep > 0): `grad` is
  // the parameter's base there, value `first` + i at grad[(j / gradCols) * gradRowStride + (j %
  // gradCols) * gradStep], j = first + i. gradStep 0: the slice's gradient is contiguous.
  int64_t gradCols = 0, gradRowStride = 0, gradStep = 0;
  // The copy's element: 2, bf16 (rounded to nearest, ties to even, as a Cast stores); 4, fp32 (a
  // packed fp32 operand: the value itself).
  int64_t mirrorBytes = 2;
};
static_assert(sizeof(AdamChunk) == 104, "AdamChunk is mirrored in the kernel source");

// What a fused-mlp-train kernel that applies Adam itself reads (EmitOptions::adamInTrainNode):
// mirrored as pa::adam::Binding (kernels/adam.cuh). Per node input index, the parameter's and
// its moments' device addresses (0 where the input is no parameter).
constexpr int kAdamBindingSlots = 40;
struct AdamBinding {
  uint64_t param[kAdamBindingSlots] = {};
  uint64_t m[kAdamBindingSlots] = {};
  uint64_t v[kAdamBindingSlots] = {};
  uint64_t step = 0;  // the step block (its StepHeader)
  uint64_t ring = 0;  // the loss ring
  int64_t ringSize = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};
static_assert(sizeof(AdamBinding) == (3 * kAdamBindingSlots + 6) * 8, "AdamBinding is mirrored in kernels/adam.cuh");

// Values per block of the multi-tensor kernels: four a thread of 256, so that a small model's
// parameters spread over many blocks and each thread issues its loads together
// (bench/RESULTS.md, "the step's own kernels").
constexpr int64_t kAdamValuesPerThread = 4;
constexpr int64_t kAdamChunkValues = 256 * kAdamValuesPerThread;

// pa_gather_rows (x and y in one launch), pa_grad_sumsq, pa_clip_scale, pa_adam_multi (which also
// records the loss), pa_record_loss (the loss alone, for a model without parameters). Each begins with
// pa::pdlBegin(): the source includes kernels/pdl.cuh, so it compiles with the embedded headers.
std::string trainingKernelsSource();

}  // namespace pa::codegen
