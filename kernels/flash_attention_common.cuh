// Device helpers shared by the flash attention templates: element types, cp.async tile loads,
// mma.sync / ldmatrix wrappers and the tile-level form of the attention mask.
/*
 * Note on what lives here and why.
 *
 * NVRTC has no standard or CUDA headers beyond its built-ins, so 16-bit element types are handled
 * as raw bits: bf16 <-> fp32 by shifts, fp16 <-> fp32 and the packing of two fp32 into a bf16x2 /
 * f16x2 register by one cvt instruction each. Tensor-core products are mma.sync.m16n8k16 with fp32
 * accumulation (sm_80 and later); operands reach registers through ldmatrix (.trans where the
 * operand is stored k-major). Global -> shared copies are 16-byte cp.async with the source size
 * set to 0 past the end of a tensor, so out-of-range rows and head-dim padding arrive as zeros:
 * the products then need no bounds checks and a zero row cannot make a NaN.
 *
 * Traps:
 *  - A row whose every key is masked has max = -inf; exp2(s - max) would be exp2(-inf + inf) =
 *    NaN. The kernels subtract 0 instead of -inf in that case (`softmaxBase`).
 *  - The backward recomputes P = exp2(s*scale2 - lse2); a row with lse = -inf saw no key, and is
 *    given lse2 = +inf so that every P of that row is exactly 0 (`backwardLse2`).
 *  - Tile skipping relies on the visible band [lo(q), hi(q)] and the sink limit being
 *    non-decreasing in q, which holds for every mask that attention_mask.h can express.
 */
#pragma once

#include "kernels/flash_attention_params.h"
#include "kernels/mma_f64.cuh"

namespace pa {
namespace flash {

typedef unsigned short u16;
typedef unsigned int u32;

// ---------------------------------------------------------------------------------------------
// Element types. `Elem<T>::Storage` is what lives in memory.
struct F32Tag {};
struct F16Tag {};
struct BF16Tag {};
// fp32 in memory, products on the tensor cores with operands rounded to TF32 (the opt-in
// FlashAttentionConfig::tf32): the mma.sync kernels, instantiated with MmaStep<TF32Tag>.
struct TF32Tag {};
// fp32 in memory, products on the FP64 tensor cores (the opt-in FlashAttentionConfig::fp64Mma):
// the same mma.sync kernels with MmaStep<F64Tag>; operands and sums exact in fp64 (DMMA).
struct F64Tag {};

template <typename Tag> struct Elem;
template <> struct Elem<F32Tag> {
  typedef float Storage;
  static constexpr int kBytes = 4;
  static __device__ __forceinline__ float toFloat(float x) { return x; }
  static __device__ __forceinline__ float fromFloat(float x) { return x; }
  static __device__ __forceinline__ void storePair(float* dst, float lo, float hi) { *(float2*)dst = make_float2(lo, hi); }
};
template <> struct Elem<TF32Tag> : Elem<F32Tag> {};
template <> struct Elem<F64Tag> : Elem<F32Tag> {};
template <> struct Elem<F16Tag> {
  typedef u16 Storage;
  static constexpr int kBytes = 2;
  static __device__ __forceinline__ float toFloat(u16 x) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(x));
    return f;
  }
  static __device__ __forceinline__ u16 fromFloat(float x) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(x));
    return h;
  }
  // Two floats into one register: lo in bits 0..15.
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("{ cvt.rn.f16x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  // Two adjacent elements (4-byte aligned).
  static __device__ __forceinline__ void storePair(u16* dst, float lo, float hi) { *(u32*)dst = pack(lo, hi); }
};
template <> struct Elem<BF16Tag> {
  typedef u16 Storage;
  static constexpr int kBytes = 2;
  static __device__ __forceinline__ float toFloat(u16 x) { return __uint_as_float(((u32)x) << 16); }
  static __device__ __forceinline__ u16 fromFloat(float x) {
    u16 h;
    asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(x));
    return h;
  }
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("{ cvt.rn.bf16x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ void storePair(u16* dst, float lo, float hi) { *(u32*)dst = pack(lo, hi); }
};

