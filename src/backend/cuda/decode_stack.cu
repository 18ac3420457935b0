// The fused decoder stack for one token: every block of a Llama-family decoder at batch 1
// in one persistent kernel (Backend::decode_stack).
//
// Why: decode at batch 1 reads every weight once per token, so its floor is the weight
// bytes over the memory bandwidth. Op by op, each of a layer's ~8 kernels drains the GPU
// at its end and fills it again at the next one's start (the 4,096-row products ran at
// 2.0–2.8 TB/s for that reason), and the small kernels between the products add their
// own launch and latency. Here the weight stream never stops: in every block one producer
// thread walks the block's share of every product of every layer in order and keeps a
// ring of shared-memory buffers filled with cp.async.bulk (completing on mbarriers). It
// depends on nothing but free buffers, so while the consumer warps wait at a grid barrier
// or compute the attention, the next product's weights are already arriving.
//
// Grid: two blocks per SM (each 8 consumer warps + 1 producer warp, ~100 KB of ring), all
// resident (a cooperative launch). A layer, for the consumers:
//   x̂ = rms_norm(x) · attn_norm      every block, into registers (thread t owns columns
//                                     8t + 2048j, as gemv_bulk.cu)
//   qkv = Wqkv · x̂                    chunks of whole rows; each block a contiguous range
//   ── grid barrier ──
//   attention splits (RoPE, KV store, partials)      decode_stack_attention.cuh
//   ── grid barrier ──
//   att = merge of the splits
//   ── grid barrier ──
//   x += Wo · att                      (each row written by the one block that owns it)
//   ── grid barrier ──
//   x̂ = rms_norm(x) · ffn_norm;  act = silu(Wgate · x̂) · (Wup · x̂)   (a chunk holds rows
//                                     r.. of gate and the same rows of up)
//   ── grid barrier ──
//   x += Wdown · act
//   ── grid barrier (not after the last layer) ──
// Row sums: per thread over its columns in order, a warp butterfly, the 8 warps in order:
// the same order as gemv_bulk.cu, and fixed, so graph and eager runs give the same bits.
//
// A grid barrier is a counter (zeroed before the launch) that every block increments once
// per barrier; a block passes barrier k when it reads k × grid. Spins are bounded
// (bulk_copy.cuh: kSpinLimitNs) so a schedule bug traps instead of hanging the device.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/decode_stack.h"
#include "backend/cuda/decode_stack_attention.cuh"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {

namespace {

using stack::consumer_sync;
using stack::kConsumers;
using stack::kConsumerWarps;

constexpr int kThreads = kConsumers + 32;           // + the producer warp
constexpr int kSweep = kConsumers * 8;              // columns one pass of the consumers covers
constexpr int kMaxSweeps = kStackMaxCols / kSweep;  // 8
constexpr int kRedRows = 2 * kStackMaxChunkRows;    // partial row sums per warp and chunk
// Rows a thread sums at once: their loads and butterflies overlap; 4 spills at 112 registers.
constexpr int kRowsAtOnce = 2;

// Dynamic shared memory: barriers and scratch first, then the ring (128-byte aligned).
constexpr int kOffFull = 0;                                            // uint64 [kStackMaxSlots]
constexpr int kOffEmpty = kOffFull + 8 * kStackMaxSlots;               // uint64 [kStackMaxSlots]
constexpr int kOffRed = kOffEmpty + 8 * kStackMaxSlots;                // float [2][warps][kRedRows]
constexpr int kOffNorm = kOffRed + 4 * 2 * kConsumerWarps * kRedRows;  // float [warps] (64 B)
constexpr int kOffQs = kOffNorm + 64;                                  // float [kStackMaxGroupDims]
constexpr int kOffComb = kOffQs + 4 * kStackMaxGroupDims;              // float [warps][128 + 2]
constexpr int kOffResid = kOffComb + 4 * kConsumerWarps * (128 + 2);    // float [kMaxResid]
constexpr int kMaxResid = 256;  // residual rows of one block's share of O or down held in smem
constexpr int kOffRope = kOffResid + 4 * kMaxResid;                    // float [64][2]: cos, sin
constexpr int kHeader = (kOffRope + 4 * 128 + 127) / 128 * 128;

enum Product { kQkv = 0, kO = 1, kGu = 2, kDown = 3 };

// One product of one layer as the producer and the consumers walk it.
struct Prod {
  const uint8_t* w;
  size_t half_bytes;  // gate|up: from a gate row to the same up row (n_ff rows); else 0
  int row_bytes;
  int cols;
  int rpc;            // rows per chunk (gate|up: of each half)
  int n_chunks;
};

__device__ __forceinline__ Prod product(const StackParams& p, int layer, int which) {
  const StackLayer& L = p.layers[layer];
  Prod d;
  int rows;
  d.half_bytes = 0;
  switch (which) {
    case kQkv:
      d.w = static_cast<const uint8_t*>(L.wqkv);
      d.cols = p.n_embd;
      rows = p.q_dim + 2 * p.kv_dim;
      break;
    case kO:
      d.w = static_cast<const uint8_t*>(L.wo);
      d.cols = p.q_dim;
      rows = p.n_embd;
      break;
    case kGu:
      d.w = static_cast<const uint8_t*>(L.wgu);
      d.cols = p.n_embd;
      rows = p.n_ff;
      d.half_bytes = static_cast<size_t>(p.n_ff) * p.n_embd * 2;
      break;
    default:
      d.w = static_cast<const uint8_t*>(L.wdown);
      d.cols = p.n_ff;
      rows = p.n_embd;
  }
  d.row_bytes = d.cols * 2;
  d.rpc = p.rpc[which];
  d.n_chunks = rows / d.rpc;
  return d;
}

// This block's contiguous share [c0, c1) of n chunks.
__device__ __forceinline__ void block_range(int n, int& c0, int& c1) {
  c0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) * n / gridDim.x);
  c1 = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * n / gridDim.x);
}

