// Writes this step's keys and values into their paged slots: K/V [n_blocks, n_kv_heads,
// block_size, head_dim], f16 (round to nearest even) or f32. One thread per element.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
template <typename KT>
__global__ void kv_store_kernel(KT* __restrict__ kc, KT* __restrict__ vc, const float* __restrict__ k, int64_t ldk,
                                const float* __restrict__ v, int64_t ldv, const int32_t* __restrict__ slots,
                                int n_tokens, int n_kv_heads, int block_size, int head_dim) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int64_t width = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * width) return;
  const int64_t t = idx / width, c = idx % width;
  const int h = static_cast<int>(c / head_dim), d = static_cast<int>(c % head_dim);
  const int64_t slot = slots[t], block = slot / block_size, offset = slot % block_size;
  const int64_t dst = ((block * n_kv_heads + h) * block_size + offset) * head_dim + d;
  if constexpr (sizeof(KT) == 2) {
    kc[dst] = __float2half_rn(k[t * ldk + c]);
    vc[dst] = __float2half_rn(v[t * ldv + c]);
  } else {
    kc[dst] = k[t * ldk + c];
    vc[dst] = v[t * ldv + c];
  }
}
}  // namespace

void launch_kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                     const int32_t* slot_mapping, int n_tokens, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_tokens) * kv.n_kv_heads * kv.head_dim;
  if (n <= 0) return;
  const unsigned grid = blocks_for(n, 256);
  if (kv.plain_dtype() == DType::F16)
    launch_pdl(kv_store_kernel<__half>, dim3(grid), dim3(256), 0, s, static_cast<__half*>(kv.k),
               static_cast<__half*>(kv.v), k, ldk, v, ldv, slot_mapping, n_tokens, kv.n_kv_heads, kv.block_size,
               kv.head_dim);
  else if (kv.plain_dtype() == DType::F32)
    launch_pdl(kv_store_kernel<float>, dim3(grid), dim3(256), 0, s, static_cast<float*>(kv.k),
               static_cast<float*>(kv.v), k, ldk, v, ldv, slot_mapping, n_tokens, kv.n_kv_heads, kv.block_size,
               kv.head_dim);
  else
    fail("cuda kv_store: KV type ", kv_format_name(kv.k_fmt), "/", kv_format_name(kv.v_fmt), " (F16 or F32)");
  TESSERA_CUDA_CHECK_LAUNCH("kv_store");
}

}  // namespace tessera::cuda
