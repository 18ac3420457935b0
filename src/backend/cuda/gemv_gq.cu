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
//
// One row of x (the decode step) takes gemv_gq_bulk_kernel instead when the shapes allow:
// the warp-per-row kernel above keeps only a warp's few loads in flight while it lives and
// measured 1.2 TB/s on the 8B model's W4G matrices. There, as in gemv_bulk.cu, a persistent
// grid walks chunks of whole rows (up to 16 KB of codes) copied into a shared-memory ring by
// the bulk copy engine, several stages in flight per block whatever the arithmetic does.
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

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

// 16 code bytes, read once: not kept in L1 (the x rows live there).
__device__ __forceinline__ uint4 load_codes(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// x[c..c+3] of one row; past `cols` zero (only in the last, partial step).
template <bool kFull, bool kVecX>
__device__ __forceinline__ float4 load_x4(const float* xr, int c, int cols) {
  if constexpr (kFull && kVecX) {
    return __ldg(reinterpret_cast<const float4*>(xr + c));
  } else {
    float4 v;
    v.x = (kFull || c + 0 < cols) ? __ldg(xr + c + 0) : 0.0f;
    v.y = (kFull || c + 1 < cols) ? __ldg(xr + c + 1) : 0.0f;
    v.z = (kFull || c + 2 < cols) ? __ldg(xr + c + 2) : 0.0f;
    v.w = (kFull || c + 3 < cols) ? __ldg(xr + c + 3) : 0.0f;
    return v;
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// One step of one lane over its 32 (W4G) or 16 (W8G) columns c, for R rows (codes q[k]):
//   W8G: part[t][k] += sum (code - zero) * x[t][c]. 2^23 + code is built as float bits
//        (byte_perm puts the code byte under exponent 0x4B); zf = 2^23 + zero; one FADD
//        gives code - zero exactly.
//   W4G: part[t][k] += sum f * x[t][c] with f = 0.5 + code / 256 (byte_perm puts the nibble
//        under the bits 0x3F00: no FADD), and sx[t] += sum x[t][c]; the caller forms
//        sum (code - zero) * x = 256 * part - (128 + zero) * sx. One PRMT and one FFMA a weight.
template <int kBits, int NR, int R, bool kFull, bool kVecX>
__device__ __forceinline__ void gq_step(const float* __restrict__ x, int n_rows, int64_t ldx, int cols, int j0,
                                        const uint4 (&q)[R], const float (&zf)[R], float (&part)[NR][R],
                                        float (&sx)[NR]) {
  constexpr int kHalves = kBits == 4 ? 2 : 1;  // W4G: low nibbles, then high nibbles
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = j0 + h * 16 + 4 * i;  // columns c..c+3
      float v[R][4];
#pragma unroll
      for (int k = 0; k < R; ++k) {
        const uint32_t wd = word_of(q[k], i);
        const uint32_t b = kBits == 8 ? wd : h == 0 ? (wd & 0x0F0F0F0Fu) : ((wd >> 4) & 0x0F0F0F0Fu);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          v[k][e] = kBits == 4 ? __uint_as_float(__byte_perm(b, 0x3F000000u, 0x7054 | (e << 8)))
                               : __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7540 + e)) - zf[k];
      }
#pragma unroll
      for (int t = 0; t < NR; ++t) {
        if (NR > 1 && t >= n_rows) break;
        const float4 xv = load_x4<kFull, kVecX>(x + t * ldx, c, cols);
        if constexpr (kBits == 4) sx[t] += (xv.x + xv.y) + (xv.z + xv.w);
#pragma unroll
        for (int k = 0; k < R; ++k) {
          float p = part[t][k];
          p = fmaf(v[k][0], xv.x, p);
          p = fmaf(v[k][1], xv.y, p);
          p = fmaf(v[k][2], xv.z, p);
          part[t][k] = fmaf(v[k][3], xv.w, p);
        }
      }
    }
}

