// Kernel arguments stored in bf16 (precision: bf16), read and written as float.
//
// A generated kernel names each pointer argument by its value's storage type: `const float*` /
// `float*` for fp32 values, and for bf16 values the one-pointer views below, passed by value
// (8 bytes, like the pointer the launcher hands over). `in[i]` converts to float; `out[i] = v`
// rounds to the nearest bf16 (ties to even, cvt.rn). The templates are written once against
// `x[i]`, `x + offset`, `y[i] = v` and `y[i] *= s`, which read the same for both.
// Raw 16-bit patterns, as in flash_attention_common.cuh: no cuda_bf16.h needed under NVRTC.
#pragma once

namespace pa {
namespace storage {

__device__ __forceinline__ float bf16ToFloat(unsigned short h) { return __uint_as_float(static_cast<unsigned>(h) << 16); }
__device__ __forceinline__ unsigned short floatToBf16(float x) {
  unsigned short h;
  asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(x));
  return h;
}
// Two values rounded to bf16 in one 32-bit word, `lo` at the lower address.
__device__ __forceinline__ unsigned packBf16x2(float lo, float hi) {
  return floatToBf16(lo) | (static_cast<unsigned>(floatToBf16(hi)) << 16);
}

// A store the compiler is not told writes memory (inline asm without a memory clobber), for a
// side output the kernel never reads back: loads on either side of it may then be shared
// (a GEMM epilogue's bias between the rows of a column). Generic addressing.
__device__ __forceinline__ void storeUnread(float* p, long long i, float v) { asm volatile("st.f32 [%0], %1;" ::"l"(p + i), "f"(v)); }
__device__ __forceinline__ void storeUnread(unsigned short* p, long long i, float v) {
  asm volatile("st.b16 [%0], %1;" ::"l"(p + i), "h"(floatToBf16(v)));
}

// One element of a bf16 output, assignable from and readable as float.
struct Bf16Ref {
  unsigned short* p;
  __device__ __forceinline__ operator float() const { return bf16ToFloat(*p); }
  __device__ __forceinline__ Bf16Ref& operator=(float v) {
    *p = floatToBf16(v);
    return *this;
  }
  __device__ __forceinline__ Bf16Ref& operator=(const Bf16Ref& o) { return *this = static_cast<float>(o); }
  __device__ __forceinline__ Bf16Ref& operator*=(float s) { return *this = static_cast<float>(*this) * s; }
  __device__ __forceinline__ Bf16Ref& operator+=(float s) { return *this = static_cast<float>(*this) + s; }
};

}  // namespace storage
}  // namespace pa

// A bf16 kernel input.
struct pa_bf16_in {
  const unsigned short* __restrict__ p;
  __device__ __forceinline__ float operator[](long long i) const { return pa::storage::bf16ToFloat(p[i]); }
  __device__ __forceinline__ pa_bf16_in operator+(long long i) const { return pa_bf16_in{p + i}; }
};

// A bf16 kernel output.
struct pa_bf16_out {
  unsigned short* __restrict__ p;
  __device__ __forceinline__ pa::storage::Bf16Ref operator[](long long i) const { return pa::storage::Bf16Ref{p + i}; }
  __device__ __forceinline__ pa_bf16_out operator+(long long i) const { return pa_bf16_out{p + i}; }
  __device__ __forceinline__ pa_bf16_out& operator+=(long long i) {
    p += i;
    return *this;
  }
};
