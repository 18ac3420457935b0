#pragma once
// One explicit forward of a model over one KV cache (vLLM's model runner): the host inputs
// of the step (a ForwardBatch, padded when it is a decode batch of a graph size), their copy
// into backend memory, the model's forward, and the readback of the chosen logits rows (full
// rows, or argmax only). On a backend that records graphs, decode and verification forwards
// are captured once per padded batch size, row count and block-table width and replayed
// without running the model code.
// Contract: docs/design/engine-core.md ("Forward runner").
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/function_ref.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace tessera {

class ModelRunner {
 public:
  // Decode and verification batches up to this many sequences run as graphs (sizes 1, 2, 4,
  // ..., 128), with up to kMaxGraphRows rows each (a speculative verification: the last token
  // and up to 32 drafts), at most kMaxGraphs graph keys (sequences, rows, table width) in all.
  static constexpr int kMaxGraphBatch = 128;
  static constexpr int kMaxGraphRows = 33;
  static constexpr size_t kMaxGraphs = 256;

  // pad_block: a KV block nobody else uses, written by the padding sequences that bring a
  // decode batch up to its graph size (-1: no padding; only batches of a graph size already
  // run as graphs). pad_local_block: the same in the local layers' pool of a cache with a
  // local group (needed there for padding). The runner keeps references to model, kv and
  // backend.
  ModelRunner(Model& model, KvCache& kv, Backend& backend, int pad_block = -1, int pad_local_block = -1);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs `batch`: writes its K/V into the cache and its logits rows [batch.logits_rows.size(),
  // n_vocab] to `logits` (host). With a plan, rows flagged argmax_only get only their argmax
  // (Backend::LogitsReadback). Throws naming what is wrong with a bad batch (token id,
  // position, size), before anything runs.
  void forward(const ForwardBatch& batch, float* logits, const Backend::LogitsReadback& plan = {});
  // Token masks of logits rows (Backend::apply_token_bitmask's arguments; rows index the
  // batch's logits rows, -1 skips a mask).
  struct TokenMasks {
    std::span<const int32_t> rows;   // [n]
    const int32_t* masks = nullptr;  // [n, words] host, unchanged until forward() returns
    int words = 0;
  };
  // The same, with token masks applied on the backend between the forward and the readback
  // (so the plan's argmax and the copied rows are of the masked logits). `masks` is called
  // once the forward's ops are issued: it may wait for masks computed meanwhile.
  void forward(const ForwardBatch& batch, float* logits, const Backend::LogitsReadback& plan,
               FunctionRef<TokenMasks()> masks);

  // The size a decode or verification batch of n sequences (and n_tokens rows, 0: one each)
  // runs at: n padded to a graph size with one-row padding sequences, or 0 when it runs as it
  // is (no graphs on this backend, too large, or padding not possible).
  int graph_batch(int n_seqs, int n_tokens = 0) const;
  // Graphs captured so far and forwards replayed from them (for tests and reports).
  int graphs_captured() const { return graphs_captured_; }
  int64_t graph_replays() const { return graph_replays_; }

  Model& model() { return model_; }
  KvCache& kv() { return kv_; }

 private:
  // One captured decode forward: its inputs at a fixed device address (the graph reads them
  // there), the logits buffer the model returned, and the backend's graph epoch at capture.
  struct GraphEntry {
    bool warmed_up = false;  // its first forward ran eagerly (kernels loaded, scratch sized)
    bool broken = false;     // its capture failed: eager from now on
    std::unique_ptr<Backend::Graph> graph;
    uint64_t epoch = 0;
    int32_t* inputs = nullptr;  // device
    float* logits = nullptr;
  };
  // The packed layout of one forward's index arrays (ints, 32-aligned segments).
  struct Layout {
    size_t tokens = 0, positions = 0, slots = 0, q_start = 0, kv_len = 0, tables = 0, rows = 0, total = 0;
    size_t local_slots = 0, local_tables = 0;  // has_local only
    size_t tree_mask = 0, rope_positions = 0;  // has_tree only
  };

  void check(const ForwardBatch& b) const;
  // `b` itself, or a copy padded to its graph size in padded_.
  const ForwardBatch& padded(const ForwardBatch& b);
  static Layout layout(const ForwardBatch& b, int table_width);
  // Packs b's arrays (block tables at table_width per row) and copies them to `device`.
  void stage(const ForwardBatch& b, const Layout& l, int table_width, int32_t* device);
  static ForwardInputs inputs(const ForwardBatch& b, const Layout& l, int table_width, const int32_t* device);
  // The forward of a graph key: eager, captured, or replayed.
  float* graph_forward(GraphEntry& g, const ForwardInputs& in);

  Model& model_;
  KvCache& kv_;
  Backend& backend_;
  int pad_block_;
  int pad_local_block_;
  int n_vocab_;
  ForwardBatch padded_;
  std::shared_ptr<void> packed_;                    // host side of the staging copy (page-locked on a device)
  size_t packed_cap_ = 0;                           // ints
  bool copy_in_flight_ = false;                     // packed_ may still feed the last copy (no readback since)
  int32_t* eager_inputs_ = nullptr;                 // device, for forwards that are not graphs (grown)
  size_t eager_cap_ = 0;                            // ints
  using GraphKey = std::tuple<int, int, int, int>;  // (sequences, rows, most rows of a sequence, table width)
  std::map<GraphKey, GraphEntry> graphs_;
  int graphs_captured_ = 0;
  int64_t graph_replays_ = 0;
};

}  // namespace tessera
