#pragma once
// Device helpers shared by the kernels (included by .cu files only).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

// The sequence of query row t: t itself in a decode batch (one row each), else the last
// whose first row is <= t (binary search over q_start).
__device__ __forceinline__ int sequence_of_row(const DeviceBatch& b, int t) {
  if (b.n_tokens == b.n_seqs) return t;
  int lo = 0, hi = b.n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.q_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The query rows a block of the split decode kernels takes (attention_decode_mma.cu,
// attention_quant_decode_frag.cu): chunk `chunk` of sequence seq's rows, 16 / group rows per
// chunk (one chunk of one row in a decode batch), and the keys each row sees (causal).
// Tree verification (AttentionBatch::tree_mask): a tree sequence's rows wrote the keys from
// its first row's position `lo` on, and bit i of a row's `hidden` bits hides key lo + i (not
// an ancestor). Rows of batches without trees hide nothing (lo = INT_MAX, bits 0).
__device__ __forceinline__ int tree_lo(const DeviceBatch& b, int seq) {
  return b.tree_mask ? b.positions[b.q_start[seq]] : INT_MAX;
}
__device__ __forceinline__ uint32_t tree_hidden(const DeviceBatch& b, int t) {
  return b.tree_mask ? ~b.tree_mask[t] : 0u;
}
__device__ __forceinline__ bool tree_hides(uint32_t hidden, int lo, int key) {
  const unsigned i = static_cast<unsigned>(key - lo);
  return i < 32u && ((hidden >> i) & 1u);
}

struct QueryChunk {
  int t = 0;     // first query row
  int rows = 0;  // rows of the chunk; <= 0 past the sequence's rows
  int len = 0;   // keys the chunk's longest row sees
  int min_len = 0;
  const int32_t* positions = nullptr;   // the rows' positions, from row t
  int kv_len = 0;                       // the sequence's keys after this step
  const uint32_t* tree_mask = nullptr;  // the rows' tree masks, from row t, or null
  int lo = INT_MAX;                     // tree_lo of the sequence
  // Keys row j of the chunk sees (0 past the chunk's rows: every key masked).
  __device__ __forceinline__ int row_len(int j) const { return j < rows ? min(kv_len, positions[j] + 1) : 0; }
  // Row j's hidden tree keys (tree_hides).
  __device__ __forceinline__ uint32_t hidden(int j) const { return tree_mask && j < rows ? ~tree_mask[j] : 0u; }
};
__device__ __forceinline__ QueryChunk query_chunk(const DeviceBatch& b, int seq, int chunk, int group) {
  QueryChunk c;
  const int chunk_rows = 16 / group;
  c.t = b.q_start[seq] + chunk * chunk_rows;
  c.rows = min(chunk_rows, b.q_start[seq + 1] - c.t);
  if (c.rows <= 0) return c;
  c.positions = b.positions + c.t;
  c.kv_len = b.kv_len[seq];
  if (b.tree_mask) {
    c.tree_mask = b.tree_mask + c.t;
    c.lo = tree_lo(b, seq);
  }
  c.min_len = INT_MAX;
  for (int j = 0; j < c.rows; ++j) c.len = max(c.len, c.row_len(j)), c.min_len = min(c.min_len, c.row_len(j));
  return c;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? partial[lane] : 0.0f;
  return warp_sum(t);
}

// Shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// f32 rounded to nearest even as bf16 (to_bf16) or f16, as raw bits: the 16-bit activations
// of the tensor-core GEMMs.
__device__ __forceinline__ uint16_t f32_to_16bits(float v, bool to_bf16) {
  return to_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ float half_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// silu(g) * u = g / (1 + e^-g) * u, through e^-|g| so large |g| never overflows (swiglu.cu
// and the fused input of gemv_bulk.cu compute it alike: the same bits).
__device__ __forceinline__ float silu_times(float g, float u) {
  const float e = __expf(-fabsf(g));
  const float sig = g >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return g * sig * u;
}

// RoPE on one pair (a, b) at `position` with the pair's inverse frequency: the angle's
// cos/sin in double (as the CPU's table), the rotation in f32. rope.cu and rope_kv_store.cu
// both call it, so their bits agree.
// Split in two for kernels that compute each pair's cos/sin once and rotate several heads.
__device__ __forceinline__ void rope_cos_sin(int32_t position, double inv_freq, float& c, float& s) {
  double sd, cd;
  sincos(static_cast<double>(position) * inv_freq, &sd, &cd);
  c = static_cast<float>(cd);
  s = static_cast<float>(sd);
}
__device__ __forceinline__ void rope_apply(float& a, float& b, float c, float s) {
  const float ra = a * c - b * s, rb = a * s + b * c;
  a = ra;
  b = rb;
}
// Dims (ia, ib) of rotated pair i (rope_kv_store.cu's rule): adjacent, or i and i + rot_half
// (neox); pairs past rot_half are the unrotated tail, in order.
__device__ __forceinline__ void rope_pair_dims(int i, int rot_half, bool neox, int& ia, int& ib) {
  const bool rotated = i < rot_half;
  ia = rotated ? (neox ? i : 2 * i) : 2 * rot_half + 2 * (i - rot_half);
  ib = rotated ? (neox ? i + rot_half : 2 * i + 1) : ia + 1;
}

__device__ __forceinline__ void rope_rotate(float& a, float& b, int32_t position, double inv_freq) {
  float c, s;
  rope_cos_sin(position, inv_freq, c, s);
  rope_apply(a, b, c, s);
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---- Programmatic dependent launch (PDL, sm_90) ----
// A kernel launched with launch_pdl may start while the kernel before it on the stream is
// still running; it must call pdl_wait() in every thread before touching anything that
// kernel writes (or reads: WAR), and before exiting, so completion stays transitive along
// the stream. Work that needs no earlier output (copies of weights) can go before it.
// pdl_trigger() lets the next PDL kernel start launching; every kernel calls it only after
// its own pdl_wait(), so when a kernel starts, every kernel before its predecessor is
// complete: work before the wait may read anything the predecessor does not write (the
// fused decode attention copies earlier steps' K/V tiles there). Keep that order. Both are
// no-ops for a kernel launched the ordinary way.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

}  // namespace tessera::cuda
