#pragma once
// Launchers of Gemma 3's CUDA kernels, beside kernels.h (same conventions): its element-wise
// ops (gemma_ops.cu) and the sliding-window variants of the plain-KV attention kernels.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

// out = gelu_tanh(gate) * up                  gate, up: [n_rows, ld_in]; out: [n_rows, dim]
void launch_geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim, cudaStream_t s);
// Per-head RMSNorm in place: x: [n_rows, ld], n_heads heads of head_dim, one weight for all.
void launch_rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w, float eps,
                           cudaStream_t s);
// x *= scale                                                        [n]
void launch_scale(float* x, float scale, int64_t n, cudaStream_t s);

// launch_attention_prefill, launch_attention_prefill_mma and launch_attention_decode with a
// sliding window: a query at position p attends keys p - window + 1 .. p (window 0: plain
// causal, the same launches as without it). The decode never takes the tensor-core kernel,
// which has no window mask (head_dim 256, Gemma 3's, never takes it anyway).
void launch_attention_prefill_window(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                     int n_heads, float scale, float* out, int64_t ldo, int window, cudaStream_t s);
bool launch_attention_prefill_mma_window(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                         int n_heads, float scale, float* out, int64_t ldo, int window, cudaStream_t s);
void launch_attention_decode_window(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                    int n_heads, float scale, float* out, int64_t ldo, int split_len, int max_splits,
                                    float* partials, int window, cudaStream_t s);

}  // namespace tessera::cuda
