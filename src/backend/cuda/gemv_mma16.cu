// Products of a few rows (1–8; FP8W 1–16) of 16-bit activations with 16-bit weights (bf16
// or f16) or FP8W weights (E4M3 codes decoded to f16 in registers, the row's f32 scale on the
// finished sum) on tensor cores, the weights read once: y[t][r] = x[t] · W[r].
//
// Why: decode of a few sequences and speculative verification at batch 1 (1 + k query rows)
// multiply a handful of rows by every weight. The step is a stream of the weights, so it
// should cost what the batch-1 bulk kernel costs (gemv_bulk.cu, ~97 % of the copy rate);
// cuBLASLt's GEMMs at 2–16 rows reached about 64 % (docs/benchmarks/spec-decode.md), and
// the SIMT multi-row kernel loaded x per element and row from L1.
//
// Layout: a block owns 16 weight rows (one m16 tile) and its 8 warps split the width in
// chunks of 64 columns (128 bytes of each row), warp w taking chunks w, w + 8, ... Within a
// chunk, lane (g = lane / 4, t = lane % 4) loads columns [16t, 16t + 16) of rows g and g + 8
// of each m16 tile with 16-byte loads, and the same columns of x row g of each n8 tile. A
// dot product may visit the columns in any order as long as both operands use the same one,
// so those registers ARE the mma.sync fragments: words (2j, 2j + 1) of each 16-byte load
// serve as the (low, high) k pairs of one m16n8k16 step. No shared memory, no shuffles.
// The 8 warps' partial sums meet in shared memory and are added in warp order (fixed order:
// graph and eager runs give the same bits).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_loads.cuh"
#include "backend/cuda/gemv_mma_common.cuh"
#include "backend/cuda/gemv_mma16.h"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 64;  // columns of one warp step
// m16 tiles per block. Two (32 weight rows sharing each x fragment) left the 4,096-row O and
// down products of an 8B layer 128 blocks for 132 SMs' 264 slots and gate|up 3.4 waves: one
// tile a block took a batch-1 verification of 4 drafts from 1.19-1.20x to 1.14x a decode
// step on an H100 (docs/benchmarks/spec-decode.md); x is re-read per block from L1/L2.
constexpr int kMT = 1;

struct Mma16Targets {
  const uint8_t* w[kGemvMaxTargets];    // [rows][row_bytes]
  const float* scale[kGemvMaxTargets];  // FP8W: [rows] f32, applied to the finished sums
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int rows[kGemvMaxTargets];
  int tile_end[kGemvMaxTargets];  // cumulative 32-row tiles: target i owns [tile_end[i-1], tile_end[i])
  int n;
};

// The weights' storage: 16-bit, or E4M3 codes (one byte, decoded to f16 pairs by the
// hardware conversion, exact) with an f32 scale per row.
enum class Kind { kBf16, kF16, kFp8 };

// A lane's 8 columns (half 0: 16t..16t+7, half 1: 16t+8..) of E4M3 codes as four f16 pairs,
// the layout a 16-byte load of 16-bit weights has.
__device__ __forceinline__ uint4 e4m3_half(const uint4& q, int half) {
  const uint32_t w0 = word_of(q, 2 * half), w1 = word_of(q, 2 * half + 1);
  auto cvt = [](uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  };
  return make_uint4(cvt(w0 & 0xFFFFu), cvt(w0 >> 16), cvt(w1 & 0xFFFFu), cvt(w1 >> 16));
}

// NT: n8 tiles of x rows (n_rows <= 8 NT, NT <= 2). E4M3 rows take one 16-byte load per
// chunk instead of two, so more chunks in flight (4 at one n8 tile, 2 at two: no spills at
// 128 registers, two blocks per SM).
template <Kind K, int NT>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_mma16_kernel(const uint16_t* __restrict__ x, int n_rows, int cols, int64_t row_bytes,
                      const __grid_constant__ Mma16Targets tg) {
  constexpr bool kFp8 = K == Kind::kFp8;
  constexpr int kLoads = kFp8 ? 1 : 2;  // 16-byte loads per row and chunk
  static_assert(NT == 1 || NT == 2, "one or two n8 tiles");
  constexpr int kUnroll = kFp8 ? (NT == 1 ? 4 : 2) : 2;  // chunks a warp loads before it multiplies
  __shared__ SkinnySums<kWarps, kMT, NT> red;
  const SkinnyBlock sb = skinny_block<kMT>(tg.tile_end, tg.rows, tg.n);
  const int warp = sb.warp, g = sb.g, t = sb.t, ti = sb.ti, row0 = sb.row0, rows = sb.rows;
  // Rows g, g + 8 of each m16 tile (clamped into the matrix; rows past it load zeros).
  const uint8_t* wr[kMT][2];
  bool wok[kMT][2];
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 16 * m + 8 * h + g;
      wok[m][h] = r < rows;
      wr[m][h] = tg.w[ti] + (wok[m][h] ? r : 0) * row_bytes;
    }
  const uint16_t* xr[NT];
  bool xok[NT];
  skinny_x_rows(x, n_rows, cols, g, xr, xok);

  float acc[kMT][NT][4] = {};
  const int n_chunks = (cols + kChunk - 1) / kChunk;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  bool waited = false;
  for (int c0 = warp; c0 < n_chunks; c0 += kWarps * kUnroll) {
    // [chunk][m16 tile][row g / g + 8][16-bit: columns 16t.. / 16t + 8..; E4M3: 16t..16t+15]
    uint4 wv[kUnroll][kMT][2][kLoads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int v = 0; v < kLoads; ++v) {
        const int col = (c0 + u * kWarps) * kChunk + 16 * t + 8 * v;  // past cols for chunks past the end
        const int byte = kFp8 ? col : 2 * col;
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) wv[u][m][h][v] = col < cols && wok[m][h] ? load_codes(wr[m][h] + byte) : zero;
      }
    // The weights are no kernel's output: the first loads go out before the wait.
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = (c0 + u * kWarps) * kChunk + 16 * t + 8 * half;
        uint4 xv[NT];
