// Paged attention for prefill and mixed batches over quantized KV pages (variable length,
// causal, GQA) on the tensor cores: attention_prefill_mma.cu's tiling and FlashAttention-2
// loop (a block of 4 warps takes up to 64 query vectors = rows of one sequence × query heads
// of one KV head, each warp 16 of them; Q·Kᵀ and P·V as mma.sync m16n8k16 with f16 operands
// and f32 accumulators; online softmax in base 2 on the accumulator fragments), with each K/V
// tile decoded from its pages into f16 shared memory by all threads (kv_decode_tile) instead
// of copied by cp.async. No dequantized copy of the cache exists outside the tile.
// Turbo keys: the queries are rotated once per block (kv_prepare_queries, in f32) and, with
// QJL, S q' sits beside them, so a score is one dot product over KW = 2·head_dim channels;
// turbo values: O is accumulated in V's rotated basis and rotated back once at the end.
//
// Numerics: the decoded K/V values and the scaled queries are rounded to f16 (a codebook
// value times its scale keeps 11 significant bits, far below the quantization step), P to
// f16 before P·V; sums and the softmax state are f32.
//
// Shared memory: Qs [64][KW + 8] f16, then either the K/V tile (Ks [KT][KW + 8], Vs [KT][HD + 8]
// f16) or, before and after the key loop, an f32 staging area [64][KW + 1] (queries before
// rotation; the output before its rotation back). Rows padded by 8 halves so the 8 rows of
// each ldmatrix land in distinct banks.
#include <cfloat>
#include <climits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"
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

template <int HD, int KW>
constexpr size_t quant_mma_smem_bytes() {
  constexpr size_t q = sizeof(__half) * kQ * (KW + kPad);
  constexpr size_t tile = sizeof(__half) * keys_per_tile<HD>() * (KW + kPad + HD + kPad);
  constexpr size_t staging = sizeof(float) * kQ * (KW + 1);
  return q + (tile > staging ? tile : staging);
}

template <int HD, int KW>
__global__ void __launch_bounds__(kThreads)
    attention_quant_prefill_mma_kernel(const float* __restrict__ q, int64_t ldq, KvSide ks, KvSide vs, DeviceBatch b,
                                       int n_kv_heads, int block_size, int group, int gc, int rows_per_tile,
                                       float scale, float* __restrict__ out, int64_t ldo) {
  constexpr int KT = keys_per_tile<HD>();
  constexpr int LDK = KW + kPad, LDV = HD + kPad, LDF = KW + 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* Qs = reinterpret_cast<__half*>(smem_raw);  // [kQ][LDK], pre-scaled by scale·log2(e)
  __half* Ks = Qs + kQ * LDK;                        // [KT][LDK]
  __half* Vs = Ks + KT * LDK;                        // [KT][LDV]
  float* F = reinterpret_cast<float*>(Ks);           // [kQ][LDF], outside the key loop only
  __shared__ int tile_info[3];                       // sequence, first row, end row
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
  for (int i = threadIdx.x; i < kQ * HD; i += kThreads) {
    const int qi = i / HD, d = i % HD, row = qi / gc, g = qi % gc;
    F[qi * LDF + d] =
        r0 + row < r1 && g < ng
            ? q[static_cast<int64_t>(r0 + row) * ldq + static_cast<int64_t>(kvh * group + g0 + g) * HD + d]
            : 0.0f;
  }
  const float q_scale = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  __shared__ float first_s[kQ];                       // the first key's score term per query vector
  // In K's basis (and S q' beside it); ends with a barrier.
  kv_prepare_queries(ks, kvh, HD, F, LDF, kQ, -1, first_s, q_scale);
  for (int i = threadIdx.x; i < kQ * KW / 2; i += kThreads) {
    const int qi = i / (KW / 2), d = 2 * (i % (KW / 2));
    *reinterpret_cast<__half2*>(Qs + qi * LDK + d) =
        __floats2half2_rn(F[qi * LDF + d] * q_scale, F[qi * LDF + d + 1] * q_scale);
  }
  __syncthreads();  // F (the tile's space) is free from here
  int max_pos = -1;
  for (int i = 0; i < kQ; ++i) max_pos = max(max_pos, pos_s[i]);
  const int kv_end = min(b.kv_len[seq], max_pos + 1);
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fr = lane >> 2, fc = lane & 3;  // fragment row (0..7) and column pair (0..3)
  const int qa = warp * 16 + fr, qb = qa + 8;
  const int pos_a = pos_s[qa], pos_b = pos_s[qb];
  const uint32_t hid_a = hid_s[qa], hid_b = hid_s[qb];
  int warp_max_pos = -1;
  for (int i = 0; i < 16; ++i) warp_max_pos = max(warp_max_pos, pos_s[warp * 16 + i]);

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

  for (int base = 0; base < kv_end; base += KT) {
    kv_decode_tile(ks, vs, table, n_kv_heads, block_size, kvh, base, kv_end, KT, HD, Ks, LDK, Vs, LDV);
    __syncthreads();
    if (base <= warp_max_pos) {  // else every key of this tile is after this warp's queries
      // S = Q · Kᵀ over KW channels: [16 query vectors] × [KT keys] per warp.
      float s[KT / 8][4];
#pragma unroll
      for (int n = 0; n < KT / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KW / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(smem_addr(Qs + (warp * 16 + (lane & 15)) * LDK + kk * 16 + (lane >> 4) * 8), a[0], a[1], a[2],
                    a[3]);
#pragma unroll
        for (int n = 0; n < KT / 8; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(smem_addr(Ks + (n * 8 + (lane & 7) + (lane >> 4) * 8) * LDK + kk * 16 + ((lane >> 3) & 1) * 8),
                      b0, b1, b2, b3);
          mma_f16(s[n], a, b0, b1);
          mma_f16(s[n + 1], a, b2, b3);
        }
      }
      if (base == 0 && fc == 0) {  // the first key: s[0][0], s[0][2]
        s[0][0] += first_s[qa];
        s[0][2] += first_s[qb];
      }
#pragma unroll
      for (int n = 0; n < KT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = base + n * 8 + 2 * fc + (e & 1);
          const int pos = e < 2 ? pos_a : pos_b;
          s[n][e] = key < kv_end && key <= pos && !tree_hides(e < 2 ? hid_a : hid_b, lo, key) ? s[n][e] : -INFINITY;
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
              smem_addr(Vs + (k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDV + n * 8 + (lane >> 4) * 8), b0, b1, b2,
              b3);
          mma_f16(o[n], a, b0, b1);
          mma_f16(o[n + 1], a, b2, b3);
        }
      }
    }                 // this warp's tile
    __syncthreads();  // every warp is done with the tile before it is overwritten
  }
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;

  if (vs.f.codec != KvCodec::Turbo) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int qi = half ? qb : qa;
      if ((half ? pos_b : pos_a) < 0) continue;
      const int row = qi / gc, g = qi % gc;
      const float inv = half ? inv_b : inv_a;
      float* dst =
          out + static_cast<int64_t>(r0 + row) * ldo + static_cast<int64_t>(kvh * group + g0 + g) * HD + 2 * fc;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
    return;
  }
  // Turbo values: the normalized rows into F (the last tile was released by the loop's
  // barrier), rotated back (H, then the signs D and 1/sqrt(hd)), then out.
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    F[qa * LDF + n * 8 + 2 * fc] = o[n][0] * inv_a;
    F[qa * LDF + n * 8 + 2 * fc + 1] = o[n][1] * inv_a;
    F[qb * LDF + n * 8 + 2 * fc] = o[n][2] * inv_b;
    F[qb * LDF + n * 8 + 2 * fc + 1] = o[n][3] * inv_b;
  }
  block_fwht(F, HD, kQ, LDF);  // starts and ends with a barrier
  const float mul = 1.0f / sqrtf(static_cast<float>(HD));
  for (int i = threadIdx.x; i < kQ * HD; i += kThreads) {
    const int qi = i / HD, d = i % HD, row = qi / gc, g = qi % gc;
    if (r0 + row >= r1 || g >= ng) continue;
    out[static_cast<int64_t>(r0 + row) * ldo + static_cast<int64_t>(kvh * group + g0 + g) * HD + d] =
        F[qi * LDF + d] * mul * vs.signs[static_cast<int64_t>(kvh) * HD + d];
  }
}

