// Products of 2–8 input rows with 16-bit weights on the tensor cores: y = x16 · Wᵀ with the
// weights streamed once (gemv_tc16.h).
//
// Why not cuBLASLt: at n = 2–8 its GEMMs read the weights at about 64 % of the copy rate on an
// H100 (docs/benchmarks/spec-decode.md: a 5-row verification step cost 1.6 one-row steps).
// The product is a stream of weights: the arithmetic (one m16n8k16 per 16×16 weights) is
// nothing; what matters is bytes in flight on every SM.
//
// Layout: the weight rows of every target, concatenated, are cut into chunks of 16 rows (one
// m16 tile; the last chunk of a target may be shorter). A persistent grid (one block per SM)
// walks contiguous runs of chunks; each chunk is read in tiles of kTileCols columns: the
// tile's 16 weight row segments and n input row segments are copied to shared memory by the
// bulk copy engine (one cp.async.bulk per row segment, issued by the lanes of warp 0,
// completing on the stage's mbarrier), as many stages in flight as shared memory holds
// (7–11: ~130–180 KB per SM; the LSU's cp.async with 3 tiles in flight reached only ~55 % of
// the copy rate). Inside a tile the 8 warps split the columns (64 each: 4 k16 steps), so each
// input and weight byte is read from shared memory once; each warp keeps one 16 × 8 f32
// accumulator tile across the chunk's tiles, and at the chunk's end the 8 partial tiles are
// summed in warp order through shared memory — a fixed order, so graph and eager runs give
// the same bits. B's columns n .. 7 repeat input row n - 1: they only feed accumulator
// columns that are never written.
//
// Rows are padded by 16 bytes in shared memory so that the 8 rows of each ldmatrix fall in
// distinct banks. Weight copies carry an L2 evict-first policy (read once a step).
// Programmatic dependent launch: the first stages' weight copies go out before pdl_wait(),
// the input (the previous kernel's output) after it.
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/gemv_tc16.h"
#include "backend/cuda/mma_common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkRows = 16;                 // weight rows per chunk: one m16 tile
constexpr int kTileCols = 512;                 // columns per pipeline stage
constexpr int kWarpCols = kTileCols / kWarps;  // 64: 4 k16 steps per warp and tile
constexpr int kLd = kTileCols + 8;             // shared row stride in halves (16-byte pad)
constexpr int kWTileBytes = kChunkRows * kLd * 2;
constexpr int kMaxStages = 12;
constexpr size_t kRedBytes = size_t{kWarps} * kChunkRows * 8 * sizeof(float);
constexpr size_t kSmemLimit = 227 << 10;  // dynamic shared memory one block may take on sm_90

// Shared memory of a stage with n input rows (128-byte aligned stages).
__host__ __device__ constexpr size_t stage_bytes(int n_rows) {
  return (size_t{kWTileBytes} + static_cast<size_t>(n_rows) * kLd * 2 + 127) / 128 * 128;
}
int stages_for(int n_rows) {
  return static_cast<int>(
      std::min<size_t>(kMaxStages, (kSmemLimit - kRedBytes - kMaxStages * 8) / stage_bytes(n_rows)));
}

struct Tc16Targets {
  const uint16_t* w[kGemvMaxTargets];
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int64_t rows[kGemvMaxTargets];
  int64_t chunk_end[kGemvMaxTargets];  // cumulative chunks: target i owns [chunk_end[i-1], chunk_end[i])
  int n;
};

// Global → shared by the copy engine, completing on `bar`, without a cache hint (the input
// rows are read by every block: they should stay in L2).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// d += a · b, m16n8k16, f32 accumulators; BF16 picks the operand type.
template <bool BF16>
__device__ __forceinline__ void mma16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    mma_f16(d, a, b0, b1);
  }
}