// The zero point's term for gq_step (see there).
template <int kBits>
__device__ __forceinline__ float gq_zero_term(int z) {
  return kBits == 4 ? 128.0f + static_cast<float>(z) : 8388608.0f + static_cast<float>(z);
}

// acc += scale * sum (code - zero) * x from gq_step's sums.
template <int kBits>
__device__ __forceinline__ float gq_finish(float acc, float scale, float part, float zf, float sx) {
  return fmaf(scale, kBits == 4 ? fmaf(-zf, sx, 256.0f * part) : part, acc);
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
      zf[k] = gq_zero_term<kBits>(zero[k] ? __ldg(zero[k] + g * plane_stride[k]) : (1 << (kBits - 1)));
    }
    float part[NR][R], sx[NR];
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      sx[t] = 0.0f;
#pragma unroll
      for (int k = 0; k < R; ++k) part[t][k] = 0.0f;
    }
    if (j0 + kCols <= cols)
      gq_step<kBits, NR, R, true, kVecX>(x, n_rows, ldx, cols, j0, q, zf, part, sx);
    else
      gq_step<kBits, NR, R, false, kVecX>(x, n_rows, ldx, cols, j0, q, zf, part, sx);
#pragma unroll
    for (int t = 0; t < NR; ++t)
#pragma unroll
      for (int k = 0; k < R; ++k) acc[t][k] = gq_finish<kBits>(acc[t][k], s[k], part[t][k], zf[k], sx[t]);
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

constexpr int kBulkThreads = 256;
constexpr int kBulkWarps = kBulkThreads / 32;
constexpr int kBulkMaxRowsPerChunk = kBulkWarps;  // every row of a chunk has at least a warp
constexpr size_t kBulkChunkBytes = 16 << 10;      // the largest chunk
constexpr size_t kBulkRingBytes = 64 << 10;       // stages in flight per block
constexpr size_t kSmemPerSm = 220 << 10;          // what the blocks of one SM may take together
constexpr int kBulkMinChunksPerBlock = 3;         // balance: rows per chunk shrink until each block has 3
constexpr int kBulkStepsPerLane = static_cast<int>(kBulkChunkBytes / (512 * kBulkWarps));  // 4

struct GqBulkTargets {
  const uint8_t* codes[kGemvMaxTargets];
  const uint16_t* scales[kGemvMaxTargets];
  const uint8_t* zeros[kGemvMaxTargets];
  float* y[kGemvMaxTargets];
  int64_t rows[kGemvMaxTargets];
  int64_t chunk_end[kGemvMaxTargets];  // cumulative chunks: target i owns [chunk_end[i-1], chunk_end[i])
  int n;
};

