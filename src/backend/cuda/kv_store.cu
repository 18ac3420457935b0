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

namespace tessera::cuda {

namespace {

// Grid: (KV head, K or V), disjoint bytes; each block takes the moves in order (a kept path's
// moves may chain: one's source is an earlier one's destination), the token's codes, then its
// own scales, a barrier between moves.
__global__ void move_kv_tokens_kernel(uint8_t* __restrict__ k, uint8_t* __restrict__ v, SlotMoves m, int n_kv_heads,
                                      int block_size, KvMovePart kp, KvMovePart vp) {
  pdl_wait();
  pdl_trigger();
  const KvMovePart& p = blockIdx.y == 0 ? kp : vp;
  uint8_t* base = blockIdx.y == 0 ? k : v;
  const int h = blockIdx.x;
  for (int j = 0; j < m.n; ++j) {
    const int src = m.src[j], dst = m.dst[j];
    const uint8_t* sp = base + (static_cast<int64_t>(src / block_size) * n_kv_heads + h) * p.page_bytes;
    uint8_t* dp = base + (static_cast<int64_t>(dst / block_size) * n_kv_heads + h) * p.page_bytes;
    for (int i = threadIdx.x; i < p.row_bytes; i += blockDim.x)
      dp[(dst % block_size) * p.row_bytes + i] = sp[(src % block_size) * p.row_bytes + i];
    for (int i = threadIdx.x; i < p.meta_bytes; i += blockDim.x)
      dp[p.meta_offset + (dst % block_size) * p.meta_bytes + i] =
          sp[p.meta_offset + (src % block_size) * p.meta_bytes + i];
    __syncthreads();  // this move's bytes are written before the next one reads
  }
}

KvMovePart move_part(const KvFormat& f, int block_size, int head_dim, int64_t page_bytes) {
  const KvPageLayout l = kv_page_layout(f, block_size, head_dim);
  return {page_bytes, static_cast<int>(l.row_bytes), l.meta_offset, static_cast<int>(l.meta_bytes / block_size)};
}

}  // namespace

void launch_move_kv_tokens(const KvLayerView& kv, std::span<const KvSlotMove> moves, cudaStream_t s) {
  const KvMovePart kp = move_part(kv.k_fmt, kv.block_size, kv.head_dim, kv.k_page_bytes);
  const KvMovePart vp = move_part(kv.v_fmt, kv.block_size, kv.head_dim, kv.v_page_bytes);
  for (size_t first = 0; first < moves.size(); first += SlotMoves::kMax) {
    SlotMoves m;
    m.n = static_cast<int>(std::min<size_t>(SlotMoves::kMax, moves.size() - first));
    for (int i = 0; i < m.n; ++i) {
      m.src[i] = moves[first + i].src;
      m.dst[i] = moves[first + i].dst;
    }
    launch_pdl(move_kv_tokens_kernel, dim3(kv.n_kv_heads, 2), dim3(128), 0, s, static_cast<uint8_t*>(kv.k),
               static_cast<uint8_t*>(kv.v), m, kv.n_kv_heads, kv.block_size, kp, vp);
  }
}

}  // namespace tessera::cuda
