// Paged attention for decode (one query row per sequence) and for speculative verification
// (a few query rows per sequence) on the tensor cores (f16 KV cache, head_dim 64/128, up to
// 16 query heads per KV head). The grid is that of the SIMT kernel in attention_decode.cu: a
// block of 4 warps per (sequence, KV head, split of split_len keys), times the chunks of a
// sequence's query rows. The query heads of the KV head, for up to 16 / group query rows of
// the sequence, are the M dimension of mma.sync m16n8k16 (f16 operands, f32 accumulate):
// row r = j · group + g is head g of the chunk's query row j, rows past the chunk's zero and
// discarded, so one k-step serves the whole GQA group (and every row of the chunk) and each
// key is read once per chunk. Each query row has its own causal length (position + 1). The split's keys are cut into tiles
// of 16; warp w takes tiles w, w+4, w+8, ... and runs independently of the other warps: its
// own online softmax (base 2, f32, on the accumulator fragments, as in attention_prefill_mma.cu),
// O accumulators and a private ring of 3 K/V tile buffers in shared memory, filled by cp.async
// (16 bytes, key -> block table -> global offset) two tiles ahead of the one computed, and
// synchronized with __syncwarp only. Q·Kᵀ takes K by ldmatrix, P·V takes V by ldmatrix.trans;
// shared rows are padded by 8 halves so the 8 rows of each ldmatrix land in distinct banks.
// At the end the block merges its 4 warps' (m, l, O) in shared memory in a fixed order
// (deterministic) and writes either the normalized output (one split) or the split's
// partials in the SIMT kernel's format (m in natural-log units), merged by
// launch_attention_decode_merge.
//
// Numerics: Q is rounded to f16 after scaling by softmax_scale·log2(e) (the KV cache is f16
// already), P to f16 before P·V; sums and the softmax state are f32. Relative error against
// the f32 kernel: 1.2e-4 to 2.6e-4 measured (H200, unit-normal q, k, v), 5e-4 with q 6× larger.
#include <cooperative_groups.h>

#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_common.cuh"
#include "backend/cuda/probe.cuh"

