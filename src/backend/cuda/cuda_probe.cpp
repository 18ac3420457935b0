// The host side of probe.cuh: the device ring of per-block records, allocated when
// TESSERA_PROBE_FILE is set and written there as text (one record a line: tag block SM aux
// t0..t5, oldest first) when the backend closes. No-ops unless built with TESSERA_CUDA_PROBE.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/probe.cuh"

namespace tessera::cuda {

#ifdef TESSERA_CUDA_PROBE
void gemv_probe_attach(void* buf, unsigned* n);  // gemv_bulk.cu
void attn_probe_attach(void* buf, unsigned* n);  // attention_decode_mma.cu

namespace {
constexpr size_t kRecBytes = sizeof(probe::Rec), kCap = probe::kCap;
void* g_ring = nullptr;  // [kCap] records, then the counter
}  // namespace

void probe_open() {
  if (!std::getenv("TESSERA_PROBE_FILE") || g_ring) return;
  if (cudaMalloc(&g_ring, kRecBytes * kCap + 256) != cudaSuccess) return;
  cudaMemset(g_ring, 0, kRecBytes * kCap + 256);
  auto* n = reinterpret_cast<unsigned*>(static_cast<char*>(g_ring) + kRecBytes * kCap);
  gemv_probe_attach(g_ring, n);
  attn_probe_attach(g_ring, n);
}

void probe_close() {
  if (!g_ring) return;
  std::vector<char> host(kRecBytes * kCap + 256);
  cudaMemcpy(host.data(), g_ring, host.size(), cudaMemcpyDeviceToHost);
  unsigned n = 0;
  std::memcpy(&n, host.data() + kRecBytes * kCap, sizeof n);
  if (FILE* f = std::fopen(std::getenv("TESSERA_PROBE_FILE"), "w")) {
    const unsigned count = n < kCap ? n : kCap;
    for (unsigned k = 0; k < count; ++k) {
      probe::Rec r;
      std::memcpy(&r, host.data() + ((n - count + k) % kCap) * kRecBytes, sizeof r);
      std::fprintf(f, "%u %u %u %u", r.tag, r.block, r.smid, r.aux);
      for (uint64_t t : r.t) std::fprintf(f, " %llu", static_cast<unsigned long long>(t));
      std::fputc('\n', f);
    }
    std::fclose(f);
  }
  cudaFree(g_ring);
  g_ring = nullptr;
}
#else
void probe_open() {}
void probe_close() {}
#endif

}  // namespace tessera::cuda
