// Paged FlashAttention for prefill and mixed batches on the tensor cores (f16 KV cache):
// a block takes up to 128 query vectors (64 at head_dim 256 or for short rows) = rows of one
// sequence × the query heads of one KV head; keys walked through the block table. Q·Kᵀ
// and P·V run as mma.sync m16n8k16 (f16 operands, f32 accumulate), FlashAttention-2 style:
// each of the 4 warps owns 32 (or 16) query vectors, its scores stay in registers, the online
// softmax (base 2, f32) runs on the accumulator fragments and the probabilities are packed
// straight into the A fragments of P·V. K/V tiles arrive in shared memory by cp.async
// (16 bytes, one KV row piece each; two buffers, the next tile copied while this one is
// computed) and are read with ldmatrix (.trans for V). Rows are
// padded by 8 halves so the 8 rows of each ldmatrix land in distinct banks.
//
// Numerics: Q is rounded to f16 after scaling by softmax_scale·log2(e) (the KV cache is f16
// already), P to f16 before P·V; sums and the softmax state are f32. Relative error against
// the f32 kernel is ~2e-4 (measured; tests/unit/cuda/cuda_attention_test.cpp).
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemma_kernels.h"
#include "backend/cuda/mma_common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // halves of padding per shared-memory row

// MT: m16 tiles of query vectors per warp. Two (a block of 128 query vectors) when head_dim
// <= 128 and the batch has rows enough to fill them: each K/V fragment read from shared memory
// then feeds two mma instead of one, which halves the ldmatrix traffic per FLOP (the limit at
// one tile per warp, with two blocks of four warps per SM). head_dim 256 keeps one: two tiles'
// O fragments would not fit the registers.
template <int MT>
__host__ __device__ constexpr int queries_per_block() {
  return 16 * kWarps * MT;
}

// Keys per K/V tile: fewer at head_dim 256 and with two query tiles per warp, so the O and S
// fragments stay in registers.
template <int HD, int MT>
__host__ __device__ constexpr int keys_per_tile() {
  return HD <= 128 && MT == 1 ? 64 : HD <= 64 ? 64 : 32;
}

// Two K/V tile buffers: the next tile's cp.async copies run while this one is computed.
constexpr int kBuffers = 2;

template <int HD, int MT>
constexpr size_t mma_smem_bytes() {
  return sizeof(__half) * (queries_per_block<MT>() + 2 * kBuffers * keys_per_tile<HD, MT>()) * (HD + kPad);
}

