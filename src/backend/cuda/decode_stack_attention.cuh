#pragma once
// The attention phase of the fused decoder stack (decode_stack.cu): one query row of one
// sequence over its paged f16 KV cache, split over the blocks of the persistent grid.
//
// The keys and values come through the block's ring like the weights: each split's KV
// blocks are chunks of the block's stream (kv_blocks_per_chunk whole KV blocks of one head,
// their keys then their values), copied in right after the block's Q|K|V rows, so when the
// phase starts they are in shared memory — the phase makes no dependent trips to device
// memory, which under the weight stream's load took microseconds each.
//
// Item (KV head h, split s) takes keys [k0, k1) (a whole number of chunks). It rotates the
// query heads of h's group (RoPE, then scaled by scale·log2 e: scores in base 2) into shared
// memory; the item whose split holds this step's position also rotates this step's key and
// stores it and the value into their slot (f16, round to nearest even: the bits
// rope_kv_store.cu writes) and keeps them (as rounded) for that key, since its chunk was
// copied before the store. Per chunk: a thread per (query head, key) score, the softmax of
// each head by one warp (online across chunks, base 2), a thread per (head, pair of output
// dims) for P·V. The item writes its partial (m, l, O) per head; the last split of a KV head
// to arrive (a counter per layer and head) merges the group's splits into `att`.
//
// Intermediate arrays written inside the launch by other blocks (qkv, partials) are read
// with ld.global.cg (L2, never a stale L1 line).
#include <cfloat>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/decode_stack.h"

