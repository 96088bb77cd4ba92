// The training step's Adam on the device: the step block's header, the update of one value, and
// the binding through which a fused-mlp-train kernel applies the step itself (codegen/emit_mlp.cpp).
// The host mirrors of StepHeader and AdamBinding are codegen::StepHeader and codegen::AdamBinding
// (codegen/training_kernels.h); the multi-tensor kernel pa_adam_multi and the fused-mlp-train
// kernel both update through pa::adam::update, so a step gives the same bits in either.
#pragma once

namespace pa {
namespace adam {

// The values the host refreshes before every step (kernels/cpu/cpu_kernels.h's AdamScalars: lr
// over the first bias correction, one over the second's square root, 1 - lr·wd; where the step's
// loss goes in the ring); the batch's row indices follow it in the step block.
struct StepHeader {
  double lrOverC1, invSqrtC2, decay, pad0;
  long long lossSlot;
  long long pad[3];
};

// Slots of a binding: a node input index each (fused-mlp-train: 3 + 2 per layer at most).
constexpr int kBindingSlots = 40;

// What a kernel that runs Adam itself reads: per node input (a parameter), its value and its
// moments' addresses (null where the input is no parameter); the step block; the loss ring; the
// hyperparameters.
struct Binding {
  float* param[kBindingSlots];
  float* m[kBindingSlots];
  float* v[kBindingSlots];
  const StepHeader* step;
  float* ring;
  long long ringSize;
  double beta1, beta2, eps;
};

// One step's scalars, read once by a kernel.
struct Hyper {
  double lrOverC1, invSqrtC2, decay, beta1, beta2, eps;
};
__device__ __forceinline__ Hyper hyperOf(const StepHeader* step, double beta1, double beta2, double eps) {
  return Hyper{step->lrOverC1, step->invSqrtC2, step->decay, beta1, beta2, eps};
}

// Adam (kernels/cpu/cpu_kernels.cpp's adamStep, in double) on one value: the gradient g times
// gradScale (clipping), the moments m and v updated in place; returns the new parameter. Every
// operation is rounded on its own (the _rn intrinsics are never fused into an FMA), so the
// result does not depend on the kernel the update is inlined into, and equals the CPU's
// operation for operation. One division and one square root (the per-step scalars come divided).
__device__ __forceinline__ float update(float g, double gradScale, float& m, float& v, float p, const Hyper& h) {
  const double gi = __dmul_rn((double)g, gradScale);
  const double mi = __dadd_rn(__dmul_rn(h.beta1, (double)m), __dmul_rn(__dsub_rn(1.0, h.beta1), gi));
  const double vi = __dadd_rn(__dmul_rn(h.beta2, (double)v), __dmul_rn(__dmul_rn(__dsub_rn(1.0, h.beta2), gi), gi));
  m = (float)mi;
  v = (float)vi;
  const double step = __ddiv_rn(__dmul_rn(h.lrOverC1, mi), __dadd_rn(__dmul_rn(__dsqrt_rn(vi), h.invSqrtC2), h.eps));
  return (float)__dsub_rn(__dmul_rn((double)p, h.decay), step);
}

}  // namespace adam
}  // namespace pa
