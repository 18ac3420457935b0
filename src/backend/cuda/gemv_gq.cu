// Decode-size products (1..kGemvMaxRows rows) read straight from group-quantized codes
// (W4G/W8G, core/group_quant.h): the codes, scales and zero points stream from device memory
// once and meet activations quantized per 32 columns (quantize_q8.cu) in integer dot products
// (dp4a: four code bytes times four activation bytes per instruction), the CPU backend's
// arithmetic (docs/design/weight-quant.md, "CPU matmul"):
//   y[t, r] = sum over 32-column blocks b of fma(scale[r, g(b)] * d[t, b], isum, ...),
//   isum = sum_j code[r, j] * q[t, j] - zero[r, g(b)] * sum_j q[t, j]   (exact, i32).
//
// No repacking is needed: the stored layout already gives every thread one 16-byte load per
// 32 columns of W4G (byte j = column j | column j+16 << 4, so the low nibbles of a word meet
// activation bytes j..j+3 and the high nibbles j+16..j+19) and two per 32 columns of W8G; a
// warp's lanes read consecutive 32-column chunks of a row. A lane's 32 columns never straddle
// a group (groups are multiples of 32 columns, or the whole row).
//
// Bytes in flight: a block takes R rows of one target and splits their columns over its warps
// (thread i takes chunks i, i + blockDim, ...; the warps' sums meet in shared memory), so every
// thread issues R independent code loads per chunk before using any, one activation load feeding
// all R. The launch picks the warps per block from the width (up to kMaxWarps, whole passes over
// the row: 4 warps and one chunk per thread at 4096 columns, 7 warps and two at 14336) and R from
// the row count against the SM count (kRowsBig unless that leaves under kMinBlocksPerSm blocks
// per SM; then kRowsSmall, more blocks of fewer rows). At Llama-8B decode shapes every thread
// holds its whole share of the matrix in flight at once. Launched as a programmatic dependent
// launch: the first chunk's codes, scales and zeros (which no kernel writes) are requested before
// pdl_wait(), so they overlap the previous kernel's tail; x is read after.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/gemv_loads.cuh"

namespace tessera::cuda {

namespace {

constexpr int kMaxWarps = 8;        // per block, all on the block's rows, each a share of the width
constexpr int kMinBlocksPerSm = 2;  // fewer blocks of kRowsBig rows than this per SM: kRowsSmall
// Rows per block. One row of x: 8, so each thread has 8 code loads in flight per chunk. Up to 8
// rows of x: 4, the accumulators (rows of x times rows of W) kept in registers.
template <int NR>
constexpr int kRowsBig = NR == 1 ? 8 : 4;
constexpr int kRowsSmall = 2;

struct GqTargets {
  const uint8_t* codes[kGemvMaxTargets];    // [rows][row_bytes]
  const uint16_t* scales[kGemvMaxTargets];  // [n_groups][rows] f16
  const uint8_t* zeros[kGemvMaxTargets];    // [n_groups][rows], or nullptr: 2^(bits-1)
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int64_t rows[kGemvMaxTargets];
  unsigned block_end[kGemvMaxTargets];  // cumulative blocks: target i owns [block_end[i-1], block_end[i])
  int n;
};

// a · b over four byte lanes, a unsigned (codes), b signed (activations), plus c.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// A thread's 32-column chunk of its block's R rows: codes, scales and zero points of the chunk's group.
template <int kBits, int R>
struct GqChunk {
  uint4 q[R][kBits / 4];  // W4G: one 16-byte load per row, W8G two
  float s[R];
  int z[R];
};

// Chunk b (columns 32b..32b+31, group g) of rows r[0..R): every load issued before any is used.
template <int kBits, int R>
__device__ __forceinline__ void load_chunk(const uint8_t* code, const uint16_t* scale, const uint8_t* zero,
                                           const int64_t (&r)[R], int64_t rows, int64_t row_bytes, int b, int64_t g,
                                           GqChunk<kBits, R>& c) {
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const uint8_t* p = code + r[k] * row_bytes + static_cast<int64_t>(b) * (4 * kBits);
#pragma unroll
    for (int v = 0; v < kBits / 4; ++v) c.q[k][v] = load_codes(p + 16 * v);
  }
#pragma unroll
  for (int k = 0; k < R; ++k) {
    c.s[k] = half_bits_to_f32(__ldg(scale + g * rows + r[k]));
    c.z[k] = zero ? __ldg(zero + g * rows + r[k]) : (1 << (kBits - 1));
  }
}

// acc[t * R + k] += the chunk's row k · x row t (those t below n_rows): one x load feeds R rows.
template <int kBits, int NR, int R>
__device__ __forceinline__ void accumulate(const GqChunk<kBits, R>& c, const Q8Rows& x, int n_rows, int n_blocks, int b,
                                           float (&acc)[NR * R]) {
#pragma unroll
  for (int t = 0; t < NR; ++t) {
    if (NR > 1 && t >= n_rows) break;
    const int8_t* xr = x.q + t * x.ld + b * 32;
    const uint4 xa = __ldg(reinterpret_cast<const uint4*>(xr));       // columns 32b..32b+15
    const uint4 xb = __ldg(reinterpret_cast<const uint4*>(xr + 16));  // 32b+16..32b+31
    const int2 m = __ldg(x.meta + t * n_blocks + b);
    const float d = __int_as_float(m.x);
#pragma unroll
    for (int k = 0; k < R; ++k) {
      int dot = -c.z[k] * m.y;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kBits == 4) {
          const uint32_t w = word_of(c.q[k][0], i);
          dot = dp4a_us(w & 0x0F0F0F0Fu, word_of(xa, i), dot);
          dot = dp4a_us((w >> 4) & 0x0F0F0F0Fu, word_of(xb, i), dot);
        } else {
          dot = dp4a_us(word_of(c.q[k][0], i), word_of(xa, i), dot);
          dot = dp4a_us(word_of(c.q[k][1], i), word_of(xb, i), dot);
        }
      }
      acc[t * R + k] = fmaf(c.s[k] * d, static_cast<float>(dot), acc[t * R + k]);
    }
  }
}

