// PTX wrappers shared by the GEMM kernels: shared-memory addresses, cp.async with zero fill, TF32
// rounding and the m16n8k8 TF32 mma.
#pragma once

#include "kernels/gemm_common.cuh"

namespace pa {
namespace gemm {

__device__ __forceinline__ u32 smemAddress(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared; zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void cpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("{ cp.async.cg.shared.global [%0], [%1], 16, %2; }" ::"r"(smemAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes global -> shared; zero-filled when !valid.
__device__ __forceinline__ void cpAsync4(void* dst, const void* src, bool valid) {
  asm volatile("{ cp.async.ca.shared.global [%0], [%1], 4, %2; }" ::"r"(smemAddress(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ u32 toTf32(float x) {
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += a·b for one m16n8k8 tile (row-major A fragment, column-major B fragment).
__device__ __forceinline__ void mmaTf32(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "{ mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3}; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace gemm
}  // namespace pa