template <int HD, int MT>
__global__ void __launch_bounds__(kThreads)
    attention_prefill_mma_kernel(const float* __restrict__ q, int64_t ldq, const __half* __restrict__ kc,
                                 const __half* __restrict__ vc, DeviceBatch b, int n_kv_heads, int block_size,
                                 int group, int gc, int rows_per_tile, float q_scale, float* __restrict__ out,
                                 int64_t ldo, int window) {
  constexpr int KT = keys_per_tile<HD, MT>();
  constexpr int kQ = queries_per_block<MT>();
  constexpr int LD = HD + kPad;  // shared row stride in halves
  extern __shared__ __align__(16) __half smem_h[];
  __half* Qs = smem_h;                     // [kQ][LD], pre-scaled
  __half* Ks0 = Qs + kQ * LD;              // [kBuffers][KT][LD]
  __half* Vs0 = Ks0 + kBuffers * KT * LD;  // [kBuffers][KT][LD]
  __shared__ int tile_info[3];             // sequence, first row, end row
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

  // Query vector qi = row * gc + g; invalid ones get position -1 (every key masked) and zeros.
  for (int qi = threadIdx.x; qi < kQ; qi += kThreads) {
    const int row = qi / gc, g = qi % gc;
    pos_s[qi] = r0 + row < r1 && g < ng ? b.positions[r0 + row] : -1;
    hid_s[qi] = r0 + row < r1 && g < ng ? tree_hidden(b, r0 + row) : 0u;
  }
  const int lo = tree_lo(b, seq);
  for (int i = threadIdx.x; i < kQ * HD / 2; i += kThreads) {
    const int qi = i / (HD / 2), d = 2 * (i % (HD / 2)), row = qi / gc, g = qi % gc;
    float2 v = make_float2(0.0f, 0.0f);
    if (r0 + row < r1 && g < ng)
      v = *reinterpret_cast<const float2*>(q + static_cast<int64_t>(r0 + row) * ldq +
                                           static_cast<int64_t>(kvh * group + g0 + g) * HD + d);
    *reinterpret_cast<__half2*>(Qs + qi * LD + d) = __floats2half2_rn(v.x * q_scale, v.y * q_scale);
  }
  __syncthreads();
  int max_pos = -1, min_pos = INT_MAX;
  for (int i = 0; i < kQ; ++i) {
    max_pos = max(max_pos, pos_s[i]);
    if (pos_s[i] >= 0) min_pos = min(min_pos, pos_s[i]);
  }
  const int kv_end = min(b.kv_len[seq], max_pos + 1);
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fr = lane >> 2, fc = lane & 3;  // fragment row (0..7) and column pair (0..3)
  const int q0 = warp * 16 * MT;            // this warp's first query vector
  // Rows of tile m: a = q0 + 16m + fr (fragment elements 0, 1), b = a + 8 (elements 2, 3).
  int pos_a[MT], pos_b[MT];
  uint32_t hid_a[MT], hid_b[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    pos_a[m] = pos_s[q0 + 16 * m + fr];
    pos_b[m] = pos_s[q0 + 16 * m + fr + 8];
    hid_a[m] = hid_s[q0 + 16 * m + fr];
    hid_b[m] = hid_s[q0 + 16 * m + fr + 8];
  }
  int warp_max_pos = -1, warp_min_pos = INT_MAX;  // over the warp's valid query vectors
  for (int i = 0; i < 16 * MT; ++i) {
    const int p = pos_s[q0 + i];
    warp_max_pos = max(warp_max_pos, p);
    if (p >= 0) warp_min_pos = min(warp_min_pos, p);
  }

  float o[MT][HD / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
  float m_a[MT], m_b[MT], l_a[MT], l_b[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    m_a[m] = m_b[m] = -INFINITY;
    l_a[m] = l_b[m] = 0.0f;
  }

  // Copies of key tile `tile` into buffer `buf`: cp.async for keys in range, zeros past the
  // end (not stale data: P is 0 there, and 0 · NaN would poison O).
  auto load_tile = [&](int tile, int buf) {
    __half* Kb = Ks0 + buf * KT * LD;
    __half* Vb = Vs0 + buf * KT * LD;
    for (int i = threadIdx.x; i < KT * (HD / 8); i += kThreads) {
      const int j = i / (HD / 8), piece = (i % (HD / 8)) * 8, key = tile * KT + j;
      // A block dropped behind a sliding window (kDropped, -1) is never read: its keys are
      // before every query's window, masked like those past the end.
      const int32_t blk = key < kv_end ? table[key / block_size] : -1;
      if (blk >= 0) {
        const int64_t off =
            ((static_cast<int64_t>(blk) * n_kv_heads + kvh) * block_size + key % block_size) * HD + piece;
        cp_async16(Kb + j * LD + piece, kc + off);
        cp_async16(Vb + j * LD + piece, vc + off);
      } else {
        *reinterpret_cast<uint4*>(Kb + j * LD + piece) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(Vb + j * LD + piece) = make_uint4(0, 0, 0, 0);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  const int n_tiles = (kv_end + KT - 1) / KT;
  // Sliding window: tiles wholly before every query's window are not loaded.
  const int t0 = window > 0 && min_pos != INT_MAX ? min(n_tiles, max(0, min_pos - window + 1) / KT) : 0;
  if (t0 < n_tiles) load_tile(t0, 0);
  for (int t = t0; t < n_tiles; ++t) {
    const int base = t * KT, buf = (t - t0) & 1;
    // The other buffer was last read in iteration t - 1, which ended with a barrier.
    if (t + 1 < n_tiles) {
      load_tile(t + 1, buf ^ 1);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // tile t has landed
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    __syncthreads();
    const __half* Ks = Ks0 + buf * KT * LD;
    const __half* Vs = Vs0 + buf * KT * LD;
    if (base <= warp_max_pos) {  // else every key of this tile is after this warp's queries
      // S = Q · Kᵀ: [16·MT query vectors] × [KT keys] per warp, in accumulator fragments; each
      // K fragment feeds the MT query tiles.
      float s[MT][KT / 8][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
          ldmatrix_x4(smem_addr(Qs + (q0 + 16 * m + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8), a[m][0], a[m][1],
                      a[m][2], a[m][3]);
#pragma unroll
        for (int n = 0; n < KT / 8; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(smem_addr(Ks + (n * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8), b0,
                      b1, b2, b3);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_f16(s[m][n], a[m], b0, b1);
            mma_f16(s[m][n + 1], a[m], b2, b3);
          }
        }
      }
      // Causal, window and length mask — skipped for a tile every query of the warp sees whole
      // (most tiles of a long context) — then the online softmax of each tile's rows.
      const bool whole = base + KT <= kv_end && base + KT - 1 <= warp_min_pos &&
                         (window == 0 || base > warp_max_pos - window) && (lo == INT_MAX || base + KT - 1 <= lo);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (!whole) {
#pragma unroll
          for (int n = 0; n < KT / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = base + n * 8 + 2 * fc + (e & 1);
              const int pos = e < 2 ? pos_a[m] : pos_b[m];
              const bool visible = key < kv_end && key <= pos && (window == 0 || key > pos - window) &&
                                   !tree_hides(e < 2 ? hid_a[m] : hid_b[m], lo, key);
              s[m][n][e] = visible ? s[m][n][e] : -INFINITY;
            }
        }
        float c_a, c_b;  // l: this lane's share of the row sum (reduced at the end)
        online_softmax_step<KT / 8>(s[m], m_a[m], m_b[m], l_a[m], l_b[m], c_a, c_b);
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          o[m][n][0] *= c_a;
          o[m][n][1] *= c_a;
          o[m][n][2] *= c_b;
          o[m][n][3] *= c_b;
        }
      }
      // O += P · V: the score fragments of keys 16k..16k+15 are the A fragment of step k; each
      // V fragment feeds the MT query tiles.
#pragma unroll
      for (int k = 0; k < KT / 16; ++k) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          a[m][0] = pack_half2(s[m][2 * k][0], s[m][2 * k][1]);
          a[m][1] = pack_half2(s[m][2 * k][2], s[m][2 * k][3]);
          a[m][2] = pack_half2(s[m][2 * k + 1][0], s[m][2 * k + 1][1]);
          a[m][3] = pack_half2(s[m][2 * k + 1][2], s[m][2 * k + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(
              smem_addr(Vs + (k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 8 + (lane >> 4) * 8), b0, b1, b2,
              b3);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_f16(o[m][n], a[m], b0, b1);
            mma_f16(o[m][n + 1], a[m], b2, b3);
          }
        }
      }
    }                 // this warp's tile
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float la = l_a[m], lb = l_b[m];
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    const float inv_a = la > 0.0f ? 1.0f / la : 0.0f, inv_b = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int qi = q0 + 16 * m + fr + 8 * half;
      if ((half ? pos_b[m] : pos_a[m]) < 0) continue;
      const int row = qi / gc, g = qi % gc;
      const float inv = half ? inv_b : inv_a;
      float* dst =
          out + static_cast<int64_t>(r0 + row) * ldo + static_cast<int64_t>(kvh * group + g0 + g) * HD + 2 * fc;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[m][n][2 * half] * inv, o[m][n][2 * half + 1] * inv);
    }
  }
}

template <int HD, int MT>
void launch_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                float* out, int64_t ldo, int window, cudaStream_t s) {
  constexpr int kQ = queries_per_block<MT>();
  const int gc = min(group, kQ);
  const int rows_per_tile = kQ / gc;
  const int g_chunks = (group + gc - 1) / gc;
  const unsigned n_tiles = static_cast<unsigned>(b.n_tokens / rows_per_tile + b.n_seqs);
  constexpr size_t smem = mma_smem_bytes<HD, MT>();
  static bool configured = false;  // per instantiation; the attribute is per function
  if (!configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_mma_kernel<HD, MT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  const float q_scale = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  attention_prefill_mma_kernel<HD, MT><<<dim3(n_tiles, kv.n_kv_heads * g_chunks), kThreads, smem, s>>>(
      q, ldq, static_cast<const __half*>(kv.k), static_cast<const __half*>(kv.v), b, kv.n_kv_heads, kv.block_size,
      group, gc, rows_per_tile, q_scale, out, ldo, window);
  TESSERA_CUDA_CHECK_LAUNCH("attention_prefill_mma");
}

// Two query tiles per warp when the batch's sequences average at least a full block of query
// vectors (prefill chunks); one for mixed batches of short rows (decode rows ride along),
// where a second tile would mostly compute masked queries.
template <int HD>
void launch_hd(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
               float* out, int64_t ldo, int window, cudaStream_t s) {
  if constexpr (HD <= 128) {
    const int64_t vectors_per_seq = static_cast<int64_t>(b.n_tokens) * group / b.n_seqs;
    if (vectors_per_seq >= queries_per_block<2>())
      return launch_mma<HD, 2>(q, ldq, kv, b, group, scale, out, ldo, window, s);
  }
  launch_mma<HD, 1>(q, ldq, kv, b, group, scale, out, ldo, window, s);
}

}  // namespace

bool launch_attention_prefill_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                                  float scale, float* out, int64_t ldo, cudaStream_t s) {
  return launch_attention_prefill_mma_window(q, ldq, kv, b, n_heads, scale, out, ldo, 0, s);
}

bool launch_attention_prefill_mma_window(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                         int n_heads, float scale, float* out, int64_t ldo, int window,
                                         cudaStream_t s) {
  if (kv.plain_dtype() != DType::F16) return false;
  if (reinterpret_cast<uintptr_t>(q) % 8 != 0 || ldq % 2 != 0 || reinterpret_cast<uintptr_t>(out) % 8 != 0 ||
      ldo % 2 != 0)
    return false;  // float2 accesses need even strides
  if (b.n_tokens == 0 || b.n_seqs == 0) return true;
  const int group = n_heads / kv.n_kv_heads;
  switch (kv.head_dim) {
    case 64:
      launch_hd<64>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      return true;
    case 128:
      launch_hd<128>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      return true;
    case 256:
      launch_hd<256>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      return true;
    default:
      return false;
  }
}

}  // namespace tessera::cuda