namespace tessera::cuda::stack {

constexpr int kConsumers = 256;  // threads of a block
constexpr int kWarps = kConsumers / 32;

// The block barrier (bar.sync 0 is __syncthreads; this kernel's blocks are all consumers).
__device__ __forceinline__ void consumer_sync() { __syncthreads(); }

// Keys the query attends to: the sequence's first min(kv_len, position + 1) (causal, as the
// op path's decode attention).
__device__ __forceinline__ int attended_keys(const StackParams& p) {
  return max(0, min(p.kv_len[0], p.positions[0] + 1));
}

// How this step's keys split: n_splits splits of split_len keys (a multiple of the keys of
// one chunk), about one chunk each up to max_splits.
struct SplitPlan {
  int kv_len, kpc, n_splits, split_len;
  __device__ __forceinline__ SplitPlan(const StackParams& p) {
    kv_len = attended_keys(p);
    kpc = p.kv_blocks_per_chunk * p.block_size;
    const int chunks = (kv_len + kpc - 1) / kpc;
    n_splits = max(1, min(p.max_splits, chunks));
    split_len = (chunks + n_splits - 1) / n_splits * kpc;
  }
  __device__ __forceinline__ int items(const StackParams& p) const { return p.n_kv * n_splits; }
  __device__ __forceinline__ int k0(int item) const { return (item % n_splits) * split_len; }
  __device__ __forceinline__ int k1(int item) const { return min(kv_len, k0(item) + split_len); }
  __device__ __forceinline__ int chunks(int item) const {
    const int n = k1(item) - k0(item);
    return n > 0 ? (n + kpc - 1) / kpc : 0;
  }
};

// cos/sin of every rotated pair at this step's position (the same for every layer): once
// per launch, in double as rope_rotate does, so the rotations give rope_rotate's bits.
__device__ __forceinline__ void rope_table(const StackParams& p, float* rope_cs) {
  for (int i = threadIdx.x; i < p.rot_half; i += kConsumers)
    rope_cos_sin(p.positions[0], p.inv_freq[i], rope_cs[2 * i], rope_cs[2 * i + 1]);
}

// rope_rotate with the pair's cos/sin from the table.
__device__ __forceinline__ void rotate_pair(float& a, float& b, const float* rope_cs, int i) {
  rope_apply(a, b, rope_cs[2 * i], rope_cs[2 * i + 1]);
}

// Shared memory of the attention phase.
struct AttnSmem {
  float* qs;      // [group][HD] rotated, scaled queries
  float* sc;      // [group][kpc] scores, then probabilities
  float* state;   // [3][8]: m, l, correction per query head
  float* kv_new;  // [2][HD]: this step's key and value as stored (f16-rounded)
  int* flag;      // 1 int: this block's item was its head's last split
};

// Keys [kc0, kc0 + n) of chunk `chunk` (kv_blocks_per_chunk KV blocks: keys, then values).
template <int HD>
__device__ __forceinline__ void attention_chunk(const StackParams& p, const AttnSmem& sm, const uint8_t* chunk,
                                                int kc0, int n, int pos_key, float (&o)[2], int g) {
  constexpr int kSteps = HD / 8;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kpc = p.kv_blocks_per_chunk * p.block_size;
  const __half* kk = reinterpret_cast<const __half*>(chunk);
  const __half* vv = kk + static_cast<size_t>(kpc) * HD;
  // Scores: a thread per (head, key); rows read from a rotated start so the 8 lanes of a
  // 16-byte phase hit different banks.
  for (int idx = tid; idx < g * n; idx += kConsumers) {
    const int gi = idx / n, j = idx - gi * n;
    const float* q = sm.qs + gi * HD;
    const bool fresh = kc0 + j == pos_key;
    const __half* kr = kk + static_cast<size_t>(j) * HD;
    float acc = 0.0f;
#pragma unroll 4
    for (int t = 0; t < kSteps; ++t) {
      const int d8 = ((t + j) & (kSteps - 1)) * 8;
      float kf[8];
      if (!fresh) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + d8);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          kf[2 * i] = half_bits_to_f32(static_cast<uint16_t>(w[i] & 0xffff));
          kf[2 * i + 1] = half_bits_to_f32(static_cast<uint16_t>(w[i] >> 16));
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) kf[i] = sm.kv_new[d8 + i];
      }
      const float4 qa = *reinterpret_cast<const float4*>(q + d8), qb = *reinterpret_cast<const float4*>(q + d8 + 4);
      acc = fmaf(qa.x, kf[0], acc);
      acc = fmaf(qa.y, kf[1], acc);
      acc = fmaf(qa.z, kf[2], acc);
      acc = fmaf(qa.w, kf[3], acc);
      acc = fmaf(qb.x, kf[4], acc);
      acc = fmaf(qb.y, kf[5], acc);
      acc = fmaf(qb.z, kf[6], acc);
      acc = fmaf(qb.w, kf[7], acc);
    }
    sm.sc[gi * kpc + j] = acc;
  }
  consumer_sync();
  // Online softmax: warp gi takes head gi's scores of this chunk.
  if (warp < g) {
    float* s = sm.sc + warp * kpc;
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    const float m_old = sm.state[warp], m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = exp2f(s[j] - m_new);
      s[j] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    __syncwarp();  // every lane has read m_old
    if (lane == 0) {
      const float corr = exp2f(m_old - m_new);  // 0 on the first chunk (m_old = -inf)
      sm.state[warp] = m_new;
      sm.state[8 + warp] = sm.state[8 + warp] * corr + sum;
      sm.state[16 + warp] = corr;
    }
  }
  consumer_sync();
  // P·V: thread (head gi, dims 2dp, 2dp + 1).
  if (tid < g * (HD / 2)) {
    const int gi = tid / (HD / 2), d = 2 * (tid % (HD / 2));
    const float* pr = sm.sc + gi * kpc;
    const float corr = sm.state[16 + gi];
    float a0 = o[0] * corr, a1 = o[1] * corr;
    for (int j = 0; j < n; ++j) {
      float v0, v1;
      if (kc0 + j != pos_key) {
        const uint32_t raw = *reinterpret_cast<const uint32_t*>(vv + static_cast<size_t>(j) * HD + d);
        v0 = half_bits_to_f32(static_cast<uint16_t>(raw & 0xffff));
        v1 = half_bits_to_f32(static_cast<uint16_t>(raw >> 16));
      } else {
        v0 = sm.kv_new[HD + d];
        v1 = sm.kv_new[HD + d + 1];
      }
      const float pj = pr[j];
      a0 = fmaf(pj, v0, a0);
      a1 = fmaf(pj, v1, a1);
    }
    o[0] = a0;
    o[1] = a1;
  }
}

