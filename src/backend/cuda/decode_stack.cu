// The fused decoder stack for one token: every block of a Llama-family decoder at batch 1
// in one persistent kernel (Backend::decode_stack).
//
// Why: decode at batch 1 reads every weight once per token, so its floor is the weight
// bytes over the memory bandwidth. Op by op, each of a layer's ~8 kernels drains the GPU
// at its end and fills it again at the next one's start (the 4,096-row products ran at
// 2.0–2.8 TB/s for that reason), and the small kernels between the products add their
// own launch and latency. Here every block walks one stream of chunks for the whole step —
// its share of every product of every layer, and between a layer's Q|K|V rows and its O
// rows the KV blocks of its attention splits — through a ring of shared-memory buffers
// filled by cp.async.bulk (completing on mbarriers). A buffer is refilled with the chunk
// `slots` places ahead as soon as the block is done with it, whatever product that chunk
// belongs to, so the next product's weights (or the attention's keys) are already arriving
// while the block waits at a grid barrier.
//
// Grid: two blocks of 256 threads per SM, ~100 KB of ring each, all resident (a cooperative
// launch). A layer:
//   x̂ = rms_norm(x) · attn_norm      every block, into registers (thread t owns columns
//                                     8t + 2048j, as gemv_bulk.cu)
//   qkv = Wqkv · x̂                    chunks of whole rows; each block a contiguous range
//   ── per-KV-head counters of the rows written (publish_qkv_rows) ──
//   attention splits (RoPE, KV store, partials; the last split of each KV head merges its
//   group into att)                    decode_stack_attention.cuh
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
// Grid barrier: one counter every block adds to and polls (grid_sync). Spins are bounded
// (bulk_copy.cuh: kSpinLimitNs): a schedule bug traps instead of hanging the device.
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
using stack::kWarps;

constexpr int kSweep = kConsumers * 8;              // columns one pass of the block covers
constexpr int kMaxSweeps = kStackMaxCols / kSweep;  // 8
constexpr int kRedRows = 2 * kStackMaxChunkRows;    // partial row sums per warp and chunk
constexpr int kRowsAtOnce = 2;                      // rows a thread sums at once (overlapped)
constexpr int kMaxResid = 256;  // residual rows of one block's share of O or down held in smem
constexpr int kLine = 32;       // unsigned per 128-byte line

// Dynamic shared memory: barriers and scratch first, then the ring (128-byte aligned).
constexpr int kOffFull = 0;                                     // uint64 [kStackMaxSlots]
constexpr int kOffRed = kOffFull + 8 * kStackMaxSlots;          // float [2][warps][kRedRows]
constexpr int kOffNorm = kOffRed + 4 * 2 * kWarps * kRedRows;   // float [warps] (+ flag)
constexpr int kOffQs = kOffNorm + 64;                           // float [kStackMaxGroupDims]
constexpr int kOffSc = kOffQs + 4 * kStackMaxGroupDims;         // float [kStackMaxScores]
constexpr int kOffState = kOffSc + 4 * kStackMaxScores;         // float [3][8]
constexpr int kOffKvNew = kOffState + 4 * 32;                   // float [2][128]
constexpr int kOffResid = kOffKvNew + 4 * 256;                  // float [kMaxResid]
constexpr int kOffRope = kOffResid + 4 * kMaxResid;             // float [64][2]: cos, sin
constexpr int kOffTable = kOffRope + 4 * 128;                   // int [kStackMaxTable]
constexpr int kOffCursor = kOffTable + 4 * kStackMaxTable;      // ChunkCursor (thread 0's)
constexpr int kOffIssuer = kOffCursor + 128;                    // IssuerState (thread 0's)
constexpr int kHeader = (kOffIssuer + 16 + 127) / 128 * 128;

// The stream's kinds of chunk, in a layer's order.
enum Kind { kQkv = 0, kAtt = 1, kO = 2, kGu = 3, kDown = 4 };