namespace tessera::cuda {
TESSERA_PROBE_TU(attn)

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 16;   // keys per tile: one k-step of P·V, two n-blocks of Q·Kᵀ
constexpr int kStages = 3;  // tile buffers per warp (two tiles in flight while one is computed)
constexpr int kPad = 8;     // halves of padding per shared K/V row
constexpr int kOPad = 8;    // floats of padding per shared O row of the final merge (no bank conflicts)

// Per block: kWarps rings of kStages × (K tile + V tile), each [kKeys][HD + kPad] halves.
// HD 128: 104,448 bytes (2 blocks per SM), HD 64: 55,296.
template <int HD>
__host__ __device__ constexpr size_t ring_smem_bytes() {
  return sizeof(__half) * kWarps * kStages * 2 * kKeys * (HD + kPad);
}
// The final merge, in the same memory: O [kWarps][16][HD + kOPad], m and l [kWarps][16] floats.
template <int HD>
__host__ __device__ constexpr size_t merge_smem_bytes() {
  return sizeof(float) * kWarps * 16 * (HD + kOPad + 2);
}

// The fused variant (kFused): RoPE + this step's K/V store + attention + the splits' merge in
// one launch (Backend::rope_kv_store_attention at decode). The splits of a (sequence, KV head)
// form one thread-block cluster (grid z = cluster z = the split count, at most 8); each block
// merges its warps as below, then the cluster merges the blocks through distributed shared
// memory, so no partials go through global memory and no merge kernel follows. Before the
// programmatic-dependent-launch wait the blocks already copy their first K/V tiles: those
// keys were written by earlier steps, and the kernel before this one triggers only after its
// own wait, so every kernel before that one is complete (cuda_common.cuh). The one key this
// step adds (position p) is rotated and stored by the block whose split holds it, which also
// writes it over the stale copy in its tile. The query heads are loaded raw and rotated in
// shared memory (rope_apply, the bits of rope_kv_store.cu), then scaled and rounded as in
// the plain variant: the output equals rope_kv_store + this kernel + the merge kernel up to
// the rounding of the merge's exponentials (exp2 here, exp there).
struct RopeStoreArgs {
  const float* k = nullptr;  // this step's keys, raw: [n_tokens, ldk], KV head h at h * head_dim
  int64_t ldk = 0;
  const float* v = nullptr;  // values: likewise
  int64_t ldv = 0;
  __half* kc = nullptr;  // the layer's caches, written at each row's slot
  __half* vc = nullptr;
  const double* inv_freq = nullptr;  // [rot_half]
  int rot_half = 0;
  int neox = 0;
};

// Shared memory of the fused variant past the tile rings: the rotated query heads
// [16][HD] floats, the new key and value [2][HD] halves, each pair's cos/sin [HD/2][2] floats.
template <int HD>
__host__ __device__ constexpr size_t fused_smem_bytes() {
  return ring_smem_bytes<HD>() + sizeof(float) * 16 * HD + sizeof(__half) * 2 * HD + sizeof(float) * HD;
}

template <int HD, bool kFused>
__global__ void __launch_bounds__(kThreads, 2)
    attention_decode_mma_kernel(const float* __restrict__ q, int64_t ldq, const __half* __restrict__ kc,
                                const __half* __restrict__ vc, DeviceBatch b, int n_kv_heads, int block_size, int group,
                                float q_scale, int split_len, int max_splits, int n_chunks, float* __restrict__ out,
                                int64_t ldo, float* __restrict__ partials, RopeStoreArgs rs) {
  constexpr int LD = HD + kPad;    // shared K/V row stride in halves
  constexpr int PPK = HD / 8;      // 16-byte pieces per key row
  constexpr int KPR = 32 / PPK;    // keys per warp-wide round of pieces: 2 (HD 128) or 4 (HD 64)
  constexpr int OLD = HD + kOPad;  // shared O row stride in floats (merge)
  static_assert(merge_smem_bytes<HD>() + sizeof(float) * 16 * (HD + 2) <= ring_smem_bytes<HD>(),
                "the merges reuse the tile rings");
  extern __shared__ __align__(16) __half smem_h[];
  TESSERA_PROBE_DECL;
  TESSERA_PROBE_MARK(0);
  if constexpr (!kFused) {
    pdl_wait();  // every thread, first: see cuda_common.cuh
    pdl_trigger();
  }

  const int seq = blockIdx.x, kvh = blockIdx.y / n_chunks, split = blockIdx.z;
  // This block's query rows t .. t + rows - 1 of the sequence (fused: a decode batch, one
  // row); the block walks the keys of the longest.
  const QueryChunk qc = query_chunk(b, seq, blockIdx.y % n_chunks, group);
  if (qc.rows <= 0) return;  // a chunk past this sequence's rows (never fused: one chunk there)
  const int t = qc.t, rows = qc.rows, len = qc.len;
  const int pos = b.positions[t];
  // Fused: the cluster's splits share this step's keys evenly in whole tiles, from the
  // position itself rather than the graph key's width (every split gets keys, so each block
  // copies fewer); the plain variant keeps split_len, which its merge kernel reads.
  const int span = kFused ? (pos + max_splits * kKeys) / (max_splits * kKeys) * kKeys : split_len;
  const int begin = split * span;
  const int n_heads = n_kv_heads * group, head0 = kvh * group;
  if constexpr (!kFused) {
    if (begin >= len) {     // the whole block (the merge reads only the splits that hold keys)
      if (max_splits == 1)  // no keys at all: zeros, as the merge gives
        for (int i = threadIdx.x; i < rows * group * HD; i += kThreads)
          out[(t + i / (group * HD)) * ldo + static_cast<int64_t>(head0) * HD + i % (group * HD)] = 0.0f;
      return;
    }
  }
  // A fused block without keys stays: it takes part in the cluster's merge with nothing.
  const int end = max(begin, min(len, begin + span));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fr = lane >> 2, fc = lane & 3;  // fragment row (0..7) and column pair (0..3)
  // The keys of this split that fragment rows fr and fr + 8 see (their query rows' lengths).
  const int end_a = min(end, qc.row_len(fr / group)), end_b = min(end, qc.row_len((fr + 8) / group));
  const uint32_t hid_a = qc.hidden(fr / group), hid_b = qc.hidden((fr + 8) / group);  // tree verification

  const int n_tiles = (end - begin + kKeys - 1) / kKeys;  // tiles of this split
  const int my_tiles = warp < n_tiles ? (n_tiles - warp + kWarps - 1) / kWarps : 0;
  // This warp's ring: K buffers [kStages][kKeys][LD], then V buffers likewise.
  __half* const ring = smem_h + warp * (kStages * 2 * kKeys * LD);
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;
  const int pj = lane / PPK, pc = (lane % PPK) * 8;  // this lane's first key of a tile and its piece

  // Issues this warp's local tile i (global tile warp + 4i) into buffer i % kStages and commits
  // a group, an empty one past the warp's last tile (the wait below counts groups). Keys past
  // the split end get zeros, not stale data: P is 0 there, but 0 · NaN would poison O.
  auto load_tile = [&](int i) {
    if (i < my_tiles) {
      __half* kd = ring + (i % kStages) * kKeys * LD + pj * LD + pc;
      __half* vd = kd + kStages * kKeys * LD;
      int key = begin + (warp + i * kWarps) * kKeys + pj;
      int blk = key / block_size, off = key - blk * block_size;
      // The table entry read once per block of keys, not once per round: the stores below
      // may alias it for the compiler, which would make every round wait for a reload.
      int phys = key < end ? __ldg(table + blk) : 0;
#pragma unroll
      for (int r = 0; r < kKeys / KPR; ++r) {
        if (key < end) {
          const int64_t src = ((static_cast<int64_t>(phys) * n_kv_heads + kvh) * block_size + off) * HD + pc;
          cp_async16(kd, kc + src);
          cp_async16(vd, vc + src);
        } else {
          *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
        }
        kd += KPR * LD;
        vd += KPR * LD;
        key += KPR;
        off += KPR;
        if (off >= block_size) {  // next block of the table (block_size may be < KPR)
          do {
            off -= block_size;
            ++blk;
          } while (off >= block_size);
          if (key < end) phys = __ldg(table + blk);
        }
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) load_tile(i);  // fused: before the wait (see above)
  TESSERA_PROBE_MARK(1);

  float* const sq = reinterpret_cast<float*>(smem_h + ring_smem_bytes<HD>() / sizeof(__half));  // [16][HD]
  __half* const snew = reinterpret_cast<__half*>(sq + 16 * HD);    // the added key [HD], its value [HD]
  float* const rope_cs = reinterpret_cast<float*>(snew + 2 * HD);  // [HD/2][2]: cos, sin
  // The split whose range holds this step's key stores it (always, as rope_kv_store would);
  // it attends to it when it is inside the causal length too.
  const bool stores_new = kFused && begin <= pos && pos < begin + span;
  const bool owns_new = stores_new && pos < end;
  if constexpr (kFused) {
    // The angles depend on the position only: computed (in double) while the kernel before
    // still runs.
    for (int pr = threadIdx.x; pr < rs.rot_half; pr += kThreads)
      rope_cos_sin(pos, rs.inv_freq[pr], rope_cs[2 * pr], rope_cs[2 * pr + 1]);
    pdl_wait();  // every thread: q, k, v are the kernel before's output
    pdl_trigger();
    TESSERA_PROBE_MARK(2);
    // This step's key and value pair (the storing split; one pair per thread), loaded
    // together with the query heads so that both wait on one round trip.
    static_assert(HD / 2 <= kThreads, "one key pair per thread");
    const int pr = threadIdx.x;
    const bool my_pair = stores_new && pr < HD / 2;
    int ia = 0, ib = 0;
    float ka = 0.0f, kb = 0.0f, va = 0.0f, vb = 0.0f;
    int64_t slot = 0;
    if (my_pair) {
      const float* kr = rs.k + t * rs.ldk + static_cast<int64_t>(kvh) * HD;
      const float* vr = rs.v + t * rs.ldv + static_cast<int64_t>(kvh) * HD;
      rope_pair_dims(pr, rs.rot_half, rs.neox, ia, ib);  // pairs as rope_kv_store.cu takes them
      ka = kr[ia], kb = kr[ib], va = vr[ia], vb = vr[ib];
      slot = b.slot_mapping[t];
    }
    // Query heads head0 .. head0 + group - 1, raw, then rotated in place.
    const float* qrow = q + t * ldq + static_cast<int64_t>(head0) * HD;
    for (int i = threadIdx.x; i < group * HD / 4; i += kThreads)
      reinterpret_cast<float4*>(sq)[i] = reinterpret_cast<const float4*>(qrow)[i];
    __syncthreads();
    for (int i = threadIdx.x; i < group * (HD / 2); i += kThreads) {
      const int g = i / (HD / 2), qp = i % (HD / 2);
      if (qp >= rs.rot_half) continue;  // the unrotated tail
      float* x = sq + g * HD;
      int qa, qb;
      rope_pair_dims(qp, rs.rot_half, rs.neox, qa, qb);
      rope_apply(x[qa], x[qb], rope_cs[2 * qp], rope_cs[2 * qp + 1]);
    }
    if (my_pair) {  // this step's key (rotated) and value: into the cache and into snew
      const int64_t blk = slot / block_size, off = slot % block_size;
      const int64_t dst = ((blk * n_kv_heads + kvh) * block_size + off) * HD;
      if (pr < rs.rot_half) rope_apply(ka, kb, rope_cs[2 * pr], rope_cs[2 * pr + 1]);
      const __half hka = __float2half_rn(ka), hkb = __float2half_rn(kb);
      const __half hva = __float2half_rn(va), hvb = __float2half_rn(vb);
      snew[ia] = hka;
      snew[ib] = hkb;
      snew[HD + ia] = hva;
      snew[HD + ib] = hvb;
      rs.kc[dst + ia] = hka;
      rs.kc[dst + ib] = hkb;
      rs.vc[dst + ia] = hva;
      rs.vc[dst + ib] = hvb;
    }
    __syncthreads();
  }

  // Q A-fragments: row r = query head head0 + r % group of query row t + r / group (zeros
  // for r >= rows · group), k-step kk:
  // {row fr, cols 16kk + 2fc, +1}, {row fr + 8, same}, {row fr, +8}, {row fr + 8, +8};
  // from global, or (fused) from the rotated rows in shared memory.
  uint32_t qf[HD / 16][4];
  {
    auto load_q = [&](int row, int col) {
      float2 v = make_float2(0.0f, 0.0f);
      if (row < rows * group)
        v = kFused ? *reinterpret_cast<const float2*>(sq + row * HD + col)
                   : *reinterpret_cast<const float2*>(q + (t + row / group) * ldq +
                                                      static_cast<int64_t>(head0 + row % group) * HD + col);
      return pack_half2(v.x * q_scale, v.y * q_scale);
    };
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      qf[kk][0] = load_q(fr, kk * 16 + 2 * fc);
      qf[kk][1] = load_q(fr + 8, kk * 16 + 2 * fc);
      qf[kk][2] = load_q(fr, kk * 16 + 8 + 2 * fc);
      qf[kk][3] = load_q(fr + 8, kk * 16 + 8 + 2 * fc);
    }
  }

  float o[HD / 8][4];  // O rows fr (elements 0, 1) and fr + 8 (2, 3), dims n*8 + 2fc, +1
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  for (int i = 0; i < my_tiles; ++i) {
    load_tile(i + kStages - 1);  // into the buffer of tile i - 1, released by the __syncwarp ending i - 1
    // Groups committed: kStages + i; at most kStages - 1 pending = groups 0..i (tile i) landed.
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();  // every lane's copies and zero stores visible to the whole warp
    const __half* Ks = ring + (i % kStages) * kKeys * LD;
    const __half* Vs = Ks + kStages * kKeys * LD;
    const int key0 = begin + (warp + i * kWarps) * kKeys;
    if (owns_new && pos >= key0 && pos < key0 + kKeys) {  // fused: the added key over its stale copy
      if (lane < 2 * PPK) {
        const int piece = lane % PPK;
        __half* row = const_cast<__half*>(lane < PPK ? Ks : Vs) + (pos - key0) * LD + piece * 8;
        *reinterpret_cast<uint4*>(row) = *reinterpret_cast<const uint4*>(snew + (lane < PPK ? 0 : HD) + piece * 8);
      }
      __syncwarp();
    }

    // S = Q · Kᵀ: [16 query heads] × [16 keys] (n-blocks of keys 0..7 and 8..15).
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(smem_addr(Ks + ((lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8), b0, b1, b2,
                  b3);
      mma_f16(s[0], qf[kk], b0, b1);
      mma_f16(s[1], qf[kk], b2, b3);
    }
    // Length mask (each row its own: a verification row sees the keys up to its position),
    // then the online softmax of rows fr (elements 0, 1) and fr + 8 (2, 3); a row that sees
    // no key of the tile keeps m = -inf and adds nothing (online_softmax_step).
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (const int key = key0 + n * 8 + 2 * fc + (e & 1);
            key >= (e < 2 ? end_a : end_b) || tree_hides(e < 2 ? hid_a : hid_b, qc.lo, key))
          s[n][e] = -INFINITY;
    float c_a, c_b;
    online_softmax_step<2>(s, m_a, m_b, l_a, l_b, c_a, c_b);
    // O = O · c + P · V: the score fragments are the A fragment of the one k-step.
    const uint32_t pa[4] = {pack_half2(s[0][0], s[0][1]), pack_half2(s[0][2], s[0][3]), pack_half2(s[1][0], s[1][1]),
                            pack_half2(s[1][2], s[1][3])};
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      o[n][0] *= c_a;
      o[n][1] *= c_a;
      o[n][2] *= c_b;
      o[n][3] *= c_b;
      o[n + 1][0] *= c_a;
      o[n + 1][1] *= c_a;
      o[n + 1][2] *= c_b;
      o[n + 1][3] *= c_b;
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4_trans(smem_addr(Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 8 + (lane >> 4) * 8), b0, b1, b2,
                        b3);
      mma_f16(o[n], pa, b0, b1);
      mma_f16(o[n + 1], pa, b2, b3);
    }
    __syncwarp();  // every lane done reading this buffer before the next iteration refills it
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // only empty groups can be pending here
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);

  // Merge of the 4 warps. A warp without tiles has m = -inf, l = 0, O = 0 and adds nothing.
  __syncthreads();                               // every warp is done with its ring: the merge area spans all of them
  float* so = reinterpret_cast<float*>(smem_h);  // [kWarps][16][OLD]
  float* sm = so + kWarps * 16 * OLD;            // [kWarps][16]
  float* sl = sm + kWarps * 16;                  // [kWarps][16]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = fr + 8 * half;
    if (row >= rows * group) continue;
    if (fc == 0) {
      sm[warp * 16 + row] = half ? m_b : m_a;
      sl[warp * 16 + row] = half ? l_b : l_a;
    }
    float* dst = so + (warp * 16 + row) * OLD + 2 * fc;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * group * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;  // tile row r: head g of query row t + j
    const int j = r / group, g = r % group;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w * 16 + r]);
    float l = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm[w * 16 + r];
      if (mw == -INFINITY) continue;  // never -inf - -inf; exp2 of -inf - finite would be 0 anyway
      const float c = exp2f(mw - mx);
      l += sl[w * 16 + r] * c;
      acc += so[(w * 16 + r) * OLD + d] * c;
    }
    if constexpr (kFused) {                        // the block's state for the cluster's merge, past the warps' area
      float* part = so + kWarps * 16 * (OLD + 2);  // [16][HD] O, then m [16], l [16]
      part[g * HD + d] = acc;
      if (d == 0) {
        part[16 * HD + g] = mx;
        part[16 * HD + 16 + g] = l;
      }
    } else if (max_splits == 1) {
      out[(t + j) * ldo + static_cast<int64_t>(head0 + g) * HD + d] = l > 0.0f ? acc * (1.0f / l) : 0.0f;
    } else {  // per query row (a decode batch's row t is its sequence)
      float* p = partials + ((static_cast<int64_t>(t + j) * n_heads + head0 + g) * max_splits + split) * (HD + 2);
      p[2 + d] = acc;
      if (d == 0) {
        p[0] = mx * 0.6931471805599453f;  // base 2 -> natural log units (the merge uses __expf)
        p[1] = l;
      }
    }
  }
  if constexpr (kFused) {
    // The cluster's merge, in split order (deterministic): block r of the cluster (= split r)
    // finishes outputs r, r + n, ... of the group's heads from every block's state.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    TESSERA_PROBE_MARK(3);
    cluster.sync();  // every block's state written and visible across the cluster
    TESSERA_PROBE_MARK(4);
    const int n_blocks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
    float* const part = so + kWarps * 16 * (OLD + 2);
    for (int i = rank * kThreads + threadIdx.x; i < group * HD; i += n_blocks * kThreads) {
      const int g = i / HD, d = i % HD;
      // Every block's m, l and O first (the remote reads in flight together), then the
      // merge in split order.
      float m[kMaxFusedSplits], lr[kMaxFusedSplits], o[kMaxFusedSplits];
#pragma unroll
      for (int r = 0; r < kMaxFusedSplits; ++r) {
        m[r] = -INFINITY;
        lr[r] = o[r] = 0.0f;
        if (r < n_blocks) {
          const float* pr = cluster.map_shared_rank(part, r);
          m[r] = pr[16 * HD + g];
          lr[r] = pr[16 * HD + 16 + g];
          o[r] = pr[g * HD + d];
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < kMaxFusedSplits; ++r) mx = fmaxf(mx, m[r]);
      float l = 0.0f, acc = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxFusedSplits; ++r) {
        if (m[r] == -INFINITY) continue;  // a split without keys (or past the cluster)
        const float c = exp2f(m[r] - mx);
        l += lr[r] * c;
        acc += o[r] * c;
      }
      out[t * ldo + static_cast<int64_t>(head0 + g) * HD + d] = l > 0.0f ? acc * (1.0f / l) : 0.0f;
    }
    TESSERA_PROBE_MARK(5);
    cluster.sync();  // no block leaves while another still reads its shared memory
    // start, tiles issued, wait over, own splits done, cluster synced, merged; tag 7
    TESSERA_PROBE_PUT(attn, 7, split_len);
  }
}

