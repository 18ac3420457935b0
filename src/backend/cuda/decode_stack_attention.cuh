#pragma once
// The attention phases of the fused decoder stack (decode_stack.cu): one query row of one
// sequence over its paged f16 KV cache, split over the blocks of the persistent grid.
//
// Phase 1, split: item (KV head h, split s) takes keys [k0, k1) of the sequence. It rotates
// the query heads of h's group (RoPE, then scaled by scale·log2 e: scores in base 2) into
// shared memory; the item whose split holds this step's position also rotates this step's
// key and stores it and the value into their slot (f16, round to nearest even: the bits
// rope_kv_store.cu writes), then reads it back like every other key. Lane j of warp w
// takes key k0 + 32(w + 8i) + j: one 16-byte load of K per 8 dims, the dot products with
// the group's query heads in registers, an online softmax per head over the warp's tiles,
// P·V with each lane owning head_dim/32 dims of the output. The 8 warps' states are merged
// in order in shared memory into the partial (m, l, O) of (query head, split).
// Phase 2, merge: block per query head combines the splits into `att`.
//
// Intermediate arrays written inside the launch by other blocks (qkv, partials) are read
// with ld.global.cg (L2, never a stale L1 line).
#include <cfloat>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/decode_stack.h"

namespace tessera::cuda::stack {

constexpr int kConsumers = 256;  // threads that compute (the producer warp is extra)
constexpr int kConsumerWarps = kConsumers / 32;
// Keys per split at least: a 32-key tile for each of the 8 warps, so short contexts take
// few splits (less to merge) and every warp of an item works in parallel.
constexpr int kKeysPerSplitMin = kConsumers;

// Named barrier of the consumer warps (barrier 0 is __syncthreads of the whole block).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }

// Splits of the KV length: at least kKeysPerSplitMin keys each, at most max_splits.
__host__ __device__ __forceinline__ int attention_splits(int kv_len, int max_splits) {
  const int want = (kv_len + kKeysPerSplitMin - 1) / kKeysPerSplitMin;
  return want < 1 ? 1 : (want > max_splits ? max_splits : want);
}

// Keys the query attends to: the sequence's first min(kv_len, position + 1) (causal, as the
// op path's decode attention).
__device__ __forceinline__ int attended_keys(const StackParams& p) {
  return max(0, min(p.kv_len[0], p.positions[0] + 1));
}

// Dims (ia, ib) of rotated pair i (rope_kv_store.cu's rule): adjacent, or i and i + rot_half
// (neox); pairs past rot_half are the unrotated tail, in order.
__device__ __forceinline__ void rope_pair_dims(int i, int rot_half, bool neox, int& ia, int& ib) {
  const bool rotated = i < rot_half;
  ia = rotated ? (neox ? i : 2 * i) : 2 * rot_half + 2 * (i - rot_half);
  ib = rotated ? (neox ? i + rot_half : 2 * i + 1) : ia + 1;
}

// Offset in halves of key `key`'s head h in the paged cache [n_blocks, n_kv, bs, HD] (the
// host checks that a layer's cache has fewer than 2^32 halves).
template <int HD>
__device__ __forceinline__ uint32_t kv_offset(const StackParams& p, int h, int key) {
  const uint32_t blk = static_cast<uint32_t>(p.block_table[key / p.block_size]);
  return ((blk * p.n_kv + h) * p.block_size + key % p.block_size) * HD;
}

// cos/sin of every rotated pair at this step's position (the same for every layer): once
// per launch, in double as rope_rotate does, so the rotations give rope_rotate's bits.
__device__ __forceinline__ void rope_table(const StackParams& p, float* rope_cs) {
  for (int i = threadIdx.x; i < p.rot_half; i += kConsumers) {
    double sd, cd;
    sincos(static_cast<double>(p.positions[0]) * p.inv_freq[i], &sd, &cd);
    rope_cs[2 * i] = static_cast<float>(cd);
    rope_cs[2 * i + 1] = static_cast<float>(sd);
  }
}

// rope_rotate with the pair's cos/sin from the table.
__device__ __forceinline__ void rotate_pair(float& a, float& b, const float* rope_cs, int i) {
  const float c = rope_cs[2 * i], sn = rope_cs[2 * i + 1];
  const float ra = a * c - b * sn, rb = a * sn + b * c;
  a = ra;
  b = rb;
}

// Split item `item` of this step: KV head h, keys [k0, k1).
struct SplitItem {
  int h, s, k0, k1;
};

__device__ __forceinline__ SplitItem split_item(int item, int n_splits, int split_len, int kv_len) {
  SplitItem it;
  it.h = item / n_splits;
  it.s = item % n_splits;
  it.k0 = it.s * split_len;
  it.k1 = min(kv_len, it.k0 + split_len);
  return it;
}

// At the start of a layer, every block asks the copy engine to bring the K and V blocks of
// its attention items into L2: by the time the splits run (after the Q|K|V product) their
// loads hit L2 instead of waiting on device memory.
template <int HD>
__device__ __forceinline__ void prefetch_attention_kv(const StackParams& p, int layer) {
  const StackLayer& L = p.layers[layer];
  const int kv_len = attended_keys(p);
  const int n_splits = attention_splits(kv_len, p.max_splits);
  const int split_len = (kv_len + n_splits - 1) / n_splits;
  const uint32_t block_bytes = static_cast<uint32_t>(p.block_size) * HD * 2;
  for (int item = blockIdx.x; item < p.n_kv * n_splits; item += gridDim.x) {
    const SplitItem it = split_item(item, n_splits, split_len, kv_len);
    if (it.k0 >= it.k1) continue;
    const int b0 = it.k0 / p.block_size, n_blocks = (it.k1 - 1) / p.block_size - b0 + 1;
    for (int i = threadIdx.x; i < n_blocks; i += kConsumers) {
      const size_t off = (static_cast<size_t>(p.block_table[b0 + i]) * p.n_kv + it.h) * p.block_size * HD;
      prefetch_l2(static_cast<const __half*>(L.k) + off, block_bytes);
      prefetch_l2(static_cast<const __half*>(L.v) + off, block_bytes);
    }
  }
}

template <int HD>
__device__ void attention_split_phase(const StackParams& p, int layer, float* qs, float* comb, const float* rope_cs) {
  constexpr int kDpl = HD / 32;                       // output dims per lane
  constexpr int kMaxGroup = kStackMaxGroupDims / HD;  // query heads per KV head
  constexpr int kHalf = HD / 2;
  constexpr int kVKeys = 16 / kDpl;                   // keys of V in flight per lane (16 floats)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const StackLayer& L = p.layers[layer];
  __half* kc = static_cast<__half*>(L.k);
  __half* vc = static_cast<__half*>(L.v);
  const int pos = p.positions[0], g = p.group;
  const int kv_len = attended_keys(p);
  const int n_splits = attention_splits(kv_len, p.max_splits);
  const int split_len = (kv_len + n_splits - 1) / n_splits;
  const bool neox = p.neox != 0;
  for (int item = blockIdx.x; item < p.n_kv * n_splits; item += gridDim.x) {
    const SplitItem si = split_item(item, n_splits, split_len, kv_len);
    const int h = si.h, s = si.s, k0 = si.k0, k1 = si.k1;
    // The new position's split stores its key and value (and reads them back below); a
    // position outside [0, kv_len) is read by no split: the last one stores it.
    const bool stores_kv = pos < kv_len ? pos >= k0 && pos < k1 : s == n_splits - 1;
    const size_t dst = ((static_cast<size_t>(p.slots[0] / p.block_size) * p.n_kv + h) * p.block_size +
                        p.slots[0] % p.block_size) * HD;
    consumer_sync();  // qs and comb are free (previous item done)
    // One pass over the group's query pairs, then (the storing split) the key's pairs: the
    // rotated queries, scaled, into qs; the rotated key and the value into their slot.
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
        qs[gi * HD + ia] = a * p.q_scale;
        qs[gi * HD + ib] = b * p.q_scale;
      } else {
        const float* vh = p.qkv + p.q_dim + p.kv_dim + static_cast<size_t>(h) * HD;
        kc[dst + ia] = __float2half_rn(a);
        kc[dst + ib] = __float2half_rn(b);
        vc[dst + ia] = __float2half_rn(__ldcg(vh + ia));
        vc[dst + ib] = __float2half_rn(__ldcg(vh + ib));
      }
    }
    consumer_sync();  // qs written; this step's key and value stored (visible to the block)

