#include "backend/cuda/gemm_lt.h"

#include <cublasLt.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

#define TESSERA_CUBLAS_CHECK(call)                                                           \
  do {                                                                                       \
    const cublasStatus_t st_ = (call);                                                       \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::tessera::cuda::throw_cublas_error(static_cast<int>(st_), #call, __FILE__, __LINE__); \
  } while (0)

namespace tessera::cuda {

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The largest power of two up to 16 that divides the address (cuBLASLt picks kernels by it).
int alignment_of(const void* p, int64_t ld, int elem) {
  const uint64_t a = reinterpret_cast<uint64_t>(p) | static_cast<uint64_t>(ld * elem);
  int al = 16;
  while (al > 1 && a % al) al /= 2;
  return al;
}

int elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_8F_E4M3 ? 1 : 2; }
}  // namespace

struct GemmLt::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

GemmLt::GemmLt() {
  cublasLtHandle_t h = nullptr;
  TESSERA_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  TESSERA_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

GemmLt::~GemmLt() {
  for (auto& [key, p] : plans_) delete p;
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

GemmLt::Plan& GemmLt::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  const auto [type_i, M, N, K, lda, ldb, ldd, align] = key;
  const auto type = static_cast<cudaDataType_t>(type_i);
  auto* p = new Plan;
  try {
    TESSERA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Column-major views: A^T is [K, M] (ld lda), B is [K, N] (ld ldb), D is [M, N] (ld ldd).
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, K, M, lda));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, K, N, ldb));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, M, N, ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const uint32_t al = static_cast<uint32_t>(align);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a, p->b,
                                                             p->d, p->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cuBLASLt has no algorithm for a ", M, "x", N, "x", K, " product (type ", type_i, ", alignment ", align,
           ", status ", static_cast<int>(st), ")");
    // The heuristic's first choice. Timing its candidates (and split-K versions) on cold L2
    // was tried and ran slower inside the decode step (docs/benchmarks/gpu.md, fourth pass).
    p->algo = result.algo;
  } catch (...) {
    delete p;
    throw;
  }
  plans_[key] = p;
  return *p;
}

void GemmLt::run(cudaDataType_t ab_type, const void* A, int64_t lda, const void* B, int64_t ldb, float* D, int64_t ldd,
                 int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  const int e = elem_bytes(ab_type);
  int align = std::min({alignment_of(A, lda, e), alignment_of(B, ldb, e), alignment_of(D, ldd, 4)});
  Plan& p = plan(Key{static_cast<int>(ab_type), M, N, K, lda, ldb, ldd, align});
  const float alpha = 1.0f, beta = 0.0f;
  TESSERA_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, A, p.a, B, p.b, &beta, D,
                                      p.d, D, p.d, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace tessera::cuda
