// The device's measured ceilings (copy bandwidth, bf16 matrix rate), for benchmark floors.
#include <algorithm>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_factory.h"
#include "core/error.h"
#include "core/fp16.h"

namespace tessera {

namespace {
// Milliseconds of `fn` on the stream, best of `reps` after one warm-up.
template <typename F>
float best_ms(cudaStream_t s, int reps, F&& fn) {
  cudaEvent_t a, b;
  TESSERA_CUDA_CHECK(cudaEventCreate(&a));
  TESSERA_CUDA_CHECK(cudaEventCreate(&b));
  fn();
  float best = 1e30f;
  for (int i = 0; i < reps; ++i) {
    TESSERA_CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    TESSERA_CUDA_CHECK(cudaEventRecord(b, s));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}
}  // namespace

DeviceCeilings measure_cuda_ceilings(Backend& backend) {
  auto* be = dynamic_cast<CudaBackend*>(&backend);
  TESSERA_CHECK(be, "measure_cuda_ceilings: backend '", backend.name(), "' is not CUDA");
  const cudaStream_t s = be->stream();
  DeviceCeilings c;
  {
    const size_t bytes = size_t{2} << 30;
    void* src = be->alloc(bytes);
    void* dst = be->alloc(bytes);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(src, 0x3c, bytes, s));  // not zeros
    const float ms =
        best_ms(s, 5, [&] { TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
    c.copy_bytes_per_s = 2.0 * bytes / (ms * 1e-3);
    be->free(src);
    be->free(dst);
  }
  {
    const int64_t n = 8192;
    std::vector<uint16_t> host(static_cast<size_t>(n) * n);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : host) v = f32_to_bf16(d(rng));
    void* a = be->alloc(host.size() * 2);
    void* b = be->alloc(host.size() * 2);
    float* out = static_cast<float*>(be->alloc(host.size() * 4));
    TESSERA_CUDA_CHECK(cudaMemcpy(a, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    TESSERA_CUDA_CHECK(cudaMemcpy(b, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    cuda::GemmLt gemm;
    const float ms = best_ms(s, 5, [&] { gemm.run(CUDA_R_16BF, a, n, b, n, out, n, n, n, n, s); });
    c.bf16_flops_per_s = 2.0 * n * n * n / (ms * 1e-3);
    be->free(a);
    be->free(b);
    be->free(out);
  }
  return c;
}

std::shared_ptr<void> cuda_pinned_host(size_t bytes) {
  void* p = nullptr;
  TESSERA_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

}  // namespace tessera
