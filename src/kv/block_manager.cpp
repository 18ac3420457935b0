#include "kv/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

KvBlockManager::KvBlockManager(const Config& config)
    : block_size_(config.block_size), prefix_caching_(config.prefix_caching) {
  TESSERA_CHECK(config.n_blocks >= 1, "KV block manager: needs at least one block (got ", config.n_blocks, ")");
  TESSERA_CHECK(config.block_size >= 1 && config.block_size <= 1024, "KV block manager: block size ", config.block_size,
                " is outside [1, 1024]");
  const int n = config.n_blocks;
  ref_.assign(n, 0);
  cached_.assign(n, 0);
  lru_prev_.assign(n, kNone);
  lru_next_.assign(n, kNone);
  if (prefix_caching_) {
    key_.resize(n);
    tokens_.assign(static_cast<size_t>(n) * block_size_, 0);
  }
  free_stack_.reserve(n);
  for (int32_t b = n - 1; b >= 0; --b) free_stack_.push_back(b);  // block 0 is handed out first
  TESSERA_CHECK(config.n_host_blocks >= 0, "KV block manager: negative host tier of ", config.n_host_blocks, " blocks");
  host_used_.assign(config.n_host_blocks, 0);
  for (int32_t h = config.n_host_blocks - 1; h >= 0; --h) host_free_.push_back(h);
}

std::span<const int32_t> KvBlockManager::stored_tokens(int32_t block) const {
  return {tokens_.data() + static_cast<size_t>(block) * block_size_, static_cast<size_t>(block_size_)};
}

std::vector<int32_t> KvBlockManager::find_prefix(const BlockHash& root, std::span<const int32_t> tokens,
                                                 int max_blocks) const {
  std::vector<int32_t> hits;
  if (!prefix_caching_) return hits;
  const int n_full = std::min(max_blocks, static_cast<int>(tokens.size()) / block_size_);
  BlockHash parent = root;
  for (int i = 0; i < n_full; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const BlockHash key = block_hash(parent, block_tokens);
    const auto it = index_.find(key);
    if (it == index_.end()) break;
    // The key is collision resistant, but a hit must still be the same tokens.
    const auto stored = stored_tokens(it->second);
    if (!std::equal(stored.begin(), stored.end(), block_tokens.begin())) break;
    hits.push_back(it->second);
    parent = key;
  }
  return hits;
}

void KvBlockManager::record_lookup(int n_query_tokens, int n_hit_tokens) {
  ++stats_.queries;
  stats_.queried_tokens += n_query_tokens;
  stats_.hit_tokens += n_hit_tokens;
}

void KvBlockManager::adopt_prefix(SeqKv& kv, std::span<const int32_t> blocks) {
  TESSERA_CHECK(kv.table.blocks.empty() && kv.table.n_tokens == 0, "KV: prefix adopted by a sequence that has KV");
  for (int32_t b : blocks) {
    TESSERA_CHECK(b >= 0 && b < n_blocks() && cached_[b], "KV: adopted block ", b, " is not cached");
    retain(b);
    kv.table.blocks.push_back(b);
  }
  kv.table.n_tokens = static_cast<int>(blocks.size()) * block_size_;
  kv.hashes.clear();
  for (int32_t b : blocks) kv.hashes.push_back(key_[b]);
  kv.n_registered = static_cast<int>(blocks.size());
}

int KvBlockManager::blocks_needed(const SeqKv& kv, int n_new) const {
  const int n_tok = kv.table.n_tokens;
  const int have = kv.n_blocks();
  const int need = blocks_for(n_tok + n_new);
  int fresh = std::max(0, need - have);
  if (n_new > 0)
    for (int i = n_tok / block_size_; i < std::min(have, need); ++i)
      if (ref_[kv.table.blocks[i]] > 1) ++fresh;  // copy-on-write
  return fresh;
}

