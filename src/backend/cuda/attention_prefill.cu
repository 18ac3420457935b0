// Paged FlashAttention for prefill and mixed batches (variable length, causal, GQA).
// A block of 128 threads takes a tile of up to 64 query vectors (rows of one sequence ×
// query heads of one KV head, so each K/V tile is loaded once for the whole group) and walks
// that sequence's keys in tiles of 32 through its block table, keeping the online-softmax
// state (m, l) per query vector and the output in registers. Scores: each thread a 4×4
// micro-tile (4 query vectors × 4 keys); P·V: each thread 4 query vectors × head_dim/8
// dims. Shared memory rows are padded by one float where threads of a warp read different
// rows of the same column.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemma_kernels.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kQ = 64;  // query vectors per block
constexpr int kK = 32;  // keys per tile

template <int HD>
constexpr size_t prefill_smem_bytes() {
  return sizeof(float) * (kQ * (HD + 1) + kK * (HD + 1) + kK * HD + kQ * (kK + 1) + 3 * kQ);
}

template <typename KT, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_prefill_kernel(const float* __restrict__ q, int64_t ldq, const KT* __restrict__ kc,
                             const KT* __restrict__ vc, DeviceBatch b, int n_kv_heads, int block_size, int group,
                             int gc, int rows_per_tile, float scale, float* __restrict__ out, int64_t ldo, int window) {
  extern __shared__ float smem[];
  float* Qs = smem;                  // [kQ][HD+1], pre-scaled
  float* Ks = Qs + kQ * (HD + 1);    // [kK][HD+1]
  float* Vs = Ks + kK * (HD + 1);    // [kK][HD]
  float* S = Vs + kK * HD;           // [kQ][kK+1] scores, then probabilities
  float* row_m = S + kQ * (kK + 1);  // [kQ]
  float* row_l = row_m + kQ;         // [kQ]
  float* row_c = row_l + kQ;         // [kQ] rescale of this tile
  __shared__ int tile_info[3];       // sequence, first row, end row
  __shared__ int pos_s[kQ];
  __shared__ uint32_t hid_s[kQ];  // tree verification: hidden keys per query vector (tree_hides)

  if (threadIdx.x == 0) {
    int tile = blockIdx.x, seq = -1, r0 = 0, r1 = 0;
    for (int s = 0; s < b.n_seqs; ++s) {
      const int len = b.q_start[s + 1] - b.q_start[s];
      const int nt = (len + rows_per_tile - 1) / rows_per_tile;
      if (tile < nt) {
        seq = s;
        r0 = b.q_start[s] + tile * rows_per_tile;
        r1 = min(b.q_start[s + 1], r0 + rows_per_tile);
        break;
      }
      tile -= nt;
    }
    tile_info[0] = seq;
    tile_info[1] = r0;
    tile_info[2] = r1;
  }
  __syncthreads();
  const int seq = tile_info[0];
  if (seq < 0) return;
  const int r0 = tile_info[1], r1 = tile_info[2];
  const int kvh = blockIdx.y / ((group + gc - 1) / gc);
  const int g0 = (blockIdx.y % ((group + gc - 1) / gc)) * gc;
  const int ng = min(gc, group - g0);

  const int lo = tree_lo(b, seq);
  // Query vector qi = row * gc + g; invalid ones get position -1 (every key masked).
  int max_pos = 0;
  for (int qi = threadIdx.x; qi < kQ; qi += kThreads) {
    const int row = qi / gc, g = qi % gc;
    const bool valid = r0 + row < r1 && g < ng;
    pos_s[qi] = valid ? b.positions[r0 + row] : -1;
    hid_s[qi] = valid ? tree_hidden(b, r0 + row) : 0u;
    row_m[qi] = -FLT_MAX;
    row_l[qi] = 0.0f;
  }
  for (int i = threadIdx.x; i < kQ * HD; i += kThreads) {
    const int qi = i / HD, d = i % HD, row = qi / gc, g = qi % gc;
    const bool valid = r0 + row < r1 && g < ng;
    Qs[qi * (HD + 1) + d] =
        valid ? q[static_cast<int64_t>(r0 + row) * ldq + static_cast<int64_t>(kvh * group + g0 + g) * HD + d] * scale
              : 0.0f;
  }
  __syncthreads();
  int min_pos = INT_MAX;
  for (int i = 0; i < kQ; ++i) {
    max_pos = max(max_pos, pos_s[i]);
    if (pos_s[i] >= 0) min_pos = min(min_pos, pos_s[i]);
  }
  const int kv_end = min(b.kv_len[seq], max_pos + 1);
  // Sliding window: tiles wholly before every query's window are skipped.
  const int kv_begin = window > 0 && min_pos != INT_MAX ? max(0, min_pos - window + 1) / kK * kK : 0;
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;

  const int qg = threadIdx.x / 8, sub = threadIdx.x % 8;  // 16 groups of 4 query vectors × 8
  float o[4][HD / 8];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[a][i] = 0.0f;

  for (int base = kv_begin; base < kv_end; base += kK) {
    // K/V tile → shared memory as f32 (zeros past the end).
    for (int i = threadIdx.x; i < kK * HD; i += kThreads) {
      const int j = i / HD, d = i % HD, key = base + j;
      float kv_k = 0.0f, kv_v = 0.0f;
      // A block dropped behind a sliding window (kDropped, -1) is never read (zeros, masked).
      const int32_t blk = key < kv_end ? table[key / block_size] : -1;
      if (blk >= 0) {
        const int64_t off = ((static_cast<int64_t>(blk) * n_kv_heads + kvh) * block_size + key % block_size) * HD + d;
        if constexpr (sizeof(KT) == 2) {
          kv_k = __half2float(kc[off]);
          kv_v = __half2float(vc[off]);
        } else {
          kv_k = kc[off];
          kv_v = vc[off];
        }
      }
      Ks[j * (HD + 1) + d] = kv_k;
      Vs[j * HD + d] = kv_v;
    }
    __syncthreads();
    // Scores: thread (qg, sub) computes query vectors 4qg..4qg+3 × keys sub + 8c.
    {
      float s[4][4] = {};
      for (int d = 0; d < HD; ++d) {
        float qv[4], kv[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) qv[a] = Qs[(4 * qg + a) * (HD + 1) + d];
#pragma unroll
        for (int c = 0; c < 4; ++c) kv[c] = Ks[(sub + 8 * c) * (HD + 1) + d];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[a][c] = fmaf(qv[a], kv[c], s[a][c]);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int qi = 4 * qg + a, key = base + sub + 8 * c;
          const bool visible = key < kv_end && key <= pos_s[qi] && (window == 0 || key > pos_s[qi] - window) &&
                               !tree_hides(hid_s[qi], lo, key);
          S[qi * (kK + 1) + sub + 8 * c] = visible ? s[a][c] : -FLT_MAX;
        }
    }
    __syncthreads();
    // Online softmax, one thread per query vector.
    if (threadIdx.x < kQ) {
      const int qi = threadIdx.x;
      float* srow = S + qi * (kK + 1);
      float mx = row_m[qi];
      for (int j = 0; j < kK; ++j) mx = fmaxf(mx, srow[j]);
      float sum = 0.0f;
      for (int j = 0; j < kK; ++j) {
        const float p = srow[j] == -FLT_MAX ? 0.0f : __expf(srow[j] - mx);
        srow[j] = p;
        sum += p;
      }
      const float c = row_l[qi] > 0.0f ? __expf(row_m[qi] - mx) : 0.0f;
      row_c[qi] = c;
      row_l[qi] = row_l[qi] * c + sum;
      row_m[qi] = mx;
    }
    __syncthreads();
    // O = O * c + P · V: thread (qg, sub) owns query vectors 4qg.. × dims sub + 8i.
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float c = row_c[4 * qg + a];
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) o[a][i] *= c;
    }
    for (int j = 0; j < kK; ++j) {
      float p[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) p[a] = S[(4 * qg + a) * (kK + 1) + j];
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        const float v = Vs[j * HD + sub + 8 * i];
#pragma unroll
        for (int a = 0; a < 4; ++a) o[a][i] = fmaf(p[a], v, o[a][i]);
      }
    }
    __syncthreads();  // before the next tile overwrites Ks/Vs/S
  }
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int qi = 4 * qg + a, row = qi / gc, g = qi % gc;
    if (r0 + row >= r1 || g >= ng) continue;
    const float inv = row_l[qi] > 0.0f ? 1.0f / row_l[qi] : 0.0f;
    float* dst = out + static_cast<int64_t>(r0 + row) * ldo + static_cast<int64_t>(kvh * group + g0 + g) * HD;
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) dst[sub + 8 * i] = o[a][i] * inv;
  }
}