template <int HD>
void launch_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads, int group,
                float scale, float* out, int64_t ldo, int split_len, int max_splits, int n_chunks, float* partials,
                cudaStream_t s) {
  constexpr size_t smem = ring_smem_bytes<HD>();
  static bool configured = false;  // per instantiation; the attribute is per function
  if (!configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_decode_mma_kernel<HD, false>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  const float q_scale = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  launch_pdl(attention_decode_mma_kernel<HD, false>, dim3(b.n_seqs, kv.n_kv_heads * n_chunks, max_splits),
             dim3(kThreads), smem, s, q, ldq, static_cast<const __half*>(kv.k), static_cast<const __half*>(kv.v), b,
             kv.n_kv_heads, kv.block_size, group, q_scale, split_len, max_splits, n_chunks, out, ldo, partials,
             RopeStoreArgs{});
  TESSERA_CUDA_CHECK_LAUNCH("attention_decode_mma");
  if (max_splits > 1) launch_attention_decode_merge(partials, b, n_heads, HD, split_len, max_splits, out, ldo, s);
}

// The fused variant: a cluster of n_splits blocks per (sequence, KV head), launched as a
// programmatic dependent launch (its tile copies overlap the kernel before).
template <int HD>
void launch_fused(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                  const RopeStoreArgs& rs, float* out, int64_t ldo, int split_len, int n_splits, cudaStream_t s) {
  constexpr size_t smem = fused_smem_bytes<HD>();
  static bool configured = false;
  if (!configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_decode_mma_kernel<HD, true>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(b.n_seqs, kv.n_kv_heads, n_splits);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = static_cast<unsigned>(n_splits);
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  const float q_scale = scale * 1.4426950408889634f;
  TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, attention_decode_mma_kernel<HD, true>, q, ldq,
                                        static_cast<const __half*>(kv.k), static_cast<const __half*>(kv.v), b,
                                        kv.n_kv_heads, kv.block_size, group, q_scale, split_len, n_splits, 1, out, ldo,
                                        static_cast<float*>(nullptr), rs));
  TESSERA_CUDA_CHECK_LAUNCH("attention_decode_mma (fused rope + kv store)");
}

}  // namespace

