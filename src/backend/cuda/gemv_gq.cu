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
// Bytes in flight: a block takes R rows of one target and splits their columns over its warps;
// a thread's step is U chunks (i, i + blockDim, ..., i + (U - 1) blockDim, the next step U
// blockDims further), all R x U code loads (and scales, zero points) issued before any is used,
// one activation load feeding all R rows; the warps' sums meet in shared memory. The shape is
// chosen per class of rows of x (kShape): 1 row R = 8, U = 1; 2-8 rows R = 4, U = 2, so each
// thread keeps 8 row-chunks of codes in flight with at most 32 accumulators (rows of x times
// R). R = 4, U = 1 at 5-8 rows (4 loads a thread) measured 201 us a Llama-8B layer at 8 rows
// against 140 for the earlier warp-per-4-rows kernel, which had 8 (two unrolled chunks of 4
// rows, 164 registers); R = 8 at 2 rows took 180 registers (W4G), R = 2 would read x through L1
// twice as often per code byte. The launch picks the warps per block from the width (up to
// kMaxWarps, whole steps over the row: 4096 columns at U = 1 take 4 warps and one chunk per
// thread, at U = 2 two warps and two) and R against the SM count (kShape's R unless that leaves under kMinBlocksPerSm blocks per SM;
// then kRowsSmall, more blocks of fewer rows). Launched as a programmatic dependent launch: the
// first step's codes, scales and zeros (which no kernel writes) are requested before
// pdl_wait(), so they overlap the previous kernel's tail; x is read after.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/gemv_loads.cuh"

