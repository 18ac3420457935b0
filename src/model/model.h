#pragma once
// The model contract: one variable-length batch in, logits for chosen rows out. The model
// does not know phases: prefill chunks and decodes of many sequences run in the same forward
// (vLLM V1). ForwardBatch is the batch on the host; ModelRunner (engine/model_runner.h)
// stages it on the backend as ForwardInputs, runs Model::forward (or replays a graph of it)
// and reads the chosen logits rows back.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace tessera {

struct ForwardBatch {
  std::vector<int32_t> tokens;        // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<int32_t> slot_mapping;  // [n_tokens] KV slot each token writes
  std::vector<int32_t> q_start;       // [n_seqs + 1] rows of each sequence
  std::vector<int32_t> kv_len;        // [n_seqs] tokens in KV after this step
  std::vector<int32_t> block_tables;  // [n_seqs, max_blocks]
  int max_blocks = 0;
  std::vector<int32_t> logits_rows;  // rows whose logits are returned, in this order
  // The local (sliding-window) layers' own tables when the KV cache has a local group
  // (KvCacheSpec::n_local_blocks), else empty: slots and tables in the same shapes as the
  // full ones; kDropped (-1) entries are blocks behind the window, never read.
  bool has_local = false;
  std::vector<int32_t> local_slot_mapping;  // [n_tokens]
  std::vector<int32_t> local_block_tables;  // [n_seqs, max_blocks]
  // Tree verification (AttentionBatch::tree_mask / rope_positions): empty unless some
  // sequence's rows are a tree (set_tree); then [n_tokens] each, chains holding their
  // causal masks and positions.
  std::vector<uint32_t> tree_mask;
  std::vector<int32_t> rope_positions;

  int n_tokens() const { return static_cast<int>(tokens.size()); }
  int n_seqs() const { return static_cast<int>(kv_len.size()); }
  void clear();
  // Appends a sequence whose KV holds seq.n_tokens tokens *before* these new ones; the new
  // tokens take positions n_tokens.. and the slots after them. want_logits: which of the new
  // tokens get logits (none, last, all). `local`: the sequence's local-layer table (the same
  // logical blocks, its own block ids); every sequence of a batch has one or none has.
  enum class Logits { None, Last, All };
  void add_sequence(const struct SequenceBlocks& seq, int block_size, const int32_t* new_tokens, int n_new,
                    Logits want_logits, const struct SequenceBlocks* local = nullptr);
  // Makes the last added sequence's rows a tree: its first row (the last verified token)
  // is the root and row 1 + j follows row 1 + parents[j] (-1: the root), parents[j] < j.
  // Each row then sees only its ancestors among the rows, and RoPE turns it by its depth.
  // At most 32 rows.
  void set_tree(std::span<const int16_t> parents);
  bool has_tree() const { return !tree_mask.empty(); }
  // Whether every sequence has exactly one new token (a decode batch).
  bool one_row_each() const;
  // The most new tokens one sequence has.
  int max_rows() const;
  // The batch over these host arrays (the CPU backend's memory is the host's).
  AttentionBatch attention_view() const;
  // The batch of sequences [first, last) alone (a pipeline's micro-batch): their rows, slots,
  // tables and tree masks; of the logits rows those in their rows, renumbered, in order.
  ForwardBatch sequences(int first, int last) const;

 private:
  // Appends causal tree masks and RoPE positions for n_new chain rows from first_row.
  void extend_chain_masks(int first_row, int n_new);
};

// One forward's inputs with every array in the backend's memory (staged by ModelRunner).
struct ForwardInputs {
  AttentionBatch batch;
  const int32_t* tokens = nullptr;       // [batch.n_tokens]
  const int32_t* logits_rows = nullptr;  // [n_logits] rows whose logits are computed, in this order
  int n_logits = 0;
  // The local layers' slots and tables (ForwardBatch::has_local), or null: they use batch's.
  const int32_t* local_slot_mapping = nullptr;
  const int32_t* local_block_tables = nullptr;

  // The batch a sliding-window layer attends with: `window`, and its own tables if any.
  AttentionBatch local_batch(int window) const {
    AttentionBatch b = batch;
    b.window = window;
    if (local_block_tables) {
      b.slot_mapping = local_slot_mapping;
      b.block_tables = local_block_tables;
    }
    return b;
  }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // Issues the ops of one forward: writes this step's K/V into `kv` and returns the logits
  // [in.n_logits, n_vocab] in backend memory (a buffer of the model's, the same every call,
  // valid until the next forward; the caller may edit it in place, e.g. mask tokens). Reads no input array on the host: the ModelRunner checks
  // them, and may record the ops once as a graph and launch it for later steps.
  virtual float* forward(const ForwardInputs& in, KvCache& kv) = 0;
  // The largest batch (in tokens) one forward takes, and the most logits rows.
  virtual int max_batch_tokens() const = 0;
  virtual int max_logits_rows() const = 0;
};

// The groups a rank of a split model talks to, on its backend (docs/design/parallel.md).
struct ModelComms {
  Communicator* tensor = nullptr;    // a tensor-parallel shard's (weights->shard.size > 1): its stage's ranks
  Communicator* pipeline = nullptr;  // a pipeline stage's (weights->stage.size > 1): one rank a stage
};

// Builds the runner for the weights' architecture on the backend; activations are sized for
// max_batch_tokens tokens and max_logits logits rows per forward. A tensor-parallel shard
// (model/tp/shard.h) needs comms.tensor and then returns the whole vocabulary's logits on
// every rank; a pipeline stage (model/pp/stage.h) needs comms.pipeline; a stage may be
// sharded too (both).
std::unique_ptr<Model> create_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_batch_tokens,
                                    int max_logits, ModelComms comms = {});

}  // namespace tessera