// The attention of one layer for this block's items: its KV chunks come from `ring` in the
// order the issuer queued them (decode_stack.cu's ChunkCursor). head_ready: this layer's
// per-KV-head counts of Q|K|V rows written (no grid barrier before this phase).
template <int HD, typename Ring>
__device__ void attention_phase(const StackParams& p, int layer, Ring& ring, const AttnSmem& sm,
                                const float* rope_cs, unsigned* split_arrivals, const unsigned* head_ready) {
  constexpr int kHalf = HD / 2;
  const int tid = threadIdx.x;
  const StackLayer& L = p.layers[layer];
  const int pos = p.positions[0], g = p.group;
  const SplitPlan sp(p);
  const bool neox = p.neox != 0;
  for (int item = blockIdx.x; item < sp.items(p); item += gridDim.x) {
    const int h = item / sp.n_splits, s = item % sp.n_splits;
    const int k0 = sp.k0(item), k1 = sp.k1(item);
    // The new position's split stores its key and value; a position outside [0, kv_len) is
    // attended by no split: the last one stores it.
    const bool stores_kv = pos < sp.kv_len ? pos >= k0 && pos < k1 : s == sp.n_splits - 1;
    // No grid barrier before the phase: wait for this head's Q|K|V rows, all (g + 2) · HD.
    if (tid == 0) spin_until_at_least(head_ready + h, static_cast<unsigned>((g + 2) * HD));
    consumer_sync();  // qs, kv_new and state are free (previous item done); the rows are in
    const int q_pairs = g * kHalf;
    for (int idx = tid; idx < q_pairs + (stores_kv ? kHalf : 0); idx += kConsumers) {
      const bool is_key = idx >= q_pairs;
      const int gi = is_key ? 0 : idx / kHalf, i = is_key ? idx - q_pairs : idx % kHalf;
      int ia, ib;
      rope_pair_dims(i, p.rot_half, neox, ia, ib);
      const float* src = p.qkv + (is_key ? p.q_dim + static_cast<size_t>(h) * HD : static_cast<size_t>(h * g + gi) * HD);
      float a = __ldcg(src + ia), b = __ldcg(src + ib);
      if (i < p.rot_half) rotate_pair(a, b, rope_cs, i);
      if (!is_key) {
        sm.qs[gi * HD + ia] = a * p.q_scale;
        sm.qs[gi * HD + ib] = b * p.q_scale;
      } else {
        const float* vh = p.qkv + p.q_dim + p.kv_dim + static_cast<size_t>(h) * HD;
        const __half ka = __float2half_rn(a), kb = __float2half_rn(b);
        const __half va = __float2half_rn(__ldcg(vh + ia)), vb = __float2half_rn(__ldcg(vh + ib));
        const int slot = p.slots[0];
        const size_t dst = ((static_cast<size_t>(slot / p.block_size) * p.n_kv + h) * p.block_size +
                            slot % p.block_size) * HD;
        __half* kc = static_cast<__half*>(L.k);
        __half* vc = static_cast<__half*>(L.v);
        kc[dst + ia] = ka;
        kc[dst + ib] = kb;
        vc[dst + ia] = va;
        vc[dst + ib] = vb;
        sm.kv_new[ia] = __half2float(ka);
        sm.kv_new[ib] = __half2float(kb);
        sm.kv_new[HD + ia] = __half2float(va);
        sm.kv_new[HD + ib] = __half2float(vb);
      }
    }
    if (tid < g) {
      sm.state[tid] = -INFINITY;
      sm.state[8 + tid] = 0.0f;
    }
    consumer_sync();
    const int pos_key = stores_kv && pos < sp.kv_len ? pos : -1;  // the key read from kv_new
    float o[2] = {0.0f, 0.0f};
    const int n_chunks = sp.chunks(item);
    for (int c = 0; c < n_chunks; ++c) {
      const uint8_t* chunk = ring.wait();
      const int kc0 = k0 + c * sp.kpc;
      attention_chunk<HD>(p, sm, chunk, kc0, min(sp.kpc, k1 - kc0), pos_key, o, g);
      ring.release();  // its barrier also orders this chunk's P·V before the next scores
    }
    // This split's partial per head: O unnormalized, m (base 2), l.
    if (tid < g * kHalf) {
      const int gi = tid / kHalf, d = 2 * (tid % kHalf);
      float* out = p.partials + (static_cast<size_t>(h * g + gi) * p.max_splits + s) * (HD + 2);
      __stcg(out + d, o[0]);
      __stcg(out + d + 1, o[1]);
      if (d == 0) {
        __stcg(out + HD, sm.state[gi]);
        __stcg(out + HD + 1, sm.state[8 + gi]);
      }
    }
    // The last split of head h to arrive merges the group's splits (threadfence reduction).
    __threadfence();
    consumer_sync();
    if (tid == 0) *sm.flag = atomicAdd(split_arrivals + layer * p.n_kv + h, 1u) == static_cast<unsigned>(sp.n_splits - 1);
    consumer_sync();
    if (*sm.flag) {
      __threadfence();
      if (tid < g * kHalf) {
        const int gi = tid / kHalf, d = 2 * (tid % kHalf);
        const float* base = p.partials + static_cast<size_t>(h * g + gi) * p.max_splits * (HD + 2);
        // The partials are in L2, written by other blocks: each batch's loads are issued
        // together (a round trip per batch, not per split: under the weight stream's load a
        // round trip takes about a microsecond).
        constexpr int kBatch = 8;
        float mx = -INFINITY;
        for (int t0 = 0; t0 < sp.n_splits; t0 += 2 * kBatch) {
          float m[2 * kBatch];
#pragma unroll
          for (int i = 0; i < 2 * kBatch; ++i)
            m[i] = t0 + i < sp.n_splits ? __ldcg(base + (t0 + i) * (HD + 2) + HD) : -INFINITY;
#pragma unroll
          for (int i = 0; i < 2 * kBatch; ++i) mx = fmaxf(mx, m[i]);
        }
        float n0 = 0.0f, n1 = 0.0f, den = 0.0f;
        if (mx != -INFINITY) {
          for (int t0 = 0; t0 < sp.n_splits; t0 += kBatch) {
            float2 ml[kBatch], ov[kBatch];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
              ml[i] = make_float2(-INFINITY, 0.0f);
              ov[i] = make_float2(0.0f, 0.0f);
              if (t0 + i < sp.n_splits) {
                const float* st = base + (t0 + i) * (HD + 2);
                ml[i] = __ldcg(reinterpret_cast<const float2*>(st + HD));
                ov[i] = __ldcg(reinterpret_cast<const float2*>(st + d));
              }
            }
            // In split order, as before: the same sums.
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
              if (ml[i].x == -INFINITY) continue;  // a split without keys (or past the last)
              const float wt = exp2f(ml[i].x - mx);
              n0 = fmaf(ov[i].x, wt, n0);
              n1 = fmaf(ov[i].y, wt, n1);
              den = fmaf(ml[i].y, wt, den);
            }
          }
        }
        const float inv = den > 0.0f ? 1.0f / den : 0.0f;  // no keys at all: 0
        float* out = p.att + static_cast<size_t>(h * g + gi) * HD;
        __stcg(out + d, n0 * inv);
        __stcg(out + d + 1, n1 * inv);
      }
    }
  }
}

}  // namespace tessera::cuda::stack
