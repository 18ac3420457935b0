// Group-quantized weights (W4G/W8G, core/group_quant.h) decoded to bf16 for the tensor-core
// GEMM: the stop-gap path until a fused W4A16 kernel reads the codes directly. Columns come
// out in input order (the act-order permutation is undone here), so the GEMM's activations
// need no permutation.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

// One thread per (row, 8 stored columns); 8 columns never straddle a group (groups are
// multiples of 32 columns, or the whole row).
__global__ void dequant_gq_bf16_kernel(const uint8_t* __restrict__ buf, GroupQuantLayout l,
                                       uint16_t* __restrict__ out) {
  const int64_t per_row = l.cols_padded / 8;
  const int64_t n_items = l.rows * per_row;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(buf + l.off_scales);
  const uint8_t* zeros = l.has_zeros ? buf + l.off_zeros : nullptr;
  const int32_t* perm = l.has_perm ? reinterpret_cast<const int32_t*>(buf + l.off_perm) : nullptr;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < n_items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = item / per_row, j0 = (item % per_row) * 8;
    if (j0 >= l.cols) continue;
    const int64_t g = j0 / l.group_size;
    const float s = half_bits_to_f32(scales[g * l.rows + r]);
    const int z = zeros ? zeros[g * l.rows + r] : (1 << (l.bits - 1));
    const uint8_t* row = buf + r * l.code_row_bytes;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t j = j0 + i;
      if (j >= l.cols) break;
      int q;
      if (l.bits == 8) {
        q = row[j];
      } else {
        const uint8_t byte = row[(j / 32) * 16 + (j % 16)];
        q = (j % 32) < 16 ? (byte & 0x0F) : (byte >> 4);
      }
      const float v = static_cast<float>(q - z) * s;
      out[r * l.cols + (perm ? perm[j] : j)] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
  }
}

}  // namespace

void launch_dequant_gq_bf16(const WeightMatrix& w, uint16_t* out, cudaStream_t s) {
  const GroupQuantLayout l = w.gq_layout();
  const char* why = l.valid_reason();
  TESSERA_CHECK(is_group_quant(w.dtype) && !why, "cuda dequant: not a valid group-quantized weight (",
                why ? why : dtype_name(w.dtype), ")");
  // The GEMM reads the bf16 rows with a leading dimension of cols (as launch_dequant_bf16's).
  TESSERA_CHECK(l.cols % 8 == 0, "cuda dequant: width ", l.cols, " is not a multiple of 8");
  const int64_t n_items = l.rows * (l.cols_padded / 8);
  if (n_items == 0) return;
  const unsigned grid = std::min<unsigned>(blocks_for(n_items, 256), 132u * 16u);
  dequant_gq_bf16_kernel<<<grid, 256, 0, s>>>(static_cast<const uint8_t*>(w.data), l, out);
  TESSERA_CUDA_CHECK_LAUNCH("dequant_gq_bf16");
}

}  // namespace tessera::cuda
