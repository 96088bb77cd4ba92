// Kernel templates of the GEMM emitters (codegen/emit_gemm.cpp): the generated GEMM's kernels
// (kernels/gemm_{simt,tf32,wgmma}.cuh), its operand copies, and the library GEMM's epilogue.
#pragma once

namespace pa::codegen::templates {

// A generated GEMM's problem and epilogue structs (kernels/gemm_common.cuh describes both).
inline constexpr const char* kGemmProblem = R"(
#include "${HEADER}"

// External linkage (no anonymous namespace): each kernel uses only one of the two structs, and
// NVRTC warns about unused internal ones. The kernel's name makes them unique in a program.
struct ${NAME}_problem {
  static constexpr long long M = ${M}, N = ${N}, K = ${K}, strideA = ${ABATCH}, strideB = ${BBATCH};
  static constexpr bool transA = ${TA}, transB = ${TB}, transC = ${TC};
  static constexpr int splits = ${SPLITS};
  static constexpr long long tailTiles = ${TAILTILES};
  static constexpr int tailSplits = ${TAILSPLITS};
  static constexpr long long batch = ${BATCH};
};
struct ${NAME}_epilogue {
${EPIMEMBERS}  static constexpr bool kPairs = ${PAIRS}, kStageRaw = ${STAGERAW}, kAux = ${AUX};
${AUXFN}  __device__ __forceinline__ float operator()(float v, long long m, long long n, long long i) const {
${EPILOGUE}    return v;
  }
  // Columns n and n + 1 (n even) together, where kPairs (kernels/gemm_common.cuh, "Pair epilogues").
  __device__ __forceinline__ void pair(float& v0, float& v1, long long m, long long n, long long i) const {
    v0 = (*this)(v0, m, n, i);
    v1 = (*this)(v1, m, n + 1, i + 1);
${PAIRBODY}  }
};
)";

// The product with its epilogue, in one kernel (${CMAP}: as in kGemmSplit).
inline constexpr const char* kGemm = R"(${PROBLEM}${SHAREDCHECK}
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MINBLOCKS}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::${ALGO}<${NAME}_problem, pa::gemm::${CONFIG}>(${APTR}, ${BPTR}, ${COUT}, epilogue${SUMS}${CMAP});
}
)";

// Split-K: each block's raw sum over its share of K into the scratch (no epilogue), and its
// partial operand sums where the kernel sums an operand (kernels/gemm_common.cuh). ${CMAP}: the
// wgmma kernel's TMA map of C (here the partial sums), or nothing.
inline constexpr const char* kGemmSplit = R"(${PROBLEM}${SHAREDCHECK}
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MINBLOCKS}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  pa::gemm::${ALGO}<${NAME}_problem, pa::gemm::${CONFIG}>(${APTR}, ${BPTR}, scratch + ${PARTS}, pa::gemm::Identity()${SUMS}${CMAP});
}
)";

// Tail split: whole tiles through the epilogue, the last wave's tiles in K pieces to scratch.
inline constexpr const char* kGemmTail = R"(${PROBLEM}${SHAREDCHECK}
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MINBLOCKS}) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::simtGemmTail<${NAME}_problem, pa::gemm::${CONFIG}>(${APTR}, ${BPTR}, ${COUT}, scratch + ${PARTS}, epilogue);
}
)";

// Tail split's second kernel: each tail tile's pieces added in split order, then the epilogue.
inline constexpr const char* kGemmTailReduce = R"(${PROBLEM}
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::simtTailReduce<${NAME}_problem, pa::gemm::${CONFIG}>(scratch + ${PARTS}, ${COUT}, epilogue);
}
)";

// Split-K's second kernel: where the product kernel summed an operand, the partial operand sums
// first (added in order); then the partial products added in split order, and the epilogue.
inline constexpr const char* kGemmReduce = R"(${PROBLEM}
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
${SUMREDUCE}  ${NAME}_epilogue epilogue;
${EPIINIT}  pa::gemm::splitReduce<${NAME}_problem, ${WIDTH}>(scratch + ${PARTS}, ${COUT}, epilogue);
}
)";

// An fp32 operand copied transposed into the node's scratch: for the TF32 wgmma kernel, which reads
// both operands K-major, and for cuBLASLt's untransposed-B candidate (libraryGemmTransposeB).
// [copies][R][C] -> [copies][C][R] through 32×32 shared tiles.
inline constexpr const char* kGemmTranspose = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  __shared__ float tile[32][33];
  const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
  const long long r0 = (long long)blockIdx.y * 32, c0 = (long long)blockIdx.x * 32;
  const float* src = in${INPUT} + (long long)blockIdx.z * ${R} * ${C};
  float* dst = scratch + ${OFFSET} + (long long)blockIdx.z * ${R} * ${C};
  for (int i = row; i < 32; i += 8)
    if (r0 + i < ${R} && c0 + lane < ${C}) tile[i][lane] = src[(r0 + i) * ${C} + c0 + lane];
  __syncthreads();
  for (int i = row; i < 32; i += 8)
    if (c0 + i < ${C} && r0 + lane < ${R}) dst[(c0 + i) * ${R} + r0 + lane] = tile[lane][i];
}
)";

// A bf16 operand widened to fp32 in the node's scratch, for the generated GEMM (exact: TF32
// holds every bf16 value, so the TF32 kernels then compute the bf16 product with fp32 sums).
inline constexpr const char* kGemmWiden = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long idx = (long long)blockIdx.x * 256 + threadIdx.x; idx < ${COUNT}; idx += (long long)gridDim.x * 256)
    scratch[${OFFSET} + idx] = in${INPUT}[idx];
}
)";

// What a library GEMM leaves of a node's epilogue, as one elementwise pass over its result
// (see "Note on library GEMMs" in emit_gemm.cpp).
inline constexpr const char* kLibraryEpilogue = R"(
extern "C" __global__ void __launch_bounds__(256) ${NAME}(${PARAMS}) {
  pa::pdlBegin();
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < ${COUNT}; i += (long long)gridDim.x * 256) {
    float v = ${SOURCE}[i];
${BODY}  }
}
)";

}  // namespace pa::codegen::templates
