// Batch-1 matrix-vector products for 16-bit weights (bf16, f16) and FP8W (E4M3 codes, the
// row's f32 scale applied to the finished sum), streamed through shared memory by the bulk
// copy engine: y[r] = x · W[r, :].
//
// Why: decode at batch 1 reads every weight once per token, so the product is a pure
// stream and its speed is bytes in flight. The warp-per-row kernel (gemv.cu) keeps each
// lane's few loads in flight only while its warp lives (a 4,096-wide row is 16 steps), and
// the grid's waves and tail leave the short matrices well under the copy rate. Here a
// persistent grid (two blocks per SM) walks contiguous chunks of rows (1-4 rows, 8-32 KB),
// and one thread keeps `stages` chunks in flight with cp.async.bulk completing on mbarriers;
// the block's 256 threads read each landed chunk from shared memory, with x held in
// registers for the whole launch (thread t owns columns 8t + 2048j).
//
// Programmatic dependent launch: the first chunks' copies are issued before pdl_wait() (the
// weights do not depend on the kernel before), so they overlap its tail; x is read after.
// With a normed input only 2 of the 3 stages go out before the wait, the third right after
// x's and the residual's loads, which would otherwise queue behind it.
// With `up`, the input is silu(x) * up computed while loading it (the FFN's down
// projection with SwiGLU fused, the same arithmetic as swiglu.cu). With the norm inputs, its
// weights are read before the wait too. Paired targets (the FFN's gate and up) put a row of
// each in every chunk, so the block that sums both writes silu(gate) * up as well: the down
// product after it then reads one f32 vector per block instead of two (at 14,336 wide that
// read, ~5 µs before its first chunk, was the largest gap of a layer).
//
// Sums: per thread over its columns in order, a warp butterfly, then the 8 warps' sums in
// order: a fixed order, so graph and eager runs give the same bits.
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_tuning.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/probe.cuh"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {
TESSERA_PROBE_TU(gemv)

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSweep = kThreads * 8;  // columns one pass of the block covers
constexpr int kMaxSweeps = 8;         // cols <= 16384
constexpr int kMaxRowsPerChunk = 4;
constexpr size_t kSmemPerSm = 220 << 10;  // what the blocks of one SM may take together

struct BulkTargets {
  const uint8_t* w[kGemvMaxTargets];
  const float* scale[kGemvMaxTargets];  // FP8W: f32 per row, applied to each finished sum
  float* y[kGemvMaxTargets];
  int64_t chunk_end[kGemvMaxTargets];  // cumulative chunks: target i owns [chunk_end[i-1], chunk_end[i])
  int n;
  // Paired (the FFN's gate and up with SwiGLU after them): n is 1, chunk c holds rows
  // [c·h, c·h + h) of w[0] and then the same rows of w[1] (h = rows per chunk / 2); their
  // products go to y[0] and y[1], and silu(y[0]) · y[1] to swiglu_out.
  float* swiglu_out;
};

// How the input row is formed (GemvInput).
enum class Input { kPlain, kSwiglu, kAddNorm };

