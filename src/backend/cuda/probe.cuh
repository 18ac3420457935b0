#pragma once
// Per-block timestamps inside chosen kernels, for finding where a batch-1 decode layer's time
// goes (tools/gpu/block_timeline.py folds them). Built only with -DTESSERA_CUDA_PROBE=ON
// (CMake); otherwise every macro here expands to nothing and the kernels are unchanged.
//
//   TESSERA_PROBE_TU(gemv)       once per .cu file, at namespace tessera::cuda scope
//   TESSERA_PROBE_DECL;          once at the top of a kernel: six timestamp slots
//   TESSERA_PROBE_MARK(i);       slot i = %globaltimer (ns, 32 ns steps on the H200)
//   TESSERA_PROBE_PUT(gemv, tag, aux);  thread 0 appends {tag, block, SM, aux, slots}
//
// Records go to one device ring (cuda_probe.cpp allocates it when TESSERA_CUDA_DIAG=probe=PATH
// is set, cuda_diag.h, and writes it to PATH as text when the backend closes).
#include <cstdint>

#ifdef TESSERA_CUDA_PROBE
namespace tessera::cuda::probe {
struct Rec {
  uint32_t tag, block, smid, aux;
  uint64_t t[6];
};
constexpr unsigned kCap = 1u << 18;  // records kept (the last ones)
}  // namespace tessera::cuda::probe

#define TESSERA_PROBE_TU(name)                                                                                       \
  static __device__ tessera::cuda::probe::Rec* name##_probe_buf = nullptr;                                           \
  static __device__ unsigned* name##_probe_n = nullptr;                                                              \
  void name##_probe_attach(void* buf, unsigned* n) {                                                                 \
    cudaMemcpyToSymbol(name##_probe_buf, &buf, sizeof buf);                                                          \
    cudaMemcpyToSymbol(name##_probe_n, &n, sizeof n);                                                                \
  }                                                                                                                  \
  __device__ __forceinline__ void name##_probe_put(uint32_t tag, uint32_t aux, const uint64_t* t) {                  \
    if (!name##_probe_buf) return;                                                                                   \
    const unsigned i = atomicAdd(name##_probe_n, 1u) % tessera::cuda::probe::kCap;                                   \
    uint32_t sm;                                                                                                     \
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                                                  \
    name##_probe_buf[i] = {                                                                                          \
        tag, blockIdx.x + 65536u * (blockIdx.y + 256u * blockIdx.z), sm, aux, {t[0], t[1], t[2], t[3], t[4], t[5]}}; \
  }
#define TESSERA_PROBE_DECL uint64_t probe_t_[6] = {0, 0, 0, 0, 0, 0}
#define TESSERA_PROBE_MARK(i) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(probe_t_[i]))
#define TESSERA_PROBE_PUT(name, tag, aux)                       \
  do {                                                          \
    if (threadIdx.x == 0) name##_probe_put(tag, aux, probe_t_); \
  } while (0)
#else
#define TESSERA_PROBE_TU(name)
#define TESSERA_PROBE_DECL static_assert(true)
#define TESSERA_PROBE_MARK(i) static_assert(true)
#define TESSERA_PROBE_PUT(name, tag, aux) static_assert(true)
#endif