    float m[kMaxGroup], l[kMaxGroup], o[kMaxGroup][kDpl];
#pragma unroll
    for (int gi = 0; gi < kMaxGroup; ++gi) {
      m[gi] = -INFINITY;
      l[gi] = 0.0f;
#pragma unroll
      for (int d = 0; d < kDpl; ++d) o[gi][d] = 0.0f;
    }
    for (int t0 = k0 + warp * 32; t0 < k1; t0 += kConsumers) {
      const int key = t0 + lane;
      const bool valid = key < k1;
      float sc[kMaxGroup];
#pragma unroll
      for (int gi = 0; gi < kMaxGroup; ++gi) sc[gi] = 0.0f;
      const uint32_t my_off = valid ? kv_offset<HD>(p, h, key) : 0;
      if (valid) {
        const __half* kr = kc + my_off;
#pragma unroll 8
        for (int d8 = 0; d8 < HD; d8 += 8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(kr + d8);
          const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
          float kf[8];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            kf[2 * i] = half_bits_to_f32(static_cast<uint16_t>(w[i] & 0xffff));
            kf[2 * i + 1] = half_bits_to_f32(static_cast<uint16_t>(w[i] >> 16));
          }
#pragma unroll
          for (int gi = 0; gi < kMaxGroup; ++gi) {
            if (gi < g) {
              const float4 qa = *reinterpret_cast<const float4*>(qs + gi * HD + d8);
              const float4 qb = *reinterpret_cast<const float4*>(qs + gi * HD + d8 + 4);
              float acc = sc[gi];
              acc = fmaf(qa.x, kf[0], acc);
              acc = fmaf(qa.y, kf[1], acc);
              acc = fmaf(qa.z, kf[2], acc);
              acc = fmaf(qa.w, kf[3], acc);
              acc = fmaf(qb.x, kf[4], acc);
              acc = fmaf(qb.y, kf[5], acc);
              acc = fmaf(qb.z, kf[6], acc);
              acc = fmaf(qb.w, kf[7], acc);
              sc[gi] = acc;
            }
          }
        }
      }
      // Online softmax per query head over this tile (lane 0's key is always valid).
      float pr[kMaxGroup];
#pragma unroll
      for (int gi = 0; gi < kMaxGroup; ++gi) {
        pr[gi] = 0.0f;
        if (gi < g) {
          const float sv = valid ? sc[gi] : -INFINITY;
          const float m_new = fmaxf(m[gi], warp_max(sv));
          const float corr = exp2f(m[gi] - m_new);
          pr[gi] = valid ? exp2f(sv - m_new) : 0.0f;
          l[gi] = l[gi] * corr + warp_sum(pr[gi]);
#pragma unroll
          for (int d = 0; d < kDpl; ++d) o[gi][d] *= corr;
          m[gi] = m_new;
        }
      }
      // P·V, kVKeys keys at a time (their V loads issued together); key j's cache offset
      // comes from lane j.
      const int n_keys = min(32, k1 - t0);
      for (int j0 = 0; j0 < n_keys; j0 += kVKeys) {
        float vf[kVKeys][kDpl];
#pragma unroll
        for (int u = 0; u < kVKeys; ++u) {
          const uint32_t off = __shfl_sync(0xffffffffu, my_off, (j0 + u) & 31);
          const __half* vr = vc + off + lane * kDpl;
          if (j0 + u < n_keys) {
            if constexpr (kDpl == 4) {
              const uint2 raw = *reinterpret_cast<const uint2*>(vr);
              vf[u][0] = half_bits_to_f32(static_cast<uint16_t>(raw.x & 0xffff));
              vf[u][1] = half_bits_to_f32(static_cast<uint16_t>(raw.x >> 16));
              vf[u][2] = half_bits_to_f32(static_cast<uint16_t>(raw.y & 0xffff));
              vf[u][3] = half_bits_to_f32(static_cast<uint16_t>(raw.y >> 16));
            } else {
              const uint32_t raw = *reinterpret_cast<const uint32_t*>(vr);
              vf[u][0] = half_bits_to_f32(static_cast<uint16_t>(raw & 0xffff));
              vf[u][1] = half_bits_to_f32(static_cast<uint16_t>(raw >> 16));
            }
          } else {
#pragma unroll
            for (int d = 0; d < kDpl; ++d) vf[u][d] = 0.0f;
          }
        }
#pragma unroll
        for (int gi = 0; gi < kMaxGroup; ++gi) {
          if (gi < g) {
#pragma unroll
            for (int u = 0; u < kVKeys; ++u) {
              const float pj = __shfl_sync(0xffffffffu, pr[gi], (j0 + u) & 31);  // 0 past the tile
#pragma unroll
              for (int d = 0; d < kDpl; ++d) o[gi][d] = fmaf(pj, vf[u][d], o[gi][d]);
            }
          }
        }
      }
    }
    // The warps' states, head by head, merged in warp order into this split's partial.
