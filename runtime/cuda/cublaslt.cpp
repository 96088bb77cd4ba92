// Run-time loading of cuBLASLt and the row-major view of its column-major API.
#include "runtime/cuda/cublaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "runtime/cuda/dynamic_library.h"

namespace pa::cuda {

// The entry points used here, typed from cublasLt.h's own declarations.
struct CublasLt::Api {
#define PA_LT_FN(name) decltype(&::name) name = nullptr;
  PA_LT_FN(cublasLtCreate)
  PA_LT_FN(cublasLtDestroy)
  PA_LT_FN(cublasLtGetVersion)
  PA_LT_FN(cublasLtMatmulDescCreate)
  PA_LT_FN(cublasLtMatmulDescDestroy)
  PA_LT_FN(cublasLtMatmulDescSetAttribute)
  PA_LT_FN(cublasLtMatrixLayoutCreate)
  PA_LT_FN(cublasLtMatrixLayoutDestroy)
  PA_LT_FN(cublasLtMatrixLayoutSetAttribute)
  PA_LT_FN(cublasLtMatmulPreferenceCreate)
  PA_LT_FN(cublasLtMatmulPreferenceDestroy)
  PA_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  PA_LT_FN(cublasLtMatmulAlgoGetHeuristic)
  PA_LT_FN(cublasLtMatmulAlgoCheck)
  PA_LT_FN(cublasLtMatmul)
#undef PA_LT_FN
};

namespace {

void ltCheck(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string("cuBLASLt: ") + call + " failed with status " + std::to_string(static_cast<int>(s)),
                    static_cast<CUresult>(s));
}

// Where a CUDA toolkit or PyTorch's wheels keep the library, after the loader's own search.

}  // namespace

std::string LtProblem::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%lldx%lldx%lld b%lld/%lld/%lld %c%c %s%s%s a%u/%u/%u", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(batch),
                static_cast<long long>(strideA), static_cast<long long>(strideB), transA ? 'T' : 'N', transB ? 'T' : 'N',
                bf16 ? (fp32C ? "bf16>fp32" : "bf16") : tf32 ? "tf32" : "fp32", bias ? " bias" : biasGradB ? " bgradB" : biasGradA ? " bgradA" : "", relu ? " relu" : "", alignA, alignB,
                alignC);
  return buf;
}

std::string LtAlgo::hex() const {
  std::string s;
  char buf[17];
  for (uint64_t w : data) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(w));
    s += buf;
  }
  return s + ":" + std::to_string(workspaceBytes);
}

bool LtAlgo::fromHex(const std::string& s, LtAlgo& out) {
  if (s.size() < 8 * 16 + 2 || s[8 * 16] != ':') return false;
  for (int i = 0; i < 8; ++i) {
    char* end = nullptr;
    const std::string word = s.substr(static_cast<size_t>(i) * 16, 16);
    out.data[i] = std::strtoull(word.c_str(), &end, 16);
    if (end != word.c_str() + 16) return false;
  }
  char* end = nullptr;
  out.workspaceBytes = std::strtoull(s.c_str() + 8 * 16 + 1, &end, 10);
  return end && *end == '\0';
}

CublasLt& CublasLt::instance() {
  static CublasLt lt;
  return lt;
}