// One product of one layer as the issuer and the block walk it.
struct Prod {
  const uint8_t* w;
  size_t half_bytes;  // gate|up: from a gate row to the same up row (n_ff rows); else 0
  int row_bytes;
  int cols;
  int rpc;            // rows per chunk (gate|up: of each half)
  int n_chunks;
};

__device__ __forceinline__ int rpc_index(int kind) { return kind == kQkv ? 0 : kind - 1; }

__device__ __forceinline__ Prod product(const StackParams& p, int layer, int kind) {
  const StackLayer& L = p.layers[layer];
  Prod d;
  int rows;
  d.half_bytes = 0;
  switch (kind) {
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
  d.rpc = p.rpc[rpc_index(kind)];
  d.n_chunks = rows / d.rpc;
  return d;
}

// This block's contiguous share [c0, c1) of n chunks.
__device__ __forceinline__ void block_range(int n, int& c0, int& c1) {
  c0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) * n / gridDim.x);
  c1 = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * n / gridDim.x);
}

// The issuer's walk over this block's stream (thread 0; sizeof <= 128, kOffCursor): layer, kind, then the chunk (a
// product's range, or an attention item's KV chunks; kinds where the block has none are
// skipped). The block consumes in the same order.
struct ChunkCursor {
  Prod d;
  int layer = 0, kind = -1, c = 0, c1 = 0;
  int item = 0, n_items = 0;  // kAtt: item, and the items of the step
  uint32_t part = 0;          // bytes of one part (gate|up chunks have two)

  __device__ __forceinline__ bool done(const StackParams& p) const { return layer >= p.n_layers; }
  __device__ __forceinline__ void next(const StackParams& p, const stack::SplitPlan& sp) {
    if (++c < c1) return;
    if (kind == kAtt && next_item(sp, item + gridDim.x)) return;
    advance(p, sp);
  }
  // The first item from `from` with chunks; false when there is none.
  __device__ __forceinline__ bool next_item(const stack::SplitPlan& sp, int from) {
    for (item = from; item < n_items; item += gridDim.x) {
      c = 0;
      c1 = sp.chunks(item);
      if (c1 > 0) return true;
    }
    return false;
  }
  __device__ __forceinline__ void advance(const StackParams& p, const stack::SplitPlan& sp) {
    for (;;) {
      if (++kind == 5) {
        kind = 0;
        ++layer;
      }
      if (layer >= p.n_layers) return;
      if (kind == kAtt) {
        n_items = sp.items(p);
        if (next_item(sp, blockIdx.x)) return;
        continue;
      }
      d = product(p, layer, kind);
      block_range(d.n_chunks, c, c1);
      part = static_cast<uint32_t>(d.rpc) * d.row_bytes;
      if (c < c1) return;
    }
  }
};

static_assert(sizeof(ChunkCursor) <= 128, "kOffCursor reserves 128 bytes a cursor");

// Thread 0's L2 policy for the weight copies (shared memory, kOffIssuer: in registers every
// thread would carry it).
struct IssuerState {
  uint64_t policy = 0;
};
static_assert(sizeof(IssuerState) <= 16, "kOffIssuer reserves 16 bytes");
static_assert(kOffCursor % alignof(ChunkCursor) == 0 && kOffIssuer % alignof(IssuerState) == 0,
              "thread 0's cursor and state are aligned in shared memory");

