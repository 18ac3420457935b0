#pragma once
// KV block manager: block metadata (reference count, prefix key, last use) and the prefix
// index, for the serving engine. A block is metadata only; its memory is found by index in
// KvCache. Contract: docs/design/kv-manager.md.
//
// Free blocks live in one of two places:
//   - the uncached free stack (never written, or written but not worth keeping),
//   - the LRU queue of free-but-cached blocks: full blocks whose prefix key is indexed. They
//     count as free, are reused oldest first (evicting their key), and a prefix hit revives
//     them without recomputation.
// A block with reference count > 1 is never written: a write into a shared block copies it
// first (copy-on-write), and the copy is returned to the caller to perform on the KV storage.
//
// Swap preemption: a second, host-memory tier of n_host_blocks slots (block-granular, its own
// free list). swap_out moves a sequence's computed KV to host slots and frees its device
// blocks; swap_in takes fresh device blocks and brings it back. Like copies, the moves are
// returned as lists for the executor to perform.
//
// Sliding windows (Config::window > 0 with n_local_blocks > 0): the model's local layers keep
// their KV in a second pool (KvCache's local group) with their own block table per sequence.
// Blocks wholly before the window of the next token to compute are dropped from it (released;
// their table entries become kDropped), so a local layer holds about one window of KV whatever
// the context. The full-attention layers keep every block as before.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_cache.h"
#include "kv/kv_pool.h"

namespace tessera {

// One sequence's KV: its block table and how many tokens are computed (table.n_tokens), its
// prefix-chain keys. Owned by the sequence, changed only through KvBlockManager.
struct SeqKv {
  SequenceBlocks table;           // blocks and computed tokens
  BlockHash root;                 // chain root over the extra keys
  std::vector<BlockHash> hashes;  // keys of the leading full blocks known so far
  int n_registered = 0;           // leading blocks already offered to the prefix index
  // Swapped out: the computed tokens' KV is in these host slots (block i of the sequence in
  // host_blocks[i]) and table.blocks is empty; table.n_tokens still counts it.
  std::vector<int32_t> host_blocks;
  // The local layers' table (windowed managers only): the same logical blocks as `table`,
  // entries [0, local_dropped) kDropped (outside every future query's window, memory given
  // back), the others blocks of the local pool. local.n_tokens == table.n_tokens. Swapped out:
  // local.blocks is empty and block local_dropped + i is in host slot local_host_blocks[i].
  SequenceBlocks local;
  int local_dropped = 0;
  int local_registered = 0;  // leading local blocks already offered to the local index
  std::vector<int32_t> local_host_blocks;

  int n_computed() const { return table.n_tokens; }
  // n more tokens computed (after the step that wrote them), in both tables.
  void add_computed(int n) {
    table.n_tokens += n;
    local.n_tokens = table.n_tokens;
  }
  int n_blocks() const { return static_cast<int>(table.blocks.size()); }
  bool swapped() const { return !host_blocks.empty(); }
  // Local-pool blocks it holds (entries not dropped).
  int n_local_live() const {
    return static_cast<int>(local.blocks.size()) - std::min(local_dropped, static_cast<int>(local.blocks.size()));
  }
};

// A dropped local table entry: never read (attention skips blocks before the window).
inline constexpr int32_t kDropped = -1;

// "Move block `device` to or from host slot `host` on every layer" (swap preemption).
struct BlockSwap {
  int32_t device = -1;
  int32_t host = -1;
  bool local = false;  // a block of the local layers' pool (only their layers move)
  bool operator==(const BlockSwap&) const = default;
};

struct KvSwapStats {
  int64_t swap_outs = 0;   // sequences moved to the host tier
  int64_t swap_ins = 0;    // sequences brought back
  int64_t blocks_out = 0;  // blocks copied device -> host
  int64_t blocks_in = 0;   // blocks copied host -> device
};

// "Copy block src to dst on every layer" — planned by the manager, done by the executor
// before the forward that writes dst.
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
  bool local = false;  // a block of the local layers' pool (only their layers are copied)
  bool operator==(const BlockCopy&) const = default;
};

struct PrefixCacheStats {
  int64_t queries = 0;         // sequences looked up
  int64_t queried_tokens = 0;  // prompt tokens looked up
  int64_t hit_tokens = 0;      // tokens served from the cache (prefill saved)
  int64_t evictions = 0;       // cached blocks reused for other data (both pools)
  int64_t registered = 0;      // blocks entered into the index (both pools)
  // Share of looked-up prompt tokens served from the cache.
  double hit_ratio() const { return queried_tokens > 0 ? static_cast<double>(hit_tokens) / queried_tokens : 0.0; }
};

