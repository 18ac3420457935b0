// Paged FlashAttention for prefill and mixed batches on the tensor cores (f16 KV cache):
// the same tiling as attention_prefill.cu (a block takes up to 64 query vectors = rows of one
// sequence × the query heads of one KV head; keys walked through the block table) but Q·Kᵀ
// and P·V run as mma.sync m16n8k16 (f16 operands, f32 accumulate), FlashAttention-2 style:
// each of the 4 warps owns 16 query vectors, its scores stay in registers, the online
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
constexpr int kQ = 16 * kWarps;  // query vectors per block
constexpr int kPad = 8;          // halves of padding per shared-memory row

template <int HD>
__host__ __device__ constexpr int keys_per_tile() {
  return HD <= 128 ? 64 : 32;  // HD 256: fewer keys keep the O fragments in registers
}

// Two K/V tile buffers: the next tile's cp.async copies run while this one is computed.
constexpr int kBuffers = 2;

template <int HD>
constexpr size_t mma_smem_bytes() {
  return sizeof(__half) * (kQ + 2 * kBuffers * keys_per_tile<HD>()) * (HD + kPad);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_prefill_mma_kernel(const float* __restrict__ q, int64_t ldq, const __half* __restrict__ kc,
                                 const __half* __restrict__ vc, DeviceBatch b, int n_kv_heads, int block_size,
                                 int group, int gc, int rows_per_tile, float q_scale, float* __restrict__ out,
                                 int64_t ldo, int window) {
  constexpr int KT = keys_per_tile<HD>();
  constexpr int LD = HD + kPad;  // shared row stride in halves
  extern __shared__ __align__(16) __half smem_h[];
  __half* Qs = smem_h;                     // [kQ][LD], pre-scaled
  __half* Ks0 = Qs + kQ * LD;              // [kBuffers][KT][LD]
  __half* Vs0 = Ks0 + kBuffers * KT * LD;  // [kBuffers][KT][LD]
  __shared__ int tile_info[3];             // sequence, first row, end row
  __shared__ int pos_s[kQ];

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
  }
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
  const int qa = warp * 16 + fr, qb = qa + 8;
  const int pos_a = pos_s[qa], pos_b = pos_s[qb];
  int warp_max_pos = -1;
  for (int i = 0; i < 16; ++i) warp_max_pos = max(warp_max_pos, pos_s[warp * 16 + i]);

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

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
      // S = Q · Kᵀ: [16 query vectors] × [KT keys] per warp, in accumulator fragments.
      float s[KT / 8][4];
#pragma unroll
      for (int n = 0; n < KT / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(smem_addr(Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8), a[0], a[1], a[2], a[3]);
#pragma unroll
        for (int n = 0; n < KT / 8; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(smem_addr(Ks + (n * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8), b0,
                      b1, b2, b3);
          mma_f16(s[n], a, b0, b1);
          mma_f16(s[n + 1], a, b2, b3);
        }
      }
      // Causal and length mask, then the online softmax of rows qa (elements 0, 1) and qb (2, 3).
#pragma unroll
      for (int n = 0; n < KT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = base + n * 8 + 2 * fc + (e & 1);
          const int pos = e < 2 ? pos_a : pos_b;
          const bool visible = key < kv_end && key <= pos && (window == 0 || key > pos - window);
          s[n][e] = visible ? s[n][e] : -INFINITY;
        }
      float c_a, c_b;  // l: this lane's share of the row sum (reduced at the end)
      online_softmax_step<KT / 8>(s, m_a, m_b, l_a, l_b, c_a, c_b);
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][0] *= c_a;
        o[n][1] *= c_a;
        o[n][2] *= c_b;
        o[n][3] *= c_b;
      }
      // O += P · V: the score fragments of keys 16k..16k+15 are the A fragment of step k.
#pragma unroll
      for (int k = 0; k < KT / 16; ++k) {
        const uint32_t a[4] = {pack_half2(s[2 * k][0], s[2 * k][1]), pack_half2(s[2 * k][2], s[2 * k][3]),
                               pack_half2(s[2 * k + 1][0], s[2 * k + 1][1]),
                               pack_half2(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(
              smem_addr(Vs + (k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 8 + (lane >> 4) * 8), b0, b1, b2,
              b3);
          mma_f16(o[n], a, b0, b1);
          mma_f16(o[n + 1], a, b2, b3);
        }
      }
    }                 // this warp's tile
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int qi = half ? qb : qa;
    if ((half ? pos_b : pos_a) < 0) continue;
    const int row = qi / gc, g = qi % gc;
    const float inv = half ? inv_b : inv_a;
    float* dst = out + static_cast<int64_t>(r0 + row) * ldo + static_cast<int64_t>(kvh * group + g0 + g) * HD + 2 * fc;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
  }
}

template <int HD>
void launch_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                float* out, int64_t ldo, int window, cudaStream_t s) {
  const int gc = min(group, kQ);
  const int rows_per_tile = kQ / gc;
  const int g_chunks = (group + gc - 1) / gc;
  const unsigned n_tiles = static_cast<unsigned>(b.n_tokens / rows_per_tile + b.n_seqs);
  constexpr size_t smem = mma_smem_bytes<HD>();
  static bool configured = false;  // per instantiation; the attribute is per function
  if (!configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_mma_kernel<HD>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  const float q_scale = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  attention_prefill_mma_kernel<HD><<<dim3(n_tiles, kv.n_kv_heads * g_chunks), kThreads, smem, s>>>(
      q, ldq, static_cast<const __half*>(kv.k), static_cast<const __half*>(kv.v), b, kv.n_kv_heads, kv.block_size,
      group, gc, rows_per_tile, q_scale, out, ldo, window);
  TESSERA_CUDA_CHECK_LAUNCH("attention_prefill_mma");
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
      launch_mma<64>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      return true;
    case 128:
      launch_mma<128>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      return true;
    case 256:
      launch_mma<256>(q, ldq, kv, b, group, scale, out, ldo, window, s);
      return true;
    default:
      return false;
  }
}

}  // namespace tessera::cuda
