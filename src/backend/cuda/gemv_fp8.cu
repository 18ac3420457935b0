// Decode-size products (1..kGemvMaxRows rows) on FP8W weights (E4M3 codes, an f32 scale per
// row; core/fp8_weight.h), any width: the codes stream once, are decoded in registers by the
// hardware E4M3 -> f16x2 conversion and meet the f32 activations in f32 FMAs; the row's scale
// multiplies the finished sum. Batch 1 at widths that are multiples of 16 normally takes the
// bulk kernel (gemv_bulk.cu) instead.
//
// Shape (gemv_gq.cu's before it split the width over a block's warps): 4 warps per block, 4
// weight rows per warp so one x load (through L1) feeds four rows; a lane's step is one 16-byte
// load of a row's codes (16 columns), a warp's 32 lanes read 512 consecutive bytes. Rows are padded to 16 bytes with zero codes; x past
// the width reads as 0.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/gemv_loads.cuh"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;

struct Fp8Targets {
  const uint8_t* codes[kGemvMaxTargets];  // [rows][row_bytes]
  const float* scale[kGemvMaxTargets];    // [rows]
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int64_t row_end[kGemvMaxTargets];  // cumulative rows: target i owns [row_end[i-1], row_end[i])
  int n;
};

template <int NR, bool kFull, bool kVecX>
__device__ __forceinline__ void fp8_step(const float* __restrict__ x, int n_rows, int64_t ldx, int cols, int j0,
                                         const uint4 (&q)[kRowsPerWarp], float (&acc)[NR][kRowsPerWarp]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = j0 + 4 * i;
    float v[kRowsPerWarp][4];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const uint32_t wd = word_of(q[k], i);
      e4m3x4_to_f32(wd, v[k]);
    }
    fma_x4<NR, kRowsPerWarp, kFull, kVecX>(x, n_rows, ldx, cols, c, v, acc);
  }
}

template <int NR, bool kVecX>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fp8_kernel(const float* __restrict__ x, int n_rows, int64_t ldx, int cols, int64_t row_bytes, Fp8Targets tg) {
  constexpr int R = kRowsPerWarp;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  const int64_t total = tg.row_end[tg.n - 1];
  if (row0 >= total) return;
  const uint8_t* code[R];
  int ti[R];
  int64_t r[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t row = min(row0 + k, total - 1);  // a missing row recomputes the last one, unwritten
    int t = 0;
    while (t < tg.n - 1 && row >= tg.row_end[t]) ++t;
    ti[k] = t;
    r[k] = row - (t ? tg.row_end[t - 1] : 0);
    code[k] = tg.codes[t] + r[k] * row_bytes;
  }
  float acc[NR][R];
#pragma unroll
  for (int t = 0; t < NR; ++t)
#pragma unroll
    for (int k = 0; k < R; ++k) acc[t][k] = 0.0f;
#pragma unroll 2
  for (int j0 = lane * 16; j0 < cols; j0 += 32 * 16) {
    uint4 q[R];
#pragma unroll
    for (int k = 0; k < R; ++k) q[k] = load_codes(code[k] + j0);
    if (j0 + 16 <= cols)
      fp8_step<NR, true, kVecX>(x, n_rows, ldx, cols, j0, q, acc);
    else
      fp8_step<NR, false, kVecX>(x, n_rows, ldx, cols, j0, q, acc);
  }
#pragma unroll
  for (int t = 0; t < NR; ++t) {
    if (NR > 1 && t >= n_rows) break;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float v = warp_sum(acc[t][k]);
      if (lane == 0 && row0 + k < total) tg.y[ti[k]][t * tg.ldy[ti[k]] + r[k]] = v * tg.scale[ti[k]][r[k]];
    }
  }
}

}  // namespace

void launch_gemv_fp8(const float* x, int n_rows, int64_t ldx, const MatmulTarget* targets, int n_targets,
                     cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && n_rows <= kGemvMaxRows && n_targets >= 1 && n_targets <= kGemvMaxTargets,
                "cuda gemv_fp8: ", n_rows, " rows / ", n_targets, " targets out of range");
  const WeightMatrix& w0 = targets[0].w;
  TESSERA_CHECK(x && ldx >= w0.cols, "cuda gemv_fp8: activation stride ", ldx, " below the width ", w0.cols);
  TESSERA_CHECK(w0.cols > 0 && w0.cols <= (int64_t{1} << 30), "cuda gemv_fp8: width ", w0.cols, " out of range");
  Fp8Targets tg{};
  tg.n = n_targets;
  int64_t total = 0;
  for (int i = 0; i < n_targets; ++i) {
    const WeightMatrix& w = targets[i].w;
    TESSERA_CHECK(is_fp8_weight(w.dtype) && w.cols == w0.cols && w.rows > 0, "cuda gemv_fp8: target ", i,
                  " is not an FP8W weight of width ", w0.cols);
    TESSERA_CHECK(w.data && reinterpret_cast<uintptr_t>(w.data) % 16 == 0, "cuda gemv_fp8: weight buffer ", i,
                  " is not 16-byte aligned");
    TESSERA_CHECK(targets[i].y && (n_rows == 1 || targets[i].ldy >= w.rows), "cuda gemv_fp8: output stride ",
                  targets[i].ldy, " below the rows ", w.rows);
    tg.codes[i] = static_cast<const uint8_t*>(w.data);
    tg.scale[i] = w.fp8_scales();
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    total += w.rows;
    tg.row_end[i] = total;
  }
  const int cols = static_cast<int>(w0.cols);
  const unsigned grid = blocks_for((total + kRowsPerWarp - 1) / kRowsPerWarp, kWarps);
  const bool vec_x = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
  auto kernel = n_rows == 1 ? (vec_x ? gemv_fp8_kernel<1, true> : gemv_fp8_kernel<1, false>)
                            : (vec_x ? gemv_fp8_kernel<kGemvMaxRows, true> : gemv_fp8_kernel<kGemvMaxRows, false>);
  kernel<<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, w0.row_bytes(), tg);
  TESSERA_CUDA_CHECK_LAUNCH("gemv_fp8");
}

}  // namespace tessera::cuda