// This block's chunks of the whole step in order (layer, product, chunk), skipping
// products where its share is empty.
struct ChunkCursor {
  Prod d;
  int layer = 0, which = -1, c = 0, c1 = 0;
  uint32_t part = 0;  // bytes of one part (gate|up chunks have two)

  __device__ __forceinline__ void start(const StackParams& p) { advance(p); }
  __device__ __forceinline__ bool done(const StackParams& p) const { return layer >= p.n_layers; }
  __device__ __forceinline__ void next(const StackParams& p) {
    if (++c >= c1) advance(p);
  }
  __device__ __forceinline__ const uint8_t* src() const { return d.w + static_cast<size_t>(c) * part; }
  __device__ __forceinline__ void advance(const StackParams& p) {
    for (;;) {
      if (++which == 4) {
        which = 0;
        ++layer;
      }
      if (layer >= p.n_layers) return;
      d = product(p, layer, which);
      block_range(d.n_chunks, c, c1);
      part = static_cast<uint32_t>(d.rpc) * d.row_bytes;
      if (c < c1) return;
    }
  }
};

// The producer (one thread): every chunk of this block, in the consumers' order, into the
// ring; p.l2_ahead chunks past the ring are prefetched into L2 first, so that while the
// ring is full (consumers at a barrier or in the attention) the memory keeps streaming.
__device__ void produce(const StackParams& p, uint8_t* ring, uint64_t* full, uint64_t* empty) {
  ChunkCursor cur, ahead;
  cur.start(p);
  ahead.start(p);
  uint32_t pf = 0;  // chunks `ahead` has passed
  for (uint32_t it = 0; !cur.done(p); cur.next(p), ++it) {
    while (p.l2_ahead > 0 && !ahead.done(p) && pf < it + p.n_slots + p.l2_ahead) {
      if (pf >= it + p.n_slots) {  // the ring's own chunks are copied directly
        prefetch_l2(ahead.src(), ahead.part);
        if (ahead.which == kGu) prefetch_l2(ahead.src() + ahead.d.half_bytes, ahead.part);
      }
      ahead.next(p);
      ++pf;
    }
    const int slot = static_cast<int>(it % p.n_slots);
    const uint32_t round = it / p.n_slots;
    if (round > 0) mbar_wait_bounded(&empty[slot], (round - 1) & 1);  // consumers released it
    uint8_t* dst = ring + static_cast<size_t>(slot) * p.slot_stride;
    const uint8_t* src = cur.src();
    if (cur.which == kGu) {
      mbar_expect_tx(&full[slot], 2 * cur.part);
      bulk_copy(dst, src, cur.part, &full[slot]);
      bulk_copy(dst + cur.part, src + cur.d.half_bytes, cur.part, &full[slot]);
    } else {
      mbar_expect_tx(&full[slot], cur.part);
      bulk_copy(dst, src, cur.part, &full[slot]);
    }
  }
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Every consumer thread of every block arrives; returns when all have. bar[0] counts
// arrivals (over the whole launch); the block that completes barrier `epoch` publishes it
// in bar[32] (another 128-byte line, so the polling does not slow the arrivals down).
__device__ void grid_sync(unsigned* bar, unsigned& epoch) {
  consumer_sync();  // this block's writes are done
  ++epoch;
  if (threadIdx.x == 0) {
    unsigned* flag = bar + 32;
    __threadfence();
    const unsigned arrived = atomicAdd(bar, 1u) + 1;
    if (arrived == epoch * gridDim.x) {
      __threadfence();
      st_release(flag, epoch);
    } else if (ld_acquire(flag) < epoch) {
      const uint64_t t0 = global_timer_ns();
      while (ld_acquire(flag) < epoch) {
        __nanosleep(32);
        if (global_timer_ns() - t0 > kSpinLimitNs) __trap();
      }
    }
    __threadfence();
  }
  consumer_sync();
}

// xr = rms_norm(x) · w for this thread's columns.
__device__ __forceinline__ void load_normed(const float* x, const float* w, int cols, float eps, float (&xr)[kMaxSweeps][8],
                            float* norm_red) {
  const int tid = threadIdx.x;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) {
    const int e = (j * kConsumers + tid) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) xr[j][k] = 0.0f;
    if (e < cols) {
      const float4 a = __ldcg(reinterpret_cast<const float4*>(x + e));
      const float4 b = __ldcg(reinterpret_cast<const float4*>(x + e + 4));
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        xr[j][k] = v[k];
        ss = fmaf(v[k], v[k], ss);
      }
    }
  }
  ss = warp_sum(ss);
  if ((tid & 31) == 0) norm_red[tid >> 5] = ss;
  consumer_sync();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kConsumerWarps; ++i) total += norm_red[i];
  const float inv = rsqrtf(total / static_cast<float>(cols) + eps);
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) {
    const int e = (j * kConsumers + tid) * 8;
    if (e < cols) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(w + e));
      const float4 b = __ldg(reinterpret_cast<const float4*>(w + e + 4));
      const float wv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) xr[j][k] = xr[j][k] * inv * wv[k];
    }
  }
}

