// The shapes the CUDA FlashAttention kernels run. The launcher validates against these, and
// fuse-attention builds a FlashAttention node only where every target the graph may be placed
// on runs it (the CPU kernel runs any shape), so a config that trains on the CPU trains on the GPU.
#pragma once

#include <cstdint>
#include <string>

namespace pa {

constexpr int64_t kFlashMinHeadDim = 8, kFlashMaxHeadDim = 256, kFlashHeadDimStep = 8;
constexpr int64_t kFlashMaxFp32BackwardHeadDim = 128;  // its tiles of larger head dims do not fit shared memory
constexpr int64_t kFlashMaxBatchTimesHeads = 65535;    // grid y

constexpr bool flashHeadDimRuns(int64_t d) {
  return d >= kFlashMinHeadDim && d <= kFlashMaxHeadDim && d % kFlashHeadDimStep == 0;
}

// Why the CUDA kernels cannot run attention of this shape, or "" when they can.
// `fp32Backward`: the fp32 backward runs too (training with fp32 inputs: precision fp32, tf32).
inline std::string flashCudaCannotRun(int64_t batch, int64_t heads, int64_t headDim, bool fp32Backward) {
  if (!flashHeadDimRuns(headDim))
    return "head dim " + std::to_string(headDim) + " is not a multiple of 8 in [8, 256]";
  if (fp32Backward && headDim > kFlashMaxFp32BackwardHeadDim)
    return "head dim " + std::to_string(headDim) +
           " is over 128, the fp32 backward's limit (its tiles do not fit shared memory; bf16 runs it)";
  if (batch * heads > kFlashMaxBatchTimesHeads)
    return "batch x heads = " + std::to_string(batch * heads) + " is over 65535";
  return "";
}

}  // namespace pa
