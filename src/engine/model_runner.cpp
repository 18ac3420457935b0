#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kv/block_manager.h"

namespace tessera {

namespace {

int next_pow2(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

size_t round_up32(size_t n) { return (n + 31) / 32 * 32; }  // 128-byte aligned segments

// A batch in the graphs' shape: every sequence 1..kMaxGraphRows new rows and every row's
// logits, in order — a decode batch (one row each) or a speculative verification (the last
// token and the drafts of each sequence). The model's forward then depends only on the
// batch's sizes and its device arrays, so a graph keyed by (sequences, rows, most rows of a
// sequence, table width) replays it.
bool graph_shaped(const ForwardBatch& b) {
  const int n = b.n_tokens();
  // Tree batches run eagerly: a graph keyed without the tree arrays would not read them.
  if (b.n_seqs() == 0 || static_cast<int>(b.logits_rows.size()) != n || b.has_tree()) return false;
  for (int i = 0; i < n; ++i)
    if (b.logits_rows[i] != i) return false;
  for (int s = 0; s < b.n_seqs(); ++s)
    if (const int rows = b.q_start[s + 1] - b.q_start[s]; rows < 1 || rows > ModelRunner::kMaxGraphRows) return false;
  return true;
}

}  // namespace

ModelRunner::ModelRunner(Model& model, KvCache& kv, Backend& backend, int pad_block, int pad_local_block)
    : model_(model),
      kv_(kv),
      backend_(backend),
      pad_block_(pad_block),
      pad_local_block_(pad_local_block),
      n_vocab_(model.config().n_vocab) {
  TESSERA_CHECK(&kv.backend() == &backend, "model runner: the KV cache lives on another backend");
  TESSERA_CHECK(pad_block < kv.spec().n_blocks, "model runner: padding block ", pad_block, " outside the KV pool of ",
                kv.spec().n_blocks);
  TESSERA_CHECK(pad_local_block < kv.spec().n_local_blocks, "model runner: local padding block ", pad_local_block,
                " outside the local pool of ", kv.spec().n_local_blocks);
}

ModelRunner::~ModelRunner() {
  // Graphs first: they read the input buffers freed after them. Destructors do not throw.
  try {
    for (auto& [key, g] : graphs_) {
      g.graph.reset();
      if (g.inputs) backend_.free(g.inputs);
    }
    if (eager_inputs_) backend_.free(eager_inputs_);
  } catch (...) {
  }
}

int ModelRunner::graph_batch(int n_seqs, int n_tokens) const {
  if (n_tokens == 0) n_tokens = n_seqs;
  if (!backend_.supports_graphs() || n_seqs < 1 || n_seqs > kMaxGraphBatch || n_tokens < n_seqs) return 0;
  const int target = next_pow2(n_seqs);
  // Each padding sequence adds one row, with its logits.
  const int padded_tokens = n_tokens + (target - n_seqs);
  if (padded_tokens > model_.max_batch_tokens() || padded_tokens > model_.max_logits_rows()) return 0;
  if (target != n_seqs && (pad_block_ < 0 || (kv_.spec().n_local_blocks > 0 && pad_local_block_ < 0))) return 0;
  return target;
}

void ModelRunner::check(const ForwardBatch& b) const {
  const int n = b.n_tokens();
  const int n_seqs = b.n_seqs();
  TESSERA_CHECK(n >= 1 && n <= model_.max_batch_tokens(), "forward: batch of ", n, " tokens, limit ",
                model_.max_batch_tokens());
  TESSERA_CHECK(static_cast<int>(b.logits_rows.size()) <= model_.max_logits_rows(), "forward: ", b.logits_rows.size(),
                " logits rows, limit ", model_.max_logits_rows());
  TESSERA_CHECK(b.positions.size() == static_cast<size_t>(n) && b.slot_mapping.size() == static_cast<size_t>(n) &&
                    b.q_start.size() == static_cast<size_t>(n_seqs) + 1 && b.q_start.back() == n &&
                    b.block_tables.size() == static_cast<size_t>(n_seqs) * b.max_blocks &&
                    (!b.has_local || (b.local_slot_mapping.size() == static_cast<size_t>(n) &&
                                      b.local_block_tables.size() == b.block_tables.size())),
                "forward: the batch's arrays disagree on its size (", n, " tokens, ", n_seqs, " sequences)");
  TESSERA_CHECK(b.has_local == (kv_.spec().n_local_blocks > 0), "forward: a batch ", b.has_local ? "with" : "without",
                " local-layer tables for a KV cache ", kv_.spec().n_local_blocks > 0 ? "with" : "without",
                " a local group");
  for (int32_t id : b.tokens)
    TESSERA_CHECK(id >= 0 && id < n_vocab_, "forward: token id ", id, " is outside the vocabulary [0, ", n_vocab_, ")");
  for (int32_t p : b.positions) TESSERA_CHECK(p >= 0, "forward: negative position ", p);
  TESSERA_CHECK(
      !b.has_tree() || (b.tree_mask.size() == static_cast<size_t>(n) &&
                        b.rope_positions.size() == static_cast<size_t>(n) && backend_.supports_tree_attention()),
      "forward: a tree batch ", backend_.supports_tree_attention() ? "with arrays of the wrong size" : "",
      backend_.supports_tree_attention() ? "" : "on a backend without tree attention");
  for (int32_t r : b.logits_rows)
    TESSERA_CHECK(r >= 0 && r < n, "forward: logits row ", r, " outside the batch of ", n, " tokens");
}

const ForwardBatch& ModelRunner::padded(const ForwardBatch& b) {
  if (!graph_shaped(b)) return b;
  const int n = b.n_seqs();
  const int target = graph_batch(n, b.n_tokens());
  if (target <= n) return b;
  padded_ = b;
  // Padding sequences: one token at position 0 in the reserved block, each with its own
  // logits row (never read back); they read and write nothing any real sequence owns.
  SequenceBlocks pad, pad_local;
  pad.blocks.push_back(pad_block_);
  pad_local.blocks.push_back(pad_local_block_);
  const int32_t token = 0;
  for (int i = n; i < target; ++i)
    padded_.add_sequence(pad, kv_.spec().block_size, &token, 1, ForwardBatch::Logits::Last,
                         b.has_local ? &pad_local : nullptr);
  return padded_;
}

ModelRunner::Layout ModelRunner::layout(const ForwardBatch& b, int table_width) {
  Layout l;
  size_t off = 0;
  const auto seg = [&](size_t& at, size_t n) {
    at = off;
    off += round_up32(n);
  };
  seg(l.tokens, b.tokens.size());
  seg(l.positions, b.positions.size());
  seg(l.slots, b.slot_mapping.size());
  seg(l.q_start, b.q_start.size());
  seg(l.kv_len, b.kv_len.size());
  seg(l.tables, static_cast<size_t>(b.n_seqs()) * table_width);
  seg(l.rows, b.logits_rows.size());
  if (b.has_local) {
    seg(l.local_slots, b.local_slot_mapping.size());
    seg(l.local_tables, static_cast<size_t>(b.n_seqs()) * table_width);
  }
  if (b.has_tree()) {
    seg(l.tree_mask, b.tree_mask.size());
    seg(l.rope_positions, b.rope_positions.size());
  }
  l.total = std::max<size_t>(off, 32);
  return l;
}

void ModelRunner::stage(const ForwardBatch& b, const Layout& l, int table_width, int32_t* device) {
  // The last forward's copy reads packed_ until the stream passes it; a readback waits for
  // that, a forward without logits rows does not.
  if (copy_in_flight_) backend_.synchronize();
  if (l.total > packed_cap_) {
    packed_cap_ = round_up32(l.total * 2);
    packed_ = backend_.alloc_host(packed_cap_ * sizeof(int32_t));
  }
  int32_t* h = static_cast<int32_t*>(packed_.get());
  std::fill(h, h + l.total, 0);
  std::copy(b.tokens.begin(), b.tokens.end(), h + l.tokens);
  std::copy(b.positions.begin(), b.positions.end(), h + l.positions);
  std::copy(b.slot_mapping.begin(), b.slot_mapping.end(), h + l.slots);
  std::copy(b.q_start.begin(), b.q_start.end(), h + l.q_start);
  std::copy(b.kv_len.begin(), b.kv_len.end(), h + l.kv_len);
  // A graph's tables are wider than this batch's (its key's width): zeros past each row.
  for (int s = 0; s < b.n_seqs(); ++s)
    std::copy_n(b.block_tables.begin() + static_cast<size_t>(s) * b.max_blocks, b.max_blocks,
                h + l.tables + static_cast<size_t>(s) * table_width);
  std::copy(b.logits_rows.begin(), b.logits_rows.end(), h + l.rows);
  if (b.has_local) {
    std::copy(b.local_slot_mapping.begin(), b.local_slot_mapping.end(), h + l.local_slots);
    for (int s = 0; s < b.n_seqs(); ++s)
      std::copy_n(b.local_block_tables.begin() + static_cast<size_t>(s) * b.max_blocks, b.max_blocks,
                  h + l.local_tables + static_cast<size_t>(s) * table_width);
  }
  if (b.has_tree()) {
    // The masks travel as int32 bit patterns in the packed buffer.
    for (size_t i = 0; i < b.tree_mask.size(); ++i) h[l.tree_mask + i] = static_cast<int32_t>(b.tree_mask[i]);
    std::copy(b.rope_positions.begin(), b.rope_positions.end(), h + l.rope_positions);
  }
  // One asynchronous transfer, ordered on the backend's stream before the forward's ops.
  backend_.copy_to_device_async(device, h, l.total * sizeof(int32_t));
  copy_in_flight_ = true;
}

ForwardInputs ModelRunner::inputs(const ForwardBatch& b, const Layout& l, int table_width, const int32_t* device) {
  ForwardInputs in;
  AttentionBatch& a = in.batch;
  a.n_tokens = b.n_tokens();
  a.n_seqs = b.n_seqs();
  a.one_row_each = b.one_row_each();
  a.positions = device + l.positions;
  a.slot_mapping = device + l.slots;
  a.q_start = device + l.q_start;
  a.kv_len = device + l.kv_len;
  a.block_tables = device + l.tables;
  a.max_blocks = table_width;
  a.max_rows = b.max_rows();
  in.tokens = device + l.tokens;
  in.logits_rows = device + l.rows;
  in.n_logits = static_cast<int>(b.logits_rows.size());
  if (b.has_local) {
    in.local_slot_mapping = device + l.local_slots;
    in.local_block_tables = device + l.local_tables;
  }
  if (b.has_tree()) {
    a.tree_mask = reinterpret_cast<const uint32_t*>(device + l.tree_mask);
    a.rope_positions = device + l.rope_positions;
  }
  return in;
}

float* ModelRunner::graph_forward(GraphEntry& g, const ForwardInputs& in) {
  // A scratch buffer the graph points into moved: capture again, after an eager warm-up.
  if (g.graph && g.epoch != backend_.graph_epoch()) {
    g.graph.reset();
    g.warmed_up = false;
  }
  if (g.graph) {
    g.graph->launch();  // the model code does not run: the staged inputs make the step
    ++graph_replays_;
    return g.logits;
  }
  if (!g.warmed_up || g.broken) {
    // First forward of the key eager: loads kernels, grows scratch, makes GEMM plans.
    g.warmed_up = true;
    return model_.forward(in, kv_);
  }
  const uint64_t epoch = backend_.graph_epoch();
  backend_.begin_capture();
  try {
    g.logits = model_.forward(in, kv_);
    g.graph = backend_.end_capture();
  } catch (...) {
    backend_.abandon_capture();
    g.broken = true;  // this key runs eagerly from now on
    throw;
  }
  g.epoch = epoch;
  ++graphs_captured_;
  g.graph->launch();  // the capture recorded the ops without running them
  return g.logits;
}

void ModelRunner::forward(const ForwardBatch& batch, float* logits, const Backend::LogitsReadback& plan) {
  forward(batch, logits, plan, [] { return TokenMasks{}; });
}

void ModelRunner::forward(const ForwardBatch& batch, float* logits, const Backend::LogitsReadback& plan,
                          FunctionRef<TokenMasks()> masks) {
  check(batch);
  const int n_rows = static_cast<int>(batch.logits_rows.size());
  const ForwardBatch& b = padded(batch);
  // A graph reads block tables at its key's width (a power of two), so one graph serves
  // every step until the tables outgrow it. Past kMaxGraphs keys, new keys run eagerly.
  const GraphKey key{b.n_seqs(), b.n_tokens(), b.max_rows(), next_pow2(std::max(b.max_blocks, 1))};
  const bool graph = graph_shaped(b) && graph_batch(b.n_seqs(), b.n_tokens()) == b.n_seqs() &&
                     (graphs_.size() < kMaxGraphs || graphs_.count(key) > 0);
  const int width = graph ? std::get<3>(key) : b.max_blocks;
  const Layout l = layout(b, width);
  float* device_logits = nullptr;
  if (graph) {
    GraphEntry& g = graphs_[key];
    if (!g.inputs) g.inputs = static_cast<int32_t*>(backend_.alloc(l.total * sizeof(int32_t)));
    stage(b, l, width, g.inputs);
    device_logits = graph_forward(g, inputs(b, l, width, g.inputs));
  } else {
    if (l.total > eager_cap_) {
      if (eager_inputs_) backend_.free(eager_inputs_);
      eager_inputs_ = nullptr;
      eager_cap_ = 0;
      const size_t cap = round_up32(l.total * 2);
      eager_inputs_ = static_cast<int32_t*>(backend_.alloc(cap * sizeof(int32_t)));
      eager_cap_ = cap;
    }
    stage(b, l, width, eager_inputs_);
    device_logits = model_.forward(inputs(b, l, width, eager_inputs_), kv_);
  }
  // After the forward (a graph's replay included): the masks were being filled meanwhile.
  const TokenMasks m = masks();
  if (!m.rows.empty()) {
    for (const int32_t r : m.rows)
      TESSERA_CHECK(r >= -1 && r < n_rows, "model runner: token mask for logits row ", r, " of ", n_rows);
    backend_.apply_token_bitmask(device_logits, n_vocab_, m.rows, m.masks, m.words);
  }
  // Padding rows follow the real ones: only the real rows come back.
  if (n_rows > 0) {
    backend_.read_logits(logits, device_logits, n_rows, n_vocab_, plan);
    copy_in_flight_ = false;  // the readback waited for the whole stream
  }
}

}  // namespace tessera