#pragma unroll
    for (int gi = 0; gi < kMaxGroup; ++gi) {
      if (gi < g) {
        float* mine = comb + warp * (HD + 2);
#pragma unroll
        for (int d = 0; d < kDpl; ++d) mine[lane * kDpl + d] = o[gi][d];
        if (lane == 0) {
          mine[HD] = m[gi];
          mine[HD + 1] = l[gi];
        }
        consumer_sync();
        if (tid < HD) {
          float mx = -INFINITY;
#pragma unroll
          for (int w = 0; w < kConsumerWarps; ++w) mx = fmaxf(mx, comb[w * (HD + 2) + HD]);
          float num = 0.0f, den = 0.0f;
          if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < kConsumerWarps; ++w) {
              const float* st = comb + w * (HD + 2);
              const float wt = exp2f(st[HD] - mx);  // 0 for a warp without keys (m = -inf)
              num = fmaf(st[tid], wt, num);
              den = fmaf(st[HD + 1], wt, den);
            }
          }
          float* out = p.partials + (static_cast<size_t>(h * g + gi) * p.max_splits + s) * (HD + 2);
          __stcg(out + tid, num);
          if (tid == 0) {
            __stcg(out + HD, mx);
            __stcg(out + HD + 1, den);
          }
        }
        consumer_sync();  // comb is free again
      }
    }
  }
}

template <int HD>
__device__ void attention_merge_phase(const StackParams& p) {
  const int tid = threadIdx.x;
  const int n_splits = attention_splits(attended_keys(p), p.max_splits);
  for (int hq = blockIdx.x; hq < p.n_head; hq += gridDim.x) {
    if (tid >= HD) continue;
    const float* base = p.partials + static_cast<size_t>(hq) * p.max_splits * (HD + 2);
    float mx = -INFINITY;
    for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, __ldcg(base + s * (HD + 2) + HD));
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float* st = base + s * (HD + 2);
      const float ms = __ldcg(st + HD);
      if (ms == -INFINITY) continue;  // an empty split
      const float wt = exp2f(ms - mx);
      num = fmaf(__ldcg(st + tid), wt, num);
      den = fmaf(__ldcg(st + HD + 1), wt, den);
    }
    __stcg(p.att + static_cast<size_t>(hq) * HD + tid, den > 0.0f ? num / den : 0.0f);  // no keys: 0
  }
}

}  // namespace tessera::cuda::stack