bool attention_decode_mma_applies(const KvLayerView& kv, int n_heads) {
  if (kv.plain_dtype() != DType::F16) return false;
  if (kv.head_dim != 64 && kv.head_dim != 128) return false;
  if (kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0) return false;
  const int group = n_heads / kv.n_kv_heads;
  return group >= 1 && group <= 16;  // the query heads of a KV head are the 16 rows of one mma
}

int attention_decode_mma_chunks(int group, int max_rows) {
  const int chunk_rows = 16 / group;
  return (max_rows + chunk_rows - 1) / chunk_rows;
}

bool launch_attention_decode_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                                 float scale, float* out, int64_t ldo, int split_len, int max_splits, float* partials,
                                 cudaStream_t s, int max_rows) {
  if (!attention_decode_mma_applies(kv, n_heads) || max_rows < 1) return false;
  const int group = n_heads / kv.n_kv_heads;
  const int n_chunks = attention_decode_mma_chunks(group, max_rows);
  if (split_len <= 0 || split_len % 64 != 0 || max_splits < 1) return false;  // 4 warps × 16-key tiles
  if (reinterpret_cast<uintptr_t>(q) % 8 != 0 || ldq % 2 != 0 || reinterpret_cast<uintptr_t>(out) % 8 != 0 ||
      ldo % 2 != 0)
    return false;  // float2 loads of Q
  if (b.n_seqs == 0) return true;
  if (kv.head_dim == 64)
    launch_mma<64>(q, ldq, kv, b, n_heads, group, scale, out, ldo, split_len, max_splits, n_chunks, partials, s);
  else
    launch_mma<128>(q, ldq, kv, b, n_heads, group, scale, out, ldo, split_len, max_splits, n_chunks, partials, s);
  return true;
}

}  // namespace tessera::cuda

