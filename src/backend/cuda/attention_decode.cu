// Paged attention for decode (one query row per sequence), split over the KV length, on the
// SIMT cores (f32 KV, or layouts the tensor-core kernel of attention_decode_mma.cu declines):
// kernel 1 gives each (sequence, KV head, up to 4 of its query heads, split of split_len
// keys) to one block of 128 threads = groups of head_dim/8 lanes; a group takes
// kDecodeKeysPerGroup keys per step (each lane 8 dims, 16-byte loads), keeping its own
// online-softmax state; the block merges its groups' states in a fixed order and writes the
// split's (m, l, O). Kernel 2 merges the splits of each (sequence, head) and normalizes.
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_tuning.h"
#include "backend/cuda/gemma_kernels.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxQ = 4;  // query heads per block

// The end of the split kernel: merge the G lane groups' softmax states (block max first,
// then each group's rescaled sums, in order) and store the block's partial result for the
// merge kernel: per query head, [m, l, o[0..HD)] at partials[(seq, head, split)].
template <int G, int HD, int DPL>
__device__ __forceinline__ void merge_groups_and_store(const float (&m)[kMaxQ], const float (&l)[kMaxQ],
                                                       const float (&acc)[kMaxQ][DPL], int lg, int li, int nq,
                                                       int head0, int n_heads, int seq, int split, int max_splits,
                                                       float* __restrict__ partials) {
  __shared__ float sm[G][kMaxQ];
  __shared__ float so[kMaxQ][HD];
  __shared__ float sl[kMaxQ];
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
        if (li * DPL < HD)  // the padding lanes of head_dim 96 hold nothing
#pragma unroll
          for (int d = 0; d < DPL; ++d) so[g][li * DPL + d] += acc[g][d] * c;
        if (li == 0) sl[g] += l[g] * c;
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < nq * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    float* p = partials + ((static_cast<int64_t>(seq) * n_heads + head0 + g) * max_splits + split) * (HD + 2);
    p[2 + d] = so[g][d];
    if (d == 0) {
      p[0] = mb[g];
      p[1] = sl[g];
    }
  }
}

// 8 consecutive KV elements as loaded (16 bytes of f16, 32 of f32).
template <typename KT>
struct Piece8;
template <>
struct Piece8<__half> {
  uint4 u;
  __device__ __forceinline__ void load(const __half* p) { u = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void zero() { u = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void to_f32(float* out) const {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(h[j]);
      out[2 * j] = f.x;
      out[2 * j + 1] = f.y;
    }
  }
};
template <>
struct Piece8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = *reinterpret_cast<const float4*>(p);
    b = *reinterpret_cast<const float4*>(p + 4);
  }
  __device__ __forceinline__ void zero() { a = b = make_float4(0, 0, 0, 0); }
  __device__ __forceinline__ void to_f32(float* out) const {
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
    out[4] = b.x;
    out[5] = b.y;
    out[6] = b.z;
    out[7] = b.w;
  }
};

// Each lane holds 8 dims of a key (one 16-byte f16 load), a group of HD/8 lanes takes
// kKeysPerGroup keys per step and issues all their K and V loads before the first use, and
// the softmax state is rescaled once per step instead of once per key. One key per group and
// step (the first kernel: one K and one V load in flight per lane, behind a dependent chain
// of shuffles and exponentials) was latency-bound at ~1.2 TB/s with 128 sequences.
template <typename KT, int HD, int kKeysPerGroup>
__global__ void __launch_bounds__(kThreads)
    attention_decode_split(const float* __restrict__ q, int64_t ldq, const KT* __restrict__ kc,
                           const KT* __restrict__ vc, DeviceBatch b, int n_kv_heads, int block_size, int group,
                           int q_chunks, float scale, int split_len, int max_splits, float* __restrict__ partials,
                           int window) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  constexpr int DPL = 8;  // dims per lane
  static_assert(HD % DPL == 0 && HD / DPL <= 32, "head_dim: a multiple of 8, at most 256");
  // Lanes per key: HD/8 rounded up to a power of two (8, 16 or 32), so a key's lanes sit in one
  // warp and the shuffles reduce them; for head_dim 96 lanes 12..15 of each 16 hold zeros.
  constexpr int LPK = HD / DPL <= 8 ? 8 : HD / DPL <= 16 ? 16 : 32;
  constexpr int G = kThreads / LPK;  // lane groups per block
  constexpr int STEP = G * kKeysPerGroup;
  const int seq = blockIdx.x;
  const int kvh = blockIdx.y / q_chunks, g0 = (blockIdx.y % q_chunks) * kMaxQ;
  const int nq = min(kMaxQ, group - g0);
  const int split = blockIdx.z;
  const int t = b.q_start[seq];
  const int len = min(b.kv_len[seq], b.positions[t] + 1);  // causal
  if (split * split_len >= len) return;
  const int end = min(len, split * split_len + split_len);
  // Sliding window: keys before pos - window + 1 are skipped; a split wholly before the window
  // runs no step and stores an empty partial (m = -FLT_MAX, l = 0) for the merge.
  const int begin = max(split * split_len, window > 0 ? b.positions[t] - window + 1 : 0);
  const int lg = threadIdx.x / LPK, li = threadIdx.x % LPK;
  const bool lane_on = li * DPL < HD;
  const int n_heads = n_kv_heads * group;

  float qr[kMaxQ][DPL], acc[kMaxQ][DPL], m[kMaxQ], l[kMaxQ];