template <typename KT, int HD>
void launch_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                    float* out, int64_t ldo, int window, cudaStream_t s) {
  const int gc = min(group, kQ);
  const int rows_per_tile = kQ / gc;
  const int g_chunks = (group + gc - 1) / gc;
  // Tiles: at most one partial tile per sequence beyond n_tokens / rows_per_tile.
  const unsigned n_tiles = static_cast<unsigned>(b.n_tokens / rows_per_tile + b.n_seqs);
  constexpr size_t smem = prefill_smem_bytes<HD>();
  static bool configured = false;  // per instantiation; the attribute is per function
  if (!configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<KT, HD>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  attention_prefill_kernel<KT, HD><<<dim3(n_tiles, kv.n_kv_heads * g_chunks), kThreads, smem, s>>>(
      q, ldq, static_cast<const KT*>(kv.k), static_cast<const KT*>(kv.v), b, kv.n_kv_heads, kv.block_size, group, gc,
      rows_per_tile, scale, out, ldo, window);
  TESSERA_CUDA_CHECK_LAUNCH("attention_prefill");
}

}  // namespace

void launch_attention_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                              float scale, float* out, int64_t ldo, cudaStream_t s) {
  launch_attention_prefill_window(q, ldq, kv, b, n_heads, scale, out, ldo, 0, s);
}

