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

template <int HD>
__device__ void attention_split_phase(const StackParams& p, int layer, float* qs, float* comb) {
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
    const int h = item / n_splits, s = item % n_splits;
    const int k0 = s * split_len, k1 = min(kv_len, k0 + split_len);
    consumer_sync();  // qs and comb are free (previous item done)
    for (int idx = tid; idx < g * kHalf; idx += kConsumers) {
      const int gi = idx / kHalf, i = idx % kHalf;
      int ia, ib;
      rope_pair_dims(i, p.rot_half, neox, ia, ib);
      const float* qh = p.qkv + static_cast<size_t>(h * g + gi) * HD;
      float a = __ldcg(qh + ia), b = __ldcg(qh + ib);
      if (i < p.rot_half) rope_rotate(a, b, pos, p.inv_freq[i]);
      qs[gi * HD + ia] = a * p.q_scale;
      qs[gi * HD + ib] = b * p.q_scale;
    }
    // The new position's split stores its key and value (and reads them back below); a
    // position outside [0, kv_len) is read by no split: the last one stores it.
    const bool stores_kv = pos < kv_len ? pos >= k0 && pos < k1 : s == n_splits - 1;
    if (stores_kv) {
      const int slot = p.slots[0];
      const size_t dst = ((static_cast<size_t>(slot / p.block_size) * p.n_kv + h) * p.block_size + slot % p.block_size) * HD;
      const float* kh = p.qkv + p.q_dim + static_cast<size_t>(h) * HD;
      const float* vh = kh + p.kv_dim;
      for (int i = tid; i < kHalf; i += kConsumers) {
        int ia, ib;
        rope_pair_dims(i, p.rot_half, neox, ia, ib);
        float a = __ldcg(kh + ia), b = __ldcg(kh + ib);
        if (i < p.rot_half) rope_rotate(a, b, pos, p.inv_freq[i]);
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
