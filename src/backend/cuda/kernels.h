#pragma once
// Host-side launchers of the CUDA backend's kernels, one .cu file each. Every pointer is a
// device pointer; every launcher enqueues on `stream` and checks the launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "backend/op_types.h"

namespace tessera::cuda {

// The batch description with its arrays on the device (see AttentionBatch).
struct DeviceBatch {
  int n_tokens = 0;
  int n_seqs = 0;
  int max_blocks = 0;                     // row stride of block_tables
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* slot_mapping = nullptr;  // [n_tokens]
  const int32_t* q_start = nullptr;       // [n_seqs + 1]
  const int32_t* kv_len = nullptr;        // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks]
  const uint32_t* tree_mask = nullptr;    // [n_tokens] or null (AttentionBatch::tree_mask)
};

// out[i, :] = table[ids[i] - first_id, :]; rows outside the table (a vocabulary-parallel
// slice's, first_id > 0 or ids past it) give zeros.
void launch_embed(const WeightMatrix& table, const int32_t* ids, int n, float* out, cudaStream_t s,
                  int64_t first_id = 0);
void launch_rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps, cudaStream_t s);
void launch_add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim, float eps,
                         cudaStream_t s);
// x_out = x + residual (x_out not aliasing either), out = rms_norm(x_out) * w as f32 (out32) or
// rounded to bf16/f16 (out16, dense [n_rows, dim]: the input of the tensor-core GEMM).
void launch_add_rms_norm_into(const float* x, const float* residual, const float* w, float* x_out, float* out32,
                              uint16_t* out16, bool to_bf16, int n_rows, int dim, float eps, cudaStream_t s);
// inv_freq: [rot_dim/2] inverse frequencies (llama3 scaling, freq factors and linear scaling
// folded in), in double so angles at long positions keep the CPU's precision.
void launch_rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, int head_dim, int rot_dim,
                 bool neox, const double* inv_freq, cudaStream_t s);
void launch_swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim, cudaStream_t s);
// silu(gate) * up rounded to bf16 (to_bf16) or f16, dense [n_rows, dim]: the input of the
// tensor-core GEMM that follows (the same values as swiglu then convert_rows).
void launch_swiglu_to16(const float* gate, const float* up, int64_t ld_in, uint16_t* out, int n_rows, int dim,
                        bool to_bf16, cudaStream_t s);
void launch_add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim, cudaStream_t s);
void launch_add(float* x, const float* y, int64_t n, cudaStream_t s);
void launch_gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst, cudaStream_t s);
// RoPE on q's n_q_heads and k's kv.n_kv_heads heads (in place) and the rotated keys and the
// values of every row into their slots, in one launch (rope_kv_store.cu).
void launch_rope_kv_store(float* q, int64_t ldq, int n_q_heads, float* k, int64_t ldk, const float* v, int64_t ldv,
                          const KvLayerView& kv, const int32_t* positions, const int32_t* slots, int n_rows,
                          int rot_dim, bool neox, const double* inv_freq, cudaStream_t s);
void launch_kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                     const int32_t* slot_mapping, int n_tokens, cudaStream_t s);

// Backend::move_kv_tokens (kv_store.cu): each move's token, every head, K and V, codes and
// its own scales, the moves in order (one may read what an earlier one wrote).
struct SlotMoves {
  static constexpr int kMax = 32;
  int32_t src[kMax], dst[kMax];
  int n = 0;
};
struct KvMovePart {  // where a token's bytes are in a page of K or V
  int64_t page_bytes = 0;
  int row_bytes = 0;
  int64_t meta_offset = 0;
  int meta_bytes = 0;  // one token's scales
};
void launch_move_kv_tokens(const KvLayerView& kv, std::span<const KvSlotMove> moves, cudaStream_t s);

// Quantized KV formats (docs/design/kv-quant.md; any K/V pair where either is not plain).
// kv_store_quant.cu: this step's keys and values encoded into their pages in place, the
// same bytes as the CPU encoder (within one code where f32 rounding differs; see the test).
// positions: the tokens' positions (a first key's own center applies at position 0).
void launch_kv_store_quant(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                           const int32_t* slot_mapping, const int32_t* positions, int n_tokens, cudaStream_t s);
// attention_quant_decode.cu: one query row per sequence, split over the KV length like
// launch_attention_decode (same partials layout), pages decoded in registers; the merge
// rotates turbo values back (and is skipped where the tensor-core kernel has one split and
// writes the output itself). head_dim 64, 128 or 256. max_rows > 1 (a verification batch,
// as launch_attention_decode_mma's; partials hold n_tokens rows) only where
// attention_quant_decode_frag_applies.
void launch_attention_quant_decode(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                   int n_heads, float scale, float* out, int64_t ldo, int split_len, int max_splits,
                                   float* partials, cudaStream_t s, int max_rows = 1);