// Batch 1, x 16-byte aligned. Chunk c of `rpc` rows lands in stage c % stages; warp w takes
// row w / wpr of it (wpr = 8 / rpc warps a row) and every wpr-th 512-byte step of that row;
// the warps' sums meet in shared memory in a fixed order (the same bits on every run).
template <int kBits>
__global__ void __launch_bounds__(kBulkThreads)
    gemv_gq_bulk_kernel(const float* __restrict__ x, int cols, int64_t row_bytes, int rpc, int64_t n_chunks,
                        int stages, int group_size, int group_shift, const __grid_constant__ GqBulkTargets tg) {
  constexpr int kCols = kBits == 4 ? 32 : 16;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t chunk_bytes = static_cast<uint32_t>(rpc * row_bytes);
  const uint32_t stage_stride = (chunk_bytes + 127) / 128 * 128;
  auto* bars = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(stages) * stage_stride);
  auto* red = reinterpret_cast<float*>(bars + stages);  // [2][kBulkWarps]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * n_chunks / gridDim.x;
  const int64_t c1 = static_cast<int64_t>(blockIdx.x + 1) * n_chunks / gridDim.x;
  auto target_of = [&](int64_t chunk, int& ti) {
    ti = 0;
    while (ti < tg.n - 1 && chunk >= tg.chunk_end[ti]) ++ti;
    return chunk - (ti ? tg.chunk_end[ti - 1] : 0);  // chunk index inside target ti
  };
  const uint64_t policy = tid == 0 ? l2_policy_evict_first() : 0;  // codes are read once a step
  auto issue = [&](int64_t chunk, int stage) {
    int ti;
    const int64_t local = target_of(chunk, ti);
    mbar_expect_tx(&bars[stage], chunk_bytes);
    bulk_copy_hint(smem + static_cast<size_t>(stage) * stage_stride, tg.codes[ti] + local * chunk_bytes, chunk_bytes,
                   &bars[stage], policy);
  };
  if (tid == 0) {
    for (int st = 0; st < stages; ++st) mbar_init(&bars[st], 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0)
    for (int st = 0; st < stages && c0 + st < c1; ++st) issue(c0 + st, st);

  const int wpr = kBulkWarps / rpc, my_row = warp / wpr, my_part = warp % wpr;
  const int64_t steps = (row_bytes + 511) / 512;  // 16 bytes a lane
  // A chunk is at most 16 KB: 32 steps of 512 bytes over 8 warps, so a lane takes at most
  // kBulkStepsPerLane. Its scales and zero terms (global loads, often from HBM) are fetched
  // one chunk ahead, so their latency hides behind the current chunk's arithmetic.
  float sc[kBulkStepsPerLane] = {}, zt[kBulkStepsPerLane] = {}, sc_next[kBulkStepsPerLane] = {},
        zt_next[kBulkStepsPerLane] = {};
  auto fetch = [&](int64_t chunk, float (&sv)[kBulkStepsPerLane], float (&zv)[kBulkStepsPerLane]) {
    int t;
    const int64_t r = target_of(chunk, t) * rpc + my_row;
#pragma unroll
    for (int k = 0; k < kBulkStepsPerLane; ++k) {
      const int64_t st = my_part + k * wpr, b = st * 512 + lane * 16;
      if (st < steps && b < row_bytes) {
        const int j0 = static_cast<int>(b * 8 / kBits);
        const int64_t g = group_shift >= 0 ? (j0 >> group_shift) : (j0 / group_size);
        const int64_t at = g * tg.rows[t] + r;
        sv[k] = half_bits_to_f32(__ldg(tg.scales[t] + at));
        zv[k] = gq_zero_term<kBits>(tg.zeros[t] ? __ldg(tg.zeros[t] + at) : (1 << (kBits - 1)));
      }
    }
  };
  if (c0 < c1) fetch(c0, sc, zt);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t i = c - c0;
    const int stage = static_cast<int>(i % stages);
    int ti;
    target_of(c, ti);
    if (c + 1 < c1) fetch(c + 1, sc_next, zt_next);
    mbar_wait(&bars[stage], static_cast<uint32_t>((i / stages) & 1));
    const uint8_t* row = smem + static_cast<size_t>(stage) * stage_stride + my_row * row_bytes;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kBulkStepsPerLane; ++k) {
      const int64_t st = my_part + k * wpr, b = st * 512 + lane * 16;
      if (st >= steps || b >= row_bytes) break;
      const int j0 = static_cast<int>(b * 8 / kBits);
      const uint4 q[1] = {*reinterpret_cast<const uint4*>(row + b)};
      const float zf[1] = {zt[k]};
      float part[1][1] = {{0.0f}}, sx[1] = {0.0f};
      if (j0 + kCols <= cols)
        gq_step<kBits, 1, 1, true, true>(x, 1, 0, cols, j0, q, zf, part, sx);
      else
        gq_step<kBits, 1, 1, false, true>(x, 1, 0, cols, j0, q, zf, part, sx);
      acc = gq_finish<kBits>(acc, sc[k], part[0][0], zf[0], sx[0]);
    }
#pragma unroll
    for (int k = 0; k < kBulkStepsPerLane; ++k) sc[k] = sc_next[k], zt[k] = zt_next[k];
    acc = warp_sum(acc);
    float* red_i = red + (i & 1) * kBulkWarps;
    if (lane == 0) red_i[warp] = acc;
    __syncthreads();  // the stage is read by every thread; red_i is complete
    if (tid == 0 && c + stages < c1) issue(c + stages, stage);
    if (tid < rpc) {
      float sum = 0.0f;
      for (int w = 0; w < wpr; ++w) sum += red_i[tid * wpr + w];
      tg.y[ti][target_of(c, ti) * rpc + tid] = sum;
    }
  }
}