CublasLt::CublasLt() : api_(std::make_unique<Api>()) {
  std::string tried;
  handle_ = openFirstLibrary(
      libraryCandidates("PA_CUBLASLT_LIBRARY", {"libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.13"},
                        {"/usr/local/lib/python3*/dist-packages/nvidia/cu13/lib/libcublasLt.so.13",
                         "/usr/local/lib/python3*/site-packages/nvidia/cu13/lib/libcublasLt.so.13",
                         "/usr/lib/python3/dist-packages/nvidia/cu13/lib/libcublasLt.so.13",
                         "/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib/libcublasLt.so.13",
                         "/usr/local/lib/python3*/site-packages/nvidia/cublas/lib/libcublasLt.so.13"}),
      path_, tried);
  if (!handle_) {
    reason_ = "libcublasLt.so.13 was not found (tried " + tried + "; PA_CUBLASLT_LIBRARY names it)";
    return;
  }
  std::string missing;
  auto resolve = [&](auto& slot, const char* name) { resolveSymbol(handle_, slot, name, missing); };
#define PA_LT_RESOLVE(name) resolve(api_->name, #name);
  PA_LT_RESOLVE(cublasLtCreate)
  PA_LT_RESOLVE(cublasLtDestroy)
  PA_LT_RESOLVE(cublasLtGetVersion)
  PA_LT_RESOLVE(cublasLtMatmulDescCreate)
  PA_LT_RESOLVE(cublasLtMatmulDescDestroy)
  PA_LT_RESOLVE(cublasLtMatmulDescSetAttribute)
  PA_LT_RESOLVE(cublasLtMatrixLayoutCreate)
  PA_LT_RESOLVE(cublasLtMatrixLayoutDestroy)
  PA_LT_RESOLVE(cublasLtMatrixLayoutSetAttribute)
  PA_LT_RESOLVE(cublasLtMatmulPreferenceCreate)
  PA_LT_RESOLVE(cublasLtMatmulPreferenceDestroy)
  PA_LT_RESOLVE(cublasLtMatmulPreferenceSetAttribute)
  PA_LT_RESOLVE(cublasLtMatmulAlgoGetHeuristic)
  PA_LT_RESOLVE(cublasLtMatmulAlgoCheck)
  PA_LT_RESOLVE(cublasLtMatmul)
#undef PA_LT_RESOLVE
  if (!missing.empty()) {
    reason_ = path_ + " lacks " + missing;
    return;
  }
  version_ = api_->cublasLtGetVersion();
  if (version_ / 10000 != CUBLAS_VER_MAJOR) {
    reason_ = path_ + " is cuBLASLt " + std::to_string(version_) + "; this build expects major version " +
              std::to_string(CUBLAS_VER_MAJOR);
    return;
  }
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t s = api_->cublasLtCreate(&h);
  if (s != CUBLAS_STATUS_SUCCESS) {
    reason_ = "cublasLtCreate failed with status " + std::to_string(static_cast<int>(s));
    return;
  }
  lt_ = h;
  available_ = true;
}

CublasLt::~CublasLt() {
  // The process is ending; the driver may already be gone, so the handle and library are left
  // to the operating system.
}