// NS: sweeps of kSweep columns (cols <= NS * kSweep); IN: what the input row is.
template <DType T, int NS, Input IN>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_bulk_kernel(const __grid_constant__ GemvInput in, int cols, int rows_per_chunk, int64_t n_chunks, int stages,
                     int prewait, const __grid_constant__ BulkTargets tg) {
  TESSERA_PROBE_DECL;
  TESSERA_PROBE_MARK(0);
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kElem = T == DType::FP8W ? 1 : 2;  // bytes per weight
  const uint32_t chunk_bytes = static_cast<uint32_t>(rows_per_chunk) * cols * kElem;
  const uint32_t stage_stride = (chunk_bytes + 127) / 128 * 128;
  auto* bars = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(stages) * stage_stride);
  auto* red = reinterpret_cast<float*>(bars + stages);  // [2][kWarps][kMaxRowsPerChunk]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * n_chunks / gridDim.x;
  const int64_t c1 = static_cast<int64_t>(blockIdx.x + 1) * n_chunks / gridDim.x;

  auto target_of = [&](int64_t chunk, int& ti) {
    ti = 0;
    while (ti < tg.n - 1 && chunk >= tg.chunk_end[ti]) ++ti;
    return chunk - (ti ? tg.chunk_end[ti - 1] : 0);  // chunk index inside target ti
  };
  // The weight copies marked evict_first in L2: read once a step, they do not push out the
  // activations and the KV cache.
  const uint64_t policy = tid == 0 ? l2_policy_evict_first() : 0;
  auto issue = [&](int64_t chunk, int stage) {
    int ti;
    const int64_t local = target_of(chunk, ti);
    mbar_expect_tx(&bars[stage], chunk_bytes);
    uint8_t* dst = smem + static_cast<size_t>(stage) * stage_stride;
    auto copy = [&](uint8_t* to, const uint8_t* from, uint32_t bytes) {
      bulk_copy_hint(to, from, bytes, &bars[stage], policy);
    };
    if (tg.swiglu_out) {
      const uint32_t half = chunk_bytes / 2;
      copy(dst, tg.w[0] + local * half, half);
      copy(dst + half, tg.w[1] + local * half, half);
    } else {
      copy(dst, tg.w[ti] + local * chunk_bytes, chunk_bytes);
    }
  };

  if (tid == 0) {
    for (int st = 0; st < stages; ++st) mbar_init(&bars[st], 1);
    mbar_fence_init();
  }
  __syncthreads();
  // Stages [0, prewait) go out now, the rest once the input's loads are issued: fewer copies
  // for those loads to queue behind.
  if (tid == 0)
    for (int st = 0; st < prewait && c0 + st < c1; ++st) issue(c0 + st, st);
  auto issue_held = [&]() {
    if (tid == 0)
      for (int st = prewait; st < stages && c0 + st < c1; ++st) issue(c0 + st, st);
  };

  // The norm's weights are no kernel's output: read while the kernel before still runs.
  float gw[IN == Input::kAddNorm ? NS : 1][8];
  if constexpr (IN == Input::kAddNorm) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int e = (j * kThreads + tid) * 8;
      if (e < cols) {
        const float4 a = *reinterpret_cast<const float4*>(in.norm_w + e),
                     b = *reinterpret_cast<const float4*>(in.norm_w + e + 4);
        gw[j][0] = a.x, gw[j][1] = a.y, gw[j][2] = a.z, gw[j][3] = a.w;
        gw[j][4] = b.x, gw[j][5] = b.y, gw[j][6] = b.z, gw[j][7] = b.w;
      }
    }
  }
  pdl_wait();  // x is the previous kernel's output
  TESSERA_PROBE_MARK(1);
  // The input's raw values first, every load in flight together, then what is formed from
  // them. Written sweep by sweep, with block 0's x_out stores (which the compiler cannot tell
  // from x) inside the loop, the second sweep's loads came after the first sweep's adds and
  // stores in the SASS: a second round trip to L2 per normed product (batch-1 decode 256 ->
  // 261 tok/s, H200, same call).
  float xr[NS][8], r2[IN == Input::kPlain ? 1 : NS][8];  // x; the residual or up
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    const int e = (j * kThreads + tid) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) xr[j][k] = 0.0f;
    if (e < cols) {
      const float4 a = *reinterpret_cast<const float4*>(in.x + e), b = *reinterpret_cast<const float4*>(in.x + e + 4);
      xr[j][0] = a.x, xr[j][1] = a.y, xr[j][2] = a.z, xr[j][3] = a.w;
      xr[j][4] = b.x, xr[j][5] = b.y, xr[j][6] = b.z, xr[j][7] = b.w;
      if constexpr (IN != Input::kPlain) {
        const float* other = IN == Input::kSwiglu ? in.up : in.residual;
        const float4 c = *reinterpret_cast<const float4*>(other + e),
                     d = *reinterpret_cast<const float4*>(other + e + 4);
        r2[j][0] = c.x, r2[j][1] = c.y, r2[j][2] = c.z, r2[j][3] = c.w;
        r2[j][4] = d.x, r2[j][5] = d.y, r2[j][6] = d.z, r2[j][7] = d.w;
      }
    }
  }
  issue_held();
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    const int e = (j * kThreads + tid) * 8;
    if (e < cols) {
      if constexpr (IN == Input::kSwiglu) {
#pragma unroll
        for (int k = 0; k < 8; ++k) xr[j][k] = silu_times(xr[j][k], r2[j][k]);
      }
      if constexpr (IN == Input::kAddNorm) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          xr[j][k] += r2[j][k];
          ss = fmaf(xr[j][k], xr[j][k], ss);
        }
        if (blockIdx.x == 0) {
          *reinterpret_cast<float4*>(in.x_out + e) = make_float4(xr[j][0], xr[j][1], xr[j][2], xr[j][3]);
          *reinterpret_cast<float4*>(in.x_out + e + 4) = make_float4(xr[j][4], xr[j][5], xr[j][6], xr[j][7]);
        }
      }
    }
  }
  if constexpr (IN == Input::kAddNorm) {
    // Every block forms the whole row's norm itself (16 KB from L2 at 4,096 wide): no kernel
    // in front of the product, and x_out (written by block 0) is read by nobody here.
    const float inv = rsqrtf(block_sum(ss) / static_cast<float>(cols) + in.eps);
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int e = (j * kThreads + tid) * 8;
      if (e < cols) {
#pragma unroll
        for (int k = 0; k < 8; ++k) xr[j][k] = xr[j][k] * inv * gw[j][k];
      }
    }
  }
  pdl_trigger();
  TESSERA_PROBE_MARK(2);

  for (int64_t c = c0; c < c1; ++c) {
    const int64_t i = c - c0;
    const int stage = static_cast<int>(i % stages);
    mbar_wait(&bars[stage], static_cast<uint32_t>((i / stages) & 1));
    const uint8_t* chunk = smem + static_cast<size_t>(stage) * stage_stride;
    float* red_i = red + (i & 1) * kWarps * kMaxRowsPerChunk;
    for (int r = 0; r < rows_per_chunk; ++r) {
      const uint8_t* row = chunk + static_cast<size_t>(r) * cols * kElem;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        const int e = (j * kThreads + tid) * 8;
        if (e < cols) {
          float w8[8];
          decode8<T>(row, e, w8);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc = fmaf(w8[k], xr[j][k], acc);
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) red_i[warp * kMaxRowsPerChunk + r] = acc;
    }
    __syncthreads();  // the stage is read by every thread; red_i is complete
    if (tid == 0 && c + stages < c1) issue(c + stages, stage);
    if (tg.swiglu_out) {
      const int h = rows_per_chunk / 2;
      if (tid < h) {
        float g = 0.0f, u = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          g += red_i[w * kMaxRowsPerChunk + tid];
          u += red_i[w * kMaxRowsPerChunk + h + tid];
        }
        const int64_t row = c * h + tid;
        if constexpr (T == DType::FP8W) {
          g *= tg.scale[0][row];
          u *= tg.scale[1][row];
        }
        tg.y[0][row] = g;
        tg.y[1][row] = u;
        tg.swiglu_out[row] = silu_times(g, u);  // swiglu.cu's arithmetic
      }
    } else if (tid < rows_per_chunk) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red_i[w * kMaxRowsPerChunk + tid];
      int ti;
      const int64_t local = target_of(c, ti);
      if constexpr (T == DType::FP8W) sum *= tg.scale[ti][local * rows_per_chunk + tid];
      tg.y[ti][local * rows_per_chunk + tid] = sum;
    }
  }
  TESSERA_PROBE_MARK(3);  // start, input wait over, input read, end; tag: input kind and width
  TESSERA_PROBE_PUT(gemv, 1000000u * static_cast<uint32_t>(IN) + cols, static_cast<uint32_t>(n_chunks));
}

