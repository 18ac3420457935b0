#include <algorithm>

#include "core/draft_tree.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace tessera {

ForwardBatch ForwardBatch::sequences(int first, int last) const {
  TESSERA_CHECK(first >= 0 && first <= last && last <= n_seqs(), "forward batch: sequences [", first, ", ", last,
                ") of ", n_seqs());
  ForwardBatch b;
  const int r0 = q_start[first], r1 = q_start[last];
  const auto rows = [&](const auto& v, auto& out) {
    if (!v.empty()) out.assign(v.begin() + r0, v.begin() + r1);
  };
  rows(tokens, b.tokens);
  rows(positions, b.positions);
  rows(slot_mapping, b.slot_mapping);
  rows(local_slot_mapping, b.local_slot_mapping);
  rows(tree_mask, b.tree_mask);
  rows(rope_positions, b.rope_positions);
  for (int s = first; s <= last; ++s) b.q_start.push_back(q_start[s] - r0);
  b.kv_len.assign(kv_len.begin() + first, kv_len.begin() + last);
  b.max_blocks = max_blocks;
  const auto table_rows = [&](const std::vector<int32_t>& v, std::vector<int32_t>& out) {
    if (!v.empty())
      out.assign(v.begin() + static_cast<ptrdiff_t>(first) * max_blocks,
                 v.begin() + static_cast<ptrdiff_t>(last) * max_blocks);
  };
  table_rows(block_tables, b.block_tables);
  b.has_local = has_local;
  table_rows(local_block_tables, b.local_block_tables);
  for (int32_t r : logits_rows)
    if (r >= r0 && r < r1) b.logits_rows.push_back(r - r0);
  return b;
}

void ForwardBatch::clear() {
  tokens.clear();
  positions.clear();
  slot_mapping.clear();
  q_start.clear();
  kv_len.clear();
  block_tables.clear();
  logits_rows.clear();
  max_blocks = 0;
  has_local = false;
  local_slot_mapping.clear();
  local_block_tables.clear();
  tree_mask.clear();
  rope_positions.clear();
}

namespace {

// Widens a [n_rows, width] matrix to new_width columns (zeros past each old row).
void widen(std::vector<int32_t>& m, int n_rows, int width, int new_width) {
  std::vector<int32_t> wider(static_cast<size_t>(n_rows) * new_width, 0);
  for (int s = 0; s < n_rows; ++s)
    std::copy_n(m.begin() + static_cast<size_t>(s) * width, width, wider.begin() + static_cast<size_t>(s) * new_width);
  m.swap(wider);
}

}  // namespace

void ForwardBatch::add_sequence(const SequenceBlocks& seq, int block_size, const int32_t* new_tokens, int n_new,
                                Logits want_logits, const SequenceBlocks* local) {
  if (q_start.empty()) {
    q_start.push_back(0);
    has_local = local != nullptr;
  }
  TESSERA_CHECK(has_local == (local != nullptr), "forward batch: a sequence ", local ? "with" : "without",
                " a local-layer table in a batch of sequences ", has_local ? "with" : "without");
  TESSERA_CHECK(!local || local->blocks.size() == seq.blocks.size(), "forward batch: a local table of ",
                local ? local->blocks.size() : 0, " blocks for a full table of ", seq.blocks.size());
  const int first_row = static_cast<int>(tokens.size());
  for (int i = 0; i < n_new; ++i) {
    tokens.push_back(new_tokens[i]);
    positions.push_back(seq.n_tokens + i);
    slot_mapping.push_back(seq.slot(seq.n_tokens + i, block_size));
    if (local) local_slot_mapping.push_back(local->slot(seq.n_tokens + i, block_size));
  }
  if (has_tree()) extend_chain_masks(first_row, n_new);
  q_start.push_back(static_cast<int32_t>(tokens.size()));
  kv_len.push_back(seq.n_tokens + n_new);
  // Widen the block table matrix if this sequence has more blocks than any before it.
  const int blocks = static_cast<int>(seq.blocks.size());
  const int n_prev = n_seqs() - 1;
  if (blocks > max_blocks) {
    widen(block_tables, n_prev, max_blocks, blocks);
    if (has_local) widen(local_block_tables, n_prev, max_blocks, blocks);
    max_blocks = blocks;
  }
  block_tables.resize(static_cast<size_t>(n_prev + 1) * max_blocks, 0);
  std::copy(seq.blocks.begin(), seq.blocks.end(), block_tables.begin() + static_cast<size_t>(n_prev) * max_blocks);
  if (local) {
    local_block_tables.resize(static_cast<size_t>(n_prev + 1) * max_blocks, 0);
    std::copy(local->blocks.begin(), local->blocks.end(),
              local_block_tables.begin() + static_cast<size_t>(n_prev) * max_blocks);
  }
  if (want_logits == Logits::Last && n_new > 0) logits_rows.push_back(first_row + n_new - 1);
  if (want_logits == Logits::All)
    for (int i = 0; i < n_new; ++i) logits_rows.push_back(first_row + i);
}

