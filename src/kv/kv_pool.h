#pragma once
// One pool of KV blocks (metadata only; the memory is KvCache's): reference counts, the
// prefix index of its cached blocks, the uncached free stack and the LRU queue of free cached
// blocks. KvBlockManager keeps one per layer group: the full-attention layers' pool and, for
// a model with sliding-window layers, the local layers' pool. Contract:
// docs/design/kv-manager.md.
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace tessera {

class KvPool {
 public:
  KvPool(int n_blocks, int block_size, bool prefix_caching);

  int n_blocks() const { return static_cast<int>(ref_.size()); }
  int n_free() const { return static_cast<int>(free_stack_.size()) + lru_size_; }
  int n_cached_free() const { return lru_size_; }
  int ref_count(int32_t block) const { return ref_[block]; }
  bool is_cached(int32_t block) const { return cached_[block] != 0; }
  const BlockHash& key(int32_t block) const { return key_[block]; }
  int64_t evictions() const { return evictions_; }
  // The tokens a cached block was indexed with.
  std::span<const int32_t> tokens_of(int32_t block) const;

  // The indexed block under `key` whose stored tokens equal `tokens` (collision resistance is
  // not trusted alone), or -1.
  int32_t find(const BlockHash& key, std::span<const int32_t> tokens) const;
  // Indexes full computed block b under key: false (and nothing changes) when b is cached
  // already or another block holds the key (the first one indexed wins).
  bool enter(int32_t b, const BlockHash& key, std::span<const int32_t> tokens);

  // A fresh block with reference count 1: from the free stack, else the LRU head (evicting
  // its key). The caller has checked n_free().
  int32_t take();
  void retain(int32_t block);  // one more holder; revives a free cached block
  void release(int32_t block);

  // Throws naming the first broken invariant; `name` says which pool.
  void check_invariants(std::string_view name) const;
  bool is_whole() const;

 private:
  static constexpr int32_t kNone = -1;
  void lru_push_back(int32_t block);
  void lru_unlink(int32_t block);

  int block_size_;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> cached_;      // key indexed (full, computed, ref or free)
  std::vector<BlockHash> key_;       // valid where cached_
  std::vector<int32_t> tokens_;      // [n_blocks, block_size] tokens of cached blocks
  std::vector<int32_t> free_stack_;  // uncached free blocks
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = kNone, lru_tail_ = kNone;
  int lru_size_ = 0;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  int64_t evictions_ = 0;
};

}  // namespace tessera
