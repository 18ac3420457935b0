// Decode-size products (1..kGemvMaxRows rows) on the GGUF block formats most files use —
// Q4_0, Q4_1, Q8_0 and Q4_K — with integer dot products (dp4a) on activations quantized per
// 32 columns (quantize_q8.cu), as gemv_gq.cu does for W4G/W8G and llama.cpp's mmvq does for
// these formats. Decoding every element to f32 (gemv.cu, still used by the other block
// formats) costs several instructions per weight; here four weights take one instruction.
//
// A lane takes one chunk per step: one 32-column block (Q4_0 18 bytes, Q4_1 20, Q8_0 34) or,
// for Q4_K, one 64-column slice of a 256-column super-block (the super-block's 16-byte header
// and 32 bytes of codes: low nibbles are sub-block 2j, high nibbles sub-block 2j+1). Blocks
// of 18 and 34 bytes sit at 2-byte alignment, so their words are read aligned and shifted.
// Per 32-column block b of x (d_x, its quants q and their sum S):
//   Q4_0  d_w * d_x * (sum code * q - 8 S)            Q8_0  d_w * d_x * sum code * q
//   Q4_1  d_w * d_x * sum code * q + m_w * d_x * S    Q4_K  d_x * (d sc * sum code * q - dmin m * S)
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_loads.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;        // per block: 16 rows
constexpr int kRowsPerWarp = 4;  // rows sharing each activation load

using BlockTargets = GemvRowTargets;

template <DType T>
constexpr int kChunkCols = T == DType::Q4_K ? 64 : 32;

// One chunk of one weight row, as the dot products want it: code words (W4: 8 nibbles a word,
// Q8_0: 4 signed bytes) and the chunk's scales.
template <DType T>
struct Chunk {
  uint32_t w[T == DType::Q4_0 || T == DType::Q4_1 ? 4 : 8];
  float d = 0, m = 0, d2 = 0, m2 = 0;  // Q4_K: d·sc and dmin·m of the two sub-blocks
};

__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t ldg_u32(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

// Bytes p[2 + 4i .. 6 + 4i) for i < N from a block at 2-byte alignment, and its leading f16.
template <int N>
__device__ __forceinline__ float load_shifted(const uint8_t* p, uint32_t (&out)[N]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(a & ~uintptr_t{3});
  const unsigned shift = 16 + 8 * static_cast<unsigned>(a & 3);  // 16 (aligned) or 32 (2 off)
  uint32_t u[N + 1];
#pragma unroll
  for (int i = 0; i <= N; ++i) u[i] = ldg_u32(base + 4 * i);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_rc(u[i], u[i + 1], shift);
  return half_bits_to_f32(static_cast<uint16_t>(a & 3 ? u[0] >> 16 : u[0] & 0xFFFF));
}

template <DType T>
__device__ __forceinline__ void load_chunk(const uint8_t* row, int c, Chunk<T>& k) {
  if constexpr (T == DType::Q4_0) {
    k.d = load_shifted(row + 18 * c, k.w);
  } else if constexpr (T == DType::Q8_0) {
    k.d = load_shifted(row + 34 * c, k.w);
  } else if constexpr (T == DType::Q4_1) {
    const uint8_t* b = row + 20 * c;
    const uint32_t dm = ldg_u32(b);
    k.d = half_bits_to_f32(static_cast<uint16_t>(dm & 0xFFFF));
    k.m = half_bits_to_f32(static_cast<uint16_t>(dm >> 16));
#pragma unroll
    for (int i = 0; i < 4; ++i) k.w[i] = ldg_u32(b + 4 + 4 * i);
  } else {  // Q4_K: super-block c / 4, slice j = c % 4
    const uint8_t* sb = row + 144 * (c >> 2);
    const int j = c & 3;
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(sb));  // d, dmin, 12 bytes of scales
    const uint4 q0 = load_codes(sb + 16 + 32 * j), q1 = load_codes(sb + 32 + 32 * j);
    k.w[0] = q0.x, k.w[1] = q0.y, k.w[2] = q0.z, k.w[3] = q0.w;
    k.w[4] = q1.x, k.w[5] = q1.y, k.w[6] = q1.z, k.w[7] = q1.w;
    // GGML's get_scale_min_k4 for sub-blocks 2j and 2j+1 on the scale words h.y (bytes 0-3),
    // h.z (4-7), h.w (8-11).
    auto scale_min = [&](int s, float& sc, float& mn) {
      const unsigned b = 8u * static_cast<unsigned>(s & 3);
      if (s < 4) {
        sc = static_cast<float>((h.y >> b) & 63);
        mn = static_cast<float>((h.z >> b) & 63);
      } else {
        sc = static_cast<float>(((h.w >> b) & 0xF) | (((h.y >> b) >> 6 & 3) << 4));
        mn = static_cast<float>(((h.w >> b) >> 4 & 0xF) | (((h.z >> b) >> 6 & 3) << 4));
      }
    };
    const float d = half_bits_to_f32(static_cast<uint16_t>(h.x & 0xFFFF));
    const float dmin = half_bits_to_f32(static_cast<uint16_t>(h.x >> 16));
    float sc, mn;
    scale_min(2 * j, sc, mn);
    k.d = d * sc, k.m = dmin * mn;
    scale_min(2 * j + 1, sc, mn);
    k.d2 = d * sc, k.m2 = dmin * mn;
  }
}

