#pragma once
// Tensor-parallel sharding of a Llama-family model (docs/design/parallel.md): Megatron's split.
// Column-parallel (by output rows): Q, K, V by heads, gate and up by FFN columns, the
// embedding and the output head by vocabulary rows. Row-parallel (by input columns): O and
// down, whose partial outputs the ranks sum (one all-reduce after each). KV heads split
// across ranks, or replicated when there are fewer KV heads than ranks (each rank then keeps
// the one KV head its query heads read). Norms, RoPE factors and Q/K norms are replicated.
#include <cstdint>
#include <memory>

#include "model/weights.h"

namespace tessera {

struct TensorParallelPlan {
  int size = 1;
  int n_head = 0, n_head_kv = 0;  // per rank
  int64_t n_ff = 0, n_vocab = 0;  // per rank
  bool kv_replicated = false;     // fewer KV heads than ranks: ranks share a KV head

  int head_first(int rank) const { return rank * n_head; }
  int kv_head_first(int rank, int total_kv) const {
    return kv_replicated ? rank / (size / total_kv) : rank * n_head_kv;
  }
};

// The plan for `c` at `size` ranks; throws tessera::Error naming the numbers that do not
// divide (heads, KV heads, FFN width, vocabulary) or the architecture that is not sharded
// (Gemma 3, mixture-of-experts layers).
TensorParallelPlan plan_tensor_parallel(const ModelConfig& c, int size);

// Rank `rank`'s weights of `whole` at `size` ranks: views of whole's row slices where the
// format allows, copies otherwise (column slices; group-quantized and FP8 planes). Block
// formats are cut at whole blocks, W4G/W8G at whole groups; a cut inside one, or a
// group-quantized matrix with an act-order permutation cut by columns, throws naming the
// tensor and the numbers. The result keeps `whole` alive.
std::shared_ptr<ModelWeights> shard_weights(std::shared_ptr<const ModelWeights> whole, int rank, int size);

}  // namespace tessera