// attention_quant_decode_frag.cu: whether the tensor-core kernel that decodes pages straight
// into mma fragments takes this layout (head_dim 64/128, blocks of 16, K and V each f16, fp8,
// int8, int4 or turbo without QJL); like attention_decode_mma.cu it fits a few blocks per SM.
bool attention_quant_decode_frag_applies(const KvLayerView& kv, int n_heads);
// How many of that kernel's blocks an SM holds for this layer's formats (its occupancy: 3 for
// the compiled pairs, 2 for a mixed pair read at run time): the split choice's slots. Asked of
// the CUDA runtime once per format pair and page size, then remembered (decode_split runs per
// layer and step).
int attention_quant_decode_frag_blocks_per_sm(const KvLayerView& kv);
// attention_quant_prefill.cu: any batch (variable length, causal, GQA), as launch_attention_prefill.
void launch_attention_quant_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                    int n_heads, float scale, float* out, int64_t ldo, cudaStream_t s);

// Matrix-vector / small-batch products straight from the stored weight format.
constexpr int kGemvMaxRows = 8;
constexpr int kGemvMaxTargets = 3;
// The targets of one matrix-vector launch over row-major weights of one type (gemv.cu,
// gemv_blocks_q8.cu), passed by value to the kernel.
struct GemvRowTargets {
  const uint8_t* w[kGemvMaxTargets];
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int64_t row_end[kGemvMaxTargets];  // cumulative rows: target i owns [row_end[i-1], row_end[i])
  int64_t row_bytes;
  int n;
};
struct GemvTarget {
  const void* w = nullptr;  // [rows, cols] in the weight's format
  float* y = nullptr;       // y[t * ldy + r]
  int64_t ldy = 0;
  int64_t rows = 0;
  const float* scale = nullptr;  // FP8W: [rows] f32 per-row scales (WeightMatrix::fp8_scales)
};
// y_i[t, r] = x[t, :] · W_i[r, :] for t < n_rows (<= kGemvMaxRows); every target has type t
// and `cols` columns. False when the type has no decoder.
bool launch_gemv(DType t, const float* x, int n_rows, int64_t ldx, int64_t cols, const GemvTarget* targets,
                 int n_targets, cudaStream_t s);
// Batch 1 with bf16/f16 weights: y_i[r] = input · W_i[r, :] (GemvInput says what the input
// is); the weights streamed through shared memory by the bulk copy engine
// (gemv_bulk.cu), launched as a programmatic dependent launch. False when it does not apply
// (other types, widths past 16384 or not a multiple of 8, misaligned pointers): the caller
// uses launch_gemv.
// What the bulk kernel computes its input row from: x itself; silu(x) * up; or, with
// residual and norm_w, rms_norm(x + residual) * norm_w, the sum written to x_out by one block
// (x_out must not alias x or residual: every block reads them).
struct GemvInput {
  const float* x = nullptr;  // [cols]
  const float* up = nullptr;
  const float* residual = nullptr;
  const float* norm_w = nullptr;
  float* x_out = nullptr;
  float eps = 0.0f;
};
// Per-block timestamps (probe.cuh), in builds with TESSERA_CUDA_PROBE only: probe_open()
// allocates the record ring when TESSERA_CUDA_DIAG names a probe file (cuda_diag.h),
// probe_close() writes it there.
void probe_open();
void probe_close();

// With swiglu_out: targets are the FFN's gate and up (same rows), each chunk takes rows of
// both, and swiglu_out[r] = silu(gate[r]) * up[r] is written beside them (false when the
// rows do not split into such chunks).
bool launch_gemv_bulk(DType t, const GemvInput& in, int64_t cols, const GemvTarget* targets, int n_targets,
                      int sm_count, cudaStream_t s, float* swiglu_out = nullptr);