namespace tessera::cuda {

bool rope_kv_store_attention_decode_applies(const float* q, int64_t ldq, const float* out, int64_t ldo,
                                            const KvLayerView& kv, int n_heads, int rot_dim, int split_len,
                                            int n_splits) {
  if (!attention_decode_mma_applies(kv, n_heads)) return false;
  if (split_len <= 0 || split_len % 64 != 0 || n_splits < 1 || n_splits > kMaxFusedSplits) return false;
  if (rot_dim < 0 || rot_dim % 2 != 0 || rot_dim > kv.head_dim) return false;
  // float4 loads of Q, float2 stores of out
  return reinterpret_cast<uintptr_t>(q) % 16 == 0 && ldq % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0 &&
         ldo % 2 == 0;
}

void launch_rope_kv_store_attention_decode(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                                           int64_t ldv, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                                           float scale, int rot_dim, bool neox, const double* inv_freq, float* out,
                                           int64_t ldo, int split_len, int n_splits, cudaStream_t s) {
  TESSERA_CHECK(rope_kv_store_attention_decode_applies(q, ldq, out, ldo, kv, n_heads, rot_dim, split_len, n_splits),
                "cuda fused rope + kv store + decode attention: does not apply to this layout");
  if (b.n_seqs == 0) return;
  RopeStoreArgs rs;
  rs.k = k;
  rs.ldk = ldk;
  rs.v = v;
  rs.ldv = ldv;
  rs.kc = static_cast<__half*>(kv.k);
  rs.vc = static_cast<__half*>(kv.v);
  rs.inv_freq = inv_freq;
  rs.rot_half = rot_dim / 2;
  rs.neox = neox ? 1 : 0;
  const int group = n_heads / kv.n_kv_heads;
  if (kv.head_dim == 64)
    launch_fused<64>(q, ldq, kv, b, group, scale, rs, out, ldo, split_len, n_splits, s);
  else
    launch_fused<128>(q, ldq, kv, b, group, scale, rs, out, ldo, split_len, n_splits, s);
}

}  // namespace tessera::cuda