bool KvBlockManager::allocate_slots(SeqKv& kv, int n_new, std::vector<BlockCopy>& copies) {
  TESSERA_CHECK(n_new >= 0, "KV: negative token count ", n_new);
  if (blocks_needed(kv, n_new) > n_free()) return false;
  const int n_tok = kv.table.n_tokens;
  const int need = blocks_for(n_tok + n_new);
  auto& blocks = kv.table.blocks;
  if (n_new > 0) {
    for (int i = n_tok / block_size_; i < std::min(kv.n_blocks(), need); ++i) {
      const int32_t src = blocks[i];
      if (ref_[src] <= 1) continue;
      const int32_t dst = take_block();
      copies.push_back({src, dst});
      blocks[i] = dst;
      release(src);  // still held by the other owners
    }
  }
  while (kv.n_blocks() < need) blocks.push_back(take_block());
  return true;
}

void KvBlockManager::cache_full_blocks(SeqKv& kv, std::span<const int32_t> tokens) {
  if (!prefix_caching_) return;
  TESSERA_CHECK(static_cast<int>(tokens.size()) >= kv.table.n_tokens, "KV: sequence has ", tokens.size(),
                " tokens but ", kv.table.n_tokens, " computed");
  const int n_full = kv.table.n_tokens / block_size_;
  for (int i = kv.n_registered; i < n_full; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    if (static_cast<int>(kv.hashes.size()) <= i)
      kv.hashes.push_back(block_hash(i == 0 ? kv.root : kv.hashes[i - 1], block_tokens));
    const int32_t b = kv.table.blocks[i];
    if (cached_[b]) continue;  // shared with the sequence that registered it
    const BlockHash& key = kv.hashes[i];
    if (!index_.emplace(key, b).second) continue;  // same data already cached in another block
    cached_[b] = 1;
    key_[b] = key;
    std::copy(block_tokens.begin(), block_tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
    ++stats_.registered;
  }
  kv.n_registered = std::max(kv.n_registered, n_full);
}

void KvBlockManager::truncate(SeqKv& kv, int n_tokens) {
  TESSERA_CHECK(n_tokens >= 0 && n_tokens <= kv.table.n_tokens && !kv.swapped(), "KV: truncate of a sequence of ",
                kv.table.n_tokens, " tokens to ", n_tokens);
  TESSERA_CHECK(kv.n_registered <= n_tokens / block_size_, "KV: truncate to ", n_tokens,
                " tokens would cut into blocks offered to the prefix index");
  auto& blocks = kv.table.blocks;
  const int keep = blocks_for(n_tokens);
  while (static_cast<int>(blocks.size()) > keep) {
    release(blocks.back());
    blocks.pop_back();
  }
  if (static_cast<int>(kv.hashes.size()) > n_tokens / block_size_) kv.hashes.resize(n_tokens / block_size_);
  kv.table.n_tokens = n_tokens;
}

void KvBlockManager::fork(const SeqKv& parent, SeqKv& child) {
  TESSERA_CHECK(child.table.blocks.empty(), "KV: fork into a sequence that has KV");
  for (int32_t b : parent.table.blocks) retain(b);
  child = parent;
}

void KvBlockManager::free(SeqKv& kv) {
  for (auto it = kv.table.blocks.rbegin(); it != kv.table.blocks.rend(); ++it) release(*it);
  for (int32_t h : kv.host_blocks) {
    TESSERA_CHECK(h >= 0 && h < n_host_blocks() && host_used_[h], "KV: free of unused host slot ", h);
    host_used_[h] = 0;
    host_free_.push_back(h);
  }
  kv.host_blocks.clear();
  kv.table.blocks.clear();
  kv.table.n_tokens = 0;
  kv.hashes.clear();
  kv.n_registered = 0;
}

bool KvBlockManager::swap_out(SeqKv& kv, std::vector<BlockSwap>& swaps) {
  TESSERA_CHECK(!kv.swapped(), "KV: swap-out of a sequence already swapped out");
  const int n = kv.n_blocks();
  if (n == 0 || n > n_host_free()) return false;
  for (int32_t b : kv.table.blocks) {
    const int32_t h = host_free_.back();
    host_free_.pop_back();
    host_used_[h] = 1;
    kv.host_blocks.push_back(h);
    swaps.push_back({b, h});
  }
  for (auto it = kv.table.blocks.rbegin(); it != kv.table.blocks.rend(); ++it) release(*it);
  kv.table.blocks.clear();  // n_tokens, hashes stay: the KV still exists, on the host
  ++swap_stats_.swap_outs;
  swap_stats_.blocks_out += n;
  return true;
}

bool KvBlockManager::swap_in(SeqKv& kv, std::vector<BlockSwap>& swaps) {
  TESSERA_CHECK(kv.swapped() && kv.table.blocks.empty(), "KV: swap-in of a sequence that is not swapped out");
  TESSERA_CHECK(static_cast<int>(kv.host_blocks.size()) == blocks_for(kv.table.n_tokens), "KV: swapped sequence has ",
                kv.host_blocks.size(), " host blocks for ", kv.table.n_tokens, " tokens");
  const int n = static_cast<int>(kv.host_blocks.size());
  if (n > n_free()) return false;
  for (int32_t h : kv.host_blocks) {
    const int32_t b = take_block();
    kv.table.blocks.push_back(b);
    swaps.push_back({b, h});
    host_used_[h] = 0;
    host_free_.push_back(h);
  }
  kv.host_blocks.clear();
  kv.n_registered = 0;  // fresh blocks: offer them to the index again
  ++swap_stats_.swap_ins;
  swap_stats_.blocks_in += n;
  return true;
}

int32_t KvBlockManager::take_block() {
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
    ++stats_.evictions;
  }
  ref_[b] = 1;
  return b;
}

