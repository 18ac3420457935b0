// Decode-size products (1..kGemvMaxRows rows) read straight from group-quantized codes
// (W4G/W8G, core/group_quant.h): the codes, scales and zero points stream from device memory
// once and meet activations quantized per 32 columns (quantize_q8.cu) in integer dot products
// (dp4a: four code bytes times four activation bytes per instruction), the CPU backend's
// arithmetic (docs/design/weight-quant.md, "CPU matmul"):
//   y[t, r] = sum over 32-column blocks b of fma(scale[r, g(b)] * d[t, b], isum, ...),
//   isum = sum_j code[r, j] * q[t, j] - zero[r, g(b)] * sum_j q[t, j]   (exact, i32).
// Integer dot products take about a quarter of the instructions per weight of decoding every
// code to f32 (the kernel this one replaced was bound by instruction issue at 1.2 TB/s).
//
// No repacking is needed: the stored layout already gives every lane one 16-byte load per
// 32 columns of W4G (byte j = column j | column j+16 << 4, so the low nibbles of a word meet
// activation bytes j..j+3 and the high nibbles j+16..j+19) and two per 32 columns of W8G; a
// warp's lanes read consecutive bytes of a row. Each warp takes kRowsPerWarp rows, so one
// activation load (through L1, shared by every warp) feeds that many weight rows. A lane's 32
// columns never straddle a group (groups are multiples of 32 columns, or the whole row).
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

// a · b over four byte lanes, a unsigned (codes), b signed (activations), plus c.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// NR: rows of x computed at once (1, or kGemvMaxRows with n_rows guarding the rest).
// group_shift: log2(group_size) when it is a power of two, else -1 (a division per step).
template <int kBits, int NR>
__global__ void __launch_bounds__(kWarps * 32) gemv_gq_kernel(Q8Rows x, int n_rows, int n_blocks, int64_t row_bytes,
                                                              int group_size, int group_shift, GqTargets tg) {
  constexpr int R = kRowsPerWarp;
  constexpr int kCodeVecs = kBits / 4;  // 16-byte code loads per row per 32 columns
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
  for (int b = lane; b < n_blocks; b += 32) {
    const int j0 = b * 32;
    const int64_t g = group_shift >= 0 ? (j0 >> group_shift) : (j0 / group_size);
    uint4 q[R][kCodeVecs];
    float s[R];
    int z[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
#pragma unroll
      for (int v = 0; v < kCodeVecs; ++v) q[k][v] = load_codes(code[k] + j0 * kBits / 8 + 16 * v);
      s[k] = half_bits_to_f32(__ldg(scale[k] + g * plane_stride[k]));
      z[k] = zero[k] ? __ldg(zero[k] + g * plane_stride[k]) : (1 << (kBits - 1));
    }
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      if (NR > 1 && t >= n_rows) break;
      const int8_t* xr = x.q + t * x.ld + j0;
      const uint4 xa = __ldg(reinterpret_cast<const uint4*>(xr));       // columns j0..j0+15
      const uint4 xb = __ldg(reinterpret_cast<const uint4*>(xr + 16));  // j0+16..j0+31
      const int2 m = __ldg(x.meta + t * n_blocks + b);
      const float d = __int_as_float(m.x);
#pragma unroll
      for (int k = 0; k < R; ++k) {
        int dot = -z[k] * m.y;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (kBits == 4) {
            const uint32_t w = word_of(q[k][0], i);
            dot = dp4a_us(w & 0x0F0F0F0Fu, word_of(xa, i), dot);
            dot = dp4a_us((w >> 4) & 0x0F0F0F0Fu, word_of(xb, i), dot);
          } else {
            dot = dp4a_us(word_of(q[k][0], i), word_of(xa, i), dot);
            dot = dp4a_us(word_of(q[k][1], i), word_of(xb, i), dot);
          }
        }
        acc[t][k] = fmaf(s[k] * d, static_cast<float>(dot), acc[t][k]);
      }
    }
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

}  // namespace

void launch_gemv_gq(const Q8Rows& x, int n_rows, const MatmulTarget* targets, int n_targets, cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && n_rows <= kGemvMaxRows && n_targets >= 1 && n_targets <= kGemvMaxTargets,
                "cuda gemv_gq: ", n_rows, " rows / ", n_targets, " targets out of range");
  const WeightMatrix& w0 = targets[0].w;
  TESSERA_CHECK(x.q && x.meta && x.ld == (w0.cols + 31) / 32 * 32, "cuda gemv_gq: activations not quantized for width ",
                w0.cols);
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
  const int n_blocks = static_cast<int>(x.ld / 32);
  const unsigned grid = blocks_for((total + kRowsPerWarp - 1) / kRowsPerWarp, kWarps);
  auto go = [&]<int kBits>() {
    auto kernel = n_rows == 1 ? gemv_gq_kernel<kBits, 1> : gemv_gq_kernel<kBits, kGemvMaxRows>;
    kernel<<<grid, kWarps * 32, 0, s>>>(x, n_rows, n_blocks, l0.code_row_bytes, gs, shift, tg);
  };
  if (w0.dtype == DType::W8G)
    go.template operator()<8>();
  else
    go.template operator()<4>();
  TESSERA_CUDA_CHECK_LAUNCH("gemv_gq");
}

}  // namespace tessera::cuda