template <int HD, int KW>
void launch_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                    float* out, int64_t ldo, cudaStream_t s) {
  const KvSide ks = kv_side(kv, true), vs = kv_side(kv, false);
  const int gc = min(group, kQ);
  const int rows_per_tile = kQ / gc;
  const int g_chunks = (group + gc - 1) / gc;
  const unsigned n_tiles = static_cast<unsigned>(b.n_tokens / rows_per_tile + b.n_seqs);
  constexpr size_t smem = quant_mma_smem_bytes<HD, KW>();
  static bool configured = false;  // per instantiation; the attribute is per function
  if (!configured) {
    int dev = 0, max_smem = 0;
    TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    TESSERA_CHECK(smem <= static_cast<size_t>(max_smem), "cuda attention: KV ", kv_format_name(kv.k_fmt, true), "/",
                  kv_format_name(kv.v_fmt), " at head_dim ", HD, " needs ", smem, " bytes of shared memory per block (",
                  max_smem, " available)");
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_quant_prefill_mma_kernel<HD, KW>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  attention_quant_prefill_mma_kernel<HD, KW><<<dim3(n_tiles, kv.n_kv_heads * g_chunks), kThreads, smem, s>>>(
      q, ldq, ks, vs, b, kv.n_kv_heads, kv.block_size, group, gc, rows_per_tile, scale, out, ldo);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_prefill");
}

template <int HD>
void launch_for_head_dim(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group,
                         float scale, float* out, int64_t ldo, cudaStream_t s) {
  if (kv.k_fmt.qjl)
    launch_prefill<HD, 2 * HD>(q, ldq, kv, b, group, scale, out, ldo, s);
  else
    launch_prefill<HD, HD>(q, ldq, kv, b, group, scale, out, ldo, s);
}

}  // namespace

void launch_attention_quant_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                    int n_heads, float scale, float* out, int64_t ldo, cudaStream_t s) {
  if (b.n_tokens == 0 || b.n_seqs == 0) return;
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(out) % 8 == 0 && ldo % 2 == 0, "cuda attention: the output (stride ", ldo,
                ") is not 8-byte aligned");
  const int group = n_heads / kv.n_kv_heads;
  switch (kv.head_dim) {
    case 64:
      launch_for_head_dim<64>(q, ldq, kv, b, group, scale, out, ldo, s);
      break;
    case 128:
      launch_for_head_dim<128>(q, ldq, kv, b, group, scale, out, ldo, s);
      break;
    case 256:
      launch_for_head_dim<256>(q, ldq, kv, b, group, scale, out, ldo, s);
      break;
    default:
      fail("cuda attention: head_dim ", kv.head_dim, " is not supported with quantized KV (64, 128, 256)");
  }
}

}  // namespace tessera::cuda