// ---------------------------------------------------------------------------------------------
// Constants and small math.
__device__ __forceinline__ float negInf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float posInf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float fastExp2(float x) {
  float y;
  asm("{ ex2.approx.ftz.f32 %0, %1; }" : "=f"(y) : "f"(x));
  return y;
}
// The value subtracted before exponentiation: the running max, or 0 while the row is empty.
__device__ __forceinline__ float softmaxBase(float rowMax) { return rowMax == negInf() ? 0.f : rowMax; }
// log2-domain lse for the backward; +inf for a row that saw nothing (see the note above).
__device__ __forceinline__ float backwardLse2(float lseNatural) {
  return lseNatural == negInf() ? posInf() : lseNatural * 1.4426950408889634f;
}

// ---------------------------------------------------------------------------------------------
// cp.async: 16 bytes global -> shared, zero-filled when `valid` is false.
__device__ __forceinline__ u32 smemAddr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("{ cp.async.cg.shared.global [%0], [%1], 16, %2; }" ::"r"(smemAddr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Copies rows [row0, row0 + ROWS) of one (batch, head) slice of a [seq, headDim] tensor into a
// shared tile of ROWS x LD elements. Rows past `rows` and columns past `headDim` (up to DPAD)
// become zeros. All threads of the block take part. The trip count is a compile-time constant
// and, when a thread's chunks share one column, the source pointer advances by a fixed stride:
// a run-time-bounded loop here cost ~250 instructions per tile in the first version.
template <typename T, int ROWS, int DPAD, int LD, int THREADS>
__device__ __forceinline__ void loadTile(T* smem, const T* gbase, long long seqStride, int row0,
                                         int rows, int headDim) {
  constexpr int kPerChunk = 16 / (int)sizeof(T);
  constexpr int kChunksPerRow = DPAD / kPerChunk;
  constexpr int kChunks = ROWS * kChunksPerRow;
  constexpr int kIters = (kChunks + THREADS - 1) / THREADS;
  if constexpr (THREADS % kChunksPerRow == 0) {
    constexpr int kRowStep = THREADS / kChunksPerRow;
    const int r0 = threadIdx.x / kChunksPerRow, col = (threadIdx.x % kChunksPerRow) * kPerChunk;
    const bool colOk = col < headDim;
    const T* src = gbase + (long long)(row0 + r0) * seqStride + col;
    T* dst = smem + r0 * LD + col;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (kChunks % THREADS == 0 || r0 + i * kRowStep < ROWS) {
        const bool valid = colOk && row0 + r0 + i * kRowStep < rows;
        cpAsync16(dst + i * kRowStep * LD, valid ? src + (long long)i * kRowStep * seqStride : gbase, valid);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int c = threadIdx.x + i * THREADS;
      if (kChunks % THREADS == 0 || c < kChunks) {
        const int r = c / kChunksPerRow;
        const int col = (c % kChunksPerRow) * kPerChunk;
        const int gr = row0 + r;
        const bool valid = gr < rows && col < headDim;
        const T* src = valid ? gbase + (long long)gr * seqStride + col : gbase;
        cpAsync16(smem + r * LD + col, src, valid);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core fragments (m16n8k16, fp32 accumulate). Register layouts, lane = 4*g + t:
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, k x n):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8):             c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
template <typename Tag> struct Mma;
template <> struct Mma<BF16Tag> {
  static __device__ __forceinline__ void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "{ mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3}; }"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<F16Tag> {
  static __device__ __forceinline__ void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "{ mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3}; }"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ void ldmatrixX4(u32 (&r)[4], const void* rowPtr) {
  asm volatile("{ ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4]; }"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(rowPtr)));
}
__device__ __forceinline__ void ldmatrixX4Trans(u32 (&r)[4], const void* rowPtr) {
  asm volatile("{ ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4]; }"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(rowPtr)));
}

// ---------------------------------------------------------------------------------------------
// One k16 step of a warp's tensor-core product, for any element type: the mma.sync kernels are
// written against this interface. `A` holds a 16x16 A fragment, `B` the 16(k) x 16(n) B fragment
// of two n-tiles; mma(c, a, b, n) adds A.B of n-tile n (n in {0, 1}) into the 16x8 accumulator c.
// Shared tiles have row stride LD = DPAD + kPad elements, which is 16 bytes past a multiple of 128
// in both cases, so ldmatrix's eight 16-byte rows fall in distinct banks.
//   loadA(a, tile, ld, r0, k0)       A = tile[r0.., k0..]          (tile row-major [row][k])
//   loadATrans(a, tile, ld, r0, k0)  A(row, k) = tile[k0 + k][r0 + row]
//   loadBNK(b, tile, ld, n0, k0)     B(k, n) = tile[n0 + n][k0 + k]   (a K tile in Q.K^T)
//   loadBKN(b, tile, ld, n0, k0)     B(k, n) = tile[k0 + k][n0 + n]   (a V tile in P.V)
//   fromAcc(a, c0, c1)               A = the two 16x8 accumulators c0 | c1 (P or dS, k = their n)
template <typename Tag> struct MmaStep16 {  // fp16 / bf16: one m16n8k16 per n-tile
  typedef u16 T;
  typedef float Acc;  // the forward's S and O accumulators
  static constexpr int kPad = 8;
  struct A {
    u32 r[4];
  };
  struct B {
    u32 r[4];  // n-tile 0: r[0], r[1]; n-tile 1: r[2], r[3]
  };
  // Lane l gives the row address of ldmatrix's matrix m = l / 8, row l % 8 (.trans where the tile
  // is stored k-major).
  static __device__ __forceinline__ void loadA(A& a, const T* tile, int ld, int r0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;  // matrices: a0 .. a3 in the order above
    ldmatrixX4(a.r, tile + (r0 + (m & 1) * 8 + (lane & 7)) * ld + k0 + (m >> 1) * 8);
  }
  static __device__ __forceinline__ void loadATrans(A& a, const T* tile, int ld, int r0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    ldmatrixX4Trans(a.r, tile + (k0 + (m >> 1) * 8 + (lane & 7)) * ld + r0 + (m & 1) * 8);
  }
  static __device__ __forceinline__ void loadBNK(B& b, const T* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    ldmatrixX4(b.r, tile + (n0 + (m >> 1) * 8 + (lane & 7)) * ld + k0 + (m & 1) * 8);
  }
  static __device__ __forceinline__ void loadBKN(B& b, const T* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    ldmatrixX4Trans(b.r, tile + (k0 + (m & 1) * 8 + (lane & 7)) * ld + n0 + (m >> 1) * 8);
  }
  static __device__ __forceinline__ void fromAcc(A& a, const float (&c0)[4], const float (&c1)[4]) {
    a.r[0] = Elem<Tag>::pack(c0[0], c0[1]);
    a.r[1] = Elem<Tag>::pack(c0[2], c0[3]);
    a.r[2] = Elem<Tag>::pack(c1[0], c1[1]);
    a.r[3] = Elem<Tag>::pack(c1[2], c1[3]);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const A& a, const B& b, int n) {
    Mma<Tag>::run(c, a.r, b.r[2 * n], b.r[2 * n + 1]);
  }
};
template <typename Tag> struct MmaStep;
template <> struct MmaStep<BF16Tag> : MmaStep16<BF16Tag> {};
template <> struct MmaStep<F16Tag> : MmaStep16<F16Tag> {};

// fp32 operands on the tensor cores, two ways: TF32 (two m16n8k8 per n-tile and k16 step) and
// FP64 (four m16n8k4). Both place the same fp32 elements in the same fragment slots and differ
// only in what an element becomes (`W::widen`) and in the MMAs (`W::mma`). The TF32 layouts
// (lane = 4g + t):
//   A (16x8): a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4);  B (8x8): b0 = (t, g), b1 = (t+4, g).
// ldmatrix moves 32-bit elements too (an 8x8 b16 matrix is 8 rows of 4 floats, lane 4g + t gets
// row g, float t), which gives A and the K tile's B exactly. For the operands whose k runs along
// the rows of a tile or through an accumulator (P, dS, V, dO, Q in dK), k is permuted instead:
// within each 8-wide k slice, the MMA's k = t and t + 4 stand for k = 2t and 2t + 1. An
// accumulator's two adjacent columns (2t, 2t+1) then become a0/a2 without shuffles, and B's rows
// 2t and 2t+1 are read by scalar loads from distinct banks (8t + g with LD = 4 mod 32). A sum
// over k is the same whatever the order of its terms, so both operands of a product only have to
// agree: loadA with loadBNK (natural k), fromAcc and loadATrans with loadBKN (permuted k).
// FP64's m16n8k4 takes A (16x4) as a0 = (g, t), a1 = (g+8, t) and B (4x8) as b0 = (t, g): the
// TF32 slice's a0/a1 and b0 are one k4 slice, its a2/a3 and b1 the next.
template <class W>
struct MmaStepF32 {
  typedef float T;
  typedef typename W::E E;
  typedef typename W::Acc Acc;  // the forward's S and O accumulators (fromAcc and mma take both)
  static constexpr int kPad = 4;
  struct A {
    E r[8];  // k slice h (of 2): r[4h .. 4h+3] = a0..a3
  };
  struct B {
    E r[8];  // n-tile n, k slice h: r[4n + 2h] = b0, r[4n + 2h + 1] = b1
  };
  static __device__ __forceinline__ void loadA(A& a, const T* tile, int ld, int r0, int k0) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      u32 q[4];
      ldmatrixX4(q, tile + (r0 + (m & 1) * 8 + (lane & 7)) * ld + k0 + 8 * h + (m >> 1) * 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) a.r[4 * h + i] = W::widen(__uint_as_float(q[i]));
    }
  }
  static __device__ __forceinline__ void loadATrans(A& a, const T* tile, int ld, int r0, int k0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const T* row = tile + (k0 + 8 * h + 2 * t) * ld + r0 + g;
      a.r[4 * h + 0] = W::widen(row[0]);
      a.r[4 * h + 1] = W::widen(row[8]);
      a.r[4 * h + 2] = W::widen(row[ld]);
      a.r[4 * h + 3] = W::widen(row[ld + 8]);
    }
  }
  static __device__ __forceinline__ void loadBNK(B& b, const T* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      u32 q[4];
      ldmatrixX4(q, tile + (n0 + 8 * n + (lane & 7)) * ld + k0 + 4 * (lane >> 3));
#pragma unroll
      for (int i = 0; i < 4; ++i) b.r[4 * n + i] = W::widen(__uint_as_float(q[i]));
    }
  }
  static __device__ __forceinline__ void loadBKN(B& b, const T* tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const T* p = tile + (k0 + 8 * h + 2 * t) * ld + n0 + 8 * n + g;
        b.r[4 * n + 2 * h] = W::widen(p[0]);
        b.r[4 * n + 2 * h + 1] = W::widen(p[ld]);
      }
  }
  template <typename C>
  static __device__ __forceinline__ void fromAcc(A& a, const C (&c0)[4], const C (&c1)[4]) {
    a.r[0] = W::widen(c0[0]), a.r[1] = W::widen(c0[2]), a.r[2] = W::widen(c0[1]), a.r[3] = W::widen(c0[3]);
    a.r[4] = W::widen(c1[0]), a.r[5] = W::widen(c1[2]), a.r[6] = W::widen(c1[1]), a.r[7] = W::widen(c1[3]);
  }
  template <typename C>
  static __device__ __forceinline__ void mma(C (&c)[4], const A& a, const B& b, int n) { W::mma(c, a.r, b.r + 4 * n); }
};

