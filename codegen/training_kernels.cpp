// The training step's own kernels (codegen/training_kernels.h).
#include "codegen/training_kernels.h"

namespace pa::codegen {

// Note on the formulas. Adam here is kernels/adam.cuh's update (kernels/cpu/cpu_kernels.cpp's
// adamStep, in double), so the CPU and GPU trainers take the same steps up to the rounding of the
// gradients they are given.
// The gradient norm is summed in double per chunk, then the chunks' sums in a fixed order by a
// single block, so it is deterministic run to run; clipping scales the gradient inside Adam
// (the gradients themselves are left as the backward wrote them).
std::string trainingKernelsSource() {
  return "#define PA_ADAM_PER_THREAD " + std::to_string(kAdamValuesPerThread) + "\n" + R"(// PureAttention training kernels: batch gather, gradient norm, multi-tensor Adam, loss record.
#include "kernels/pdl.cuh"
#include "kernels/adam.cuh"
typedef pa::adam::StepHeader PaStepHeader;
struct PaChunk {
  float* param;
  const float* grad;
  long long state, count;
  void* mirror;
  long long first, mirrorCols, mirrorRowStride, mirrorStep;
  long long gradCols, gradRowStride, gradStep;
  long long mirrorBytes;
};

// Where value j of a parameter stands in a packed tensor: row j / cols, `step` apart in the row.
// (A 32-bit division where j and cols fit in 32 bits: a 64-bit one is a long subroutine, and this
// runs for every value of a packed parameter.)
__device__ __forceinline__ long long paPackedAt(long long j, long long cols, long long rowStride, long long step) {
  const bool narrow = ((unsigned long long)j | (unsigned long long)cols) < (1ull << 32);
  const long long row = narrow ? (long long)((unsigned)j / (unsigned)cols) : j / cols;
  return row * rowStride + (j - row * cols) * step;
}
// Gradient value i of a chunk: contiguous, or at its place in a packed gradient (gradStep > 0).
__device__ __forceinline__ float paGrad(const PaChunk& c, long long i) {
  if (!c.gradStep) return c.grad[i];
  return c.grad[paPackedAt(c.first + i, c.gradCols, c.gradRowStride, c.gradStep)];
}

// Rounded to the nearest bf16, ties to even, as the Cast kernels store (kernels/storage.cuh).
__device__ __forceinline__ unsigned short paToBf16(float x) {
#if __CUDA_ARCH__ >= 800
  unsigned short h;
  asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(x));
  return h;
#else
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// The batch's rows (the step block's indices) of x (blockIdx.y 0) and y (1) into the graph's inputs:
// four consecutive values a thread where rows allow 16-byte loads, else four 256 apart, all loaded
// before any is stored (as the elementwise kernels).
// Each value goes to `dst` and, rounded to bf16, to `dstB` (x's cast to bf16, which the runner then
// skips: CudaRunnerOptions::gatheredInput); either may be null.
template <typename I, typename R>
__device__ __forceinline__ void paGather(const float* __restrict__ src, float* __restrict__ dst, unsigned short* __restrict__ dstB,
                                         I rowSize, I total, const R* __restrict__ idx) {
  // Rows of whole 16-byte chunks (rowSize a multiple of 4) in aligned buffers: 4 consecutive values
  // of one row a thread at a time (one row index and division per 4 values).
  if (rowSize % 4 == 0 && (((unsigned long long)src | (unsigned long long)dst) & 15) == 0 && ((unsigned long long)dstB & 7) == 0) {
    for (I q = (I)blockIdx.x * 256 + threadIdx.x; q < total / 4; q += (I)gridDim.x * 256) {
      const I i = 4 * q, r = i / rowSize, c = i - r * rowSize;
      const float4 v = *reinterpret_cast<const float4*>(src + (long long)idx[r] * rowSize + c);
      if (dst) *reinterpret_cast<float4*>(dst + i) = v;
      if (dstB)
        *reinterpret_cast<uint2*>(dstB + i) = make_uint2(paToBf16(v.x) | ((unsigned)paToBf16(v.y) << 16),
                                                         paToBf16(v.z) | ((unsigned)paToBf16(v.w) << 16));
    }
    return;
  }
  for (I first = (I)blockIdx.x * 1024 + threadIdx.x; first < total; first += (I)gridDim.x * 1024) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const I i = first + (I)(u * 256);
      if (i < total) {
        const I r = i / rowSize, c = i - r * rowSize;
        v[u] = src[(long long)idx[r] * rowSize + c];
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const I i = first + (I)(u * 256);
      if (i < total && dst) dst[i] = v[u];
      if (i < total && dstB) dstB[i] = paToBf16(v[u]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) pa_gather_rows(const float* __restrict__ srcX, float* __restrict__ dstX,
                                                                  unsigned short* __restrict__ dstXb, long long rowSizeX,
                                                                  const float* __restrict__ srcY,
                                                                  float* __restrict__ dstY, long long rowSizeY,
                                                                  const char* __restrict__ step, long long rows, int narrow) {
  pa::pdlBegin();
  const char* idx = step + sizeof(PaStepHeader);  // uint16 indices where `narrow`, else int32
  const unsigned short* idx16 = (const unsigned short*)idx;
  const int* idx32 = (const int*)idx;
  const float* src = blockIdx.y ? srcY : srcX;
  float* dst = blockIdx.y ? dstY : dstX;
  unsigned short* dstB = blockIdx.y ? nullptr : dstXb;
  const long long rowSize = blockIdx.y ? rowSizeY : rowSizeX, total = rows * rowSize;
  if (total <= 0x7fffffffLL) {  // 32-bit division
    if (narrow) paGather<unsigned>(src, dst, dstB, (unsigned)rowSize, (unsigned)total, idx16);
    else paGather<unsigned>(src, dst, dstB, (unsigned)rowSize, (unsigned)total, idx32);
  } else {
    if (narrow) paGather<long long>(src, dst, dstB, rowSize, total, idx16);
    else paGather<long long>(src, dst, dstB, rowSize, total, idx32);
  }
}

// One block per chunk: its sum of squared gradients, in double.
extern "C" __global__ void __launch_bounds__(256) pa_grad_sumsq(const PaChunk* __restrict__ chunks, double* __restrict__ partial) {
  pa::pdlBegin();
  __shared__ double red[256];
  const PaChunk c = chunks[blockIdx.x];
  double s = 0.0;
  for (long long i = threadIdx.x; i < c.count; i += 256) {
    const double g = paGrad(c, i);
    s += g * g;
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

// One block: the global norm from the chunks' sums, and the factor Adam multiplies gradients by.
extern "C" __global__ void __launch_bounds__(256) pa_clip_scale(const double* __restrict__ partial, long long chunks,
                                                                 double maxNorm, double* __restrict__ scale) {
  pa::pdlBegin();
  __shared__ double red[256];
  double s = 0.0;
  for (long long i = threadIdx.x; i < chunks; i += 256) s += partial[i];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double norm = sqrt(red[0]);
    scale[0] = norm > maxNorm ? maxNorm / norm : 1.0;
    scale[1] = norm;
  }
}

// One block per chunk of one parameter; m and v are flat buffers laid out like the parameters.
// A chunk with a mirror also stores each updated weight's copy there, bf16 or fp32 (contiguous, or
// at its place in a packed copy: AdamChunk). A thread's values
// (PA_ADAM_PER_THREAD, 256 apart) are all loaded before any is computed. Block 0 also copies the
// step's loss into the ring (the step's last kernel: the loss is final).
extern "C" __global__ void __launch_bounds__(256) pa_adam_multi(const PaChunk* __restrict__ chunks, float* __restrict__ m,
                                                                 float* __restrict__ v, const PaStepHeader* __restrict__ step,
                                                                 double beta1, double beta2, double eps,
                                                                 const double* __restrict__ clip, const float* __restrict__ loss,
                                                                 float* __restrict__ ring, long long ringSize) {
  pa::pdlBegin();
  constexpr int N = PA_ADAM_PER_THREAD;
  const PaChunk c = chunks[blockIdx.x];
  const pa::adam::Hyper h = pa::adam::hyperOf(step, beta1, beta2, eps);
  const double gradScale = clip ? clip[0] : 1.0;
  if (blockIdx.x == 0 && threadIdx.x == 0) ring[step->lossSlot % ringSize] = loss[0];
  float* __restrict__ mc = m + c.state;
  float* __restrict__ vc = v + c.state;
  float g[N], mo[N], vo[N], po[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const long long i = threadIdx.x + 256LL * k;
    if (i < c.count) g[k] = paGrad(c, i), mo[k] = mc[i], vo[k] = vc[i], po[k] = c.param[i];
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const long long i = threadIdx.x + 256LL * k;
    if (i >= c.count) break;
    const float p = pa::adam::update(g[k], gradScale, mo[k], vo[k], po[k], h);
    mc[i] = mo[k];
    vc[i] = vo[k];
    c.param[i] = p;
    if (c.mirror) {
      long long at = i;
      if (c.mirrorStep) at = paPackedAt(c.first + i, c.mirrorCols, c.mirrorRowStride, c.mirrorStep);
      if (c.mirrorBytes == 4) static_cast<float*>(c.mirror)[at] = p;
      else static_cast<unsigned short*>(c.mirror)[at] = paToBf16(p);
    }
  }
}

extern "C" __global__ void pa_record_loss(const float* __restrict__ loss, const PaStepHeader* __restrict__ step,
                                          float* __restrict__ ring, long long ringSize) {
  pa::pdlBegin();
  ring[step->lossSlot % ringSize] = loss[0];
}
)";
}

}  // namespace pa::codegen