namespace tessera::cuda {

namespace {

constexpr int kMaxWarps = 8;        // per block, all on the block's rows, each a share of the width
constexpr int kMinBlocksPerSm = 2;  // fewer blocks of kShape's R rows than this per SM: kRowsSmall
constexpr int kRowsSmall = 2;

// Kernel shape per class of rows of x (NR: 1, 2, 4 or 8, the count rounded up to one of
// them): R weight rows per block, U chunks per thread per step (see the top of the file).
struct GqShape {
  int R, U;
};
template <int NR>
constexpr GqShape kShape = NR == 1 ? GqShape{8, 1} : GqShape{4, 2};

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

// One halving exchange of warp_sum_each over its first C values, then the next (a template
// recursion, not a loop: at V = 32 and U = 2 nvcc left the loop rolled, v in local memory).
// Lanes with bit o set keep the upper half of the C values, the others the lower half; each
// adds its partner's copy of the half it keeps.
template <int V, int C>
__device__ __forceinline__ void halve_exchange(float (&v)[V], int lane) {
  if constexpr (C > 1) {
    constexpr int o = 16 * C / V;
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      const float keep = upper ? v[i + C / 2] : v[i];
      const float send = upper ? v[i] : v[i + C / 2];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
    halve_exchange<V, C / 2>(v, lane);
  }
}

// Each of V values (a power of two <= 32) summed over the warp by halving exchanges: V - 1 +
// log2(32 / V) shuffles instead of 5V. Afterwards lane l holds the total of value l / (32 / V).
template <int V>
__device__ __forceinline__ float warp_sum_each(float (&v)[V]) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "a power of two up to the warp");
  halve_exchange<V, V>(v, threadIdx.x & 31);
  float s = v[0];
#pragma unroll
  for (int o = 16 / V; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// NR: rows of x computed at once (n_rows <= NR guards the rest). R: rows of W per block, U:
// chunks per thread per step. group_shift: log2(group_size) when it is a power of two, else -1
// (a division).
template <int kBits, int NR, int R, int U>
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
  // A step: chunks b0 + u * blockDim.x (u < U) of those below n_blocks, every load of the step
  // before any use. The first step's weights are requested before waiting on the previous
  // kernel (no kernel writes them), x after.
  const int stride = static_cast<int>(blockDim.x);
  GqChunk<kBits, R> c[U];
  auto load_step = [&](int b0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * stride;
      if (b < n_blocks) load_chunk<kBits, R>(code, scale, zero, r, rows, row_bytes, b, group_of(b), c[u]);
    }
  };
  const int first = threadIdx.x;
  load_step(first);
  pdl_wait();  // every thread, before x: see cuda_common.cuh
  for (int b0 = first; b0 < n_blocks; b0 += U * stride) {
    if (b0 != first) load_step(b0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * stride;
      if (b < n_blocks) accumulate<kBits, NR, R>(c[u], x, n_rows, n_blocks, b, acc);
    }
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
  int n_rows, n_blocks;
  int64_t row_bytes;
  int group_size, group_shift;
};

template <int kBits, int NR, int R, int U>
void launch_rows(const GqLaunch& a, GqTargets tg, cudaStream_t s) {
  unsigned end = 0;
  for (int i = 0; i < tg.n; ++i) {
    end += static_cast<unsigned>((tg.rows[i] + R - 1) / R);
    tg.block_end[i] = end;
  }
  // Warps per block: as few whole steps over the row's chunks as kMaxWarps allows, the chunks
  // spread evenly (4096 columns, 128 chunks: U = 1 4 warps, U = 2 2 warps; 14336, 448 chunks:
  // 7 warps, two chunks each at U = 1, one step of two at U = 2).
  const int per_warp_step = 32 * U;
  const int steps = (a.n_blocks + per_warp_step * kMaxWarps - 1) / (per_warp_step * kMaxWarps);
  const int warps = (a.n_blocks + per_warp_step * steps - 1) / (per_warp_step * steps);
  launch_pdl(gemv_gq_kernel<kBits, NR, R, U>, dim3(end), dim3(warps * 32), 0, s, a.x, a.n_rows, a.n_blocks, a.row_bytes,
             a.group_size, a.group_shift, tg);
}

// kShape's R rows per block unless that leaves fewer than kMinBlocksPerSm blocks per SM.
template <int kBits, int NR>
void launch_shape(const GqLaunch& a, const GqTargets& tg, int sm_count, cudaStream_t s) {
  constexpr GqShape sh = kShape<NR>;
  int64_t big_blocks = 0;
  for (int i = 0; i < tg.n; ++i) big_blocks += (tg.rows[i] + sh.R - 1) / sh.R;
  if (big_blocks >= int64_t{kMinBlocksPerSm} * sm_count)
    launch_rows<kBits, NR, sh.R, sh.U>(a, tg, s);
  else
    launch_rows<kBits, NR, kRowsSmall, sh.U>(a, tg, s);
}

// The row count of x rounded up to a shape class (1, 2, 4, 8).
template <int kBits>
void launch_rows_class(const GqLaunch& a, const GqTargets& tg, int sm_count, cudaStream_t s) {
  if (a.n_rows == 1)
    launch_shape<kBits, 1>(a, tg, sm_count, s);
  else if (a.n_rows == 2)
    launch_shape<kBits, 2>(a, tg, sm_count, s);
  else if (a.n_rows <= 4)
    launch_shape<kBits, 4>(a, tg, sm_count, s);
  else
    launch_shape<kBits, 8>(a, tg, sm_count, s);
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
  GqLaunch a{x, n_rows, static_cast<int>(x.ld / 32), l0.code_row_bytes, static_cast<int>(l0.group_size), -1};
  const int gs = a.group_size;
  if ((gs & (gs - 1)) == 0) a.group_shift = __builtin_ctz(static_cast<unsigned>(gs));
  static_assert(kGemvMaxRows == 8, "shape classes 1, 2, 4, 8 rows of x");
  if (w0.dtype == DType::W8G)
    launch_rows_class<8>(a, tg, sm_count, s);
  else
    launch_rows_class<4>(a, tg, sm_count, s);
}

}  // namespace tessera::cuda