// xr = src for this thread's columns (src written earlier in this launch: read from L2).
__device__ __forceinline__ void load_plain(const float* src, int cols, float (&xr)[kMaxSweeps][8]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) {
    const int e = (j * kConsumers + tid) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) xr[j][k] = 0.0f;
    if (e < cols) {
      const float4 a = __ldcg(reinterpret_cast<const float4*>(src + e));
      const float4 b = __ldcg(reinterpret_cast<const float4*>(src + e + 4));
      xr[j][0] = a.x; xr[j][1] = a.y; xr[j][2] = a.z; xr[j][3] = a.w;
      xr[j][4] = b.x; xr[j][5] = b.y; xr[j][6] = b.z; xr[j][7] = b.w;
    }
  }
}

// The consumers' side of one product: every chunk of this block's range as it lands.
// O and down add into the residual rows this block owns: those are read into `resid`
// (shared) before the first chunk, off the chunks' critical path.
template <DType T>
__device__ __forceinline__ void consume(const StackParams& p, const Prod& d, int which, const float (&xr)[kMaxSweeps][8],
                                        const uint8_t* ring, uint64_t* full, uint64_t* empty, float* red,
                                        float* resid, uint32_t& it) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int c0, c1;
  block_range(d.n_chunks, c0, c1);
  const int rows = which == kGu ? 2 * d.rpc : d.rpc;
  const int row0 = c0 * d.rpc;
  const bool adds = which == kO || which == kDown;
  const bool resid_in_smem = adds && (c1 - c0) * d.rpc <= kMaxResid;
  // Visible to the threads that use it after the first chunk's consumer_sync.
  if (resid_in_smem && tid < (c1 - c0) * d.rpc) resid[tid] = __ldcg(p.x + row0 + tid);
  for (int c = c0; c < c1; ++c, ++it) {
    const int slot = static_cast<int>(it % p.n_slots);
    mbar_wait_bounded(&full[slot], (it / p.n_slots) & 1);
    const uint8_t* chunk = ring + static_cast<size_t>(slot) * p.slot_stride;
    float* red_i = red + (it & 1) * kConsumerWarps * kRedRows;
    for (int r0 = 0; r0 < rows; r0 += kRowsAtOnce) {
      float acc[kRowsAtOnce] = {};
#pragma unroll
      for (int j = 0; j < kMaxSweeps; ++j) {
        const int e = (j * kConsumers + tid) * 8;
        if (e < d.cols) {
#pragma unroll
          for (int q = 0; q < kRowsAtOnce; ++q) {
            if (r0 + q < rows) {
              float w8[8];
              decode8<T>(chunk + static_cast<size_t>(r0 + q) * d.row_bytes, e, w8);
#pragma unroll
              for (int k = 0; k < 8; ++k) acc[q] = fmaf(w8[k], xr[j][k], acc[q]);
            }
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kRowsAtOnce; ++q) {
        const float s = warp_sum(acc[q]);
        if (lane == 0 && r0 + q < rows) red_i[warp * kRedRows + r0 + q] = s;
      }
    }
    consumer_sync();  // every warp is done with the buffer; red_i is complete
    if (tid == 0) mbar_arrive(&empty[slot]);
    if (tid < d.rpc) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) sum += red_i[w * kRedRows + tid];
      const int row = c * d.rpc + tid;
      if (which == kQkv) {
        __stcg(p.qkv + row, sum);
      } else if (which == kGu) {
        float up = 0.0f;
#pragma unroll
        for (int w = 0; w < kConsumerWarps; ++w) up += red_i[w * kRedRows + d.rpc + tid];
        __stcg(p.act + row, silu_times(sum, up));
      } else {  // the residual: this block owns the row
        __stcg(p.x + row, (resid_in_smem ? resid[row - row0] : __ldcg(p.x + row)) + sum);
      }
    }
  }
}