void KvBlockManager::retain(int32_t b) {
  if (ref_[b] == 0) {
    TESSERA_CHECK(cached_[b], "KV: retain of free uncached block ", b);
    lru_unlink(b);
  }
  ++ref_[b];
}

void KvBlockManager::release(int32_t b) {
  TESSERA_CHECK(b >= 0 && b < n_blocks() && ref_[b] > 0, "KV: release of free block ", b);
  if (--ref_[b] > 0) return;
  if (cached_[b])
    lru_push_back(b);
  else
    free_stack_.push_back(b);
}

void KvBlockManager::lru_push_back(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = kNone;
  if (lru_tail_ != kNone)
    lru_next_[lru_tail_] = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++lru_size_;
}

void KvBlockManager::lru_unlink(int32_t b) {
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  (p != kNone ? lru_next_[p] : lru_head_) = n;
  (n != kNone ? lru_prev_[n] : lru_tail_) = p;
  lru_prev_[b] = lru_next_[b] = kNone;
  --lru_size_;
}

void KvBlockManager::check_invariants() const {
  const int n = n_blocks();
  std::vector<uint8_t> seen(n, 0);
  for (int32_t b : free_stack_) {
    TESSERA_CHECK(b >= 0 && b < n && !seen[b], "KV invariant: block ", b, " twice in the free stack");
    TESSERA_CHECK(ref_[b] == 0 && !cached_[b], "KV invariant: free-stack block ", b, " has ref ", ref_[b],
                  " or is cached");
    seen[b] = 1;
  }
  int lru_count = 0;
  int32_t prev = kNone;
  for (int32_t b = lru_head_; b != kNone; b = lru_next_[b]) {
    TESSERA_CHECK(b >= 0 && b < n && !seen[b], "KV invariant: block ", b, " twice among free blocks");
    TESSERA_CHECK(ref_[b] == 0 && cached_[b], "KV invariant: LRU block ", b, " has ref ", ref_[b], " or is uncached");
    TESSERA_CHECK(lru_prev_[b] == prev, "KV invariant: LRU links broken at block ", b);
    seen[b] = 1;
    prev = b;
    ++lru_count;
  }
  TESSERA_CHECK(prev == lru_tail_ && lru_count == lru_size_, "KV invariant: LRU size ", lru_size_, " but ", lru_count,
                " linked");
  for (int32_t b = 0; b < n; ++b) {
    TESSERA_CHECK(ref_[b] >= 0, "KV invariant: block ", b, " has negative ref ", ref_[b]);
    TESSERA_CHECK((ref_[b] == 0) == (seen[b] != 0), "KV invariant: block ", b, " with ref ", ref_[b],
                  seen[b] ? " is listed free" : " is lost (neither used nor free)");
    if (cached_[b]) {
      const auto it = index_.find(key_[b]);
      TESSERA_CHECK(it != index_.end() && it->second == b, "KV invariant: cached block ", b, " not indexed");
    }
  }
  for (const auto& [key, b] : index_)
    TESSERA_CHECK(cached_[b] && key_[b] == key, "KV invariant: index entry for block ", b, " is stale");
  std::vector<uint8_t> host_seen(n_host_blocks(), 0);
  for (int32_t h : host_free_) {
    TESSERA_CHECK(h >= 0 && h < n_host_blocks() && !host_seen[h] && !host_used_[h], "KV invariant: host slot ", h,
                  " listed free twice or while used");
    host_seen[h] = 1;
  }
  const auto n_used = std::count(host_used_.begin(), host_used_.end(), 1);
  TESSERA_CHECK(n_used + n_host_free() == n_host_blocks(), "KV invariant: ", n_used, " host slots used + ",
                n_host_free(), " free != ", n_host_blocks());
}