// Rows per chunk for the bulk kernel (a power of two <= 8 dividing every target, the chunk
// <= kBulkChunkBytes, each block a few chunks), or 0 when none fits.
int bulk_rows_per_chunk(const MatmulTarget* targets, int n_targets, int64_t row_bytes, int64_t total, int blocks) {
  for (int rpc = kBulkMaxRowsPerChunk; rpc >= 1; rpc /= 2) {
    bool ok = static_cast<size_t>(rpc * row_bytes) <= kBulkChunkBytes &&
              (rpc == 1 || total / rpc >= int64_t{kBulkMinChunksPerBlock} * blocks);
    for (int i = 0; i < n_targets; ++i) ok = ok && targets[i].w.rows % rpc == 0;
    if (ok) return rpc;
  }
  return 0;
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
                    int sm_count, cudaStream_t s) {
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
  const bool vec_x = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
  if (n_rows == 1 && vec_x) {
    const int per_sm = static_cast<int>(kSmemPerSm / (kBulkRingBytes + 1024));
    const int rpc = bulk_rows_per_chunk(targets, n_targets, l0.code_row_bytes, total, per_sm * sm_count);
    if (rpc > 0) {
      GqBulkTargets bt{};
      bt.n = n_targets;
      int64_t chunks = 0;
      for (int i = 0; i < n_targets; ++i) {
        bt.codes[i] = tg.codes[i];
        bt.scales[i] = tg.scales[i];
        bt.zeros[i] = tg.zeros[i];
        bt.y[i] = tg.y[i];
        bt.rows[i] = targets[i].w.rows;
        chunks += targets[i].w.rows / rpc;
        bt.chunk_end[i] = chunks;
      }
      const size_t stage_stride = (rpc * l0.code_row_bytes + 127) / 128 * 128;
      const int stages = static_cast<int>(std::min<size_t>(8, kBulkRingBytes / stage_stride));
      const size_t smem = stages * stage_stride + stages * sizeof(uint64_t) + 2 * kBulkWarps * sizeof(float);
      auto bulk = [&]<int kBits>() {
        static size_t configured = 0;  // the attributes are per function
        if (smem > configured) {
          TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemv_gq_bulk_kernel<kBits>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
          TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemv_gq_bulk_kernel<kBits>,
                                                  cudaFuncAttributePreferredSharedMemoryCarveout, 100));
          configured = smem;
        }
        // Persistent: no more blocks than fit at once (a second round would run alone).
        int fit = 0;
        TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, gemv_gq_bulk_kernel<kBits>,
                                                                         kBulkThreads, smem));
        const unsigned grid = static_cast<unsigned>(std::min<int64_t>(chunks, int64_t{std::max(fit, 1)} * sm_count));
        gemv_gq_bulk_kernel<kBits><<<grid, kBulkThreads, smem, s>>>(x, cols, l0.code_row_bytes, rpc, chunks, stages,
                                                                     gs, shift, bt);
      };
      if (w0.dtype == DType::W8G)
        bulk.template operator()<8>();
      else
        bulk.template operator()<4>();
      TESSERA_CUDA_CHECK_LAUNCH("gemv_gq_bulk");
      return;
    }
  }
  const unsigned grid = blocks_for((total + kRowsPerWarp - 1) / kRowsPerWarp, kWarps);
  auto go = [&]<int kBits>() {
    auto kernel = n_rows == 1 ? (vec_x ? gemv_gq_kernel<kBits, 1, true> : gemv_gq_kernel<kBits, 1, false>)
                              : (vec_x ? gemv_gq_kernel<kBits, kGemvMaxRows, true>
                                       : gemv_gq_kernel<kBits, kGemvMaxRows, false>);
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