// Whether launch_gemv_bulk takes weights of type t, `cols` wide, with these inputs.
bool gemv_bulk_applies(DType t, int64_t cols, const GemvInput& in);
// out[r, :] = W[r, :] as bf16 (round to nearest even), for the tensor-core path at large
// batch. False when the type has no decoder.
bool launch_dequant_bf16(DType t, const void* w, int64_t rows, int64_t cols, uint16_t* out, cudaStream_t s);
// Group-quantized weights (W4G/W8G) as bf16, dense [rows, cols] in input-column order (the
// act-order permutation undone): their tensor-core path past kGemvMaxRows rows (dequant_gq.cu).
void launch_dequant_gq_bf16(const WeightMatrix& w, uint16_t* out, cudaStream_t s);
// FP8W weights (E4M3 codes, f32 scale per row) at decode sizes (gemv_fp8.cu), any width:
// y_i[t * ldy_i + r] = scale_i[r] * sum_k x[t, k] * e4m3(W_i[r, k]) for t < n_rows (<= kGemvMaxRows),
// f32 arithmetic; targets share the width. Weight buffers 16-byte aligned.
void launch_gemv_fp8(const float* x, int n_rows, int64_t ldx, const MatmulTarget* targets, int n_targets,
                     cudaStream_t s);
// FP8 W8A8 past kGemvMaxRows (gemm_fp8.cu): activations quantized per row to E4M3,
// xq [n_rows][ldq] (columns past cols zero, ldq a multiple of 16) with sx[t] = amax_t / 448
// (1 for a zero row); and the scaling epilogue y[t * ldy + r] *= sw[r] * sx[t] on cuBLASLt's
// unscaled FP8 product.
void launch_quantize_rows_e4m3(const float* x, int n_rows, int64_t ldx, int64_t cols, uint8_t* xq, int64_t ldq,
                               float* sx, cudaStream_t s);
void launch_scale_outer(float* y, int64_t ldy, int n_rows, int64_t rows, const float* sw, const float* sx,
                        cudaStream_t s);
// Activations quantized per 32 columns for the integer decode kernels (quantize_q8.cu), the
// CPU backend's Q8 numerics: q [n_rows][ld] int8 (ld = cols rounded up to 32, zeros past cols),
// meta [n_rows][ld / 32] = {bits of d = fp16(amax / 127) as f32, sum of the block's q}.
struct Q8Rows {
  int8_t* q = nullptr;
  int2* meta = nullptr;
  int64_t ld = 0;
};
size_t q8_rows_bytes(int n_rows, int64_t cols);
Q8Rows q8_rows_view(void* buf, int n_rows, int64_t cols);  // buf: q8_rows_bytes, 256-byte aligned
// out row t = Q8(x[t, perm[j]] for j < cols) (perm nullptr: x[t, j]).
void launch_quantize_q8_rows(const float* x, int n_rows, int64_t ldx, int64_t cols, const int32_t* perm, Q8Rows out,
                             cudaStream_t s);
// Group-quantized weights (W4G/W8G) at decode sizes, read straight from the codes with integer
// dot products on Q8 activations (gemv_gq.cu): y_i[t * ldy_i + r] = sum over 32-column blocks b
// of scale_i[r, g(b)] * d[t, b] * sum_j (code - zero) * q[t, j], for t < n_rows (<= kGemvMaxRows),
// the CPU backend's arithmetic. The targets (<= kGemvMaxTargets) share type, width and group
// size; x is in their stored column order (an act-order weight runs alone, on x quantized
// through its permutation). sm_count (the device's) picks the rows per block. A programmatic
// dependent launch: the weights are read before the previous kernel completes.
void launch_gemv_gq(const Q8Rows& x, int n_rows, const MatmulTarget* targets, int n_targets, int sm_count,
                    cudaStream_t s);
// GGUF Q4_0, Q4_1, Q8_0 (widths of 32k) and Q4_K (256k) at decode sizes, integer dot products on
// Q8 activations (gemv_blocks_q8.cu): y_i[t * ldy_i + r] = x[t, :] · W_i[r, :] for t < n_rows.
bool gemv_blocks_q8_applies(DType type, int64_t cols);
void launch_gemv_blocks_q8(DType type, const Q8Rows& x, int n_rows, int64_t cols, const GemvTarget* targets,
                           int n_targets, cudaStream_t s);
// out[r, c] = x[r * ldx + c] as bf16 (to_bf16) or f16, dense [n_rows, cols].
void launch_convert_rows(const float* x, int n_rows, int64_t ldx, int64_t cols, uint16_t* out, bool to_bf16,
                         cudaStream_t s);