// Thread 0 queues the cursor's chunk into `slot` (an mbarrier phase per fill).
template <int HD>
__device__ __forceinline__ void issue(const StackParams& p, const stack::SplitPlan& sp, const ChunkCursor& cur,
                                      const int* table, uint8_t* dst, uint64_t* bar, uint64_t policy) {
  if (cur.kind == kAtt) {
    const int h = cur.item / sp.n_splits;
    const int kc0 = sp.k0(cur.item) + cur.c * sp.kpc;
    const int n = min(sp.kpc, sp.k1(cur.item) - kc0);
    const int b0 = kc0 / p.block_size, nb = (n + p.block_size - 1) / p.block_size;
    const uint32_t blk_bytes = static_cast<uint32_t>(p.block_size) * HD * 2;
    const StackLayer& L = p.layers[cur.layer];
    mbar_expect_tx(bar, 2 * nb * blk_bytes);
    uint8_t* vdst = dst + static_cast<size_t>(sp.kpc) * HD * 2;
    for (int j = 0; j < nb; ++j) {
      const size_t off = (static_cast<size_t>(table[b0 + j]) * p.n_kv + h) * p.block_size * HD * 2;
      bulk_copy(dst + j * blk_bytes, static_cast<const uint8_t*>(L.k) + off, blk_bytes, bar);
      bulk_copy(vdst + j * blk_bytes, static_cast<const uint8_t*>(L.v) + off, blk_bytes, bar);
    }
    return;
  }
  const uint8_t* src = cur.d.w + static_cast<size_t>(cur.c) * cur.part;
  auto copy = [&](uint8_t* to, const uint8_t* from) {
    if (p.evict_first)
      bulk_copy_hint(to, from, cur.part, bar, policy);
    else
      bulk_copy(to, from, cur.part, bar);
  };
  if (cur.kind == kGu) {
    mbar_expect_tx(bar, 2 * cur.part);
    copy(dst, src);
    copy(dst + cur.part, src + cur.d.half_bytes);
  } else {
    mbar_expect_tx(bar, cur.part);
    copy(dst, src);
  }
}

// The block's ring: chunk `it` lives in slot it % n_slots; releasing it (after a block
// barrier: every thread is done with it) refills that slot with chunk it + n_slots. The
// issuer's cursor and state live in shared memory (thread 0 alone uses them; in registers
// every thread would carry them through the products).
template <int HD>
struct Ring {
  const StackParams& p;
  const stack::SplitPlan sp;
  uint8_t* base;
  uint64_t* full;
  const int* table;
  ChunkCursor* cur;  // the next chunk to issue
  IssuerState* st;
  uint32_t it = 0;   // the next chunk to consume

  __device__ __forceinline__ Ring(const StackParams& p_, const stack::SplitPlan& sp_, uint8_t* base_, uint64_t* full_,
                                  const int* table_, ChunkCursor* cur_, IssuerState* st_)
      : p(p_), sp(sp_), base(base_), full(full_), table(table_), cur(cur_), st(st_) {}
  __device__ __forceinline__ uint8_t* slot(uint32_t i) const { return base + static_cast<size_t>(i % p.n_slots) * p.slot_stride; }
  // Thread 0: the first n_slots chunks of the stream.
  __device__ __forceinline__ void start() {
    st->policy = p.evict_first ? l2_policy_evict_first() : 0;
    *cur = ChunkCursor();
    cur->advance(p, sp);
    for (uint32_t i = 0; i < static_cast<uint32_t>(p.n_slots) && !cur->done(p); ++i, cur->next(p, sp))
      issue<HD>(p, sp, *cur, table, slot(i), &full[i], st->policy);
  }
  __device__ __forceinline__ const uint8_t* wait() const {
    mbar_wait_bounded(&full[it % p.n_slots], (it / p.n_slots) & 1);
    return slot(it);
  }
  __device__ __forceinline__ void release() {
    consumer_sync();  // every thread is done with the buffer
    if (threadIdx.x == 0 && !cur->done(p)) {
      issue<HD>(p, sp, *cur, table, slot(it), &full[it % p.n_slots], st->policy);
      cur->next(p, sp);
    }
    ++it;
  }
};