// TESSERA_CUDA_STACK_TIMING=1: SM cycles of each phase of each layer, added per block (a
// kernel of its own: the clocks' registers would make the fast one spill).
template <bool kTimed>
struct PhaseClock {
  unsigned long long* slot = nullptr;  // this block's [n_layers][kStackPhases], or nullptr
  long long last = 0;
  __device__ __forceinline__ void start(const StackParams& p) {
    if (kTimed && p.timing && threadIdx.x == 0) {
      slot = p.timing + static_cast<size_t>(blockIdx.x) * p.n_layers * kStackPhases;
      last = clock64();
    }
  }
  __device__ __forceinline__ void mark(int layer, int phase) {
    if (kTimed && slot) {
      const long long now = clock64();
      slot[layer * kStackPhases + phase] += static_cast<unsigned long long>(now - last);
      last = now;
    }
  }
};

template <DType T, int HD, bool kTimed>
__global__ void __maxnreg__(112) decode_stack_kernel(const __grid_constant__ StackParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  auto* full = reinterpret_cast<uint64_t*>(smem + kOffFull);
  auto* empty = reinterpret_cast<uint64_t*>(smem + kOffEmpty);
  auto* red = reinterpret_cast<float*>(smem + kOffRed);
  auto* norm_red = reinterpret_cast<float*>(smem + kOffNorm);
  auto* qs = reinterpret_cast<float*>(smem + kOffQs);
  auto* comb = reinterpret_cast<float*>(smem + kOffComb);
  auto* resid = reinterpret_cast<float*>(smem + kOffResid);
  auto* rope_cs = reinterpret_cast<float*>(smem + kOffRope);
  uint8_t* ring = smem + kHeader;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < p.n_slots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (tid >= kConsumers) {
    if (tid == kConsumers) produce(p, ring, full, empty);
    return;
  }
  uint32_t it = 0;
  unsigned epoch = 0;
  float xr[kMaxSweeps][8];
  const uint64_t t_start = kTimed && tid == 0 ? global_timer_ns() : 0;
  const long long c_start = kTimed ? clock64() : 0;
  PhaseClock<kTimed> clk;
  clk.start(p);
  stack::rope_table(p, rope_cs);  // read after the first layer's first consumer_sync
  for (int layer = 0; layer < p.n_layers; ++layer) {
    const StackLayer& L = p.layers[layer];
    stack::prefetch_attention_kv<HD>(p, layer);
    load_normed(p.x, L.attn_norm, p.n_embd, p.eps, xr, norm_red);
    consume<T>(p, product(p, layer, kQkv), kQkv, xr, ring, full, empty, red, resid, it);
    clk.mark(layer, 0);
    grid_sync(p.barrier, epoch);
    clk.mark(layer, 1);
    stack::attention_split_phase<HD>(p, layer, qs, comb, rope_cs);
    clk.mark(layer, 2);
    grid_sync(p.barrier, epoch);
    clk.mark(layer, 3);
    stack::attention_merge_phase<HD>(p);
    clk.mark(layer, 4);
    grid_sync(p.barrier, epoch);
    clk.mark(layer, 5);
    load_plain(p.att, p.q_dim, xr);
    consume<T>(p, product(p, layer, kO), kO, xr, ring, full, empty, red, resid, it);
    clk.mark(layer, 6);
    grid_sync(p.barrier, epoch);
    clk.mark(layer, 7);
    load_normed(p.x, L.ffn_norm, p.n_embd, p.eps, xr, norm_red);
    consume<T>(p, product(p, layer, kGu), kGu, xr, ring, full, empty, red, resid, it);
    clk.mark(layer, 8);
    grid_sync(p.barrier, epoch);
    clk.mark(layer, 9);
    load_plain(p.act, p.n_ff, xr);
    consume<T>(p, product(p, layer, kDown), kDown, xr, ring, full, empty, red, resid, it);
    clk.mark(layer, 10);
    if (layer + 1 < p.n_layers) grid_sync(p.barrier, epoch);
    clk.mark(layer, 11);
  }
  if (kTimed && p.timing_ns && tid == 0) {
    p.timing_ns[2 * blockIdx.x] += global_timer_ns() - t_start;
    p.timing_ns[2 * blockIdx.x + 1] += static_cast<unsigned long long>(clock64() - c_start);
  }
}