void launch_attention_prefill_window(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                     int n_heads, float scale, float* out, int64_t ldo, int window, cudaStream_t s) {
  TESSERA_CHECK(kv.plain_dtype() == DType::F16 || kv.plain_dtype() == DType::F32, "cuda attention: KV type ",
                kv_format_name(kv.k_fmt), "/", kv_format_name(kv.v_fmt));
  if (b.n_tokens == 0 || b.n_seqs == 0) return;
  const int group = n_heads / kv.n_kv_heads;
  const bool f16 = kv.plain_dtype() == DType::F16;
  switch (kv.head_dim) {
    case 64:
      f16 ? launch_prefill<__half, 64>(q, ldq, kv, b, group, scale, out, ldo, window, s)
          : launch_prefill<float, 64>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      break;
    case 96:  // Phi-3
      f16 ? launch_prefill<__half, 96>(q, ldq, kv, b, group, scale, out, ldo, window, s)
          : launch_prefill<float, 96>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      break;
    case 128:
      f16 ? launch_prefill<__half, 128>(q, ldq, kv, b, group, scale, out, ldo, window, s)
          : launch_prefill<float, 128>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      break;
    case 256:
      f16 ? launch_prefill<__half, 256>(q, ldq, kv, b, group, scale, out, ldo, window, s)
          : launch_prefill<float, 256>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      break;
    default:
      fail("cuda attention: head_dim ", kv.head_dim, " is not supported (64, 96, 128, 256)");
  }
}

}  // namespace tessera::cuda
