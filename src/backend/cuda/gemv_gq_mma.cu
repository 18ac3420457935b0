// Products of 9–32 rows of f16 activations with group-quantized weights (W4G/W8G,
// core/group_quant.h) on tensor cores, the codes read once and decoded in registers:
// y[t][r] = sum_k x[t][k] * (code[r][k] - zero[r][g(k)]) * scale[r][g(k)].
//
// Why: past the integer decode kernels' 8 rows (gemv_gq.cu), a product used to decode the
// whole matrix to bf16 in memory on every call and hand it to cuBLASLt: 4× the W4G bytes
// written and read again, for a step of 9–32 rows (a decode batch, a speculative
// verification) that should cost what streaming the codes costs.
//
// Layout (the skinny 16-bit kernel's, gemv_mma16.cu): a block owns 32 weight rows (two m16
// tiles), its 8 warps split the width. A lane (g = lane / 4, t = lane % 4) takes whole
// 32-column blocks of the stored codes — one 16-byte load per row for W4G, two for W8G —
// for rows g and g + 8 of each tile; the 4 lanes of a row take 4 consecutive blocks (64 or
// 128 contiguous code bytes per row), W4G up to 16 rows of x two such steps at once. A lane's block
// lies inside one group (groups are multiples of 32 columns), so one scale and zero point
// per row and block. The codes become f16 by bit tricks (a nibble or byte under the
// exponent of 1024: the value 1024 + code, exact), then (v - (1024 + zero)) (exact) times
// the scale (one rounding); the columns come out in pairs (4q, 4q + 2), (4q + 1, 4q + 3)
// per quad q of the block, and x is permuted the same way (two byte permutes per quad), so
// each quad is one m16n8k16 step with the pairs as its low and high k halves.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_loads.cuh"
#include "backend/cuda/gemv_mma16.h"
#include "backend/cuda/gemv_mma_common.cuh"
#include "core/group_quant.h"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMT = 2;  // m16 tiles per block

struct GqMmaTargets {
  const uint8_t* codes[kGemvMaxTargets];    // [rows][row_bytes]
  const uint16_t* scales[kGemvMaxTargets];  // [n_groups][rows] f16
  const uint8_t* zeros[kGemvMaxTargets];    // [n_groups][rows], or nullptr: 2^(bits-1)
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int rows[kGemvMaxTargets];
  int tile_end[kGemvMaxTargets];  // cumulative 32-row tiles
  int n;
};

// One row's 32-column block: its codes, and (1024 + zero, scale) as f16 pairs.
template <int kBits>
struct RowBlock {
  uint4 q[kBits / 4];
  uint32_t zz, ss;
};

// Quad q (columns 4q..4q+3 of the block) as f16 pairs 1024 + code: (4q, 4q + 2), (4q + 1, 4q + 3).
// W4G byte j holds column j (low nibble) and j + 16 (high); W8G byte j column j.
template <int kBits>
__device__ __forceinline__ void quad_codes(const uint4 (&q)[kBits / 4], int quad, uint32_t& a0, uint32_t& a1) {
  if constexpr (kBits == 4) {
    uint32_t w = word_of(q[0], quad & 3);
    if (quad >= 4) w >>= 4;
    a0 = (w & 0x000F000Fu) | 0x64006400u;
    a1 = ((w >> 8) & 0x000F000Fu) | 0x64006400u;
  } else {
    const uint32_t w = word_of(q[quad >> 2], quad & 3);
    a0 = __byte_perm(w, 0x64646464u, 0x4240);
    a1 = __byte_perm(w, 0x64646464u, 0x4341);
  }
}

__device__ __forceinline__ uint32_t dequant_pair(uint32_t v, uint32_t zz, uint32_t ss) {
  const __half2 d = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&zz)),
                            *reinterpret_cast<const __half2*>(&ss));
  return *reinterpret_cast<const uint32_t*>(&d);
}

__device__ __forceinline__ uint32_t half_pair(uint16_t h) { return static_cast<uint32_t>(h) * 0x00010001u; }

template <int kBits, int NT>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_gq_mma_kernel(const uint16_t* __restrict__ x, int n_rows, int cols, int64_t row_bytes, int group_size,
                       const __grid_constant__ GqMmaTargets tg) {
  // Steps of 4 blocks (one per lane of a row) a warp loads at once: 128 code bytes in flight
  // per lane either way, registers under 128 (two blocks per SM) without spills.
  constexpr int kUnroll = kBits == 4 && NT <= 2 ? 2 : 1;
  __shared__ SkinnySums<kWarps, kMT, NT> red;
  const SkinnyBlock sb = skinny_block<kMT>(tg.tile_end, tg.rows, tg.n);
  const int warp = sb.warp, g = sb.g, t = sb.t, ti = sb.ti, row0 = sb.row0, rows = sb.rows;
  int rr[kMT][2];  // rows g, g + 8 of each tile, clamped (rows past the matrix are not stored)
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) rr[m][h] = min(row0 + 16 * m + 8 * h + g, rows - 1);
  const uint16_t* xr[NT];
  bool xok[NT];
  skinny_x_rows(x, n_rows, cols, g, xr, xok);
  const uint8_t* codes = tg.codes[ti];
  const uint16_t* scales = tg.scales[ti];
  const uint8_t* zeros = tg.zeros[ti];
  constexpr int kZero = 1 << (kBits - 1);

  float acc[kMT][NT][4] = {};
  const int n_blocks = cols / 32;
  constexpr int kStep = 4 * kUnroll;  // blocks of one warp step
  bool waited = false;
  for (int b0 = warp * kStep; b0 < n_blocks; b0 += kWarps * kStep) {
    RowBlock<kBits> wb[kUnroll][kMT][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int b = b0 + 4 * u + t;
      const bool in = b < n_blocks;
      const int64_t grp = in ? static_cast<int64_t>(b) * 32 / group_size : 0;
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          RowBlock<kBits>& rb = wb[u][m][h];
          const uint8_t* p = codes + rr[m][h] * row_bytes + static_cast<int64_t>(b) * (4 * kBits);
#pragma unroll
          for (int v = 0; v < kBits / 4; ++v) rb.q[v] = in ? load_codes(p + 16 * v) : make_uint4(0, 0, 0, 0);
          const int64_t at = grp * rows + rr[m][h];
          const int z = zeros && in ? __ldg(zeros + at) : kZero;
          rb.zz = half_pair(static_cast<uint16_t>(0x6400 + z));  // f16 1024 + z (exact below 2048)
          rb.ss = in ? half_pair(__ldg(scales + at)) : 0u;       // a block past the width adds zeros
        }
    }
    // Codes, scales and zero points are no kernel's output: the first loads go out before the wait.
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int b = b0 + 4 * u + t;
      const int col = (b < n_blocks ? b : 0) * 32;