class KvBlockManager {
 public:
  struct Config {
    int n_blocks = 0;
    int block_size = 16;
    bool prefix_caching = true;
    int n_host_blocks = 0;  // host tier for swap preemption; 0 = none
    // Sliding window of the local layers (keys a query sees, itself included) and their own
    // pool's size; either 0 = no local group (local layers, if any, share the full table).
    int window = 0;
    int n_local_blocks = 0;
  };
  explicit KvBlockManager(const Config& config);

  int n_blocks() const { return full_.n_blocks(); }
  int block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Free blocks, cached or not: what an allocation can take.
  int n_free() const { return full_.n_free(); }
  int n_cached_free() const { return full_.n_cached_free(); }
  int ref_count(int32_t block) const { return full_.ref_count(block); }
  bool is_cached(int32_t block) const { return full_.is_cached(block); }
  // The local layers' pool (windowed() only).
  bool windowed() const { return local_.has_value(); }
  int window() const { return window_; }
  int n_local_blocks() const { return local_ ? local_->n_blocks() : 0; }
  int n_local_free() const { return local_ ? local_->n_free() : 0; }
  int local_ref_count(int32_t block) const { return local_->ref_count(block); }
  bool local_is_cached(int32_t block) const { return local_->is_cached(block); }
  PrefixCacheStats stats() const;
  const KvSwapStats& swap_stats() const { return swap_stats_; }
  int n_host_blocks() const { return static_cast<int>(host_used_.size()); }
  int n_host_free() const { return static_cast<int>(host_free_.size()); }
  bool host_used(int32_t slot) const { return host_used_[slot] != 0; }
  // Blocks needed to hold n tokens.
  int blocks_for(int n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }
  // Local table entries a sequence of n computed tokens no longer needs: every block wholly
  // before the window of token n (the first query of its next step). 0 unless windowed().
  int local_first_live(int n_computed) const {
    return windowed() ? std::max(0, n_computed - window_ + 1) / block_size_ : 0;
  }

  // The longest cached prefix of `tokens` under `root`: indexed blocks whose keys chain and
  // whose stored tokens are equal, at most max_blocks. Windowed: shortened until the local
  // pool also holds the blocks of the window before the hit point (local_first_live of it).
  // Changes nothing.
  std::vector<int32_t> find_prefix(const BlockHash& root, std::span<const int32_t> tokens, int max_blocks) const;
  // Counts a lookup in the stats (queries, queried and hit tokens).
  void record_lookup(int n_query_tokens, int n_hit_tokens);

  // Makes `blocks` (a find_prefix result) the first blocks of an empty sequence, which then
  // holds blocks.size() * block_size computed tokens. Revives free cached blocks (in the
  // local pool too: the window's blocks under the same keys).
  void adopt_prefix(SeqKv& kv, std::span<const int32_t> blocks);

  // Fresh blocks allocate_slots(kv, n_new) takes: new table entries plus copies of shared
  // blocks that the new tokens write into.
  int blocks_needed(const SeqKv& kv, int n_new) const;
  // The same for the local pool, less the blocks its drops free first (windowed() only).
  int local_blocks_needed(const SeqKv& kv, int n_new) const;
  // Makes room for n_new more tokens after kv.n_computed(), all or nothing: false and no
  // change when fewer than blocks_needed() blocks are free (or local_blocks_needed() local
  // ones). Shared blocks about to be written are replaced by private copies, appended to
  // `copies`. Windowed: local blocks before local_first_live(n_computed) are dropped first.
  bool allocate_slots(SeqKv& kv, int n_new, std::vector<BlockCopy>& copies);

  // Enters the sequence's newly full computed blocks into the prefix index (a dropped local
  // block is never entered). `tokens` are the sequence's tokens (at least kv.n_computed()).
  // No-op without prefix caching.
  void cache_full_blocks(SeqKv& kv, std::span<const int32_t> tokens);

  // Speculative rollback: the sequence keeps only its first n_tokens computed tokens
  // (n_tokens <= kv.n_computed()); blocks past them go back to the pool. Those blocks were
  // allocated fresh for draft positions, so they are private and unindexed; a kept block's
  // stale slots are overwritten by the next write. Keys of blocks no longer full are dropped.
  // The window of n_tokens must not reach a dropped local block (it never does: drops follow
  // the computed count before the step, and a rollback keeps at least that).
  void truncate(SeqKv& kv, int n_tokens);