// x16 [n_rows, cols] dense; every target `cols` wide; cols a multiple of 32.
template <bool BF16>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_tc16_kernel(const uint16_t* __restrict__ x16, int n_rows, int cols, int64_t n_chunks, int stages,
                     const __grid_constant__ Tc16Targets tg) {
  extern __shared__ __align__(128) uint8_t smem[];
  const size_t sbytes = stage_bytes(n_rows);
  auto* bars = reinterpret_cast<uint64_t*>(smem + stages * sbytes);
  auto* red = reinterpret_cast<float*>(bars + kMaxStages);  // [kWarps][16][8]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_kt = (cols + kTileCols - 1) / kTileCols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * n_chunks / gridDim.x;
  const int64_t c1 = static_cast<int64_t>(blockIdx.x + 1) * n_chunks / gridDim.x;
  const int64_t n_tiles = (c1 - c0) * n_kt;

  // Target, first row and rows of a chunk.
  auto locate = [&](int64_t chunk, int& ti, int64_t& row0, int& nrows) {
    ti = 0;
    while (ti < tg.n - 1 && chunk >= tg.chunk_end[ti]) ++ti;
    row0 = (chunk - (ti ? tg.chunk_end[ti - 1] : 0)) * kChunkRows;
    nrows = static_cast<int>(min(int64_t{kChunkRows}, tg.rows[ti] - row0));
  };
  auto tile_width = [&](int kt) { return min(kTileCols, cols - kt * kTileCols); };
  auto stage_w = [&](int stage) { return reinterpret_cast<uint16_t*>(smem + stage * sbytes); };
  // Warp 0 only. Weights (and the expected bytes of the whole stage) of tile t into `stage`.
  auto issue_w = [&](int64_t t, int stage) {
    int ti, nrows;
    int64_t row0;
    locate(c0 + t / n_kt, ti, row0, nrows);
    const int kt = static_cast<int>(t % n_kt), k0 = kt * kTileCols;
    const uint32_t seg = static_cast<uint32_t>(tile_width(kt)) * 2;
    if (lane == 0) mbar_expect_tx(&bars[stage], seg * static_cast<uint32_t>(nrows + n_rows));
    __syncwarp();
    if (lane < nrows)
      bulk_copy_hint(stage_w(stage) + lane * kLd, tg.w[ti] + (row0 + lane) * cols + k0, seg, &bars[stage],
                     l2_policy_evict_first());
  };
  auto issue_x = [&](int64_t t, int stage) {
    const int kt = static_cast<int>(t % n_kt), k0 = kt * kTileCols;
    const uint32_t seg = static_cast<uint32_t>(tile_width(kt)) * 2;
    if (lane < n_rows)
      bulk_copy(stage_w(stage) + kWTileBytes / 2 + lane * kLd, x16 + static_cast<int64_t>(lane) * cols + k0, seg,
                &bars[stage]);
  };

  if (tid == 0) {
    for (int st = 0; st < stages; ++st) mbar_init(&bars[st], 1);
    mbar_fence_init();
  }
  __syncthreads();
  // Prologue: every stage's weights before the wait, their input rows after it.
  const int first = static_cast<int>(min(int64_t{stages}, n_tiles));
  if (warp == 0)
    for (int st = 0; st < first; ++st) issue_w(st, st);
  pdl_wait();  // x16 is the previous kernel's output
  pdl_trigger();
  if (warp == 0)
    for (int st = 0; st < first; ++st) issue_x(st, st);

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // rows g, g (n 2q, 2q+1), then rows g + 8
  for (int64_t t = 0; t < n_tiles; ++t) {
    const int stage = static_cast<int>(t % stages);
    mbar_wait(&bars[stage], static_cast<uint32_t>((t / stages) & 1));
    const int kt = static_cast<int>(t % n_kt);
    const uint16_t* ws = stage_w(stage);
    const uint16_t* xs = ws + kWTileBytes / 2;
    const int w_begin = warp * kWarpCols, w_end = min(w_begin + kWarpCols, tile_width(kt));
    // 32 columns per pass: B (input) of two k16 steps by one ldmatrix.x4, A (weights) per step.
    // The stage holds n_rows input rows: B's columns n_rows .. 7 repeat the last one (their
    // sums are never written; pointing past the rows would leave the last stage's space).
    const uint16_t* xrow = xs + min(lane & 7, n_rows - 1) * kLd;
    for (int k = w_begin; k < w_end; k += 32) {
      uint32_t b[4];
      ldmatrix_x4(smem_addr(xrow + k + (lane >> 3) * 8), b[0], b[1], b[2], b[3]);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t a[4];
        ldmatrix_x4(smem_addr(ws + ((lane & 7) + ((lane >> 3) & 1) * 8) * kLd + k + s * 16 + (lane >> 4) * 8), a[0],
                    a[1], a[2], a[3]);
        mma16<BF16>(acc, a, b[2 * s], b[2 * s + 1]);
      }
    }

    if (kt == n_kt - 1) {  // the chunk is complete: the warps' partial tiles, summed in order
      const int g = lane >> 2, q = lane & 3;
      float* mine = red + warp * kChunkRows * 8;
      mine[g * 8 + 2 * q] = acc[0];
      mine[g * 8 + 2 * q + 1] = acc[1];
      mine[(g + 8) * 8 + 2 * q] = acc[2];
      mine[(g + 8) * 8 + 2 * q + 1] = acc[3];
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      __syncthreads();
      if (tid < kChunkRows * 8) {
        const int row = tid >> 3, n = tid & 7;
        int ti, nrows;
        int64_t row0;
        locate(c0 + t / n_kt, ti, row0, nrows);
        if (n < n_rows && row < nrows) {
          float sum = 0.0f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum += red[w * kChunkRows * 8 + tid];
          tg.y[ti][n * tg.ldy[ti] + row0 + row] = sum;
        }
      }
    }
    __syncthreads();  // every warp is done with the stage (and with red)
    if (warp == 0 && t + stages < n_tiles) {
      issue_w(t + stages, stage);
      issue_x(t + stages, stage);
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <bool BF16>
void launch_typed(unsigned grid, cudaStream_t s, const uint16_t* x16, int n_rows, int cols, int64_t chunks,
                  const Tc16Targets& tg) {
  const int stages = stages_for(n_rows);
  const size_t smem = stages * stage_bytes(n_rows) + kMaxStages * sizeof(uint64_t) + kRedBytes;
  static size_t configured = 0;  // the attribute is per function: once per instantiation, raised as needed
  if (smem > configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemv_tc16_kernel<BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
    configured = smem;
  }
  launch_pdl(gemv_tc16_kernel<BF16>, dim3(grid), dim3(kThreads), smem, s, x16, n_rows, cols, chunks, stages, tg);
}

}  // namespace

bool launch_gemv_tc16(bool bf16, const uint16_t* x16, int n_rows, int64_t cols, const GemvTarget* targets,
                      int n_targets, int sm_count, cudaStream_t s) {
  if (n_rows < 2 || n_rows > kGemvTc16MaxRows || n_targets < 1 || n_targets > kGemvMaxTargets || cols % 32 != 0 ||
      cols > (int64_t{1} << 30) || !aligned16(x16))
    return false;
  Tc16Targets tg{};
  tg.n = n_targets;
  int64_t chunks = 0;
  for (int i = 0; i < n_targets; ++i) {
    if (!aligned16(targets[i].w) || targets[i].rows <= 0) return false;
    tg.w[i] = static_cast<const uint16_t*>(targets[i].w);
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    tg.rows[i] = targets[i].rows;
    chunks += (targets[i].rows + kChunkRows - 1) / kChunkRows;
    tg.chunk_end[i] = chunks;
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(chunks, std::max(1, sm_count)));
  if (bf16)
    launch_typed<true>(grid, s, x16, n_rows, static_cast<int>(cols), chunks, tg);
  else
    launch_typed<false>(grid, s, x16, n_rows, static_cast<int>(cols), chunks, tg);
  TESSERA_CUDA_CHECK_LAUNCH("gemv_tc16");
  return true;
}

}  // namespace tessera::cuda
