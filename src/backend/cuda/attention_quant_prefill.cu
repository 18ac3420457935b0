// Paged attention for prefill and mixed batches over quantized KV pages (variable length,
// causal, GQA): attention_prefill.cu's tiling (a block of 128 threads takes up to 64 query
// vectors of one sequence × query heads of one KV head; tiles of 32 keys; 4×4 score
// micro-tiles, 4 query vectors × head_dim/8 dims of P·V per thread) with the K/V tile
// decoded from its pages into shared memory (kv_decode_tile) instead of converted from f16.
// Turbo keys: queries rotated once per block (and S q' beside them for the QJL term, so a
// score is one dot product over 2·head_dim); turbo values: the output is accumulated in V's
// rotated basis and rotated back once at the end.
#include <cfloat>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kQ = 64;  // query vectors per block
constexpr int kK = 32;  // keys per tile

size_t prefill_smem_bytes(int hd, int kw) {
  return sizeof(float) * (kQ * (kw + 1) + kK * (kw + 1) + kK * hd + kQ * (kK + 1) + 3 * kQ);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_quant_prefill_kernel(const float* __restrict__ q, int64_t ldq, KvSide ks, KvSide vs, DeviceBatch b,
                                   int n_kv_heads, int block_size, int group, int gc, int rows_per_tile, float scale,
                                   float* __restrict__ out, int64_t ldo) {
  extern __shared__ float smem[];
  const int kw = ks.f.qjl ? 2 * HD : HD;
  float* Qs = smem;                  // [kQ][kw+1], pre-scaled, in K's basis
  float* Ks = Qs + kQ * (kw + 1);    // [kK][kw+1]
  float* Vs = Ks + kK * (kw + 1);    // [kK][HD]
  float* S = Vs + kK * HD;           // [kQ][kK+1] scores, then probabilities
  float* row_m = S + kQ * (kK + 1);  // [kQ]
  float* row_l = row_m + kQ;         // [kQ]
  float* row_c = row_l + kQ;         // [kQ] rescale of this tile
  __shared__ int tile_info[3];       // sequence, first row, end row
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

  // Query vector qi = row * gc + g; invalid ones get position -1 (every key masked).
  for (int qi = threadIdx.x; qi < kQ; qi += kThreads) {
    const int row = qi / gc, g = qi % gc;
    const bool valid = r0 + row < r1 && g < ng;
    pos_s[qi] = valid ? b.positions[r0 + row] : -1;
    row_m[qi] = -FLT_MAX;
    row_l[qi] = 0.0f;
  }
  for (int i = threadIdx.x; i < kQ * HD; i += kThreads) {
    const int qi = i / HD, d = i % HD, row = qi / gc, g = qi % gc;
    const bool valid = r0 + row < r1 && g < ng;
    Qs[qi * (kw + 1) + d] =
        valid ? q[static_cast<int64_t>(r0 + row) * ldq + static_cast<int64_t>(kvh * group + g0 + g) * HD + d] * scale
              : 0.0f;
  }
  kv_prepare_queries(ks, kvh, HD, Qs, kw + 1, kQ);
  int max_pos = 0;
  for (int i = 0; i < kQ; ++i) max_pos = max(max_pos, pos_s[i]);
  const int kv_end = min(b.kv_len[seq], max_pos + 1);
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;

  const int qg = threadIdx.x / 8, sub = threadIdx.x % 8;  // 16 groups of 4 query vectors × 8
  float o[4][HD / 8];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[a][i] = 0.0f;

  for (int base = 0; base < kv_end; base += kK) {
    kv_decode_tile(ks, vs, table, n_kv_heads, block_size, kvh, base, kv_end, kK, HD, Ks, kw + 1, Vs, HD);
    __syncthreads();
    {
      float s[4][4] = {};
      for (int d = 0; d < kw; ++d) {
        float qv[4], kv[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) qv[a] = Qs[(4 * qg + a) * (kw + 1) + d];
#pragma unroll
        for (int c = 0; c < 4; ++c) kv[c] = Ks[(sub + 8 * c) * (kw + 1) + d];
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
          const bool visible = key < kv_end && key <= pos_s[qi];
          S[qi * (kK + 1) + sub + 8 * c] = visible ? s[a][c] : -FLT_MAX;
        }
    }
    __syncthreads();
    if (threadIdx.x < kQ) {  // online softmax, one thread per query vector
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
  // Normalized rows into Qs (free now), turbo values rotated back there, then out.
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int qi = 4 * qg + a;
    const float inv = row_l[qi] > 0.0f ? 1.0f / row_l[qi] : 0.0f;
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) Qs[qi * (kw + 1) + sub + 8 * i] = o[a][i] * inv;
  }
  const bool turbo_v = vs.f.codec == KvCodec::Turbo;
  float mul = 1.0f;
  if (turbo_v) {
    block_fwht(Qs, HD, kQ, kw + 1);
    mul = 1.0f / sqrtf(static_cast<float>(HD));
  } else {
    __syncthreads();
  }
  for (int i = threadIdx.x; i < kQ * HD; i += kThreads) {
    const int qi = i / HD, d = i % HD, row = qi / gc, g = qi % gc;
    if (r0 + row >= r1 || g >= ng) continue;
    const float sg = turbo_v ? vs.signs[static_cast<int64_t>(kvh) * HD + d] : 1.0f;
    out[static_cast<int64_t>(r0 + row) * ldo + static_cast<int64_t>(kvh * group + g0 + g) * HD + d] =
        Qs[qi * (kw + 1) + d] * mul * sg;
  }
}

template <int HD>
void launch_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                    float* out, int64_t ldo, cudaStream_t s) {
  const KvSide ks = kv_side(kv, true), vs = kv_side(kv, false);
  const int gc = min(group, kQ);
  const int rows_per_tile = kQ / gc;
  const int g_chunks = (group + gc - 1) / gc;
  const unsigned n_tiles = static_cast<unsigned>(b.n_tokens / rows_per_tile + b.n_seqs);
  const size_t smem = prefill_smem_bytes(HD, ks.f.qjl ? 2 * HD : HD);
  int dev = 0, max_smem = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TESSERA_CHECK(smem <= static_cast<size_t>(max_smem), "cuda attention: KV ", kv_format_name(kv.k_fmt, true), "/",
                kv_format_name(kv.v_fmt), " at head_dim ", HD, " needs ", smem, " bytes of shared memory per block (",
                max_smem, " available)");
  static size_t configured = 0;  // per instantiation: the largest opt-in asked for so far
  if (smem > configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_quant_prefill_kernel<HD>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = smem;
  }
  attention_quant_prefill_kernel<HD><<<dim3(n_tiles, kv.n_kv_heads * g_chunks), kThreads, smem, s>>>(
      q, ldq, ks, vs, b, kv.n_kv_heads, kv.block_size, group, gc, rows_per_tile, scale, out, ldo);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_prefill");
}

}  // namespace

void launch_attention_quant_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                    int n_heads, float scale, float* out, int64_t ldo, cudaStream_t s) {
  if (b.n_tokens == 0 || b.n_seqs == 0) return;
  const int group = n_heads / kv.n_kv_heads;
  switch (kv.head_dim) {
    case 64:
      launch_prefill<64>(q, ldq, kv, b, group, scale, out, ldo, s);
      break;
    case 128:
      launch_prefill<128>(q, ldq, kv, b, group, scale, out, ldo, s);
      break;
    case 256:
      launch_prefill<256>(q, ldq, kv, b, group, scale, out, ldo, s);
      break;
    default:
      fail("cuda attention: head_dim ", kv.head_dim, " is not supported with quantized KV (64, 128, 256)");
  }
}

}  // namespace tessera::cuda
