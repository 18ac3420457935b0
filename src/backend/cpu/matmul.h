#pragma once
// Matrix products on weights in their stored format (F32, F16, BF16 and the GGUF block
// formats), f32 activations in and out. Block-format weights are dotted directly against
// activations quantized once per call to the matching 8-bit format (Q8_0, Q8_1 or Q8_K, as
// llama.cpp does), never dequantized whole.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "backend/tensor.h"
#include "core/thread_pool.h"

namespace tessera {

class CpuMatmul {
 public:
  explicit CpuMatmul(ThreadPool& pool);
  ~CpuMatmul();

  // For every target: y[t, r] = x[t, :] · W[r, :], for t in [0, n_rows).
  // All targets share the input, which is quantized once; all of them run in one parallel
  // region. Every target's w.cols must equal the width of x.
  void run(const float* x, int64_t n_rows, int64_t ldx, std::span<const MatmulTarget> targets);

  // Name of the kernel family picked at run time for this CPU ("avx512", "avx2", "scalar").
  // TESSERA_ISA=scalar|avx2|avx512 forces one; naming one this CPU lacks is an error.
  static const char* isa();

  // Whether this CPU can run the named kernel family (tests run every one it can).
  static bool isa_supported(std::string_view name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rows of a weight as f32: out[i, :] = W[ids[i], :] (embedding lookup). ids are trusted
// (checked against rows by the caller).
void cpu_get_rows(const WeightMatrix& w, const int32_t* ids, int64_t n, float* out);

}  // namespace tessera