// Paged attention. Prefill: any batch (variable length, causal, GQA), query tiles from the
// device batch. Decode: one query row per sequence, the KV length split over blocks of
// `split_len` keys (partials: [n_seqs * n_heads * max_splits * (head_dim + 2)] floats),
// then merged by a second kernel.
void launch_attention_prefill(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                              float scale, float* out, int64_t ldo, cudaStream_t s);
// The same on the tensor cores (f16 KV, head_dim 64/128/256; attention_prefill_mma.cu). False
// when it does not apply (f32 KV, other head sizes, odd strides): the caller runs
// launch_attention_prefill instead.
bool launch_attention_prefill_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                                  float scale, float* out, int64_t ldo, cudaStream_t s);
bool attention_decode_supported(const KvLayerView& kv);
void launch_attention_decode(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                             float scale, float* out, int64_t ldo, int split_len, int max_splits, float* partials,
                             cudaStream_t s);
// The same on the tensor cores (f16 KV, head_dim 64/128, query heads per KV head <= 16;
// attention_decode_mma.cu): split_len a multiple of 64. With max_splits == 1 it writes `out`
// directly; otherwise it writes the partials (per query row) and runs the same merge as
// launch_attention_decode. False when it does not apply (the caller runs the SIMT kernels).
// max_rows > 1: a verification batch, up to max_rows query rows per sequence (the grid takes
// attention_decode_mma_chunks(group, max_rows) chunks of 16 / group rows per (sequence, KV
// head); chunks past a sequence's rows exit), each row attending to the keys up to its own
// position; partials hold n_tokens rows.
bool launch_attention_decode_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                                 float scale, float* out, int64_t ldo, int split_len, int max_splits, float* partials,
                                 cudaStream_t s, int max_rows = 1);
int attention_decode_mma_chunks(int group, int max_rows);
// Whether the tensor-core decode kernel takes this KV layout and head count (the backend
// sizes its splits for it: one block per KV head, two blocks per SM).
bool attention_decode_mma_applies(const KvLayerView& kv, int n_heads);
// RoPE on q and k, this step's K/V into the cache, the tensor-core decode attention and the
// merge of its splits in one launch (attention_decode_mma.cu, the fused variant): every
// sequence one query row (its position b.positions, slot b.slot_mapping), q/k/v raw from the
// Q|K|V product (q 16-byte aligned, ldq a multiple of 4), n_splits <= kMaxFusedSplits blocks
// per (sequence, KV head) forming one cluster. Writes out; q and k are left as they were.
// rope_kv_store_attention_decode_applies says whether it takes these (the caller runs
// rope_kv_store and the attention otherwise).
constexpr int kMaxFusedSplits = 8;  // the portable cluster size
bool rope_kv_store_attention_decode_applies(const float* q, int64_t ldq, const float* out, int64_t ldo,
                                            const KvLayerView& kv, int n_heads, int rot_dim, int split_len,
                                            int n_splits);
void launch_rope_kv_store_attention_decode(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                                           int64_t ldv, const KvLayerView& kv, const DeviceBatch& b, int n_heads,
                                           float scale, int rot_dim, bool neox, const double* inv_freq, float* out,
                                           int64_t ldo, int split_len, int n_splits, cudaStream_t s);
// Kernel 2 of the split decode: merges the splits' (m, l, O) partials of each (query row,
// head) and normalizes (attention_decode.cu); a row reads the splits that hold its keys (its
// position + 1). m is in natural-log units.
void launch_attention_decode_merge(const float* partials, const DeviceBatch& b, int n_heads, int head_dim,
                                   int split_len, int max_splits, float* out, int64_t ldo, cudaStream_t s);

// out[r] = first index of the largest value of row r of x [n_rows, n_cols]; -1 for a row
// with a NaN or +inf, or of -inf only.
void launch_row_argmax(const float* x, int n_rows, int n_cols, int32_t* out, cudaStream_t s);

// Token masks (token_bitmask.cu): for m < n_masks with rows[m] >= 0, every logit of row
// rows[m] of logits [*, n_vocab] whose bit in masks[m, :] (words per mask) is 0 becomes -inf.
// rows and masks are device arrays.
void launch_apply_token_bitmask(float* logits, int n_vocab, const int32_t* rows, int n_masks, const int32_t* masks,
                                int words, cudaStream_t s);

}  // namespace tessera::cuda