#pragma unroll
        for (int n = 0; n < NT; ++n)
          xv[n] = col < cols && xok[n] ? __ldg(reinterpret_cast<const uint4*>(xr[n] + col)) : zero;
        uint4 a[kMT][2];  // this half's 8 columns of rows g, g + 8 as 16-bit pairs
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) a[m][h] = kFp8 ? e4m3_half(wv[u][m][h][0], half) : wv[u][m][h][kFp8 ? 0 : half];
#pragma unroll
        for (int j = 0; j < 2; ++j)  // words (2j, 2j + 1): one k16 step
#pragma unroll
          for (int m = 0; m < kMT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
              mma_16bit<K == Kind::kBf16>(acc[m][n], word_of(a[m][0], 2 * j), word_of(a[m][1], 2 * j),
                                          word_of(a[m][0], 2 * j + 1), word_of(a[m][1], 2 * j + 1),
                                          word_of(xv[n], 2 * j), word_of(xv[n], 2 * j + 1));
      }
  }
  if (!waited) pdl_wait();  // a warp with no chunk (cols < 8 chunks) still orders itself
  pdl_trigger();

  store_skinny_sums(acc, red, row0, rows, n_rows, tg.y[ti], tg.ldy[ti], kFp8 ? tg.scale[ti] : nullptr);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_mma16_applies(DType type, int n_rows, int64_t cols, const void* w) {
  const int max_rows = type == DType::BF16 || type == DType::F16 ? kMma16MaxRows
                       : type == DType::FP8W && cols % 16 == 0   ? kFp8MmaMaxRows
                                                                 : 0;
  return n_rows >= 1 && n_rows <= max_rows && cols > 0 && cols % 8 == 0 && cols <= (int64_t{1} << 30) && aligned16(w);
}

void launch_gemv_mma16(DType type, const uint16_t* x, int n_rows, int64_t cols, const GemvTarget* targets,
                       int n_targets, cudaStream_t s) {
  TESSERA_CHECK(n_targets >= 1 && n_targets <= kGemvMaxTargets, "gemv_mma16: ", n_targets, " targets");
  TESSERA_CHECK(aligned16(x), "gemv_mma16: x is not 16-byte aligned");
  Mma16Targets tg{};
  tg.n = n_targets;
  int tiles = 0;
  for (int i = 0; i < n_targets; ++i) {
    TESSERA_CHECK(gemv_mma16_applies(type, n_rows, cols, targets[i].w) && targets[i].rows < (int64_t{1} << 30) &&
                      (type != DType::FP8W || targets[i].scale),
                  "gemv_mma16: ", n_rows, " rows of width ", cols, " (", dtype_name(type), ") do not apply");
    tg.w[i] = static_cast<const uint8_t*>(targets[i].w);
    tg.scale[i] = targets[i].scale;
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    tg.rows[i] = static_cast<int>(targets[i].rows);
    tiles += static_cast<int>((targets[i].rows + 16 * kMT - 1) / (16 * kMT));
    tg.tile_end[i] = tiles;
  }
  if (tiles == 0) return;
  const int c = static_cast<int>(cols);
  const int64_t row_bytes = type == DType::FP8W ? cols : 2 * cols;  // FP8W rows: whole 16-byte units here
  auto go = [&]<Kind K, int NT>() {
    launch_pdl(gemv_mma16_kernel<K, NT>, dim3(tiles), dim3(kThreads), 0, s, x, n_rows, c, row_bytes, tg);
  };
  if (type == DType::BF16)
    go.template operator()<Kind::kBf16, 1>();
  else if (type == DType::F16)
    go.template operator()<Kind::kF16, 1>();
  else if (n_rows <= 8)
    go.template operator()<Kind::kFp8, 1>();
  else
    go.template operator()<Kind::kFp8, 2>();
  TESSERA_CUDA_CHECK_LAUNCH("gemv_mma16");
}

}  // namespace tessera::cuda
