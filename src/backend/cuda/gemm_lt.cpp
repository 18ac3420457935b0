#include "backend/cuda/gemm_lt.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

#define TESSERA_CUBLAS_CHECK(call)                                                          \
  do {                                                                                      \
    const cublasStatus_t st_ = (call);                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
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

int elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// Heuristic candidates per shape: 1 (then nothing is timed: cuBLASLt's first choice), or
// TESSERA_CUDA_GEMM_TUNE=N (up to kTuneCandidates), timed with their split-K versions when
// TESSERA_CUDA_GEMM_SPLITK=1. Kept for experiments, off by default because it measured no
// gain on the H200 (decode of 128 sequences, 8B bf16, one run each, 2026-12-01): first
// choice alone 14,488 tok/s; with its split-K versions, timed, 14,476; 16 candidates and
// their split-K versions, timed, 12,956 (12,731 and 13,005 without split-K in an earlier
// run): the isolated timings do not rank the candidates as they run inside the decode step.
int tune_candidates() {
  static const int n = [] {
    const char* env = std::getenv("TESSERA_CUDA_GEMM_TUNE");
    const int v = env ? std::atoi(env) : 0;
    return v >= 1 && v <= kTuneCandidates ? v : 1;
  }();
  return n;
}
// Shapes worth timing: N (rows of activations) a power of two up to 512 — the padded decode
// batches that graphs replay every step, and prefill chunks of those sizes. Other N (any
// chunk length of a serving prefill) would each cost a tuning pause the first time: they
// take the heuristic's first choice.
bool tuned_size(int64_t n) { return n >= 1 && n <= 512 && (n & (n - 1)) == 0; }

// TESSERA_CUDA_GEMM_SPLITK=1: split-K versions of each candidate join the timing.
bool split_k_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("TESSERA_CUDA_GEMM_SPLITK");
    return env && env[0] == '1';
  }();
  return on;
}
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

// Opt-in tuning (tune_candidates, split_k_enabled). The idea: the heuristic's first
// choice need not be the fastest: at 128 rows of activations a
// 4,096-row weight makes only 32 output tiles for 132 SMs (the products read the weights at
// 1.2-3.0 TB/s on the H200, under the 4.3 TB/s copy rate). So each new shape times the
// candidates — the heuristic's, and split-K versions of them (2, 4, 8 slices of K, reduced
// through the workspace in f32: deterministic) — on its real operands and keeps the
// fastest (fastest() says how). D is simply overwritten. Not while a
// graph is being captured (nothing may synchronize then): -1, the caller takes the first
// candidate without remembering it.
std::vector<cublasLtMatmulAlgo_t> GemmLt::candidates(const Plan& p, const cublasLtMatmulHeuristicResult_t* results,
                                                     int found) {
  std::vector<cublasLtMatmulAlgo_t> out;
  auto h = static_cast<cublasLtHandle_t>(handle_);
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    out.push_back(results[i].algo);
  }
  if (!split_k_enabled()) return out;
  const size_t n_heuristic = out.size();
  for (size_t i = 0; i < n_heuristic; ++i) {
    int32_t support = 0;
    size_t written = 0;
    uint32_t splits_now = 1;
    if (cublasLtMatmulAlgoCapGetAttribute(&out[i], CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof support,
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        !support)
      continue;
    cublasLtMatmulAlgoConfigGetAttribute(&out[i], CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits_now, sizeof splits_now,
                                         &written);
    if (splits_now > 1) continue;  // the heuristic split it already
    for (uint32_t splits : {2u, 4u, 8u}) {
      cublasLtMatmulAlgo_t algo = out[i];
      const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                               sizeof scheme) != CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(h, p.op, p.a, p.b, p.d, p.d, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > workspace_bytes_)
        continue;
      out.push_back(algo);
    }
  }
  return out;
}

