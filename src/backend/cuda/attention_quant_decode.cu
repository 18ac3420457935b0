// Decode attention over quantized KV pages (any K/V formats of kv_format.h), split over the
// KV length on the SIMT cores, each key decoded in registers: no dequantized copy of the
// cache, and no shared-memory f32 tile either (estimated ~20 bytes of shared-memory traffic
// per byte of an 8-bit cache, a ceiling below the f16 kernel's speed). Kernel 1 has
// attention_decode.cu's layout: one block of 128 threads per (sequence, KV head, up to 4 of
// its query heads, split of split_len keys); lane groups of head_dim/8 lanes, each lane 8
// channels of a key: kv_load8 for every key of a step first (their loads in flight together),
// kv_convert8 at use; instantiated per codec when K and V share one. The query heads' 8
// channels stay in registers (turbo: rotated once per block in shared memory, and S q' for
// the QJL term). The groups' states merge in a fixed order; the split's (m, l, O) is stored.
// Kernel 2 merges the splits, normalizes and, for turbo values (accumulated in V's rotated
// basis), rotates the output back once.
#include <cfloat>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/kv_quant_frag.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxQ = 4;  // query heads per block

// The end of the split kernel: the G lane groups' softmax states merged in a fixed order
// (block max first, then each group's rescaled sums) and the block's partial result stored
// for the merge kernel: per query head [m, l, o[0..HD)] at partials[(seq, head, split)].
template <int G, int HD>
__device__ __forceinline__ void merge_groups_and_store(const float (&m)[kMaxQ], const float (&l)[kMaxQ],
                                                       const float (&acc)[kMaxQ][8], int lg, int li, int nq,
                                                       float* __restrict__ dst0, int64_t head_stride) {
  __shared__ float sm[G][kMaxQ];
  __shared__ float so[kMaxQ][HD];
  __shared__ float sl[kMaxQ];
  __syncthreads();  // the query staging in shared memory is done with
  if (li == 0)
#pragma unroll
    for (int g = 0; g < kMaxQ; ++g) sm[lg][g] = l[g] > 0.0f ? m[g] : -FLT_MAX;
  for (int i = threadIdx.x; i < kMaxQ * HD; i += kThreads) so[i / HD][i % HD] = 0.0f;
  if (threadIdx.x < kMaxQ) sl[threadIdx.x] = 0.0f;
  __syncthreads();
  float mb[kMaxQ];
#pragma unroll
  for (int g = 0; g < kMaxQ; ++g) {
    mb[g] = -FLT_MAX;
    for (int i = 0; i < G; ++i) mb[g] = fmaxf(mb[g], sm[i][g]);
  }
  for (int turn = 0; turn < G; ++turn) {
    if (lg == turn) {
#pragma unroll
      for (int g = 0; g < kMaxQ; ++g) {
        const float c = l[g] > 0.0f ? __expf(m[g] - mb[g]) : 0.0f;
#pragma unroll
        for (int d = 0; d < 8; ++d) so[g][li * 8 + d] += acc[g][d] * c;
        if (li == 0) sl[g] += l[g] * c;
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < nq * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    float* p = dst0 + g * head_stride;
    p[2 + d] = so[g][d];
    if (d == 0) {
      p[0] = mb[g];
      p[1] = sl[g];
    }
  }
}

// Lane groups of HD/8 lanes, each lane 8 channels of a key: a group takes KEYS keys per step,
// decoding every K and V of the step (C: the codec of both, or -1 for mixed formats, decoded
// through a runtime switch) before the first use, so their loads are in flight together;
// the score is 8 FMAs per lane and a shuffle sum over the group (turbo keys with QJL add the
// lane's 8 sketch signs against its 8 channels of S q'); one softmax rescale per step.
template <int C, int HD, int KEYS>
__global__ void __launch_bounds__(kThreads)
    attention_quant_decode_split(const float* __restrict__ q, int64_t ldq, KvSide ks, KvSide vs, DeviceBatch b,
                                 int n_kv_heads, int block_size, int group, int q_chunks, float scale, int split_len,
                                 int max_splits, float* __restrict__ partials) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  constexpr int LPK = HD / 8;        // lanes per key: 8, 16 or 32
  constexpr int G = kThreads / LPK;  // lane groups per block
  constexpr int STEP = G * KEYS;
  __shared__ float Qs[kMaxQ][2 * HD];  // queries in K's basis, then S q' (QJL)
  const int seq = blockIdx.x;
  const int kvh = blockIdx.y / q_chunks, g0 = (blockIdx.y % q_chunks) * kMaxQ;
  const int nq = min(kMaxQ, group - g0);
  const int split = blockIdx.z;
  const int t = b.q_start[seq];
  const int len = min(b.kv_len[seq], b.positions[t] + 1);  // causal
  const int begin = split * split_len;
  if (begin >= len) return;
  const int end = min(len, begin + split_len);
  const int lg = threadIdx.x / LPK, li = threadIdx.x % LPK;
  // Known false at compile time unless turbo (or mixed) keys: no sketch registers otherwise.
  const bool qjl = (C == static_cast<int>(KvCodec::Turbo) || C < 0) && ks.f.qjl;
  for (int i = threadIdx.x; i < kMaxQ * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    Qs[g][d] = g < nq ? q[t * ldq + static_cast<int64_t>(kvh * group + g0 + g) * HD + d] * scale : 0.0f;
  }
  __shared__ float first_s[kMaxQ];  // the first key's score term per query head (the split holding it)
  kv_prepare_queries(ks, kvh, HD, &Qs[0][0], 2 * HD, kMaxQ, -1, begin == 0 ? first_s : nullptr);
  float qr[kMaxQ][8], sq[kMaxQ][8], acc[kMaxQ][8], m[kMaxQ], l[kMaxQ];
#pragma unroll
  for (int g = 0; g < kMaxQ; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      acc[g][d] = 0.0f;
      qr[g][d] = Qs[g][li * 8 + d];
      sq[g][d] = qjl ? Qs[g][HD + li * 8 + d] : 0.0f;
    }
  }
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;
  for (int jb = begin; jb < end; jb += STEP) {
    Raw8 kr[KEYS], vr[KEYS];
    bool valid[KEYS];
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      const int j = jb + u * G + lg;
      valid[u] = j < end;
      const int jj = valid[u] ? j : begin;  // a key in range, its result discarded
      const int64_t page = static_cast<int64_t>(__ldg(table + jj / block_size)) * n_kv_heads + kvh;
      kv_load8<C>(ks, ks.base + page * ks.page_bytes, jj % block_size, li * 8, HD, kvh, kr[u]);
      kv_load8<C>(vs, vs.base + page * vs.page_bytes, jj % block_size, li * 8, HD, kvh, vr[u]);
    }
    float s[KEYS][kMaxQ];
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      float kf[8], sg[8];
      kv_convert8<C>(ks, kr[u], li * 8, HD, kf);
      if (qjl) kv_convert_qjl8(kr[u], sg);
#pragma unroll
      for (int g = 0; g < kMaxQ; ++g) {
        float v = 0.0f;
#pragma unroll
        for (int d = 0; d < 8; ++d) v = fmaf(qr[g][d], kf[d], v);
        if (qjl)
#pragma unroll
          for (int d = 0; d < 8; ++d) v = fmaf(sq[g][d], sg[d], v);
#pragma unroll
        for (int o = 1; o < LPK; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (jb + u * G + lg == 0) v += first_s[g];  // the first key's term (kv_prepare_queries)
        s[u][g] = v;
      }
    }
    float vf[KEYS][8];
#pragma unroll
    for (int u = 0; u < KEYS; ++u) kv_convert8<C>(vs, vr[u], li * 8, HD, vf[u]);
#pragma unroll
    for (int g = 0; g < kMaxQ; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < KEYS; ++u)
        if (valid[u]) mx = fmaxf(mx, s[u][g]);
      const float c = __expf(m[g] - mx);
      float p[KEYS], sum = 0.0f;
#pragma unroll
      for (int u = 0; u < KEYS; ++u) {
        p[u] = valid[u] ? __expf(s[u][g] - mx) : 0.0f;
        sum += p[u];
      }
      l[g] = l[g] * c + sum;
      m[g] = mx;
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        float a = acc[g][d] * c;
#pragma unroll
        for (int u = 0; u < KEYS; ++u) a = fmaf(p[u], vf[u][d], a);
        acc[g][d] = a;
      }
    }
  }
  const int n_heads = n_kv_heads * group;
  float* dst0 = partials + ((static_cast<int64_t>(seq) * n_heads + kvh * group + g0) * max_splits + split) * (HD + 2);
  merge_groups_and_store<G, HD>(m, l, acc, lg, li, nq, dst0, static_cast<int64_t>(max_splits) * (HD + 2));
}