#pragma unroll
  for (int g = 0; g < kMaxQ; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < DPL; ++d) {
      acc[g][d] = 0.0f;
      qr[g][d] = g < nq && lane_on ? q[t * ldq + static_cast<int64_t>(kvh * group + g0 + g) * HD + li * DPL + d] * scale
                                   : 0.0f;
    }
  }
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;
  for (int jb = begin; jb < end; jb += STEP) {
    // Every load of the step first (independent, kept in their stored form to save
    // registers), then the arithmetic.
    Piece8<KT> kr[kKeysPerGroup], vr[kKeysPerGroup];
    bool valid[kKeysPerGroup];
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; ++u) {
      const int j = jb + u * G + lg;
      valid[u] = j < end;
      if (valid[u] && lane_on) {
        const int64_t base =
            ((static_cast<int64_t>(table[j / block_size]) * n_kv_heads + kvh) * block_size + j % block_size) * HD +
            li * DPL;
        kr[u].load(kc + base);
        vr[u].load(vc + base);
      } else {
        kr[u].zero();
        vr[u].zero();
      }
    }
    float s[kKeysPerGroup][kMaxQ];
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; ++u) {
      float kf[DPL];
      kr[u].to_f32(kf);
#pragma unroll
      for (int g = 0; g < kMaxQ; ++g) {
        float v = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; ++d) v = fmaf(qr[g][d], kf[d], v);
#pragma unroll
        for (int o = 1; o < LPK; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        s[u][g] = v;
      }
    }
    float p[kKeysPerGroup][kMaxQ];
#pragma unroll
    for (int g = 0; g < kMaxQ; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; ++u)
        if (valid[u]) mx = fmaxf(mx, s[u][g]);
      const float c = __expf(m[g] - mx);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; ++u) {
        p[u][g] = valid[u] ? __expf(s[u][g] - mx) : 0.0f;
        sum += p[u][g];
      }
      l[g] = l[g] * c + sum;
      m[g] = mx;
#pragma unroll
      for (int d = 0; d < DPL; ++d) acc[g][d] *= c;
    }
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; ++u) {
      float vf[DPL];
      vr[u].to_f32(vf);
#pragma unroll
      for (int g = 0; g < kMaxQ; ++g)
#pragma unroll
        for (int d = 0; d < DPL; ++d) acc[g][d] = fmaf(p[u][g], vf[d], acc[g][d]);
    }
  }
  merge_groups_and_store<G, HD, DPL>(m, l, acc, lg, li, nq, kvh * group + g0, n_heads, seq, split, max_splits,
                                     partials);
}