  // child shares every block of parent (one more reference each) and its computed count.
  void fork(const SeqKv& parent, SeqKv& child);
  // Gives every block of the sequence back (last block first, so the head of a prefix
  // stays cached longest), and its host slots if swapped, and empties it.
  void free(SeqKv& kv);

  // Host slots swap_out takes: one per full-pool block and per live local block, after the
  // drops swap_out does first.
  int host_slots_needed(const SeqKv& kv) const;
  // Moves the sequence's KV to host slots, all or nothing: false and no change when the
  // host tier has fewer free slots than host_slots_needed (or it has no blocks). Drops the
  // local blocks outside the window first, then appends {device, host} moves to `swaps`
  // (the executor copies them before any block they free is written), then releases the
  // device blocks. The computed count and keys stay.
  bool swap_out(SeqKv& kv, std::vector<BlockSwap>& swaps);
  // Brings a swapped sequence back into fresh device blocks, all or nothing (false and no
  // change when too few are free); appends {device, host} moves and frees the host slots.
  // Its full blocks are offered to the prefix index again by the next cache_full_blocks
  // (a key still indexed in another block is not entered twice).
  bool swap_in(SeqKv& kv, std::vector<BlockSwap>& swaps);

  // Throws naming the first broken invariant of the pools' own bookkeeping.
  void check_invariants() const;
  // Throws when the sequence's local table breaks its shape (dropped prefix, live rest,
  // its count in step with the full table's). No-op unless windowed().
  void check_local_table(const SeqKv& kv) const;
  // Every block free and unreferenced, every host slot free.
  bool is_whole() const;

 private:
  friend class KvPlan;
  // The local pool's blocks for the window before the hit point of a find_prefix result
  // (the same keys, looked up in the local index): local_first_live(hit tokens) .. end.
  // Entries not found are -1 (a plan made them all present).
  std::vector<int32_t> local_hits(std::span<const int32_t> hits) const;
  // Releases the local blocks before local_first_live(kv.n_computed()) (first to last).
  void drop_outside_window(SeqKv& kv);
  int take_host_slot();

  int block_size_;
  bool prefix_caching_;
  int window_ = 0;
  KvPool full_;
  std::optional<KvPool> local_;
  PrefixCacheStats stats_;          // evictions are the pools'
  std::vector<uint8_t> host_used_;  // [n_host_blocks]
  std::vector<int32_t> host_free_;  // free host slots, a stack
  KvSwapStats swap_stats_;
};

// A plan's what-if view of the pools: reference-count deltas and the free counts, so that a
// scheduler can decide a whole step without changing anything. Simulates the commit order
// of Scheduler::commit (releases, then prefix adoptions, then allocations); freed shared
// blocks released by copy-on-write are not credited (the plan stays conservative). Local
// drops are credited exactly: a dropped block the sequence alone holds is free again.
class KvPlan {
 public:
  explicit KvPlan(const KvBlockManager& manager)
      : m_(manager), free_(manager.n_free()), local_free_(manager.n_local_free()), host_free_(manager.n_host_free()) {}

  int n_free() const { return free_; }
  int n_local_free() const { return local_free_; }
  int n_host_free() const { return host_free_; }
  // Takes what adopting `hits` and then allocating n_new tokens after them would take, all
  // or nothing. For a sequence with KV, hits must be empty. A swapped sequence (no device
  // blocks, n_computed > 0) needs all of its blocks again: exactly what swap_in and then
  // allocate_slots take.
  bool reserve(const SeqKv& kv, std::span<const int32_t> hits, int n_new);
  // Gives back what freeing the sequence would give back.
  void release(const SeqKv& kv);
  // What swap_out would do: host slots for every block (all or nothing: false and no
  // change when the host tier is short), then release.
  bool swap_out(const SeqKv& kv);

 private:
  int ref(int32_t b) const;
  int local_ref(int32_t b) const;
  bool reserve_local(const SeqKv& kv, std::span<const int32_t> hits, int n_new);
  const KvBlockManager& m_;
  int free_;
  int local_free_;
  int host_free_;
  std::unordered_map<int32_t, int32_t> delta_;
  std::unordered_map<int32_t, int32_t> local_delta_;
};

}  // namespace tessera