// The chunk's contribution for one row of x: 32-column blocks b (and b + 1 for Q4_K).
template <DType T>
__device__ __forceinline__ float chunk_dot(const Chunk<T>& k, const Q8Rows& x, int t, int b, int n_blocks) {
  const int8_t* xr = x.q + t * x.ld + 32 * b;
  const uint4 xa = __ldg(reinterpret_cast<const uint4*>(xr));       // columns 0..15 of block b
  const uint4 xb = __ldg(reinterpret_cast<const uint4*>(xr + 16));  // 16..31
  const int2 m0 = __ldg(x.meta + t * n_blocks + b);
  const float dx = __int_as_float(m0.x);
  if constexpr (T == DType::Q4_K) {
    const uint4 xc = __ldg(reinterpret_cast<const uint4*>(xr + 32)),
                xd = __ldg(reinterpret_cast<const uint4*>(xr + 48));
    const int2 m1 = __ldg(x.meta + t * n_blocks + b + 1);
    int lo = 0, hi = 0;  // sub-block 2j meets block b, 2j+1 block b+1
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      lo = dp4a_us(k.w[i] & 0x0F0F0F0Fu, word_of(i < 4 ? xa : xb, i & 3), lo);
      hi = dp4a_us((k.w[i] >> 4) & 0x0F0F0F0Fu, word_of(i < 4 ? xc : xd, i & 3), hi);
    }
    const float dx1 = __int_as_float(m1.x);
    float r = dx * fmaf(k.d, static_cast<float>(lo), -k.m * static_cast<float>(m0.y));
    return fmaf(dx1, fmaf(k.d2, static_cast<float>(hi), -k.m2 * static_cast<float>(m1.y)), r);
  } else if constexpr (T == DType::Q8_0) {
    int dot = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      dot = __dp4a(static_cast<int>(k.w[i]), static_cast<int>(word_of(i < 4 ? xa : xb, i & 3)), dot);
    return k.d * dx * static_cast<float>(dot);
  } else {
    int dot = T == DType::Q4_0 ? -8 * m0.y : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dot = dp4a_us(k.w[i] & 0x0F0F0F0Fu, word_of(xa, i), dot);
      dot = dp4a_us((k.w[i] >> 4) & 0x0F0F0F0Fu, word_of(xb, i), dot);
    }
    const float r = k.d * dx * static_cast<float>(dot);
    return T == DType::Q4_1 ? fmaf(k.m * dx, static_cast<float>(m0.y), r) : r;
  }
}

