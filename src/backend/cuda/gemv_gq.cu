// Decode-size products (1..kGemvMaxRows rows) read straight from group-quantized codes
// (W4G/W8G, core/group_quant.h): the codes, scales and zero points stream from device memory
// once, are decoded in registers and meet the f32 activations in f32 FMAs.
//
// No repacking is needed: the stored layout already gives every lane one 16-byte load per
// step (W4G: 32 columns, byte j = column j | column j+16 << 4; W8G: 16 columns), and a
// warp's 32 lanes read 512 consecutive bytes of a row. Each warp takes kRowsPerWarp rows, so
// one x load (through L1, shared by every warp) feeds that many weight rows. A lane's
// columns never straddle a group (groups are multiples of 32 columns, or the whole row), so
// it applies the group's scale once per step to its partial sum. Act-order weights take x
// gathered into stored column order first (launch_permute_cols), once per call.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/gemv_loads.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;        // per block: 16 rows, so a 4096-row matrix still fills the GPU
constexpr int kRowsPerWarp = 4;  // rows sharing each x load

struct GqTargets {
  const uint8_t* codes[kGemvMaxTargets];    // [rows][row_bytes]
  const uint16_t* scales[kGemvMaxTargets];  // [n_groups][rows] f16
  const uint8_t* zeros[kGemvMaxTargets];    // [n_groups][rows], or nullptr: 2^(bits-1)
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int64_t row_end[kGemvMaxTargets];  // cumulative rows: target i owns [row_end[i-1], row_end[i])
  int n;
};

// One step of one lane: part[t][k] += sum over the lane's columns of (code - zero) * x[t].
// 2^23 + code is built as float bits (byte_perm puts the code byte under exponent 0x4B), so
// subtracting zf = 2^23 + zero gives code - zero exactly in one FADD.
template <int kBits, int NR, bool kFull, bool kVecX>
__device__ __forceinline__ void gq_step(const float* __restrict__ x, int n_rows, int64_t ldx, int cols, int j0,
                                        const uint4 (&q)[kRowsPerWarp], const float (&zf)[kRowsPerWarp],
                                        float (&part)[NR][kRowsPerWarp]) {
  constexpr int kHalves = kBits == 4 ? 2 : 1;  // W4G: low nibbles, then high nibbles
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = j0 + h * 16 + 4 * i;  // columns c..c+3
      float v[kRowsPerWarp][4];
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        const uint32_t wd = word_of(q[k], i);
        const uint32_t b = kBits == 8 ? wd : h == 0 ? (wd & 0x0F0F0F0Fu) : ((wd >> 4) & 0x0F0F0F0Fu);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[k][e] = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7540 + e)) - zf[k];
      }
      fma_x4<NR, kRowsPerWarp, kFull, kVecX>(x, n_rows, ldx, cols, c, v, part);
    }
}

// NR: rows of x computed at once (1, or kGemvMaxRows with n_rows guarding the rest).
// group_shift: log2(group_size) when it is a power of two, else -1 (a division per step).
template <int kBits, int NR, bool kVecX>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gq_kernel(const float* __restrict__ x, int n_rows, int64_t ldx, int cols, int64_t row_bytes, int group_size,
                   int group_shift, GqTargets tg) {
  constexpr int kCols = kBits == 4 ? 32 : 16;  // columns per lane per step (16 bytes of codes)
  constexpr int R = kRowsPerWarp;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  const int64_t total = tg.row_end[tg.n - 1];
  if (row0 >= total) return;
  const uint8_t* code[R];
  const uint16_t* scale[R];
  const uint8_t* zero[R];
  int64_t plane_stride[R];  // the target's rows: scales/zeros of group g sit g * rows further
  int ti[R];
  int64_t r[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t row = min(row0 + k, total - 1);  // a missing row recomputes the last one, unwritten
    int t = 0;
    while (t < tg.n - 1 && row >= tg.row_end[t]) ++t;
    const int64_t first = t ? tg.row_end[t - 1] : 0;
    ti[k] = t;
    r[k] = row - first;
    plane_stride[k] = tg.row_end[t] - first;
    code[k] = tg.codes[t] + r[k] * row_bytes;
    scale[k] = tg.scales[t] + r[k];
    zero[k] = tg.zeros[t] ? tg.zeros[t] + r[k] : nullptr;
  }
  float acc[NR][R];
#pragma unroll
  for (int t = 0; t < NR; ++t)
#pragma unroll
    for (int k = 0; k < R; ++k) acc[t][k] = 0.0f;
#pragma unroll 2
  for (int j0 = lane * kCols; j0 < cols; j0 += 32 * kCols) {
    const int64_t g = group_shift >= 0 ? (j0 >> group_shift) : (j0 / group_size);
    uint4 q[R];
    float s[R], zf[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      q[k] = load_codes(code[k] + j0 * kBits / 8);
      s[k] = half_bits_to_f32(__ldg(scale[k] + g * plane_stride[k]));
      const int z = zero[k] ? __ldg(zero[k] + g * plane_stride[k]) : (1 << (kBits - 1));
      zf[k] = 8388608.0f + static_cast<float>(z);
    }
    float part[NR][R];
#pragma unroll
    for (int t = 0; t < NR; ++t)
#pragma unroll
      for (int k = 0; k < R; ++k) part[t][k] = 0.0f;
    if (j0 + kCols <= cols)
      gq_step<kBits, NR, true, kVecX>(x, n_rows, ldx, cols, j0, q, zf, part);
    else
      gq_step<kBits, NR, false, kVecX>(x, n_rows, ldx, cols, j0, q, zf, part);
#pragma unroll
    for (int t = 0; t < NR; ++t)
#pragma unroll
      for (int k = 0; k < R; ++k) acc[t][k] = fmaf(s[k], part[t][k], acc[t][k]);
  }
#pragma unroll
  for (int t = 0; t < NR; ++t) {
    if (NR > 1 && t >= n_rows) break;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float v = warp_sum(acc[t][k]);
      if (lane == 0 && row0 + k < total) tg.y[ti[k]][t * tg.ldy[ti[k]] + r[k]] = v;
    }
  }
}

