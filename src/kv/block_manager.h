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
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_cache.h"

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

  int n_computed() const { return table.n_tokens; }
  int n_blocks() const { return static_cast<int>(table.blocks.size()); }
  bool swapped() const { return !host_blocks.empty(); }
};

// "Move block `device` to or from host slot `host` on every layer" (swap preemption).
struct BlockSwap {
  int32_t device = -1;
  int32_t host = -1;
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
  bool operator==(const BlockCopy&) const = default;
};

struct PrefixCacheStats {
  int64_t queries = 0;         // sequences looked up
  int64_t queried_tokens = 0;  // prompt tokens looked up
  int64_t hit_tokens = 0;      // tokens served from the cache (prefill saved)
  int64_t evictions = 0;       // cached blocks reused for other data
  int64_t registered = 0;      // blocks entered into the index
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
  };
  explicit KvBlockManager(const Config& config);

  int n_blocks() const { return static_cast<int>(ref_.size()); }
  int block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Free blocks, cached or not: what an allocation can take.
  int n_free() const { return static_cast<int>(free_stack_.size()) + lru_size_; }
  int n_cached_free() const { return lru_size_; }
  int ref_count(int32_t block) const { return ref_[block]; }
  bool is_cached(int32_t block) const { return cached_[block] != 0; }
  const PrefixCacheStats& stats() const { return stats_; }
  const KvSwapStats& swap_stats() const { return swap_stats_; }
  int n_host_blocks() const { return static_cast<int>(host_used_.size()); }
  int n_host_free() const { return static_cast<int>(host_free_.size()); }
  bool host_used(int32_t slot) const { return host_used_[slot] != 0; }
  // Blocks needed to hold n tokens.
  int blocks_for(int n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }

  // The longest cached prefix of `tokens` under `root`: indexed blocks whose keys chain and
  // whose stored tokens are equal, at most max_blocks. Changes nothing.
  std::vector<int32_t> find_prefix(const BlockHash& root, std::span<const int32_t> tokens, int max_blocks) const;
  // Counts a lookup in the stats (queries, queried and hit tokens).
  void record_lookup(int n_query_tokens, int n_hit_tokens);

  // Makes `blocks` (a find_prefix result) the first blocks of an empty sequence, which then
  // holds blocks.size() * block_size computed tokens. Revives free cached blocks.
  void adopt_prefix(SeqKv& kv, std::span<const int32_t> blocks);

  // Fresh blocks allocate_slots(kv, n_new) takes: new table entries plus copies of shared
  // blocks that the new tokens write into.
  int blocks_needed(const SeqKv& kv, int n_new) const;
  // Makes room for n_new more tokens after kv.n_computed(), all or nothing: false and no
  // change when fewer than blocks_needed() blocks are free. Shared blocks about to be
  // written are replaced by private copies, appended to `copies`.
  bool allocate_slots(SeqKv& kv, int n_new, std::vector<BlockCopy>& copies);

  // Enters the sequence's newly full computed blocks into the prefix index. `tokens` are
  // the sequence's tokens (at least kv.n_computed()). No-op without prefix caching.
  void cache_full_blocks(SeqKv& kv, std::span<const int32_t> tokens);

  // Speculative rollback: the sequence keeps only its first n_tokens computed tokens
  // (n_tokens <= kv.n_computed()); blocks past them go back to the pool. Those blocks were
  // allocated fresh for draft positions, so they are private and unindexed; a kept block's
  // stale slots are overwritten by the next write. Keys of blocks no longer full are dropped.
  void truncate(SeqKv& kv, int n_tokens);

  // child shares every block of parent (one more reference each) and its computed count.
  void fork(const SeqKv& parent, SeqKv& child);
  // Gives every block of the sequence back (last block first, so the head of a prefix
  // stays cached longest), and its host slots if swapped, and empties it.
  void free(SeqKv& kv);

  // Moves the sequence's KV to host slots, all or nothing: false and no change when the
  // host tier has fewer free slots than the sequence has blocks (or it has none). Appends
  // {device, host} moves to `swaps` (the executor copies them before any block they free
  // is written), then releases the device blocks. The computed count and keys stay.
  bool swap_out(SeqKv& kv, std::vector<BlockSwap>& swaps);
  // Brings a swapped sequence back into fresh device blocks, all or nothing (false and no
  // change when too few are free); appends {device, host} moves and frees the host slots.
  // Its full blocks are offered to the prefix index again by the next cache_full_blocks
  // (a key still indexed in another block is not entered twice).
  bool swap_in(SeqKv& kv, std::vector<BlockSwap>& swaps);

  // Throws naming the first broken invariant of the pool's own bookkeeping.
  void check_invariants() const;
  // Every block free and unreferenced, every host slot free.
  bool is_whole() const;

 private:
  static constexpr int32_t kNone = -1;
  int32_t take_block();        // from the free stack, else evict the LRU head
  void retain(int32_t block);  // revives a free cached block
  void release(int32_t block);
  void lru_push_back(int32_t block);
  void lru_unlink(int32_t block);
  std::span<const int32_t> stored_tokens(int32_t block) const;

  int block_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> cached_;      // key indexed (full, computed, ref or free)
  std::vector<BlockHash> key_;       // valid where cached_
  std::vector<int32_t> tokens_;      // [n_blocks, block_size] tokens of cached blocks
  std::vector<int32_t> free_stack_;  // uncached free blocks
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = kNone, lru_tail_ = kNone;
  int lru_size_ = 0;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  PrefixCacheStats stats_;
  std::vector<uint8_t> host_used_;  // [n_host_blocks]
  std::vector<int32_t> host_free_;  // free host slots, a stack
  KvSwapStats swap_stats_;
};

// A plan's what-if view of the pool: reference-count deltas and the free count, so that a
// scheduler can decide a whole step without changing anything. Simulates the commit order
// of Scheduler::commit (releases, then prefix adoptions, then allocations); freed shared
// blocks released by copy-on-write are not credited (the plan stays conservative).
class KvPlan {
 public:
  explicit KvPlan(const KvBlockManager& manager)
      : m_(manager), free_(manager.n_free()), host_free_(manager.n_host_free()) {}

  int n_free() const { return free_; }
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
  const KvBlockManager& m_;
  int free_;
  int host_free_;
  std::unordered_map<int32_t, int32_t> delta_;
};

}  // namespace tessera
