// A CUPTI injection library that writes one line per kernel run (start and end in ns on the
// GPU's clock, graph id, name) for the timeline of a decode step: which kernels overlap
// under programmatic dependent launch and where the GPU waits. Nsight Systems is not on the
// lent GPU machine; this is the part of it we need. Not linked into tessera.
//
//   nvcc -shared -Xcompiler -fPIC -o kernel_trace.so tools/gpu/kernel_trace.cpp -lcupti
//   CUDA_INJECTION64_PATH=$PWD/kernel_trace.so TESSERA_KERNEL_TRACE=trace.txt <program>
//   python3 tools/gpu/kernel_timeline.py trace.txt
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

FILE* g_out = nullptr;
std::mutex g_mu;
constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    if (g_out)
      std::fprintf(g_out, "%llu %llu %u %u %d %s\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->graphId, k->streamId, k->gridX * k->gridY * k->gridZ,
                   k->name ? k->name : "?");
  }
  free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("TESSERA_KERNEL_TRACE");
  g_out = std::fopen(path && *path ? path : "kernel_trace.txt", "w");
  if (!g_out) return 0;
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
    std::fprintf(stderr, "kernel_trace: cannot enable kernel activity records\n");
  std::atexit(flush_at_exit);
  return 1;
}
