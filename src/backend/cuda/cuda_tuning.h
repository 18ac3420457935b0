#pragma once
// The CUDA backend's tuning numbers, in one place. Each value was chosen by a same-call
// measurement on an H200 (Llama-3.1-8B shape, bf16 weights); docs/benchmarks/gpu.md,
// "Tuning constants", lists each with the pass and the figures that chose it.
#include <cstddef>

namespace tessera::cuda {

struct CudaTuning {
  // ---- Batch-1 bulk matrix-vector product (gemv_bulk.cu) ----
  static constexpr size_t kGemvBulkChunkBytes = 32 << 10;  // one ring stage at most
  static constexpr size_t kGemvBulkRingBytes = 96 << 10;   // chunks in flight per block: 2 blocks per SM
  static constexpr int kGemvBulkMinChunksPerBlock = 3;     // when choosing rows per chunk
  static constexpr int kGemvNormPrewaitStages = 2;         // ring stages before the PDL wait, normed input
  static constexpr int kGemvPlainPrewaitStages = 8;        // the same, plain input: all of them

  // ---- Warp-per-row matrix-vector product at batch 1 (gemv.cu) ----
  static constexpr int kGemvFeaturesPerWarp = 4;
  static constexpr int kGemvMinBlocksPerSm = 1;  // __launch_bounds__: lets ptxas use 154 registers

  // ---- Decode attention (attention_decode.cu; splits in cuda_backend.cpp) ----
  static constexpr int kDecodeKeysPerGroup = 4;       // keys in flight per lane group (SIMT kernel)
  static constexpr int kDecodeBlocksPerSm = 4;        // the split's target, SIMT kernel
  static constexpr int kDecodeMmaBlocksPerSm = 2;     // the split's target, tensor-core kernels
  static constexpr int kDecodeMmaMinSplitKeys = 256;  // shortest split of the tensor-core kernel
  // A fragment-decoding block's cost outside its keys (query load, pipeline fill, merge), in
  // keys: the wave regime's fixed term (decode_split.h; 0 and 128 chose the same splits at
  // 64 × 8k and 1 × 32k).
  static constexpr int kDecodeSplitFixedKeys = 128;
  // A batch of a few query rows per sequence (speculative verification) takes the tensor-core
  // decode kernel, its keys split over the SMs, while no sequence has more rows than this
  // (AttentionBatch::max_rows); larger batches take the prefill kernel (one tile of up to 64
  // query vectors per sequence and KV head, no split of the keys).
  static constexpr int kDecodeMmaMaxRows = 17;
};

}  // namespace tessera::cuda
