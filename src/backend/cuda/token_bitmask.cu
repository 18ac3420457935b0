// Structured output's token masks applied to logits rows on the device, before the argmax or
// the readback (Backend::apply_token_bitmask; layout in core/token_bitmask.h). A warp takes
// 32 mask words (one load each, coalesced) and walks them one word at a time: lane l handles
// token 32 * word + l, so every store of the warp covers 32 consecutive logits. Only the
// forbidden logits are written (-inf); the rest of the row is not touched.
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWordsPerBlock = kThreads;  // a warp's 32 lanes load 32 words

// grid (ceil(words / kWordsPerBlock), n_masks); mask m goes to row rows[m] (-1: skipped).
__global__ void __launch_bounds__(kThreads)
    apply_token_bitmask_kernel(float* __restrict__ logits, int n_vocab, const int32_t* __restrict__ rows,
                               const int32_t* __restrict__ masks, int words) {
  const int row = rows[blockIdx.y];
  if (row < 0) return;
  const int lane = threadIdx.x & 31;
  const int first = blockIdx.x * kWordsPerBlock + (threadIdx.x & ~31);  // the warp's first word
  if (first >= words) return;
  const int word = first + lane;
  const int used = (n_vocab + 31) / 32;  // words past the vocabulary are ignored
  const uint32_t mine =
      word < used ? static_cast<uint32_t>(masks[static_cast<int64_t>(blockIdx.y) * words + word]) : 0xffffffffu;
  // Nothing to clear in the warp's 1,024 tokens (free text, or an allowed stretch).
  if (__all_sync(0xffffffffu, mine == 0xffffffffu)) return;
  float* x = logits + static_cast<int64_t>(row) * n_vocab;
  for (int k = 0; k < 32; ++k) {
    const uint32_t bits = __shfl_sync(0xffffffffu, mine, k);
    if (bits == 0xffffffffu) continue;  // uniform across the warp
    const int token = (first + k) * 32 + lane;
    if (token < n_vocab && !((bits >> lane) & 1u)) x[token] = -INFINITY;
  }
}

}  // namespace

void launch_apply_token_bitmask(float* logits, int n_vocab, const int32_t* rows, int n_masks, const int32_t* masks,
                                int words, cudaStream_t s) {
  if (n_masks <= 0 || n_vocab <= 0) return;
  const dim3 grid((words + kWordsPerBlock - 1) / kWordsPerBlock, n_masks);
  apply_token_bitmask_kernel<<<grid, kThreads, 0, s>>>(logits, n_vocab, rows, masks, words);
  TESSERA_CUDA_CHECK_LAUNCH("apply_token_bitmask");
}

}  // namespace tessera::cuda