// Each of V values (a power of two <= 32) summed over the warp by halving exchanges: V - 1 +
// log2(32 / V) shuffles instead of 5V. Afterwards lane l holds the total of value l / (32 / V).
template <int V>
__device__ __forceinline__ float warp_sum_each(float (&v)[V]) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "a power of two up to the warp");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = V; c > 1; c >>= 1) {
    // Lanes with bit o set keep the upper half of the c values, the others the lower half;
    // each adds its partner's copy of the half it keeps.
    const int o = 16 * c / V;
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < c / 2; ++i) {
      const float keep = upper ? v[i + c / 2] : v[i];
      const float send = upper ? v[i] : v[i + c / 2];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
  float s = v[0];
#pragma unroll
  for (int o = 16 / V; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// NR: rows of x computed at once (1, or kGemvMaxRows with n_rows guarding the rest). R: rows of
// W per block. group_shift: log2(group_size) when it is a power of two, else -1 (a division).
template <int kBits, int NR, int R>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_gq_kernel(Q8Rows x, int n_rows, int n_blocks, int64_t row_bytes,
                                                                 int group_size, int group_shift, GqTargets tg) {
  constexpr int V = NR * R;
  __shared__ float partial[kMaxWarps][V];  // [warp][t * R + k]: each warp's share of the sums
  int ti = 0;
  while (ti < tg.n - 1 && blockIdx.x >= tg.block_end[ti]) ++ti;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - (ti ? tg.block_end[ti - 1] : 0u)) * R;
  const int64_t rows = tg.rows[ti];
  int64_t r[R];
#pragma unroll
  for (int k = 0; k < R; ++k) r[k] = min(row0 + k, rows - 1);  // a missing row recomputes the last, unwritten
  const uint8_t* code = tg.codes[ti];
  const uint16_t* scale = tg.scales[ti];
  const uint8_t* zero = tg.zeros[ti];
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0f;
  auto group_of = [&](int b) -> int64_t { return group_shift >= 0 ? (b * 32) >> group_shift : b * 32 / group_size; };
  // Thread i takes chunks i, i + blockDim.x, ...: the first one's weights are requested before
  // waiting on the previous kernel (no kernel writes them), x after.
  GqChunk<kBits, R> c;
  const int first = threadIdx.x;
  if (first < n_blocks) load_chunk<kBits, R>(code, scale, zero, r, rows, row_bytes, first, group_of(first), c);
  pdl_wait();  // every thread, before x: see cuda_common.cuh
  for (int b = first; b < n_blocks; b += blockDim.x) {
    if (b != first) load_chunk<kBits, R>(code, scale, zero, r, rows, row_bytes, b, group_of(b), c);
    accumulate<kBits, NR, R>(c, x, n_rows, n_blocks, b, acc);
  }
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const float v = warp_sum_each<V>(acc);
  if (lane % (32 / V) == 0) partial[threadIdx.x >> 5][lane / (32 / V)] = v;
  __syncthreads();
  if (threadIdx.x < V) {
    const int t = threadIdx.x / R, k = threadIdx.x % R;
    if (t < n_rows && row0 + k < rows) {
      float sum = 0.0f;
      for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) sum += partial[w][threadIdx.x];
      tg.y[ti][t * tg.ldy[ti] + row0 + k] = sum;
    }
  }
}

