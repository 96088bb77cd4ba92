// The FP64 tensor-core product shared by the FlashAttention (FP64 forward and backward) and GEMM
// (f64Gemm) kernels.
#pragma once

namespace pa {

// d += a·b for one m16n8k4 fp64 tile in TF32's m16n8k8 fragment layout (g = lane/4, t = lane%4):
// a0 = A[g][t], a1 = A[g+8][t], b0 = B[t][g]; d = C[g][2t, 2t+1], C[g+8][2t, 2t+1]. m16n8k4 on sm_90;
// two m8n8k4 (rows g and g + 8) below.
__device__ __forceinline__ void mmaF64(double (&d)[4], double a0, double a1, double b0) {
#if __CUDA_ARCH__ >= 900
  asm volatile("{ mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3}; }"
               : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
               : "d"(a0), "d"(a1), "d"(b0));
#else
  asm volatile("{ mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1}; }"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a0), "d"(b0));
  asm volatile("{ mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1}; }"
               : "+d"(d[2]), "+d"(d[3])
               : "d"(a1), "d"(b0));
#endif
}

}  // namespace pa