void ForwardBatch::extend_chain_masks(int first_row, int n_new) {
  for (int i = 0; i < n_new; ++i) {
    // Causal: every earlier row of the sequence and itself (rows past 32 see by position).
    tree_mask.push_back(i >= 31 ? ~0u : (2u << i) - 1u);
    rope_positions.push_back(positions[static_cast<size_t>(first_row + i)]);
  }
}

void ForwardBatch::set_tree(std::span<const int16_t> parents) {
  TESSERA_CHECK(n_seqs() > 0, "forward batch: a tree without a sequence");
  const int first = q_start[static_cast<size_t>(n_seqs()) - 1], n_rows = n_tokens() - first;
  const int n = static_cast<int>(parents.size());
  TESSERA_CHECK(n_rows == n + 1 && n_rows <= 32, "forward batch: a tree of ", n, " nodes over ", n_rows,
                " rows (expected nodes + 1 rows, at most 32)");
  if (!has_tree()) {
    // Every row so far is a chain's.
    for (int s = 0; s < n_seqs(); ++s) extend_chain_masks(q_start[s], q_start[s + 1] - q_start[s]);
  }
  for (int j = 0; j < n; ++j)
    TESSERA_CHECK(parents[static_cast<size_t>(j)] >= -1 && parents[static_cast<size_t>(j)] < j,
                  "forward batch: tree node ", j, " has parent ", parents[static_cast<size_t>(j)], " (expected -1 .. ",
                  j - 1, ")");
  const std::vector<int> depth = draft_tree_depths(parents);
  const int root_pos = positions[static_cast<size_t>(first)];
  tree_mask[static_cast<size_t>(first)] = 1u;
  for (int j = 0; j < n; ++j) {
    const int row = 1 + j, parent_row = 1 + parents[static_cast<size_t>(j)];
    tree_mask[static_cast<size_t>(first + row)] = tree_mask[static_cast<size_t>(first + parent_row)] | (1u << row);
    rope_positions[static_cast<size_t>(first + row)] = root_pos + depth[static_cast<size_t>(j)];
  }
}

bool ForwardBatch::one_row_each() const {
  if (n_tokens() != n_seqs()) return false;
  for (int s = 0; s < n_seqs(); ++s)
    if (q_start[s + 1] - q_start[s] != 1) return false;
  return true;
}

int ForwardBatch::max_rows() const {
  int most = 0;
  for (int s = 0; s < n_seqs(); ++s) most = std::max(most, q_start[s + 1] - q_start[s]);
  return most;
}

AttentionBatch ForwardBatch::attention_view() const {
  AttentionBatch b;
  b.n_tokens = n_tokens();
  b.n_seqs = n_seqs();
  b.one_row_each = one_row_each();
  b.positions = positions.data();
  b.slot_mapping = slot_mapping.data();
  b.q_start = q_start.data();
  b.kv_len = kv_len.data();
  b.block_tables = block_tables.data();
  b.max_blocks = max_blocks;
  b.max_rows = max_rows();
  if (has_tree()) {
    b.tree_mask = tree_mask.data();
    b.rope_positions = rope_positions.data();
  }
  return b;
}

}  // namespace tessera