// Ring stages issued before the PDL wait: with a normed input (the Q|K|V and gate|up
// products and the output head: x and the residual read after the wait) fewer, so the
// input's loads queue behind fewer copies; with a plain one (O, down) all of them.
int prewait_stages(bool normed) {
  return normed ? CudaTuning::kGemvNormPrewaitStages : CudaTuning::kGemvPlainPrewaitStages;
}

template <DType T, Input IN>
void launch_typed(int ns, const GemvInput& in, int cols, int rpc, int64_t n_chunks, int stages, int prewait,
                  unsigned grid, size_t smem, const BulkTargets& tg, cudaStream_t s) {
  auto go = [&]<int NS>() {
    static size_t configured = 0;  // the attribute is per function
    if (smem > configured) {
      TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemv_bulk_kernel<T, NS, IN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
      configured = smem;
    }
    launch_pdl(gemv_bulk_kernel<T, NS, IN>, dim3(grid), dim3(kThreads), smem, s, in, cols, rpc, n_chunks, stages,
               prewait, tg);
  };
  switch (ns) {
    case 1:
      go.template operator()<1>();
      break;
    case 2:
      go.template operator()<2>();
      break;
    case 3:
      go.template operator()<3>();
      break;
    case 4:
      go.template operator()<4>();
      break;
    case 5:
      go.template operator()<5>();
      break;
    case 6:
      go.template operator()<6>();
      break;
    case 7:
      go.template operator()<7>();
      break;
    default:
      go.template operator()<8>();
      break;
  }
}