struct GqLaunch {
  Q8Rows x;
  int n_rows, n_blocks, warps;  // warps per block
  int64_t row_bytes;
  int group_size, group_shift;
};

template <int kBits, int NR, int R>
void launch_rows(const GqLaunch& a, GqTargets tg, cudaStream_t s) {
  unsigned end = 0;
  for (int i = 0; i < tg.n; ++i) {
    end += static_cast<unsigned>((tg.rows[i] + R - 1) / R);
    tg.block_end[i] = end;
  }
  launch_pdl(gemv_gq_kernel<kBits, NR, R>, dim3(end), dim3(a.warps * 32), 0, s, a.x, a.n_rows, a.n_blocks, a.row_bytes,
             a.group_size, a.group_shift, tg);
}

// kRowsBig rows per block unless that leaves fewer than kMinBlocksPerSm blocks per SM.
template <int kBits, int NR>
void launch_shape(const GqLaunch& a, const GqTargets& tg, int sm_count, cudaStream_t s) {
  int64_t big_blocks = 0;
  for (int i = 0; i < tg.n; ++i) big_blocks += (tg.rows[i] + kRowsBig<NR> - 1) / kRowsBig<NR>;
  if (big_blocks >= int64_t{kMinBlocksPerSm} * sm_count)
    launch_rows<kBits, NR, kRowsBig<NR>>(a, tg, s);
  else
    launch_rows<kBits, NR, kRowsSmall>(a, tg, s);
}

}  // namespace

void launch_gemv_gq(const Q8Rows& x, int n_rows, const MatmulTarget* targets, int n_targets, int sm_count,
                    cudaStream_t s) {
  TESSERA_CHECK(
      n_rows >= 1 && n_rows <= kGemvMaxRows && n_targets >= 1 && n_targets <= kGemvMaxTargets && sm_count >= 1,
      "cuda gemv_gq: ", n_rows, " rows / ", n_targets, " targets / ", sm_count, " SMs out of range");
  const WeightMatrix& w0 = targets[0].w;
  TESSERA_CHECK(x.q && x.meta && x.ld == (w0.cols + 31) / 32 * 32, "cuda gemv_gq: activations not quantized for width ",
                w0.cols);
  TESSERA_CHECK(w0.cols <= (int64_t{1} << 30), "cuda gemv_gq: width ", w0.cols, " too large");
  GqTargets tg{};
  tg.n = n_targets;
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
    tg.rows[i] = w.rows;
  }
  const GroupQuantLayout l0 = w0.gq_layout();
  GqLaunch a{x, n_rows, static_cast<int>(x.ld / 32), 0, l0.code_row_bytes, static_cast<int>(l0.group_size), -1};
  const int gs = a.group_size;
  if ((gs & (gs - 1)) == 0) a.group_shift = __builtin_ctz(static_cast<unsigned>(gs));
  // Warps per block: as few whole passes over the row's chunks as kMaxWarps allows, the chunks
  // spread evenly (4096 columns: 128 chunks, 4 warps, one each; 14336: 448, 7 warps, two each).
  const int passes = (a.n_blocks + 32 * kMaxWarps - 1) / (32 * kMaxWarps);
  a.warps = (a.n_blocks + 32 * passes - 1) / (32 * passes);
  const bool w8 = w0.dtype == DType::W8G;
  if (n_rows == 1)
    w8 ? launch_shape<8, 1>(a, tg, sm_count, s) : launch_shape<4, 1>(a, tg, sm_count, s);
  else
    w8 ? launch_shape<8, kGemvMaxRows>(a, tg, sm_count, s) : launch_shape<4, kGemvMaxRows>(a, tg, sm_count, s);
}

}  // namespace tessera::cuda
