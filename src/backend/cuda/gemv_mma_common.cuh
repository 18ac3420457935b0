#pragma once
// Shared by the skinny tensor-core products (gemv_mma16.cu, gemv_gq_mma.cu): a block owns
// kMT m16 tiles of weight rows, its warps split the width, each warp's m16n8k16 fragments
// are the registers it loaded (no shared-memory staging), and the warps' partial sums meet in
// shared memory at the end. Included by .cu files only.
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace tessera::cuda {

// d += a · b, m16n8k16, bf16 (BF16) or f16 operands, f32 accumulators. a: rows g, g + 8 of the
// low k pair, then of the high k pair; b: the low and high k pairs of column g.
template <bool BF16>
__device__ __forceinline__ void mma_16bit(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  if constexpr (BF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The x rows of a lane's B fragments: row g + 8n of each n8 tile (x is [n_rows][cols]); rows
// past n_rows point at row 0 and are marked not ok (they load zeros).
template <int NT>
__device__ __forceinline__ void skinny_x_rows(const uint16_t* x, int n_rows, int cols, int g, const uint16_t* (&xr)[NT],
                                              bool (&xok)[NT]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    xok[n] = 8 * n + g < n_rows;
    xr[n] = x + static_cast<int64_t>(xok[n] ? 8 * n + g : 0) * cols;
  }
}

// Shared memory of the warps' partial sums.
template <int kWarps, int kMT, int NT>
struct SkinnySums {
  float v[kWarps][kMT * NT * 4][32];
};

// The block's sums: acc[m][n] of each warp (elements 0, 1: weight row g of tile m, x rows
// 2t, 2t + 1 of n8 tile n; 2, 3: row g + 8) added in warp order (a fixed order: graph and eager
// runs give the same bits) and stored to y[xrow * ldy + row] for rows < rows, x rows
// < n_rows, times scale[row] when there is one. Call once, from every thread.
template <int kWarps, int kMT, int NT>
__device__ __forceinline__ void store_skinny_sums(const float (&acc)[kMT][NT][4], SkinnySums<kWarps, kMT, NT>& red,
                                                  int row0, int rows, int n_rows, float* y, int64_t ldy,
                                                  const float* scale = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) red.v[warp][(m * NT + n) * 4 + e][lane] = acc[m][n][e];
  __syncthreads();
  for (int i = threadIdx.x; i < kMT * NT * 4 * 32; i += kWarps * 32) {
    const int l = i & 31, slot = i >> 5, e = slot & 3, n = (slot >> 2) % NT, m = (slot >> 2) / NT;
    const int r = row0 + 16 * m + (l >> 2) + (e >= 2 ? 8 : 0), xrow = 8 * n + 2 * (l & 3) + (e & 1);
    if (r >= rows || xrow >= n_rows) continue;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red.v[w][slot][l];
    y[static_cast<int64_t>(xrow) * ldy + r] = scale ? s * __ldg(scale + r) : s;
  }
}

// What a thread of a skinny kernel's block works on: its lane's fragment coordinates, and the
// block's target (tile_end: cumulative tiles of kMT m16 tiles per target), first weight row and
// row count.
struct SkinnyBlock {
  int lane, warp, g, t;  // g = lane / 4: fragment row; t = lane % 4: column pair
  int ti, row0, rows;
};
template <int kMT, int N>
__device__ __forceinline__ SkinnyBlock skinny_block(const int (&tile_end)[N], const int (&rows)[N], int n) {
  SkinnyBlock s;
  s.lane = threadIdx.x & 31;
  s.warp = threadIdx.x >> 5;
  s.g = s.lane >> 2;
  s.t = s.lane & 3;
  const int b = static_cast<int>(blockIdx.x);
  s.ti = 0;
  while (s.ti < n - 1 && b >= tile_end[s.ti]) ++s.ti;
  s.row0 = (b - (s.ti ? tile_end[s.ti - 1] : 0)) * 16 * kMT;
  s.rows = rows[s.ti];
  return s;
}

}  // namespace tessera::cuda