template <DType T, int NR>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_blocks_q8_kernel(Q8Rows x, int n_rows, int n_blocks, BlockTargets tg) {
  constexpr int R = kRowsPerWarp;
  constexpr int kBlocksPerChunk = kChunkCols<T> / 32;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  const int64_t total = tg.row_end[tg.n - 1];
  if (row0 >= total) return;
  const uint8_t* wr[R];
  int ti[R];
  int64_t r[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t row = min(row0 + k, total - 1);  // a missing row recomputes the last one, unwritten
    int t = 0;
    while (t < tg.n - 1 && row >= tg.row_end[t]) ++t;
    ti[k] = t;
    r[k] = row - (t ? tg.row_end[t - 1] : 0);
    wr[k] = tg.w[t] + r[k] * tg.row_bytes;
  }
  float acc[NR][R];
#pragma unroll
  for (int t = 0; t < NR; ++t)
#pragma unroll
    for (int k = 0; k < R; ++k) acc[t][k] = 0.0f;
  const int n_chunks = n_blocks / kBlocksPerChunk;
#pragma unroll 2
  for (int c = lane; c < n_chunks; c += 32) {
    Chunk<T> ch[R];
#pragma unroll
    for (int k = 0; k < R; ++k) load_chunk<T>(wr[k], c, ch[k]);
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      if (NR > 1 && t >= n_rows) break;
#pragma unroll
      for (int k = 0; k < R; ++k) acc[t][k] += chunk_dot<T>(ch[k], x, t, c * kBlocksPerChunk, n_blocks);
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

bool gemv_blocks_q8_applies(DType type, int64_t cols) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q8_0:
      return cols % 32 == 0;
    case DType::Q4_K:
      return cols % 256 == 0;
    default:
      return false;
  }
}

void launch_gemv_blocks_q8(DType type, const Q8Rows& x, int n_rows, int64_t cols, const GemvTarget* targets,
                           int n_targets, cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && n_rows <= kGemvMaxRows && n_targets >= 1 && n_targets <= kGemvMaxTargets,
                "cuda gemv_blocks_q8: ", n_rows, " rows / ", n_targets, " targets out of range");
  TESSERA_CHECK(gemv_blocks_q8_applies(type, cols), "cuda gemv_blocks_q8: ", dtype_name(type), " at width ", cols,
                " is not taken");
  TESSERA_CHECK(x.q && x.meta && x.ld == cols, "cuda gemv_blocks_q8: activations not quantized for width ", cols);
  BlockTargets tg{};
  tg.n = n_targets;
  tg.row_bytes = dtype_row_bytes(type, cols);
  int64_t total = 0;
  for (int i = 0; i < n_targets; ++i) {
    tg.w[i] = static_cast<const uint8_t*>(targets[i].w);
    // Q4_1 words and the Q4_K header are read 4 and 16 bytes wide.
    TESSERA_CHECK(reinterpret_cast<uintptr_t>(tg.w[i]) % 16 == 0, "cuda gemv_blocks_q8: weight buffer ", i,
                  " is not 16-byte aligned");
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    total += targets[i].rows;
    tg.row_end[i] = total;
  }
  const int n_blocks = static_cast<int>(cols / 32);
  const unsigned grid = blocks_for((total + kRowsPerWarp - 1) / kRowsPerWarp, kWarps);
  auto go = [&]<DType T>() {
    auto kernel = n_rows == 1 ? gemv_blocks_q8_kernel<T, 1> : gemv_blocks_q8_kernel<T, kGemvMaxRows>;
    kernel<<<grid, kWarps * 32, 0, s>>>(x, n_rows, n_blocks, tg);
  };
  switch (type) {
    case DType::Q4_0:
      go.template operator()<DType::Q4_0>();
      break;
    case DType::Q4_1:
      go.template operator()<DType::Q4_1>();
      break;
    case DType::Q8_0:
      go.template operator()<DType::Q8_0>();
      break;
    default:
      go.template operator()<DType::Q4_K>();
      break;
  }
  TESSERA_CUDA_CHECK_LAUNCH("gemv_blocks_q8");
}

}  // namespace tessera::cuda
