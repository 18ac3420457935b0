// Quantized weights past the skinny tensor-core kernels (prefill, large batches): decoded to
// bf16 and multiplied by cuBLASLt (Backend::matmul, CudaBackend::gemm).
//
// Why slabs: decoding the whole matrix writes 2 bytes per weight to DRAM and the GEMM reads
// them back (W4G: 4× the codes' bytes twice, ~350 µs a Llama-3.1-8B layer on an H100, as much
// as a 512-row GEMM itself). When the activations are small enough to stay in the L2 beside
// it, the matrix is decoded a slab of rows at a time into one scratch of a quarter of the L2,
// and each slab's GEMM reads it back from there: the scratch is rewritten in place, so its
// lines stay in the L2 and DRAM sees about the codes alone. Past that (long prefill chunks),
// each slab's GEMM would re-read activations larger than the L2 from DRAM: the whole matrix
// is decoded once, as before.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace tessera {

int64_t CudaBackend::dequant_slab_rows(int n_rows, int64_t rows, int64_t cols) const {
  const int64_t act_bytes = static_cast<int64_t>(n_rows) * cols * 2;  // the GEMM's bf16 activations
  const int64_t slab_bytes = l2_bytes_ / 4;
  if (slab_bytes <= 0 || act_bytes > l2_bytes_ / 2) return rows;
  // Whole 128-row multiples keep every slab's output 512-byte aligned for cuBLASLt.
  const int64_t slab = std::max<int64_t>(128, slab_bytes / (cols * 2) / 128 * 128);
  return std::min(slab, rows);
}

void CudaBackend::dequant_gemm(const MatmulTarget& t, int n_rows, int64_t cols, const uint16_t* x_bf16) {
  const WeightMatrix& w = t.w;
  const int64_t slab = dequant_slab_rows(n_rows, w.rows, cols);
  auto* wb = static_cast<uint16_t*>(scratch(wdeq_, wdeq_cap_, static_cast<size_t>(slab) * cols * 2));
  const bool group_quant = is_group_quant(w.dtype);
  for (int64_t r0 = 0; r0 < w.rows; r0 += slab) {
    const int64_t n = std::min(slab, w.rows - r0);  // wb: [n][cols] bf16, rows r0.. of W
    if (group_quant) {
      cuda::launch_dequant_gq_bf16(w, r0, n, wb, stream_);
    } else {
      const auto* rows = static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes();
      TESSERA_CHECK(cuda::launch_dequant_bf16(w.dtype, rows, n, cols, wb, stream_), "cuda matmul: weight type ",
                    dtype_name(w.dtype), " is not supported");
    }
    gemm_->run(CUDA_R_16BF, wb, cols, x_bf16, cols, t.y + r0, t.ldy, n, n_rows, cols, stream_);
  }
}

}  // namespace tessera
