// Decode attention over quantized KV pages (any K/V formats of kv_format.h), split over the
// KV length on the SIMT cores, the pages decoded tile by tile into shared memory (no
// dequantized copy of the cache). Kernel 1: one block of 128 threads per (sequence, KV head,
// up to 4 of its query heads, split of split_len keys); per tile of 32 keys, thread
// (g = warp, j = lane) scores query head g against key j over kw channels (turbo keys with
// QJL: the rotated dims then the scaled sketch signs against S q'), the warp keeps g's
// online softmax, then each thread accumulates P·V for its channels. Writes the split's
// (m, l, O) like attention_decode.cu. Kernel 2 merges the splits, normalizes and, for turbo
// values (accumulated in V's rotated basis), rotates the output back once.
#include <cfloat>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxQ = 4;  // query heads per block (one warp each)
constexpr int kTile = 32;  // keys per tile (one per lane)

size_t decode_smem_bytes(int hd, int kw) {
  return sizeof(float) * (kMaxQ * kw + kTile * (kw + 1) + kTile * hd + kMaxQ * kTile + kMaxQ);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_quant_decode_split(const float* __restrict__ q, int64_t ldq, KvSide ks, KvSide vs, DeviceBatch b,
                                 int n_kv_heads, int block_size, int group, int q_chunks, float scale, int split_len,
                                 int max_splits, float* __restrict__ partials) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  extern __shared__ float smem[];
  const int kw = ks.f.qjl ? 2 * HD : HD;
  float* Qs = smem;                     // [kMaxQ][kw]
  float* Ks = Qs + kMaxQ * kw;          // [kTile][kw + 1]
  float* Vs = Ks + kTile * (kw + 1);    // [kTile][HD]
  float* Ps = Vs + kTile * HD;          // [kMaxQ][kTile]
  float* Cs = Ps + kMaxQ * kTile;       // [kMaxQ] rescale of this tile
  const int seq = blockIdx.x;
  const int kvh = blockIdx.y / q_chunks, g0 = (blockIdx.y % q_chunks) * kMaxQ;
  const int nq = min(kMaxQ, group - g0);
  const int split = blockIdx.z;
  const int t = b.q_start[seq];
  const int len = min(b.kv_len[seq], b.positions[t] + 1);  // causal
  const int begin = split * split_len;
  if (begin >= len) return;
  const int end = min(len, begin + split_len);
  const int n_heads = n_kv_heads * group;
  for (int i = threadIdx.x; i < kMaxQ * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    Qs[g * kw + d] = g < nq ? q[t * ldq + static_cast<int64_t>(kvh * group + g0 + g) * HD + d] * scale : 0.0f;
  }
  kv_prepare_queries(ks, kvh, HD, Qs, kw, kMaxQ);

  constexpr int DIMS = HD < kThreads ? HD : kThreads;  // threads per query row in P·V
  constexpr int QS = kThreads / DIMS;                  // query rows taken at once
  constexpr int NQ = kMaxQ / QS, ND = HD / DIMS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int dt = threadIdx.x % DIMS, qoff = threadIdx.x / DIMS;
  float acc[NQ][ND];
#pragma unroll
  for (int a = 0; a < NQ; ++a)
#pragma unroll
    for (int i = 0; i < ND; ++i) acc[a][i] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;  // query head `warp`, the same in every lane
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;
  for (int base = begin; base < end; base += kTile) {
    kv_decode_tile(ks, vs, table, n_kv_heads, block_size, kvh, base, end, kTile, HD, Ks, kw + 1, Vs, HD);
    __syncthreads();
    {
      const float* qr = Qs + warp * kw;
      const float* kr = Ks + lane * (kw + 1);
      float s = 0.0f;
      for (int c = 0; c < kw; ++c) s = fmaf(qr[c], kr[c], s);
      const bool valid = base + lane < end;
      const float mx = fmaxf(m, warp_max(valid ? s : -FLT_MAX));
      const float p = valid ? __expf(s - mx) : 0.0f;
      const float c = __expf(m - mx);
      l = l * c + warp_sum(p);
      m = mx;
      Ps[warp * kTile + lane] = p;
      if (lane == 0) Cs[warp] = c;
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < NQ; ++a) {
      const int g = qoff + a * QS;
      const float c = Cs[g];
#pragma unroll
      for (int i = 0; i < ND; ++i) acc[a][i] *= c;
      for (int j = 0; j < kTile; ++j) {
        const float p = Ps[g * kTile + j];
#pragma unroll
        for (int i = 0; i < ND; ++i) acc[a][i] = fmaf(p, Vs[j * HD + dt + i * DIMS], acc[a][i]);
      }
    }
    __syncthreads();  // before the next tile overwrites Ks/Vs/Ps
  }
  auto slot = [&](int g) {
    return partials + ((static_cast<int64_t>(seq) * n_heads + kvh * group + g0 + g) * max_splits + split) * (HD + 2);
  };
  if (lane == 0 && warp < nq) {
    slot(warp)[0] = m;
    slot(warp)[1] = l;
  }
#pragma unroll
  for (int a = 0; a < NQ; ++a) {
    const int g = qoff + a * QS;
    if (g >= nq) continue;
#pragma unroll
    for (int i = 0; i < ND; ++i) slot(g)[2 + dt + i * DIMS] = acc[a][i];
  }
}

