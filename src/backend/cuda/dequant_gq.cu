// Group-quantized weights (W4G/W8G, core/group_quant.h) decoded to bf16 for the tensor-core
// GEMM past kGemvMaxRows rows (decode sizes read the codes directly: gemv_gq.cu). Columns
// come out in input order (the act-order permutation is undone here), so the GEMM's
// activations need no permutation.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

// One thread per (row, 32 stored columns): 16-byte code loads (W4G one, W8G two), the
// group's scale and zero read once (32 columns never straddle a group: groups are multiples
// of 32 columns, or the whole row), and without a permutation four 16-byte stores of 8 bf16.
// With one, each value goes to its input column.
template <int kBits, bool kPerm>
__global__ void dequant_gq_bf16_kernel(const uint8_t* __restrict__ buf, GroupQuantLayout l,
                                       uint16_t* __restrict__ out) {
  const int64_t per_row = l.cols_padded / 32;
  const int64_t n_items = l.rows * per_row;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(buf + l.off_scales);
  const uint8_t* zeros = l.has_zeros ? buf + l.off_zeros : nullptr;
  const int32_t* perm = reinterpret_cast<const int32_t*>(buf + l.off_perm);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < n_items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = item / per_row, j0 = (item % per_row) * 32;
    const int64_t g = j0 / l.group_size;
    const float s = half_bits_to_f32(scales[g * l.rows + r]);
    const float z = static_cast<float>(zeros ? zeros[g * l.rows + r] : (1 << (kBits - 1)));
    const uint8_t* codes = buf + r * l.code_row_bytes + j0 * kBits / 8;
    uint32_t w[kBits];  // 16 (W4G) or 32 (W8G) bytes
    const uint4 a = *reinterpret_cast<const uint4*>(codes);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    if constexpr (kBits == 8) {
      const uint4 b = *reinterpret_cast<const uint4*>(codes + 16);
      w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    }
    uint32_t v[16];  // 32 bf16, stored column j0 + i in half i of v[i / 2]
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      // W4G: byte i % 16 holds column i (low nibble, i < 16) or column i (high, i >= 16).
      const uint32_t byte = kBits == 8 ? (w[i / 4] >> (8 * (i % 4))) & 0xFF : (w[(i % 16) / 4] >> (8 * (i % 4))) & 0xFF;
      const int q = kBits == 8 ? static_cast<int>(byte) : static_cast<int>(i < 16 ? byte & 0x0F : byte >> 4);
      const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn((static_cast<float>(q) - z) * s));
      v[i / 2] = i % 2 ? (v[i / 2] | h << 16) : h;
    }
    uint16_t* row = out + r * l.cols;
    if (!kPerm && j0 + 32 <= l.cols) {
      uint4* dst = reinterpret_cast<uint4*>(row + j0);
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[i] = make_uint4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
      continue;
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int64_t j = j0 + i;
      if (j >= l.cols) break;
      row[kPerm ? perm[j] : j] = static_cast<uint16_t>(i % 2 ? v[i / 2] >> 16 : v[i / 2] & 0xFFFF);
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
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
                "cuda dequant: buffers not 16-byte aligned");
  const int64_t n_items = l.rows * (l.cols_padded / 32);
  const unsigned grid = std::min<unsigned>(blocks_for(n_items, 256), 132u * 16u);
  const auto* buf = static_cast<const uint8_t*>(w.data);
  auto kernel = l.bits == 8 ? (l.has_perm ? dequant_gq_bf16_kernel<8, true> : dequant_gq_bf16_kernel<8, false>)
                            : (l.has_perm ? dequant_gq_bf16_kernel<4, true> : dequant_gq_bf16_kernel<4, false>);
  kernel<<<grid, 256, 0, s>>>(buf, l, out);
  TESSERA_CUDA_CHECK_LAUNCH("dequant_gq_bf16");
}

}  // namespace tessera::cuda
