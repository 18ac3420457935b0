#pragma once
// Dense products through cuBLASLt, for batches past the matrix-vector kernels:
//   D[t * ldd + r] = sum_k A[r * lda + k] * B[t * ldb + k]    for r < M, t < N
// A: weights [M, K] row-major; B: activations [N, K] row-major; both bf16, f16, f32 or E4M3;
// D f32; f32 accumulation (no TF32). The algorithm chosen for each shape is cached.
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace tessera::cuda {

class GemmLt {
 public:
  GemmLt();
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  // ab_type CUDA_R_8F_E4M3 (FP8W, W8A8): D unscaled, the caller applies the scales (cuBLAS 13.1
  // offers no per-row "outer vector" scale mode on Hopper); lda, ldb, K, M multiples of 16 and D
  // 16-byte aligned, or cuBLASLt finds no algorithm.
  void run(cudaDataType_t ab_type, const void* A, int64_t lda, const void* B, int64_t ldb, float* D, int64_t ldd,
           int64_t M, int64_t N, int64_t K, cudaStream_t stream);

 private:
  struct Plan;
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>;
  Plan& plan(const Key& key);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan*> plans_;
};

}  // namespace tessera::cuda