// Merges the splits of one (sequence, head); turbo values (signs != null) are rotated back.
__global__ void attention_quant_decode_merge(const float* __restrict__ partials, DeviceBatch b, int n_heads,
                                             int group, int head_dim, int split_len, int max_splits,
                                             const float* __restrict__ signs, float* __restrict__ out, int64_t ldo) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  __shared__ float o_s[256];
  const int seq = blockIdx.x, head = blockIdx.y;
  const int t = b.q_start[seq];
  const int len = min(b.kv_len[seq], b.positions[t] + 1);
  const int n_splits = (len + split_len - 1) / split_len;
  const float* p = partials + (static_cast<int64_t>(seq) * n_heads + head) * max_splits * (head_dim + 2);
  float mx = -FLT_MAX;
  for (int i = 0; i < n_splits; ++i) mx = fmaxf(mx, p[i * (head_dim + 2)]);
  float sum = 0.0f;
  for (int i = 0; i < n_splits; ++i) sum += p[i * (head_dim + 2) + 1] * __expf(p[i * (head_dim + 2)] - mx);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < n_splits; ++i) o += p[i * (head_dim + 2) + 2 + d] * __expf(p[i * (head_dim + 2)] - mx);
    o_s[d] = o * inv;
  }
  float* dst = out + t * ldo + static_cast<int64_t>(head) * head_dim;
  if (signs) {
    block_fwht(o_s, head_dim, 1, head_dim);
    const float* sg = signs + static_cast<int64_t>(head / group) * head_dim;
    const float inv_sqrt = 1.0f / sqrtf(static_cast<float>(head_dim));
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = o_s[d] * inv_sqrt * sg[d];
    return;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = o_s[d];
}

template <int HD>
void launch_split(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                  int split_len, int max_splits, float* partials, cudaStream_t s) {
  const KvSide ks = kv_side(kv, true), vs = kv_side(kv, false);
  const int q_chunks = (group + kMaxQ - 1) / kMaxQ;
  const size_t smem = decode_smem_bytes(HD, ks.f.qjl ? 2 * HD : HD);
  static size_t configured = 0;  // per instantiation: the largest opt-in asked for so far
  if (smem > configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_quant_decode_split<HD>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = smem;
  }
  launch_pdl(attention_quant_decode_split<HD>, dim3(b.n_seqs, kv.n_kv_heads * q_chunks, max_splits), dim3(kThreads),
             smem, s, q, ldq, ks, vs, b, kv.n_kv_heads, kv.block_size, group, q_chunks, scale, split_len, max_splits,
             partials);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_decode_split");
}

}  // namespace

void launch_attention_quant_decode(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                   int n_heads, float scale, float* out, int64_t ldo, int split_len, int max_splits,
                                   float* partials, cudaStream_t s) {
  if (b.n_seqs == 0) return;
  const int group = n_heads / kv.n_kv_heads;
  switch (kv.head_dim) {
    case 64: launch_split<64>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s); break;
    case 128: launch_split<128>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s); break;
    case 256: launch_split<256>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s); break;
    default: fail("cuda attention: head_dim ", kv.head_dim, " is not supported with quantized KV (64, 128, 256)");
  }
  const KvSide vs = kv_side(kv, false);
  launch_pdl(attention_quant_decode_merge, dim3(b.n_seqs, n_heads), dim3(128), 0, s, partials, b, n_heads, group,
             kv.head_dim, split_len, max_splits, vs.f.codec == KvCodec::Turbo ? vs.signs : nullptr, out, ldo);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_decode_merge");
}

}  // namespace tessera::cuda