int GemmLt::fastest(const Plan& p, const std::vector<cublasLtMatmulAlgo_t>& algos, const Call& c) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(c.stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return -1;
  // Timed as the model runs them: the weights come from device memory, not from L2 (a
  // 4,096 x 4,096 bf16 matrix fits the H200's L2, and back-to-back runs would measure the
  // cache). So every timed run follows a write of a buffer twice the L2's size. The first
  // products of a process also run while the clocks ramp up from idle: a warm-up burst
  // first, then rounds over all candidates, each candidate scored by its best round.
  int l2 = 0, device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  const size_t flush_bytes = std::max<size_t>(size_t{2} * l2, size_t{64} << 20);
  void* flush = nullptr;
  if (cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    cudaGetLastError();  // no room (the KV pool took it): time with whatever L2 holds
    flush = nullptr;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, c.A, p.a, c.B, p.b, &beta, c.D, p.d,
                          c.D, p.d, &algo, workspace_, workspace_bytes_, c.stream);
  };
  std::vector<float> best_ms(algos.size(), 1e30f);
  std::vector<bool> usable(algos.size(), true);
  for (size_t i = 0; i < algos.size(); ++i) usable[i] = run(algos[i]) == CUBLAS_STATUS_SUCCESS;  // loads kernels
  for (int r = 0; r < 20; ++r) run(algos[0]);
  constexpr int kRounds = 4;
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < algos.size(); ++i) {
      if (!usable[i]) continue;
      if (flush) TESSERA_CUDA_CHECK(cudaMemsetAsync(flush, round + 1, flush_bytes, c.stream));
      TESSERA_CUDA_CHECK(cudaEventRecord(start, c.stream));
      const bool ok = run(algos[i]) == CUBLAS_STATUS_SUCCESS;
      TESSERA_CUDA_CHECK(cudaEventRecord(stop, c.stream));
      TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (!ok) usable[i] = false;
      best_ms[i] = std::min(best_ms[i], ms);
    }
  int best = 0;
  for (size_t i = 0; i < algos.size(); ++i)
    if (usable[i] && (!usable[best] || best_ms[i] < best_ms[best])) best = static_cast<int>(i);
  cudaGetLastError();  // a candidate that failed to launch leaves nothing behind
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (flush) TESSERA_CUDA_CHECK(cudaFree(flush));
  return best;
}

GemmLt::Plan& GemmLt::plan(const Key& key, const Call* call) {
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
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a,
                                                             p->b, p->d, p->d, pref, tune_candidates(), results,
                                                             &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cuBLASLt has no algorithm for a ", M, "x", N, "x", K, " product (type ", type_i, ", alignment ", align,
           ", status ", static_cast<int>(st), ")");
    // One choice per shape for the whole process: two backends (graphs on and off, say)
    // then run the same algorithm and agree bit for bit.
    static std::mutex tuned_mutex;
    static std::map<Key, int> tuned;
    std::lock_guard<std::mutex> lock(tuned_mutex);
    const std::vector<cublasLtMatmulAlgo_t> algos = candidates(*p, results, found);
    if (algos.empty()) fail("cuBLASLt: no usable algorithm for a ", M, "x", N, "x", K, " product");
    auto it = tuned.find(key);
    int pick = 0;
    if (it != tuned.end() && it->second < static_cast<int>(algos.size()))
      pick = it->second;
    else if (algos.size() > 1 && call && tuned_size(N) && (pick = fastest(*p, algos, *call)) >= 0)
      tuned[key] = pick;
    p->algo = algos[std::max(pick, 0)];
  } catch (...) {
    delete p;
    throw;
  }
  plans_[key] = p;
  return *p;
}

void GemmLt::run(cudaDataType_t ab_type, const void* A, int64_t lda, const void* B, int64_t ldb, float* D,
                 int64_t ldd, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  const int e = elem_bytes(ab_type);
  int align = std::min({alignment_of(A, lda, e), alignment_of(B, ldb, e), alignment_of(D, ldd, 4)});
  const Call call{A, B, D, stream};
  Plan& p = plan(Key{static_cast<int>(ab_type), M, N, K, lda, ldb, ldd, align}, &call);
  const float alpha = 1.0f, beta = 0.0f;
  TESSERA_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, A, p.a, B, p.b, &beta, D,
                                      p.d, D, p.d, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace tessera::cuda