// Every thread of every block arrives; returns when all have. Thread 0 adds one to the
// counter sync[0] (a reduction: no reply to wait for) and polls it until the whole grid has
// (epoch × grid). Measured faster than two levels of counters (groups of 16 blocks, then a
// top counter and a flag): 227 against 218 tok/s, the hops of a barrier being round trips
// through a loaded memory system.
__device__ void grid_sync(unsigned* sync, unsigned& epoch) {
  consumer_sync();  // this block's writes are done
  ++epoch;
  if (threadIdx.x == 0) {
    red_release_gpu_add(sync, 1);
    spin_until_at_least(sync, epoch * gridDim.x);
    __threadfence();
  }
  consumer_sync();
}

// Instead of a grid barrier between Q|K|V and the attention: the block counts the Q|K|V
// rows it wrote on each KV head's counter (its group's query rows, its key and value rows:
// (group + 2) · head_dim in all), and an attention item of head h waits for h's count alone
// (decode_stack_attention.cuh); blocks without an item go on to the barrier before O.
// Measured 227 → 230 tok/s (the mean wait before the attention 4.1 → 2.4 µs per layer).
__device__ void publish_qkv_rows(const StackParams& p, int layer, unsigned* head_ready) {
  consumer_sync();  // this block's rows are written
  if (threadIdx.x != 0) return;
  int c0, c1;
  block_range(product(p, layer, kQkv).n_chunks, c0, c1);
  const int r0 = c0 * p.rpc[0], r1 = c1 * p.rpc[0], hd = p.head_dim, gd = p.group * hd;
  auto overlap = [&](int a, int b) { return max(0, min(r1, b) - max(r0, a)); };
  for (int h = 0; h < p.n_kv; ++h) {
    const int n = overlap(h * gd, (h + 1) * gd) + overlap(p.q_dim + h * hd, p.q_dim + (h + 1) * hd) +
                  overlap(p.q_dim + p.kv_dim + h * hd, p.q_dim + p.kv_dim + (h + 1) * hd);
    if (n > 0) red_release_gpu_add(head_ready + layer * p.n_kv + h, static_cast<unsigned>(n));
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

// xr = rms_norm(x) · w for this thread's columns (columns past `cols` are 0 in xr and add
// nothing to the sum).
__device__ __forceinline__ void load_normed(const float* x, const float* w, int cols, float eps,
                                            float (&xr)[kMaxSweeps][8], float* norm_red) {
  const int tid = threadIdx.x;
  load_plain(x, cols, xr);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j)
#pragma unroll
    for (int k = 0; k < 8; ++k) ss = fmaf(xr[j][k], xr[j][k], ss);
  ss = warp_sum(ss);
  if ((tid & 31) == 0) norm_red[tid >> 5] = ss;
  consumer_sync();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) total += norm_red[i];
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

// This block's chunks of one product as they land. O and down add into the residual rows
// this block owns: those are read into `resid` (shared) before the first chunk, off the
// chunks' critical path.
template <DType T, int HD>
__device__ __forceinline__ void consume(const StackParams& p, int layer, int kind, const float (&xr)[kMaxSweeps][8],
                                        Ring<HD>& ring, float* red, float* resid) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const Prod d = product(p, layer, kind);
  int c0, c1;
  block_range(d.n_chunks, c0, c1);
  const int rows = kind == kGu ? 2 * d.rpc : d.rpc;
  const int row0 = c0 * d.rpc;
  const bool adds = kind == kO || kind == kDown;
  const bool resid_in_smem = adds && (c1 - c0) * d.rpc <= kMaxResid;
  // Read after the first chunk's barrier.
  if (resid_in_smem && tid < (c1 - c0) * d.rpc) resid[tid] = __ldcg(p.x + row0 + tid);
  for (int c = c0; c < c1; ++c) {
    const uint8_t* chunk = ring.wait();
    float* red_i = red + (ring.it & 1) * kWarps * kRedRows;
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
    ring.release();  // every warp is done with the buffer; red_i is complete
    if (tid < d.rpc) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red_i[w * kRedRows + tid];
      const int row = c * d.rpc + tid;
      if (kind == kQkv) {
        __stcg(p.qkv + row, sum);
      } else if (kind == kGu) {
        float up = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) up += red_i[w * kRedRows + d.rpc + tid];
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
__global__ void __launch_bounds__(kConsumers, 2) decode_stack_kernel(const __grid_constant__ StackParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  auto* full = reinterpret_cast<uint64_t*>(smem + kOffFull);
  auto* red = reinterpret_cast<float*>(smem + kOffRed);
  auto* norm_red = reinterpret_cast<float*>(smem + kOffNorm);
  auto* resid = reinterpret_cast<float*>(smem + kOffResid);
  auto* rope_cs = reinterpret_cast<float*>(smem + kOffRope);
  auto* table = reinterpret_cast<int*>(smem + kOffTable);
  const stack::AttnSmem att_smem{reinterpret_cast<float*>(smem + kOffQs), reinterpret_cast<float*>(smem + kOffSc),
                                 reinterpret_cast<float*>(smem + kOffState),
                                 reinterpret_cast<float*>(smem + kOffKvNew),
                                 reinterpret_cast<int*>(smem + kOffNorm + 4 * kWarps)};
  const int tid = threadIdx.x;
  const uint64_t t_start = kTimed && tid == 0 ? global_timer_ns() : 0;
  const long long c_start = kTimed ? clock64() : 0;
  const stack::SplitPlan sp(p);
  // The block table (the issuer reads it for every KV chunk) and RoPE's cos/sin, once.
  for (int i = tid; i < (sp.kv_len + p.block_size - 1) / p.block_size; i += kConsumers) table[i] = p.block_table[i];
  stack::rope_table(p, rope_cs);
  if (tid == 0) {
    for (int s = 0; s < p.n_slots; ++s) mbar_init(&full[s], 1);
    mbar_fence_init();
  }
  __syncthreads();
  Ring<HD> ring(p, sp, smem + kHeader, full, table, reinterpret_cast<ChunkCursor*>(smem + kOffCursor),
                 reinterpret_cast<IssuerState*>(smem + kOffIssuer));
  if (tid == 0) ring.start();
  unsigned* split_arrivals = p.sync + kLine;                   // [n_layers][n_kv]
  unsigned* head_ready = split_arrivals + p.n_layers * p.n_kv;  // [n_layers][n_kv]
  unsigned epoch = 0;
  auto barrier = [&] { grid_sync(p.sync, epoch); };
  float xr[kMaxSweeps][8];
  PhaseClock<kTimed> clk;
  clk.start(p);
  for (int layer = 0; layer < p.n_layers; ++layer) {
    const StackLayer& L = p.layers[layer];
    load_normed(p.x, L.attn_norm, p.n_embd, p.eps, xr, norm_red);
    consume<T, HD>(p, layer, kQkv, xr, ring, red, resid);
    clk.mark(layer, 0);
    publish_qkv_rows(p, layer, head_ready);
    clk.mark(layer, 1);
    stack::attention_phase<HD>(p, layer, ring, att_smem, rope_cs, split_arrivals, head_ready + layer * p.n_kv);
    clk.mark(layer, 2);
    barrier();
    clk.mark(layer, 3);
    load_plain(p.att, p.q_dim, xr);
    consume<T, HD>(p, layer, kO, xr, ring, red, resid);
    clk.mark(layer, 4);
    barrier();
    clk.mark(layer, 5);
    load_normed(p.x, L.ffn_norm, p.n_embd, p.eps, xr, norm_red);
    consume<T, HD>(p, layer, kGu, xr, ring, red, resid);
    clk.mark(layer, 6);
    barrier();
    clk.mark(layer, 7);
    load_plain(p.act, p.n_ff, xr);
    consume<T, HD>(p, layer, kDown, xr, ring, red, resid);
    clk.mark(layer, 8);
    if (layer + 1 < p.n_layers) barrier();
    clk.mark(layer, 9);
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

}  // namespace

bool plan_decode_stack(const StackShape& sh, int sm_count, StackParams& p, StackLaunch& launch) {
  if (sh.wtype != DType::BF16 && sh.wtype != DType::F16) return false;
  if (sh.head_dim != 64 && sh.head_dim != 128) return false;
  if (sh.n_layers < 1 || sh.n_layers > kStackMaxLayers || sh.n_kv <= 0 || sh.n_head % sh.n_kv != 0) return false;
  const int group = sh.n_head / sh.n_kv;
  if (group * sh.head_dim > kStackMaxGroupDims) return false;
  if (sh.rot_dim < 2 || sh.rot_dim % 2 != 0 || sh.rot_dim > sh.head_dim || sh.block_size < 1) return false;
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
  p.rpc[0] = rows_per_chunk(q_dim + 2 * kv_dim, sh.n_embd, 1);
  p.rpc[1] = rows_per_chunk(sh.n_embd, q_dim, 1);
  p.rpc[2] = rows_per_chunk(sh.n_ff, sh.n_embd, 2);
  p.rpc[3] = rows_per_chunk(sh.n_embd, sh.n_ff, 1);
  if (!p.rpc[0] || !p.rpc[1] || !p.rpc[2] || !p.rpc[3]) return false;
  const size_t chunk_max = std::max({static_cast<size_t>(p.rpc[0]) * sh.n_embd * 2,
                                     static_cast<size_t>(p.rpc[1]) * q_dim * 2,
                                     static_cast<size_t>(p.rpc[2]) * sh.n_embd * 4,
                                     static_cast<size_t>(p.rpc[3]) * sh.n_ff * 2});
  p.slot_stride = static_cast<uint32_t>((chunk_max + 127) / 128 * 128);
  // KV chunks: as many whole KV blocks (keys and values of one head) as a slot holds, and
  // their scores within the shared buffer.
  const size_t kv_block_bytes = static_cast<size_t>(sh.block_size) * sh.head_dim * 2;
  p.kv_blocks_per_chunk = static_cast<int>(p.slot_stride / (2 * kv_block_bytes));
  while (p.kv_blocks_per_chunk > 0 && group * p.kv_blocks_per_chunk * sh.block_size > kStackMaxScores)
    --p.kv_blocks_per_chunk;
  if (p.kv_blocks_per_chunk < 1) return false;
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
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kConsumers, launch.smem));
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
  p.block_size = sh.block_size;
  p.rot_half = sh.rot_dim / 2;
  p.max_splits = std::max(1, launch.grid / sh.n_kv);
  // The weight copies marked evict_first in L2: read once a step, they no longer push out
  // the activations, the KV and the barrier's lines (TESSERA_CUDA_STACK_EVICT_FIRST=0: off).
  static const bool evict_first = env_switch_on("TESSERA_CUDA_STACK_EVICT_FIRST");
  p.evict_first = evict_first ? 1 : 0;

  launch.scratch_floats = static_cast<size_t>(q_dim + 2 * kv_dim) + q_dim + sh.n_ff +
                          static_cast<size_t>(sh.n_head) * p.max_splits * (sh.head_dim + 2);
  // The barrier's flag, top counter and group counters, then a split-arrival counter per
  // (layer, KV head): one 128-byte line each for the barrier's.
  launch.sync_bytes = static_cast<size_t>(kLine) * 4 + 2 * static_cast<size_t>(sh.n_layers) * sh.n_kv * 4;

  return true;
}

void launch_decode_stack(DType wtype, const StackParams& p, const StackLaunch& launch, cudaStream_t s) {
  TESSERA_CUDA_CHECK(cudaMemsetAsync(p.sync, 0, launch.sync_bytes, s));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(launch.grid);
  cfg.blockDim = dim3(kConsumers);
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