// 16-byte loads of x and bulk copies of whole rows need 16-byte aligned pointers.
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_bulk_applies(DType type, int64_t cols, const GemvInput& in) {
  const bool norm = in.residual || in.norm_w || in.x_out;
  if (norm && (!in.residual || !in.norm_w || !in.x_out || in.up || !aligned(in.residual) || !aligned(in.norm_w) ||
               !aligned(in.x_out)))
    return false;
  // FP8W rows are contiguous (no padding) when the width is a multiple of 16.
  const bool typed = type == DType::BF16 || type == DType::F16 || (type == DType::FP8W && cols % 16 == 0);
  return typed && cols % 8 == 0 && cols <= int64_t{kSweep} * kMaxSweeps && aligned(in.x) && (!in.up || aligned(in.up));
}

bool launch_gemv_bulk(DType type, const GemvInput& in, int64_t cols, const GemvTarget* targets, int n_targets,
                      int sm_count, cudaStream_t s, float* swiglu_out) {
  if (!gemv_bulk_applies(type, cols, in) || n_targets < 1 || n_targets > kGemvMaxTargets) return false;
  const bool paired = swiglu_out != nullptr;
  if (paired && (n_targets != 2 || targets[0].rows != targets[1].rows)) return false;
  const size_t row_bytes = static_cast<size_t>(cols) * (type == DType::FP8W ? 1 : 2);
  int64_t total_rows = 0;
  for (int i = 0; i < n_targets; ++i) {
    if (!aligned(targets[i].w) || (type == DType::FP8W && !targets[i].scale)) return false;
    total_rows += targets[i].rows;
  }
  // Blocks per SM from the shared memory one takes (stages of chunks up to the budget).
  const size_t budget = CudaTuning::kGemvBulkRingBytes;
  const int per_sm = std::max<int>(1, static_cast<int>(kSmemPerSm / (budget + 2048)));
  // Rows per chunk: as many as fit the chunk budget while every target splits into whole
  // chunks and each block of the grid still gets a few (balance).
  int rpc = kMaxRowsPerChunk;
  // Paired: a chunk takes rpc / 2 rows of each target.
  auto fits = [&](int r) {
    if (static_cast<size_t>(r) * row_bytes > CudaTuning::kGemvBulkChunkBytes ||
        total_rows / r < int64_t{CudaTuning::kGemvBulkMinChunksPerBlock} * per_sm * sm_count)
      return false;
    for (int i = 0; i < n_targets; ++i)
      if (targets[i].rows % (paired ? r / 2 : r) != 0) return false;
    return true;
  };
  while (rpc > 1 && !fits(rpc)) rpc /= 2;
  if (paired && rpc < 2) return false;
  const size_t chunk_bytes = static_cast<size_t>(rpc) * row_bytes;
  if (chunk_bytes > budget / 2) return false;  // at least two stages in flight
  BulkTargets tg{};
  tg.n = paired ? 1 : n_targets;
  tg.swiglu_out = swiglu_out;
  int64_t chunks = 0;
  for (int i = 0; i < n_targets; ++i) {
    tg.w[i] = static_cast<const uint8_t*>(targets[i].w);
    tg.scale[i] = targets[i].scale;
    tg.y[i] = targets[i].y;
    if (!paired || i == 0) chunks += targets[i].rows / (paired ? rpc / 2 : rpc);
    tg.chunk_end[i] = chunks;
  }
  const size_t stage_stride = (chunk_bytes + 127) / 128 * 128;
  const int stages = static_cast<int>(std::min<size_t>(8, budget / stage_stride));
  const size_t smem = stages * stage_stride + stages * sizeof(uint64_t) + 2 * kWarps * kMaxRowsPerChunk * sizeof(float);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(chunks, int64_t{per_sm} * sm_count));
  const int ns = static_cast<int>((cols + kSweep - 1) / kSweep);
  const int c = static_cast<int>(cols);
  const Input mode = in.up ? Input::kSwiglu : in.residual ? Input::kAddNorm : Input::kPlain;
  const int prewait = std::min(stages, prewait_stages(mode == Input::kAddNorm));
  auto typed = [&]<DType T>() {
    if (mode == Input::kSwiglu)
      launch_typed<T, Input::kSwiglu>(ns, in, c, rpc, chunks, stages, prewait, grid, smem, tg, s);
    else if (mode == Input::kAddNorm)
      launch_typed<T, Input::kAddNorm>(ns, in, c, rpc, chunks, stages, prewait, grid, smem, tg, s);
    else
      launch_typed<T, Input::kPlain>(ns, in, c, rpc, chunks, stages, prewait, grid, smem, tg, s);
  };
  if (type == DType::BF16)
    typed.template operator()<DType::BF16>();
  else if (type == DType::FP8W)
    typed.template operator()<DType::FP8W>();
  else
    typed.template operator()<DType::F16>();
  TESSERA_CUDA_CHECK_LAUNCH("gemv_bulk");
  return true;
}

}  // namespace tessera::cuda
