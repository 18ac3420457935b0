// The host side of probe.cuh: the device ring of per-block records, allocated when
// TESSERA_CUDA_DIAG names a probe file (cuda_diag.h) and written there as text (one record a
// line: tag block SM aux t0..t5, oldest first) when the backend closes. Only in builds with
// TESSERA_CUDA_PROBE; in others asking for the probe is an error that says so.
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_diag.h"
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
  if (diagnostics().probe_file.empty() || g_ring) return;
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
  if (FILE* f = std::fopen(diagnostics().probe_file.c_str(), "w")) {
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
void probe_open() {
  TESSERA_CHECK(diagnostics().probe_file.empty(),
                "TESSERA_CUDA_DIAG=probe=...: this build has no probe (configure with -DTESSERA_CUDA_PROBE=ON)");
}
void probe_close() {}
#endif

}  // namespace tessera::cuda