using StackKernel = void (*)(const StackParams);

template <bool kTimed>
StackKernel pick_timed(DType wtype, int head_dim) {
  if (wtype == DType::BF16)
    return head_dim == 64 ? decode_stack_kernel<DType::BF16, 64, kTimed> : decode_stack_kernel<DType::BF16, 128, kTimed>;
  return head_dim == 64 ? decode_stack_kernel<DType::F16, 64, kTimed> : decode_stack_kernel<DType::F16, 128, kTimed>;
}

StackKernel pick_kernel(DType wtype, int head_dim, bool timed) {
  return timed ? pick_timed<true>(wtype, head_dim) : pick_timed<false>(wtype, head_dim);
}

size_t env_kb(const char* name, size_t fallback) {
  const char* env = std::getenv(name);
  const long v = env ? std::atol(env) : 0;
  return v >= 8 && v <= 200 ? static_cast<size_t>(v) << 10 : fallback;
}

}  // namespace

bool plan_decode_stack(const StackShape& sh, int sm_count, StackParams& p, StackLaunch& launch) {
  if (sh.wtype != DType::BF16 && sh.wtype != DType::F16) return false;
  if (sh.head_dim != 64 && sh.head_dim != 128) return false;
  if (sh.n_layers < 1 || sh.n_layers > kStackMaxLayers || sh.n_kv <= 0 || sh.n_head % sh.n_kv != 0) return false;
  const int group = sh.n_head / sh.n_kv;
  if (group * sh.head_dim > kStackMaxGroupDims) return false;
  if (sh.rot_dim < 2 || sh.rot_dim % 2 != 0 || sh.rot_dim > sh.head_dim) return false;
  const int q_dim = sh.n_head * sh.head_dim, kv_dim = sh.n_kv * sh.head_dim;
  for (int cols : {sh.n_embd, q_dim, sh.n_ff})
    if (cols <= 0 || cols % 8 != 0 || cols > kStackMaxCols) return false;
  // Chunks of whole rows, up to 32 KB (TESSERA_CUDA_STACK_CHUNK_KB), never past a matrix.
  static const size_t chunk_target = env_kb("TESSERA_CUDA_STACK_CHUNK_KB", 32 << 10);
  auto rows_per_chunk = [&](int rows, int cols, int parts) {
    for (int r = kStackMaxChunkRows; r >= 1; r /= 2)
      if (rows % r == 0 && static_cast<size_t>(r) * cols * 2 * parts <= chunk_target) return r;
    return static_cast<size_t>(cols) * 2 * parts <= (64u << 10) ? 1 : 0;  // one row, past the target
  };
  p.rpc[kQkv] = rows_per_chunk(q_dim + 2 * kv_dim, sh.n_embd, 1);
  p.rpc[kO] = rows_per_chunk(sh.n_embd, q_dim, 1);
  p.rpc[kGu] = rows_per_chunk(sh.n_ff, sh.n_embd, 2);
  p.rpc[kDown] = rows_per_chunk(sh.n_embd, sh.n_ff, 1);
  if (!p.rpc[kQkv] || !p.rpc[kO] || !p.rpc[kGu] || !p.rpc[kDown]) return false;
  const size_t chunk_max = std::max({static_cast<size_t>(p.rpc[kQkv]) * sh.n_embd * 2,
                                     static_cast<size_t>(p.rpc[kO]) * q_dim * 2,
                                     static_cast<size_t>(p.rpc[kGu]) * sh.n_embd * 4,
                                     static_cast<size_t>(p.rpc[kDown]) * sh.n_ff * 2});
  p.slot_stride = static_cast<uint32_t>((chunk_max + 127) / 128 * 128);
  // Ring: 96 KB per block (TESSERA_CUDA_STACK_RING_KB), two blocks per SM.
  static const size_t ring = env_kb("TESSERA_CUDA_STACK_RING_KB", 96 << 10);
  p.n_slots = static_cast<int>(std::min<size_t>(kStackMaxSlots, ring / p.slot_stride));
  if (p.n_slots < 2) return false;
  launch.smem = kHeader + static_cast<size_t>(p.n_slots) * p.slot_stride;
  const StackKernel kernel = pick_kernel(sh.wtype, sh.head_dim, false);
  for (const StackKernel k : {kernel, pick_kernel(sh.wtype, sh.head_dim, true)})
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(launch.smem)));
  int per_sm = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, launch.smem));
  if (per_sm < 1) return false;
  launch.grid = std::min(per_sm, 2) * sm_count;
  p.n_layers = sh.n_layers;
  p.n_embd = sh.n_embd;
  p.q_dim = q_dim;
  p.kv_dim = kv_dim;
  p.n_ff = sh.n_ff;
  p.n_head = sh.n_head;
  p.n_kv = sh.n_kv;
  p.head_dim = sh.head_dim;
  p.group = group;
  p.rot_half = sh.rot_dim / 2;
  p.max_splits = std::max(1, launch.grid / sh.n_kv);
  // L2 prefetch past the ring: 2 chunks per block (TESSERA_CUDA_STACK_L2_AHEAD, 0 = none).
  static const int l2_ahead = [] {
    const char* env = std::getenv("TESSERA_CUDA_STACK_L2_AHEAD");
    const int v = env ? std::atoi(env) : 2;
    return v >= 0 && v <= 64 ? v : 2;
  }();
  p.l2_ahead = l2_ahead;
  launch.scratch_floats = static_cast<size_t>(q_dim + 2 * kv_dim) + q_dim + sh.n_ff +
                          static_cast<size_t>(sh.n_head) * p.max_splits * (sh.head_dim + 2);
  return true;
}

void launch_decode_stack(DType wtype, const StackParams& p, const StackLaunch& launch, cudaStream_t s) {
  TESSERA_CUDA_CHECK(cudaMemsetAsync(p.barrier, 0, kStackBarrierBytes, s));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(launch.grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = launch.smem;
  cfg.stream = s;
  // Every block must be resident at once (the grid barriers): a cooperative launch
  // guarantees it or fails. TESSERA_CUDA_STACK_COOP=0 launches plainly (the grid is what
  // the occupancy calculator says fits, and the kernel starts on an idle stream).
  static const bool coop = env_switch_on("TESSERA_CUDA_STACK_COOP");
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = coop ? 1 : 0;
  TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, pick_kernel(wtype, p.head_dim, p.timing != nullptr), p));
  TESSERA_CUDA_CHECK_LAUNCH("decode_stack");
}

}  // namespace tessera::cuda