bool KvBlockManager::is_whole() const {
  return n_free() == n_blocks() && std::all_of(ref_.begin(), ref_.end(), [](int32_t r) { return r == 0; }) &&
         n_host_free() == n_host_blocks();
}

int KvPlan::ref(int32_t b) const {
  const auto it = delta_.find(b);
  return m_.ref_count(b) + (it == delta_.end() ? 0 : it->second);
}

bool KvPlan::reserve(const SeqKv& kv, std::span<const int32_t> hits, int n_new) {
  const int bs = m_.block_size();
  TESSERA_CHECK(hits.empty() || kv.table.blocks.empty(), "KV plan: prefix hits for a sequence that has KV");
  int revived = 0;  // hits that are free now and leave the free count when adopted
  for (int32_t b : hits)
    if (ref(b) == 0) ++revived;
  // A block listed twice in hits cannot happen (keys chain), so counting once is exact.
  const int n_tok = hits.empty() ? kv.table.n_tokens : static_cast<int>(hits.size()) * bs;
  const int have = hits.empty() ? kv.n_blocks() : static_cast<int>(hits.size());
  const int need = m_.blocks_for(n_tok + n_new);
  int fresh = std::max(0, need - have);
  std::vector<int32_t> copied;
  if (n_new > 0 && hits.empty())
    for (int i = n_tok / bs; i < std::min(have, need); ++i)
      if (ref(kv.table.blocks[i]) > 1) {
        ++fresh;
        copied.push_back(kv.table.blocks[i]);
      }
  if (revived + fresh > free_) return false;
  free_ -= revived + fresh;
  for (int32_t b : hits) ++delta_[b];
  for (int32_t b : copied) --delta_[b];  // not credited to free_: see the class comment
  return true;
}

bool KvPlan::swap_out(const SeqKv& kv) {
  const int n = kv.n_blocks();
  if (n == 0 || n > host_free_) return false;
  host_free_ -= n;
  release(kv);
  return true;
}

void KvPlan::release(const SeqKv& kv) {
  for (int32_t b : kv.table.blocks) {
    const int r = ref(b);
    TESSERA_CHECK(r > 0, "KV plan: release of free block ", b);
    --delta_[b];
    if (r == 1) ++free_;
  }
}

}  // namespace tessera