// Merges the splits of one (sequence, head); turbo values (signs != null) are rotated back.
// The splits' weights exp(m_i - max) go through shared memory a chunk at a time, so each
// thread's sum over the splits has its loads in flight together (a loop of dependent global
// loads per split measured 20-60 us at 33-64 splits).
__global__ void attention_quant_decode_merge(const float* __restrict__ partials, DeviceBatch b, int n_heads, int group,
                                             int head_dim, int split_len, int max_splits,
                                             const float* __restrict__ signs, float* __restrict__ out, int64_t ldo) {
  constexpr int kChunk = 256;
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  __shared__ float o_s[256];
  __shared__ float w_s[kChunk];
  __shared__ float red[2][4];
  const int t = blockIdx.x, head = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;  // query row
  const int seq = sequence_of_row(b, t);
  const int len = min(b.kv_len[seq], b.positions[t] + 1);
  const int n_splits = (len + split_len - 1) / split_len;
  const int stride = head_dim + 2;
  const float* p = partials + (static_cast<int64_t>(t) * n_heads + head) * max_splits * stride;
  float mx = -FLT_MAX;
  for (int i = tid; i < n_splits; i += blockDim.x) mx = fmaxf(mx, p[i * stride]);
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[0][warp] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(red[0][0], red[0][1]), fmaxf(red[0][2], red[0][3]));  // 128 threads: 4 warps
  float sum = 0.0f, acc[2] = {0.0f, 0.0f};                               // dims tid, tid + 128
  for (int c0 = 0; c0 < n_splits; c0 += kChunk) {
    const int cn = min(kChunk, n_splits - c0);
    for (int i = tid; i < cn; i += blockDim.x) {
      const float w = __expf(p[(c0 + i) * stride] - mx);
      w_s[i] = w;
      sum += p[(c0 + i) * stride + 1] * w;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int d = tid + h * blockDim.x;
      if (d >= head_dim) continue;
      const float* pd = p + static_cast<int64_t>(c0) * stride + 2 + d;
      float a = acc[h];
#pragma unroll 8
      for (int i = 0; i < cn; ++i) a += pd[i * stride] * w_s[i];
      acc[h] = a;
    }
    __syncthreads();  // w_s reused by the next chunk
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[1][warp] = sum;
  __syncthreads();
  sum = (red[1][0] + red[1][1]) + (red[1][2] + red[1][3]);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int h = 0; h < 2; ++h) {
    const int d = tid + h * blockDim.x;
    if (d < head_dim) o_s[d] = acc[h] * inv;
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

template <int C, int HD>
void launch_split_as(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                     int split_len, int max_splits, float* partials, cudaStream_t s) {
  const int q_chunks = (group + kMaxQ - 1) / kMaxQ;
  // Fewer keys in flight where a lane holds more per key (turbo's sketch signs).
  constexpr int kKeys = C == static_cast<int>(KvCodec::Turbo) || C < 0 ? 2 : 4;
  launch_pdl(attention_quant_decode_split<C, HD, kKeys>, dim3(b.n_seqs, kv.n_kv_heads * q_chunks, max_splits),
             dim3(kThreads), 0, s, q, ldq, kv_side(kv, true), kv_side(kv, false), b, kv.n_kv_heads, kv.block_size,
             group, q_chunks, scale, split_len, max_splits, partials);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_decode_split");
}

template <int HD>
void launch_split(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                  int split_len, int max_splits, float* partials, cudaStream_t s) {
  // One codec for K and V: that codec's instantiation; mixed formats: the runtime switch.
  const KvCodec c = kv.k_fmt.codec == kv.v_fmt.codec ? kv.k_fmt.codec : KvCodec::F32;
#define TESSERA_QUANT_DECODE(CODEC) \
  launch_split_as<static_cast<int>(CODEC), HD>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s)
  switch (c) {
    case KvCodec::Fp8E4M3:
      TESSERA_QUANT_DECODE(KvCodec::Fp8E4M3);
      break;
    case KvCodec::Fp8E5M2:
      TESSERA_QUANT_DECODE(KvCodec::Fp8E5M2);
      break;
    case KvCodec::Int8:
      TESSERA_QUANT_DECODE(KvCodec::Int8);
      break;
    case KvCodec::Int4:
      TESSERA_QUANT_DECODE(KvCodec::Int4);
      break;
    case KvCodec::Turbo:
      TESSERA_QUANT_DECODE(KvCodec::Turbo);
      break;
    default:
      launch_split_as<-1, HD>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
  }
#undef TESSERA_QUANT_DECODE
}

}  // namespace

