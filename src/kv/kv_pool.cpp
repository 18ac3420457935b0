#include "kv/kv_pool.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

KvPool::KvPool(int n_blocks, int block_size, bool prefix_caching) : block_size_(block_size) {
  TESSERA_CHECK(n_blocks >= 1, "KV block manager: needs at least one block (got ", n_blocks, ")");
  TESSERA_CHECK(block_size >= 1 && block_size <= 1024, "KV block manager: block size ", block_size,
                " is outside [1, 1024]");
  ref_.assign(n_blocks, 0);
  cached_.assign(n_blocks, 0);
  lru_prev_.assign(n_blocks, kNone);
  lru_next_.assign(n_blocks, kNone);
  if (prefix_caching) {
    key_.resize(n_blocks);
    tokens_.assign(static_cast<size_t>(n_blocks) * block_size_, 0);
  }
  free_stack_.reserve(n_blocks);
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_stack_.push_back(b);  // block 0 is handed out first
}

std::span<const int32_t> KvPool::tokens_of(int32_t block) const {
  return {tokens_.data() + static_cast<size_t>(block) * block_size_, static_cast<size_t>(block_size_)};
}

int32_t KvPool::find(const BlockHash& key, std::span<const int32_t> tokens) const {
  const auto it = index_.find(key);
  if (it == index_.end()) return kNone;
  const auto stored = tokens_of(it->second);
  return std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end()) ? it->second : kNone;
}

bool KvPool::enter(int32_t b, const BlockHash& key, std::span<const int32_t> tokens) {
  if (cached_[b]) return false;                      // shared with the sequence that registered it
  if (!index_.emplace(key, b).second) return false;  // same data already cached in another block
  cached_[b] = 1;
  key_[b] = key;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
  return true;
}

int32_t KvPool::take() {
  int32_t b;
  if (!free_stack_.empty()) {
    b = free_stack_.back();
    free_stack_.pop_back();
  } else {
    TESSERA_CHECK(lru_head_ != kNone, "KV: no free block (allocation not checked)");
    b = lru_head_;
    lru_unlink(b);
    index_.erase(key_[b]);
    cached_[b] = 0;
    ++evictions_;
  }
  ref_[b] = 1;
  return b;
}

void KvPool::retain(int32_t b) {
  if (ref_[b] == 0) {
    TESSERA_CHECK(cached_[b], "KV: retain of free uncached block ", b);
    lru_unlink(b);
  }
  ++ref_[b];
}

void KvPool::release(int32_t b) {
  TESSERA_CHECK(b >= 0 && b < n_blocks() && ref_[b] > 0, "KV: release of free block ", b);
  if (--ref_[b] > 0) return;
  if (cached_[b])
    lru_push_back(b);
  else
    free_stack_.push_back(b);
}

void KvPool::lru_push_back(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = kNone;
  if (lru_tail_ != kNone)
    lru_next_[lru_tail_] = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++lru_size_;
}

void KvPool::lru_unlink(int32_t b) {
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  (p != kNone ? lru_next_[p] : lru_head_) = n;
  (n != kNone ? lru_prev_[n] : lru_tail_) = p;
  lru_prev_[b] = lru_next_[b] = kNone;
  --lru_size_;
}

void KvPool::check_invariants(std::string_view name) const {
  const int n = n_blocks();
  std::vector<uint8_t> seen(n, 0);
  for (int32_t b : free_stack_) {
    TESSERA_CHECK(b >= 0 && b < n && !seen[b], "KV invariant (", name, "): block ", b, " twice in the free stack");
    TESSERA_CHECK(ref_[b] == 0 && !cached_[b], "KV invariant (", name, "): free-stack block ", b, " has ref ", ref_[b],
                  " or is cached");
    seen[b] = 1;
  }
  int lru_count = 0;
  int32_t prev = kNone;
  for (int32_t b = lru_head_; b != kNone; b = lru_next_[b]) {
    TESSERA_CHECK(b >= 0 && b < n && !seen[b], "KV invariant (", name, "): block ", b, " twice among free blocks");
    TESSERA_CHECK(ref_[b] == 0 && cached_[b], "KV invariant (", name, "): LRU block ", b, " has ref ", ref_[b],
                  " or is uncached");
    TESSERA_CHECK(lru_prev_[b] == prev, "KV invariant (", name, "): LRU links broken at block ", b);
    seen[b] = 1;
    prev = b;
    ++lru_count;
  }
  TESSERA_CHECK(prev == lru_tail_ && lru_count == lru_size_, "KV invariant (", name, "): LRU size ", lru_size_, " but ",
                lru_count, " linked");
  for (int32_t b = 0; b < n; ++b) {
    TESSERA_CHECK(ref_[b] >= 0, "KV invariant (", name, "): block ", b, " has negative ref ", ref_[b]);
    TESSERA_CHECK((ref_[b] == 0) == (seen[b] != 0), "KV invariant (", name, "): block ", b, " with ref ", ref_[b],
                  seen[b] ? " is listed free" : " is lost (neither used nor free)");
    if (cached_[b]) {
      const auto it = index_.find(key_[b]);
      TESSERA_CHECK(it != index_.end() && it->second == b, "KV invariant (", name, "): cached block ", b,
                    " not indexed");
    }
  }
  for (const auto& [key, b] : index_)
    TESSERA_CHECK(cached_[b] && key_[b] == key, "KV invariant (", name, "): index entry for block ", b, " is stale");
}

bool KvPool::is_whole() const {
  return n_free() == n_blocks() && std::all_of(ref_.begin(), ref_.end(), [](int32_t r) { return r == 0; });
}

}  // namespace tessera