__global__ void attention_decode_merge(const float* __restrict__ partials, DeviceBatch b, int n_heads, int head_dim,
                                       int split_len, int max_splits, float* __restrict__ out, int64_t ldo) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int t = blockIdx.x, head = blockIdx.y;  // query row, head
  const int seq = sequence_of_row(b, t);
  const int len = min(b.kv_len[seq], b.positions[t] + 1);
  const int n_splits = (len + split_len - 1) / split_len;
  const float* p = partials + (static_cast<int64_t>(t) * n_heads + head) * max_splits * (head_dim + 2);
  float mx = -FLT_MAX;
  for (int i = 0; i < n_splits; ++i) mx = fmaxf(mx, p[i * (head_dim + 2)]);
  float sum = 0.0f;
  for (int i = 0; i < n_splits; ++i) sum += p[i * (head_dim + 2) + 1] * __expf(p[i * (head_dim + 2)] - mx);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < n_splits; ++i) o += p[i * (head_dim + 2) + 2 + d] * __expf(p[i * (head_dim + 2)] - mx);
    out[t * ldo + static_cast<int64_t>(head) * head_dim + d] = o * inv;
  }
}

template <typename KT, int HD>
void launch_split(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
                  int split_len, int max_splits, float* partials, int window, cudaStream_t s) {
  const int q_chunks = (group + kMaxQ - 1) / kMaxQ;
  const dim3 grid(b.n_seqs, kv.n_kv_heads * q_chunks, max_splits);
  constexpr int kKeys = CudaTuning::kDecodeKeysPerGroup;
  launch_pdl(attention_decode_split<KT, HD, kKeys>, dim3(grid), dim3(kThreads), 0, s, q, ldq,
             static_cast<const KT*>(kv.k), static_cast<const KT*>(kv.v), b, kv.n_kv_heads, kv.block_size, group,
             q_chunks, scale, split_len, max_splits, partials, window);
}

}  // namespace

bool attention_decode_supported(const KvLayerView& kv) {
  return (kv.head_dim == 64 || kv.head_dim == 96 || kv.head_dim == 128 || kv.head_dim == 256) &&
         (kv.plain_dtype() == DType::F16 || kv.plain_dtype() == DType::F32);
}

void launch_attention_decode(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                             float scale, float* out, int64_t ldo, int split_len, int max_splits, float* partials,
                             cudaStream_t s) {
  launch_attention_decode_window(q, ldq, kv, b, n_heads, scale, out, ldo, split_len, max_splits, partials, 0, s);
}

void launch_attention_decode_window(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                    int n_heads, float scale, float* out, int64_t ldo, int split_len, int max_splits,
                                    float* partials, int window, cudaStream_t s) {
  TESSERA_CHECK(attention_decode_supported(kv), "cuda decode attention: head_dim ", kv.head_dim, " / KV ",
                kv_format_name(kv.k_fmt), "/", kv_format_name(kv.v_fmt), " not supported");
  if (b.n_seqs == 0) return;
  // The tensor-core kernel has no window mask.
  if (window == 0 &&
      launch_attention_decode_mma(q, ldq, kv, b, n_heads, scale, out, ldo, split_len, max_splits, partials, s))
    return;
  const int group = n_heads / kv.n_kv_heads;
  const bool f16 = kv.plain_dtype() == DType::F16;
  const auto w = window;
  switch (kv.head_dim) {
    case 64:
      f16 ? launch_split<__half, 64>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s)
          : launch_split<float, 64>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s);
      break;
    case 96:  // Phi-3
      f16 ? launch_split<__half, 96>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s)
          : launch_split<float, 96>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s);
      break;
    case 128:
      f16 ? launch_split<__half, 128>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s)
          : launch_split<float, 128>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s);
      break;
    default:
      f16 ? launch_split<__half, 256>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s)
          : launch_split<float, 256>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, w, s);
  }
  TESSERA_CUDA_CHECK_LAUNCH("attention_decode_split");
  launch_attention_decode_merge(partials, b, n_heads, kv.head_dim, split_len, max_splits, out, ldo, s);
}

void launch_attention_decode_merge(const float* partials, const DeviceBatch& b, int n_heads, int head_dim,
                                   int split_len, int max_splits, float* out, int64_t ldo, cudaStream_t s) {
  launch_pdl(attention_decode_merge, dim3(b.n_tokens, n_heads), dim3(128), 0, s, partials, b, n_heads, head_dim,
             split_len, max_splits, out, ldo);
  TESSERA_CUDA_CHECK_LAUNCH("attention_decode_merge");
}

}  // namespace tessera::cuda