__global__ void permute_cols_kernel(const float* __restrict__ x, int n_rows, int64_t ldx,
                                    const int32_t* __restrict__ perm, int64_t cols, float* __restrict__ xp,
                                    int64_t ldxp) {
  const int64_t n = n_rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / cols, j = i % cols;
    xp[t * ldxp + j] = x[t * ldx + perm[j]];
  }
}

}  // namespace

void launch_gemv_gq(const float* x, int n_rows, int64_t ldx, const MatmulTarget* targets, int n_targets,
                    cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && n_rows <= kGemvMaxRows && n_targets >= 1 && n_targets <= kGemvMaxTargets,
                "cuda gemv_gq: ", n_rows, " rows / ", n_targets, " targets out of range");
  const WeightMatrix& w0 = targets[0].w;
  TESSERA_CHECK(x && ldx >= w0.cols, "cuda gemv_gq: activation stride ", ldx, " below the width ", w0.cols);
  TESSERA_CHECK(w0.cols <= (int64_t{1} << 30), "cuda gemv_gq: width ", w0.cols, " too large");
  GqTargets tg{};
  tg.n = n_targets;
  int64_t total = 0;
  for (int i = 0; i < n_targets; ++i) {
    const WeightMatrix& w = targets[i].w;
    const GroupQuantLayout l = w.gq_layout();
    const char* why = is_group_quant(w.dtype) ? l.valid_reason() : "not a group-quantized type";
    TESSERA_CHECK(!why, "cuda gemv_gq: target ", i, ": ", why);
    TESSERA_CHECK(w.dtype == w0.dtype && w.cols == w0.cols && w.group_size == w0.group_size && !w.gq_perm,
                  "cuda gemv_gq: targets of one launch need one type, width and group size, and no permutation");
    TESSERA_CHECK(w.data && reinterpret_cast<uintptr_t>(w.data) % 16 == 0, "cuda gemv_gq: weight buffer ", i,
                  " is not 16-byte aligned");
    TESSERA_CHECK(targets[i].y && targets[i].ldy >= w.rows, "cuda gemv_gq: output stride ", targets[i].ldy,
                  " below the rows ", w.rows);
    const auto* base = static_cast<const uint8_t*>(w.data);
    tg.codes[i] = base;
    tg.scales[i] = reinterpret_cast<const uint16_t*>(base + l.off_scales);
    tg.zeros[i] = l.has_zeros ? base + l.off_zeros : nullptr;
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    total += w.rows;
    tg.row_end[i] = total;
  }
  const GroupQuantLayout l0 = w0.gq_layout();
  const int gs = static_cast<int>(l0.group_size);
  const int shift = (gs & (gs - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(gs)) : -1;
  const int cols = static_cast<int>(w0.cols);
  const unsigned grid = blocks_for((total + kRowsPerWarp - 1) / kRowsPerWarp, kWarps);
  const bool vec_x = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
  auto go = [&]<int kBits>() {
    auto kernel =
        n_rows == 1 ? (vec_x ? gemv_gq_kernel<kBits, 1, true> : gemv_gq_kernel<kBits, 1, false>)
                    : (vec_x ? gemv_gq_kernel<kBits, kGemvMaxRows, true> : gemv_gq_kernel<kBits, kGemvMaxRows, false>);
    kernel<<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, l0.code_row_bytes, gs, shift, tg);
  };
  if (w0.dtype == DType::W8G)
    go.template operator()<8>();
  else
    go.template operator()<4>();
  TESSERA_CUDA_CHECK_LAUNCH("gemv_gq");
}

void launch_permute_cols(const float* x, int n_rows, int64_t ldx, const int32_t* perm, int64_t cols, float* xp,
                         int64_t ldxp, cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && ldx >= cols && ldxp >= cols, "cuda permute_cols: bad shape");
  const int64_t n = n_rows * cols;
  const unsigned grid = std::min<unsigned>(blocks_for(n, 256), 132u * 8u);
  permute_cols_kernel<<<grid, 256, 0, s>>>(x, n_rows, ldx, perm, cols, xp, ldxp);
  TESSERA_CUDA_CHECK_LAUNCH("permute_cols");
}

}  // namespace tessera::cuda
