#pragma once
// The fused decoder stack for one token (decode_stack.cu): every block of a Llama-family
// decoder at batch 1 in one persistent kernel. Host side: the parameters, the plan (which
// shapes it takes and how the weights and the KV cache are cut into chunks) and the launcher.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace tessera::cuda {

constexpr int kStackMaxLayers = 128;
constexpr int kStackMaxSlots = 8;         // ring buffers per block
constexpr int kStackMaxChunkRows = 8;     // rows of one matrix per chunk (gate|up: 8 of each)
constexpr int kStackMaxCols = 16384;      // widths x can hold in registers (256 threads × 8 × 8)
constexpr int kStackMaxGroupDims = 512;   // query heads per KV head × head_dim
constexpr int kStackMaxTable = 1024;      // KV blocks of the sequence (its block table in smem)
constexpr int kStackMaxScores = 1024;     // query heads per KV head × keys per KV chunk
// Phases of a layer timed by TESSERA_CUDA_STACK_TIMING=1 (each block, per layer): norm +
// Q|K|V, barrier, attention (+ merge), barrier, O, barrier, norm + gate|up, barrier, down,
// barrier.
constexpr int kStackPhases = 10;

// One block's weights (16-bit, rows contiguous; Q|K|V and gate|up each one allocation, the
// second part right after the first) and its KV cache (f16, [n_blocks, n_kv, bs, hd]).
struct StackLayer {
  const void* wqkv = nullptr;   // [q_dim + 2 kv_dim, n_embd]
  const void* wo = nullptr;     // [n_embd, q_dim]
  const void* wgu = nullptr;    // [2 n_ff, n_embd]: gate rows, then up rows
  const void* wdown = nullptr;  // [n_embd, n_ff]
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  void* k = nullptr;
  void* v = nullptr;
};

struct StackParams {
  int n_layers = 0;
  int n_embd = 0, q_dim = 0, kv_dim = 0, n_ff = 0;
  int n_head = 0, n_kv = 0, head_dim = 0, group = 0;
  // Rows per chunk of the four products: Q|K|V, O, gate|up (rows of each half), down.
  int rpc[4] = {};
  int n_slots = 0;
  uint32_t slot_stride = 0;  // bytes, a multiple of 128
  int evict_first = 0;       // weight chunks copied with an L2 evict_first policy
  // Attention: a KV chunk holds kv_blocks_per_chunk whole KV blocks of one head (their keys,
  // then their values); splits are whole chunks of keys.
  int kv_blocks_per_chunk = 0;
  int max_splits = 0;  // attention splits per KV head at most (partials' stride)
  int block_size = 0;
  // The one sequence's index arrays on the device (staged: fixed addresses under graphs).
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* kv_len = nullptr;
  const int32_t* block_table = nullptr;
  const double* inv_freq = nullptr;  // [rot_dim / 2] (rope_inv_freq)
  int rot_half = 0;
  int neox = 0;
  float eps = 0.0f;
  float q_scale = 0.0f;  // attention scale × log2(e): scores in base 2
  // Residual stream [n_embd]: the embedding in, the last block's output added out.
  float* x = nullptr;
  // Scratch: qkv [q_dim + 2 kv_dim], att [q_dim], act [n_ff],
  // partials [n_head, max_splits, head_dim + 2]; `sync`: the grid barrier's counters and the
  // attention splits' arrival counters (barrier_bytes(), zeroed before every launch).
  float* qkv = nullptr;
  float* att = nullptr;
  float* act = nullptr;
  float* partials = nullptr;
  unsigned* sync = nullptr;
  // TESSERA_CUDA_STACK_TIMING=1: SM cycles added per (block, layer, phase), and nanoseconds
  // and cycles of the whole kernel per block (to convert); nullptr otherwise.
  unsigned long long* timing = nullptr;     // [grid][n_layers][kStackPhases]
  unsigned long long* timing_ns = nullptr;  // [grid][2]
  StackLayer layers[kStackMaxLayers];
};

// The shapes of a stack, for planning.
struct StackShape {
  DType wtype = DType::BF16;
  int n_layers = 0, n_embd = 0, n_head = 0, n_kv = 0, head_dim = 0, n_ff = 0, rot_dim = 0, block_size = 0;
};

// How a stack runs: the chunking and ring written into `p` (rpc, n_slots, slot_stride,
// kv_blocks_per_chunk, max_splits and the model dimensions), the grid and the dynamic shared
// memory. False when the kernel does not take these shapes (the caller runs the blocks op by
// op).
struct StackLaunch {
  int grid = 0;
  size_t smem = 0;
  size_t scratch_floats = 0;  // qkv + att + act + partials
  size_t sync_bytes = 0;      // the zeroed counters after them
};
bool plan_decode_stack(const StackShape& shape, int sm_count, StackParams& p, StackLaunch& launch);

// Zeroes the counters and launches the stack kernel (cooperative: every block resident at
// once) on `s`.
void launch_decode_stack(DType wtype, const StackParams& p, const StackLaunch& launch, cudaStream_t s);

}  // namespace tessera::cuda