#pragma unroll
      for (int quad = 0; quad < 8; ++quad) {
        uint32_t a[kMT][2][2];  // [tile][row g / g + 8][pair (4q, 4q+2) / (4q+1, 4q+3)]
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const RowBlock<kBits>& rb = wb[u][m][h];
            quad_codes<kBits>(rb.q, quad, a[m][h][0], a[m][h][1]);
            a[m][h][0] = dequant_pair(a[m][h][0], rb.zz, rb.ss);
            a[m][h][1] = dequant_pair(a[m][h][1], rb.zz, rb.ss);
          }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint2 xv = xok[n] ? __ldg(reinterpret_cast<const uint2*>(xr[n] + col + 4 * quad)) : make_uint2(0, 0);
          const uint32_t x0 = __byte_perm(xv.x, xv.y, 0x5410), x1 = __byte_perm(xv.x, xv.y, 0x7632);
#pragma unroll
          for (int m = 0; m < kMT; ++m)
            mma_16bit<false>(acc[m][n], a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1], x0, x1);
        }
      }
    }
  }
  if (!waited) pdl_wait();
  pdl_trigger();
  store_skinny_sums(acc, red, row0, rows, n_rows, tg.y[ti], tg.ldy[ti]);
}

}  // namespace

bool gemv_gq_mma_applies(int n_rows, const WeightMatrix& w) {
  if (n_rows < kGqMmaMinRows || n_rows > kGqMmaMaxRows || !is_group_quant(w.dtype) || w.gq_perm) return false;
  if (w.cols % 32 != 0 || w.cols > (int64_t{1} << 30) || w.rows >= (int64_t{1} << 30)) return false;
  return w.data && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && !w.gq_layout().valid_reason();
}

void launch_gemv_gq_mma(const uint16_t* x, int n_rows, const MatmulTarget* targets, int n_targets, cudaStream_t s) {
  TESSERA_CHECK(n_targets >= 1 && n_targets <= kGemvMaxTargets, "gemv_gq_mma: ", n_targets, " targets");
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "gemv_gq_mma: x is not 16-byte aligned");
  const WeightMatrix& w0 = targets[0].w;
  GqMmaTargets tg{};
  tg.n = n_targets;
  int tiles = 0;
  for (int i = 0; i < n_targets; ++i) {
    const WeightMatrix& w = targets[i].w;
    TESSERA_CHECK(
        gemv_gq_mma_applies(n_rows, w) && w.dtype == w0.dtype && w.cols == w0.cols && w.group_size == w0.group_size,
        "gemv_gq_mma: target ", i, " does not apply (", n_rows, " rows, ", dtype_name(w.dtype), ")");
    const GroupQuantLayout l = w.gq_layout();
    const auto* base = static_cast<const uint8_t*>(w.data);
    tg.codes[i] = base;
    tg.scales[i] = reinterpret_cast<const uint16_t*>(base + l.off_scales);
    tg.zeros[i] = l.has_zeros ? base + l.off_zeros : nullptr;
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    tg.rows[i] = static_cast<int>(w.rows);
    tiles += static_cast<int>((w.rows + 16 * kMT - 1) / (16 * kMT));
    tg.tile_end[i] = tiles;
  }
  if (tiles == 0) return;
  const GroupQuantLayout l0 = w0.gq_layout();
  const int c = static_cast<int>(w0.cols), gs = static_cast<int>(l0.group_size);
  auto go = [&]<int NT>() {
    if (w0.dtype == DType::W8G)
      launch_pdl(gemv_gq_mma_kernel<8, NT>, dim3(tiles), dim3(kThreads), 0, s, x, n_rows, c, l0.code_row_bytes, gs, tg);
    else
      launch_pdl(gemv_gq_mma_kernel<4, NT>, dim3(tiles), dim3(kThreads), 0, s, x, n_rows, c, l0.code_row_bytes, gs, tg);
  };
  static_assert(kGqMmaMinRows > 8, "no one-tile instantiation");
  if (n_rows <= 16)
    go.template operator()<2>();
  else if (n_rows <= 24)
    go.template operator()<3>();
  else
    go.template operator()<4>();
  TESSERA_CUDA_CHECK_LAUNCH("gemv_gq_mma");
}

}  // namespace tessera::cuda