// Operands rounded to TF32 with cvt.rna (nearest, ties away: relative error <= 2^-11).
__device__ __forceinline__ u32 toTf32(float x) {
  u32 r;
  asm("{ cvt.rna.tf32.f32 %0, %1; }" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void mmaTf32(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "{ mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3}; }"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
struct Tf32Widen {
  typedef u32 E;
  typedef float Acc;
  static __device__ __forceinline__ u32 widen(float x) { return toTf32(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const u32* a, const u32* b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) mmaTf32(c, a[4 * h], a[4 * h + 1], a[4 * h + 2], a[4 * h + 3], b[2 * h], b[2 * h + 1]);
  }
};
template <> struct MmaStep<TF32Tag> : MmaStepF32<Tf32Widen> {};

// Operands widened exactly to fp64, products exact. With fp32 accumulators (the backward
// kernels) the k16 step's 16 products and the accumulator are summed in fp64 and rounded to fp32
// once: no less accurate than 16 FFMAs. The forward keeps S and O in fp64 (Acc), which saves
// the accumulators' round trip through fp32 at every k16 step (8 of its ~3 conversions per
// m16n8k4 a k16 step: 3.1 -> 1.5 conversions per m16n8k4 in the forward's PTX at head dim 64,
// for 228 registers instead of 168, see chooseF64Mma in codegen/flash_chooser.cpp).
struct F64Widen {
  typedef double E;
  typedef double Acc;
  static __device__ __forceinline__ double widen(float x) { return (double)x; }
  static __device__ __forceinline__ double widen(double x) { return x; }
  static __device__ __forceinline__ void mma(double (&d)[4], const double* a, const double* b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mmaF64(d, a[4 * h], a[4 * h + 1], b[2 * h]);
      mmaF64(d, a[4 * h + 2], a[4 * h + 3], b[2 * h + 1]);
    }
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const double* a, const double* b) {
    double d[4] = {c[0], c[1], c[2], c[3]};
    mma(d, a, b);
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = (float)d[i];
  }
};
template <> struct MmaStep<F64Tag> : MmaStepF32<F64Widen> {};

// ---------------------------------------------------------------------------------------------
// The mask at tile granularity. Rows [m0, m1) and keys [n0, n1) (both clipped to the lengths).
struct TileMask {
  AttentionMaskSpec m;
  long long qLen, kLen;

  // Could any (row, key) pair of the tile be visible? Conservative (true may still be all hidden).
  __device__ __forceinline__ bool anyVisible(int m0, int m1, int n0, int n1) const {
    if (m0 >= m1 || n0 >= n1) return false;
    long long lo0, hi0, lo1, hi1;
    attentionBand(m, m0, qLen, kLen, &lo0, &hi0);
    attentionBand(m, m1 - 1, qLen, kLen, &lo1, &hi1);
    if (lo0 <= n1 - 1 && hi1 >= n0 && lo0 <= hi1) return true;
    return n0 <= attentionSinkLimit(m, m1 - 1, qLen, kLen);
  }
  // Is every (row, key) pair of the tile visible, so per-element masking can be skipped?
  __device__ __forceinline__ bool allVisible(int m0, int m1, int n0, int n1) const {
    long long lo0, hi0, lo1, hi1;
    attentionBand(m, m0, qLen, kLen, &lo0, &hi0);
    attentionBand(m, m1 - 1, qLen, kLen, &lo1, &hi1);
    if (lo1 <= n0 && hi0 >= n1 - 1) return true;
    return n1 - 1 <= attentionSinkLimit(m, m0, qLen, kLen);
  }
  __device__ __forceinline__ bool visible(int q, int k) const { return keyVisible(m, q, k, qLen, kLen); }
  // The visible set of row q in three integers (see RowBand); identical to keyVisible for every
  // 0 <= k < kLen, because both the band's upper end and the sink limit are clamped to kLen - 1.
  __device__ __forceinline__ void rowBand(int q, int& lo, int& hi, int& sinkHi) const {
    long long l, h;
    attentionBand(m, q, qLen, kLen, &l, &h);
    const long long s = attentionSinkLimit(m, q, qLen, kLen);
    lo = (int)l;
    hi = (int)(h < -1 ? -1 : h);
    sinkHi = (int)(s < -1 ? -1 : s);
  }
};

// The key tiles a block of rows [m0, m1) must visit, and which of them need no per-element mask,
// from five integers computed once per block (TileMask::anyVisible / allVisible per tile cost a
// few dozen 64-bit instructions each time). Relies on the monotonicity noted at the top.
struct BlockTiles {
  int nTiles, sinkLast, bandFirst, bandLast;
  int loMax, hiMin, sinkMin;
  // Tile 0 holds no key of any row's band and the sinks lie below kFlashSinkTileKeys (the wgmma
  // kernels' narrow products), which a tile of bn keys holds.
  bool sinkNarrow;
  __device__ __forceinline__ void init(const TileMask& tm, int m0, int m1, int bn) {
    nTiles = (int)((tm.kLen + bn - 1) / bn);
    long long lo0, hi0, lo1, hi1;
    attentionBand(tm.m, m0, tm.qLen, tm.kLen, &lo0, &hi0);
    attentionBand(tm.m, m1 - 1, tm.qLen, tm.kLen, &lo1, &hi1);
    const long long sinkHi = attentionSinkLimit(tm.m, m1 - 1, tm.qLen, tm.kLen);
    if (lo0 <= hi1) {
      bandFirst = (int)(lo0 / bn);
      bandLast = (int)(hi1 / bn);
    } else {
      bandFirst = nTiles;
      bandLast = -1;
    }
    sinkLast = sinkHi >= 0 ? (int)(sinkHi / bn) : -1;
    sinkNarrow = bandFirst > 0 && sinkHi >= 0 && sinkHi < kFlashSinkTileKeys && bn >= kFlashSinkTileKeys;
    loMax = (int)lo1;
    hiMin = (int)(hi0 < -1 ? -1 : hi0);
    const long long sinkLo = attentionSinkLimit(tm.m, m0, tm.qLen, tm.kLen);
    sinkMin = (int)(sinkLo < -1 ? -1 : sinkLo);
  }
  // First tile >= j that some row may see, or nTiles.
  __device__ __forceinline__ int next(int j) const {
    if (j <= sinkLast) return j;
    if (j < bandFirst) j = bandFirst;
    return j <= bandLast && j < nTiles ? j : nTiles;
  }
  // Every row sees every key of [n0, n1)?
  __device__ __forceinline__ bool full(int n0, int n1) const {
    return (loMax <= n0 && hiMin >= n1 - 1) || n1 - 1 <= sinkMin;
  }
};

// Key k is visible from a row with band (lo, hi, sinkHi) - the per-element test of partial tiles,
// three compares instead of a call of keyVisible, so the unrolled tile code stays small.
__device__ __forceinline__ bool bandVisible(int k, int lo, int hi, int sinkHi) {
  return (k >= lo && k <= hi) || k <= sinkHi;
}

__device__ __forceinline__ int ceilDiv(int a, int b) { return (a + b - 1) / b; }

// The (slice, tile) of a block of a non-persistent grid (x: tiles, y: slices). Blocks are issued in
// linear blockIdx order (x fastest), and that order is read as WorkList's (below): groups of
// p.workHeads slices (1 where unset: slice by slice), each group's tiles heaviest first (`lastFirst`:
// the last tile first, for query tiles under a causal mask; else the first, for key blocks), slice
// by slice. So the heavy tiles of every slice of a group start before any lighter one and the grid
// ends on the lightest (longest-first list scheduling), while the slices in flight together stay
// few enough that the data their blocks share stays in L2.
__device__ __forceinline__ void gridItem(const FlashKernelParams& p, bool lastFirst, int& slice, int& tile) {
  const int tiles = (int)gridDim.x, slices = (int)gridDim.y;
  const int n = (int)blockIdx.x + tiles * (int)blockIdx.y;
  const int heads = max(1, min(p.workHeads, slices));
  const int groupItems = heads * tiles, group = n / groupItems, r = n % groupItems;
  const int inGroup = min(heads, slices - group * heads);
  const int t = r / inGroup;
  tile = lastFirst ? tiles - 1 - t : t;
  slice = group * heads + r % inGroup;
}

// The work list of a persistent kernel (flashForwardWgmma, and the wgmma backward's): items
// (slice, tile), each taken by the next block that is free through an atomic counter
// (p.workCounter: items taken, blocks done; zero between launches: each launch's last block
// zeroes it), in groups of p.workHeads slices (as many as keep the data their items share within a
// part of L2), each group's tiles heaviest first (`lastFirst`: the last tile first, for query
// tiles under a causal mask; else the first, for key blocks), slice by slice. Taken in that order
// by whichever block is free, the heavy items start first and the grid ends on the lightest
// (longest-first list scheduling). Ahead of the groups, `lead` first tiles of every slice (the
// dK/dV key blocks that hold sink keys, which every query sees: far the heaviest; 0 elsewhere).
// A non-persistent kernel keeps count 1 and never calls take().
struct WorkList {
  int tiles, slices, count, lead;
  bool lastFirst;
  __device__ __forceinline__ void init(const FlashKernelParams& p, int nTiles, int nSlices, bool lastTileFirst, int leadTiles = 0) {
    tiles = nTiles, slices = nSlices, count = nTiles * nSlices, lastFirst = lastTileFirst;
    lead = lastTileFirst ? 0 : min(leadTiles, nTiles);
    (void)p;
  }
  __device__ __forceinline__ void item(const FlashKernelParams& p, int n, int& slice, int& tile) const {
    if (n < lead * slices) {
      tile = n / slices, slice = n % slices;
      return;
    }
    n -= lead * slices;
    const int rest = tiles - lead;
    const int groupItems = p.workHeads * rest, group = n / groupItems, r = n % groupItems;
    const int inGroup = min(p.workHeads, slices - group * p.workHeads);
    tile = lastFirst ? tiles - 1 - r / inGroup : lead + r / inGroup;
    slice = group * p.workHeads + r % inGroup;
  }
  __device__ __forceinline__ int take(const FlashKernelParams& p) const { return atomicAdd((int*)p.workCounter, 1); }
  // After the block's last take(): the last block to get here zeroes the counter for the next launch.
  __device__ __forceinline__ void finish(const FlashKernelParams& p) const {
    if (atomicAdd((int*)p.workCounter + 1, 1) == (int)gridDim.x - 1) ((int*)p.workCounter)[0] = ((int*)p.workCounter)[1] = 0;
  }
};

// The query rows [m0, m1) of one forward or dQ block (batch b, query head h of slice bh, its KV
// head hk; heaviest query tiles first: gridItem) and the key tiles of bn rows they visit.
struct QueryBlock {
  int bh, b, h, hk, m0, m1;
  TileMask tm;
  BlockTiles tiles;
  __device__ __forceinline__ void init(const FlashKernelParams& p, int bm, int bn) {
    int slice, qt;
    gridItem(p, true, slice, qt);
    initAt(p, bm, bn, slice, qt);
  }
  // Slice `slice` (batch · heads + head), query tile `qt` of bm rows.
  __device__ __forceinline__ void initAt(const FlashKernelParams& p, int bm, int bn, int slice, int qt) {
    bh = slice;
    b = bh / p.heads;
    h = bh % p.heads;
    hk = h / (p.heads / p.kvHeads);
    m0 = qt * bm;
    m1 = min(m0 + bm, p.qLen);
    tm = TileMask{p.mask, p.qLen, p.kLen};
    tiles.init(tm, m0, m1, bn);
  }
};

}  // namespace flash
}  // namespace pa