// Note on the row-major view. cuBLASLt is column-major. A row-major M×N matrix is the same bytes
// as a column-major N×M one, so C = op(A)·op(B) becomes Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's A is the
// graph's B and its B is the graph's A, with m and n swapped. The graph's B (row-major K×N, or
// N×K when transposed) seen column-major is N×K with leading dimension N (no transpose needed),
// or K×N with leading dimension K (transposed). Likewise the graph's A gives K×M (ld K) or M×K
// (ld M, transposed). The bias runs along the graph's columns, which are cuBLASLt's rows of D,
// exactly the length-m vector its BIAS epilogue adds. Bias gradients follow the same swap: the
// graph's B summed over K (a length-n vector along the graph's columns, cuBLASLt's rows of D) is
// BGRADA, the bias gradient of cuBLASLt's A; the graph's A summed over K (length m) is BGRADB.
std::unique_ptr<LtPlan> CublasLt::plan(const LtProblem& p, size_t workspaceBytes, int maxAlgos) const {
  std::unique_ptr<LtPlan> plan(new LtPlan(p));
  if (!available_) return plan;
  const Api& a = *api_;
  const cublasComputeType_t compute = p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op = nullptr;
  ltCheck(a.cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  plan->op_ = op;
  const cublasOperation_t ta = p.transB ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  ltCheck(a.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
  ltCheck(a.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
  const cublasLtEpilogue_t epi = p.bias && p.relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                 : p.bias         ? CUBLASLT_EPILOGUE_BIAS
                                 : p.relu         ? CUBLASLT_EPILOGUE_RELU
                                 : p.biasGradB    ? CUBLASLT_EPILOGUE_BGRADA
                                 : p.biasGradA    ? CUBLASLT_EPILOGUE_BGRADB
                                                  : CUBLASLT_EPILOGUE_DEFAULT;
  ltCheck(a.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "set EPILOGUE");
  if (p.bias || p.biasGradA || p.biasGradB) {  // the graph's biases and their gradients are fp32, whatever C is
    const cudaDataType_t bt = CUDA_R_32F;
    ltCheck(a.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "set BIAS_DATA_TYPE");
  }
  const cudaDataType_t abType = p.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t cType = p.bf16 && !p.fp32C ? CUDA_R_16BF : CUDA_R_32F;

  auto layout = [&](cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int64_t stride) {
    cublasLtMatrixLayout_t l = nullptr;
    ltCheck(a.cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    if (p.batch > 1) {
      const int32_t count = static_cast<int32_t>(p.batch);
      ltCheck(a.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "set BATCH_COUNT");
      ltCheck(a.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "set STRIDED_BATCH_OFFSET");
    }
    return static_cast<void*>(l);
  };
  const auto M = static_cast<uint64_t>(p.m), N = static_cast<uint64_t>(p.n), K = static_cast<uint64_t>(p.k);
  plan->layoutA_ = p.transB ? layout(abType, K, N, p.k, p.strideB) : layout(abType, N, K, p.n, p.strideB);
  plan->layoutB_ = p.transA ? layout(abType, M, K, p.m, p.strideA) : layout(abType, K, M, p.k, p.strideA);
  plan->layoutC_ = layout(cType, N, M, p.n, p.m * p.n);

  cublasLtMatmulPreference_t pref = nullptr;
  ltCheck(a.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspaceBytes;
  ltCheck(a.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "set MAX_WORKSPACE_BYTES");
  // cuBLASLt's A is the graph's B.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.alignB},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.alignA},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.alignC},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.alignC}};
  for (const auto& [attr, bytes] : aligns)
    ltCheck(a.cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes), "set MIN_ALIGNMENT");
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(maxAlgos, 1)));
  int returned = 0;
  const auto lc = static_cast<cublasLtMatrixLayout_t>(plan->layoutC_);
  const cublasStatus_t s = a.cublasLtMatmulAlgoGetHeuristic(
      static_cast<cublasLtHandle_t>(lt_), op, static_cast<cublasLtMatrixLayout_t>(plan->layoutA_),
      static_cast<cublasLtMatrixLayout_t>(plan->layoutB_), lc, lc, pref, static_cast<int>(results.size()), results.data(),
      &returned);
  a.cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return plan;  // NOT_SUPPORTED: no algorithm for this problem
  for (int i = 0; i < returned; ++i) {
    if (results[static_cast<size_t>(i)].state != CUBLAS_STATUS_SUCCESS) continue;
    LtAlgo algo;
    static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof algo.data, "cublasLtMatmulAlgo_t is 8 words");
    std::memcpy(algo.data, &results[static_cast<size_t>(i)].algo, sizeof algo.data);
    algo.workspaceBytes = results[static_cast<size_t>(i)].workspaceSize;
    plan->algos_.push_back(algo);
  }
  return plan;
}

LtPlan::~LtPlan() {
  if (!CublasLt::instance().available()) return;
  const CublasLt::Api& a = *CublasLt::instance().api_;
  if (op_) a.cublasLtMatmulDescDestroy(static_cast<cublasLtMatmulDesc_t>(op_));
  for (void* l : {layoutA_, layoutB_, layoutC_})
    if (l) a.cublasLtMatrixLayoutDestroy(static_cast<cublasLtMatrixLayout_t>(l));
}

bool LtPlan::check(const LtAlgo& algo) const {
  const CublasLt& lt = CublasLt::instance();
  if (!lt.available() || !op_) return false;
  cublasLtMatmulAlgo_t al;
  std::memcpy(&al, algo.data, sizeof al);
  cublasLtMatmulHeuristicResult_t r{};
  const auto lc = static_cast<cublasLtMatrixLayout_t>(layoutC_);
  const cublasStatus_t s = lt.api_->cublasLtMatmulAlgoCheck(
      static_cast<cublasLtHandle_t>(lt.lt_), static_cast<cublasLtMatmulDesc_t>(op_),
      static_cast<cublasLtMatrixLayout_t>(layoutA_), static_cast<cublasLtMatrixLayout_t>(layoutB_), lc, lc, &al, &r);
  return s == CUBLAS_STATUS_SUCCESS && r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= algo.workspaceBytes;
}

void LtPlan::run(const LtAlgo& algo, CUdeviceptr a, CUdeviceptr b, CUdeviceptr bias, CUdeviceptr c, CUdeviceptr workspace,
                 CUstream stream) const {
  const CublasLt& lt = CublasLt::instance();
  const CublasLt::Api& f = *lt.api_;
  auto op = static_cast<cublasLtMatmulDesc_t>(op_);
  if (p_.bias || p_.biasGradA || p_.biasGradB) {
    const void* bp = reinterpret_cast<const void*>(bias);
    ltCheck(f.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp), "set BIAS_POINTER");
  }
  cublasLtMatmulAlgo_t al;
  std::memcpy(&al, algo.data, sizeof al);
  const float alpha = 1.0f, beta = 0.0f;
  const auto lc = static_cast<cublasLtMatrixLayout_t>(layoutC_);
  // cuBLASLt's A is the graph's B (see the note above plan()).
  ltCheck(f.cublasLtMatmul(static_cast<cublasLtHandle_t>(lt.lt_), op, &alpha, reinterpret_cast<const void*>(b),
                         static_cast<cublasLtMatrixLayout_t>(layoutA_), reinterpret_cast<const void*>(a),
                         static_cast<cublasLtMatrixLayout_t>(layoutB_), &beta, reinterpret_cast<const void*>(c), lc,
                         reinterpret_cast<void*>(c), lc, &al, reinterpret_cast<void*>(workspace), algo.workspaceBytes,
                         reinterpret_cast<cudaStream_t>(stream)),
        "cublasLtMatmul");
}

}  // namespace pa::cuda