void launch_attention_quant_decode(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                   int n_heads, float scale, float* out, int64_t ldo, int split_len, int max_splits,
                                   float* partials, cudaStream_t s, int max_rows) {
  if (b.n_seqs == 0) return;
  const int group = n_heads / kv.n_kv_heads;
  TESSERA_CHECK(max_rows == 1 || attention_quant_decode_frag_applies(kv, n_heads),
                "cuda quantized decode attention: several rows per sequence need the fragment kernel");
  if (attention_quant_decode_frag_applies(kv, n_heads)) {
    launch_attention_quant_decode_frag(q, ldq, kv, b, n_heads, scale, split_len, max_splits, partials, out, ldo, s,
                                       max_rows);
    if (attention_quant_decode_frag_direct(kv, max_splits)) return;  // the kernel normalized and stored the output
  } else if (attention_quant_decode_mma_applies(kv, n_heads)) {
    launch_attention_quant_decode_mma(q, ldq, kv, b, n_heads, scale, split_len, max_splits, partials, s);
  } else {
    switch (kv.head_dim) {
      case 64:
        launch_split<64>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
        break;
      case 128:
        launch_split<128>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
        break;
      case 256:
        launch_split<256>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
        break;
      default:
        fail("cuda attention: head_dim ", kv.head_dim, " is not supported with quantized KV (64, 128, 256)");
    }
  }
  const KvSide vs = kv_side(kv, false);
  launch_pdl(attention_quant_decode_merge, dim3(b.n_tokens, n_heads), dim3(128), 0, s, partials, b, n_heads, group,
             kv.head_dim, split_len, max_splits, vs.f.codec == KvCodec::Turbo ? vs.signs : nullptr, out, ldo);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_decode_merge");
}

}  // namespace tessera::cuda
