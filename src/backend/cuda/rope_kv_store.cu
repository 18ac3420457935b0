// RoPE on the query and key heads of each row, and this step's keys (rotated) and values
// into their paged slots, in one launch (Backend::rope_kv_store): at decode the two small
// kernels it replaces were each a few microseconds of a ~140 µs layer. One thread per (row,
// head, pair of dims): a query head's thread rotates its pair in place; a key head's thread
// rotates its pair in place too, stores it into the K cache and stores the same two dims of
// V. Pairs past rot_dim (partial rotation) are copied unrotated. The rotation is rope.cu's
// (`rope_rotate`, cuda_common.cuh) and the stores are
// kv_store.cu's (f16 round to nearest even, or f32), so the bits equal the three separate ops.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

template <typename KT>
__device__ __forceinline__ KT to_cache(float v) {
  if constexpr (sizeof(KT) == 2)
    return __float2half_rn(v);
  else
    return v;
}

template <typename KT>
__global__ void rope_kv_store_kernel(float* __restrict__ q, int64_t ldq, int n_q_heads, float* __restrict__ k,
                                     int64_t ldk, const float* __restrict__ v, int64_t ldv, KT* __restrict__ kc,
                                     KT* __restrict__ vc, const int32_t* __restrict__ positions,
                                     const int32_t* __restrict__ slots, int n_rows, int n_kv_heads, int block_size,
                                     int head_dim, int rot_half, bool neox, const double* __restrict__ inv_freq) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int pairs = head_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * (n_q_heads + n_kv_heads) * pairs) return;
  const int i = static_cast<int>(idx % pairs);
  const int64_t rh = idx / pairs;
  const int h = static_cast<int>(rh % (n_q_heads + n_kv_heads)), r = static_cast<int>(rh / (n_q_heads + n_kv_heads));
  const bool is_key = h >= n_q_heads;
  const bool rotated = i < rot_half;
  if (!is_key && !rotated) return;  // a query's unrotated dims stay as they are
  int ia, ib;  // dims of this pair: rotated pairs as rope.cu takes them, the unrotated tail in order
  rope_pair_dims(i, rot_half, neox, ia, ib);
  float* x = is_key ? k + r * ldk + static_cast<int64_t>(h - n_q_heads) * head_dim
                    : q + r * ldq + static_cast<int64_t>(h) * head_dim;
  float a = x[ia], b = x[ib];
  if (rotated) {
    rope_rotate(a, b, positions[r], inv_freq[i]);
    x[ia] = a;
    x[ib] = b;
  }
  if (!is_key) return;
  const int kh = h - n_q_heads;
  const int64_t slot = slots[r], block = slot / block_size, offset = slot % block_size;
  const int64_t dst = ((block * n_kv_heads + kh) * block_size + offset) * head_dim;
  kc[dst + ia] = to_cache<KT>(a);
  kc[dst + ib] = to_cache<KT>(b);
  const float* vr = v + r * ldv + static_cast<int64_t>(kh) * head_dim;
  vc[dst + ia] = to_cache<KT>(vr[ia]);
  vc[dst + ib] = to_cache<KT>(vr[ib]);
}

}  // namespace

void launch_rope_kv_store(float* q, int64_t ldq, int n_q_heads, float* k, int64_t ldk, const float* v, int64_t ldv,
                          const KvLayerView& kv, const int32_t* positions, const int32_t* slots, int n_rows,
                          int rot_dim, bool neox, const double* inv_freq, cudaStream_t s) {
  TESSERA_CHECK(kv.head_dim % 2 == 0 && rot_dim % 2 == 0 && rot_dim <= kv.head_dim, "cuda rope_kv_store: head ",
                kv.head_dim, ", rotated ", rot_dim);
  const int64_t n = static_cast<int64_t>(n_rows) * (n_q_heads + kv.n_kv_heads) * (kv.head_dim / 2);
  if (n <= 0) return;
  const dim3 grid(blocks_for(n, 256));
  if (kv.plain_dtype() == DType::F16)
    launch_pdl(rope_kv_store_kernel<__half>, grid, dim3(256), 0, s, q, ldq, n_q_heads, k, ldk, v, ldv,
               static_cast<__half*>(kv.k), static_cast<__half*>(kv.v), positions, slots, n_rows, kv.n_kv_heads,
               kv.block_size, kv.head_dim, rot_dim / 2, neox, inv_freq);
  else if (kv.plain_dtype() == DType::F32)
    launch_pdl(rope_kv_store_kernel<float>, grid, dim3(256), 0, s, q, ldq, n_q_heads, k, ldk, v, ldv,
               static_cast<float*>(kv.k), static_cast<float*>(kv.v), positions, slots, n_rows, kv.n_kv_heads,
               kv.block_size, kv.head_dim, rot_dim / 2, neox, inv_freq);
  else
    fail("cuda rope_kv_store: KV type ", kv_format_name(kv.k_fmt), "/", kv_format_name(kv.v_fmt), " (F16 or F32)");
  TESSERA_CUDA_CHECK_LAUNCH("rope_kv_store");
}

}  // namespace tessera::cuda
