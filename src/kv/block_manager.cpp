#include "kv/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

KvBlockManager::KvBlockManager(const Config& config)
    : block_size_(config.block_size),
      prefix_caching_(config.prefix_caching),
      full_(config.n_blocks, config.block_size, config.prefix_caching) {
  TESSERA_CHECK(config.window >= 0 && config.n_local_blocks >= 0, "KV block manager: negative window ", config.window,
                " or local pool of ", config.n_local_blocks, " blocks");
  TESSERA_CHECK((config.window > 0) == (config.n_local_blocks > 0), "KV block manager: a window (", config.window,
                ") and a local pool (", config.n_local_blocks, " blocks) go together");
  if (config.window > 0) {
    window_ = config.window;
    local_.emplace(config.n_local_blocks, config.block_size, config.prefix_caching);
  }
  TESSERA_CHECK(config.n_host_blocks >= 0, "KV block manager: negative host tier of ", config.n_host_blocks, " blocks");
  host_used_.assign(config.n_host_blocks, 0);
  for (int32_t h = config.n_host_blocks - 1; h >= 0; --h) host_free_.push_back(h);
}

std::vector<int32_t> KvBlockManager::find_prefix(const BlockHash& root, std::span<const int32_t> tokens,
                                                 int max_blocks) const {
  std::vector<int32_t> hits;
  if (!prefix_caching_) return hits;
  const int n_full = std::min(max_blocks, static_cast<int>(tokens.size()) / block_size_);
  std::vector<uint8_t> local_ok;  // [hits] the local pool holds block i too
  BlockHash parent = root;
  for (int i = 0; i < n_full; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const BlockHash key = block_hash(parent, block_tokens);
    const int32_t b = full_.find(key, block_tokens);
    if (b < 0) break;
    hits.push_back(b);
    if (local_) local_ok.push_back(local_->find(key, block_tokens) >= 0);
    parent = key;
  }
  if (local_) {
    // The longest hit whose window (the blocks a query at the hit point still sees) is in
    // the local pool: a missing block i cuts the hit to i, whose window lies before i.
    int h = static_cast<int>(hits.size());
    while (h > 0) {
      int miss = -1;
      for (int i = h - 1; i >= local_first_live(h * block_size_); --i)
        if (!local_ok[i]) {
          miss = i;
          break;
        }
      if (miss < 0) break;
      h = miss;
    }
    hits.resize(h);
  }
  return hits;
}

std::vector<int32_t> KvBlockManager::local_hits(std::span<const int32_t> hits) const {
  std::vector<int32_t> out;
  const int h = static_cast<int>(hits.size());
  for (int i = local_first_live(h * block_size_); i < h; ++i)
    out.push_back(local_->find(full_.key(hits[i]), full_.tokens_of(hits[i])));
  return out;
}

PrefixCacheStats KvBlockManager::stats() const {
  PrefixCacheStats s = stats_;
  s.evictions = full_.evictions() + (local_ ? local_->evictions() : 0);
  return s;
}

void KvBlockManager::record_lookup(int n_query_tokens, int n_hit_tokens) {
  ++stats_.queries;
  stats_.queried_tokens += n_query_tokens;
  stats_.hit_tokens += n_hit_tokens;
}

void KvBlockManager::adopt_prefix(SeqKv& kv, std::span<const int32_t> blocks) {
  TESSERA_CHECK(kv.table.blocks.empty() && kv.table.n_tokens == 0, "KV: prefix adopted by a sequence that has KV");
  for (int32_t b : blocks) {
    TESSERA_CHECK(b >= 0 && b < n_blocks() && full_.is_cached(b), "KV: adopted block ", b, " is not cached");
    full_.retain(b);
    kv.table.blocks.push_back(b);
  }
  kv.table.n_tokens = static_cast<int>(blocks.size()) * block_size_;
  kv.hashes.clear();
  for (int32_t b : blocks) kv.hashes.push_back(full_.key(b));
  kv.n_registered = static_cast<int>(blocks.size());
  if (!local_) return;
  const int first = local_first_live(kv.table.n_tokens);
  kv.local.blocks.assign(first, kDropped);
  for (int32_t b : local_hits(blocks)) {
    TESSERA_CHECK(b >= 0, "KV: a prefix hit's window is missing from the local pool");
    local_->retain(b);
    kv.local.blocks.push_back(b);
  }
  kv.local.n_tokens = kv.table.n_tokens;
  kv.local_dropped = first;
  kv.local_registered = kv.n_registered;
}

int KvBlockManager::blocks_needed(const SeqKv& kv, int n_new) const {
  const int n_tok = kv.table.n_tokens;
  const int have = kv.n_blocks();
  const int need = blocks_for(n_tok + n_new);
  int fresh = std::max(0, need - have);
  if (n_new > 0)
    for (int i = n_tok / block_size_; i < std::min(have, need); ++i)
      if (full_.ref_count(kv.table.blocks[i]) > 1) ++fresh;  // copy-on-write
  return fresh;
}

int KvBlockManager::local_blocks_needed(const SeqKv& kv, int n_new) const {
  const int n_tok = kv.table.n_tokens;
  const auto& blocks = kv.local.blocks;
  const int have = static_cast<int>(blocks.size());
  const int need = blocks_for(n_tok + n_new);
  const int first = local_first_live(n_tok);
  int freed = 0;  // drops this sequence alone holds
  for (int i = kv.local_dropped; i < std::min(first, have); ++i)
    if (local_->ref_count(blocks[i]) == 1) ++freed;
  int fresh = std::max(0, need - have);
  if (n_new > 0)
    for (int i = std::max(n_tok / block_size_, first); i < std::min(have, need); ++i)
      if (local_->ref_count(blocks[i]) > 1) ++fresh;  // copy-on-write
  return fresh - freed;
}

void KvBlockManager::drop_outside_window(SeqKv& kv) {
  const int first = std::min(local_first_live(kv.table.n_tokens), static_cast<int>(kv.local.blocks.size()));
  for (int i = kv.local_dropped; i < first; ++i) {
    local_->release(kv.local.blocks[i]);
    kv.local.blocks[i] = kDropped;
  }
  kv.local_dropped = std::max(kv.local_dropped, first);
}

bool KvBlockManager::allocate_slots(SeqKv& kv, int n_new, std::vector<BlockCopy>& copies) {
  TESSERA_CHECK(n_new >= 0, "KV: negative token count ", n_new);
  if (blocks_needed(kv, n_new) > n_free()) return false;
  if (local_ && local_blocks_needed(kv, n_new) > local_->n_free()) return false;
  const int n_tok = kv.table.n_tokens;
  const int need = blocks_for(n_tok + n_new);
  auto& blocks = kv.table.blocks;
  if (n_new > 0) {
    for (int i = n_tok / block_size_; i < std::min(kv.n_blocks(), need); ++i) {
      const int32_t src = blocks[i];
      if (full_.ref_count(src) <= 1) continue;
      const int32_t dst = full_.take();
      copies.push_back({src, dst});
      blocks[i] = dst;
      full_.release(src);  // still held by the other owners
    }
  }
  while (kv.n_blocks() < need) blocks.push_back(full_.take());
  if (!local_) return true;
  drop_outside_window(kv);  // first: what it frees may be taken below
  auto& local = kv.local.blocks;
  if (n_new > 0) {
    for (int i = n_tok / block_size_; i < std::min(static_cast<int>(local.size()), need); ++i) {
      const int32_t src = local[i];
      if (local_->ref_count(src) <= 1) continue;
      const int32_t dst = local_->take();
      copies.push_back({src, dst, /*local=*/true});
      local[i] = dst;
      local_->release(src);
    }
  }
  while (static_cast<int>(local.size()) < need) local.push_back(local_->take());
  kv.local.n_tokens = n_tok;
  return true;
}

void KvBlockManager::cache_full_blocks(SeqKv& kv, std::span<const int32_t> tokens) {
  if (!prefix_caching_) return;
  TESSERA_CHECK(static_cast<int>(tokens.size()) >= kv.table.n_tokens, "KV: sequence has ", tokens.size(),
                " tokens but ", kv.table.n_tokens, " computed");
  const int n_full = kv.table.n_tokens / block_size_;
  const auto block_tokens = [&](int i) { return tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_); };
  for (int i = kv.n_registered; i < n_full; ++i) {
    if (static_cast<int>(kv.hashes.size()) <= i)
      kv.hashes.push_back(block_hash(i == 0 ? kv.root : kv.hashes[i - 1], block_tokens(i)));
    if (full_.enter(kv.table.blocks[i], kv.hashes[i], block_tokens(i))) ++stats_.registered;
  }
  kv.n_registered = std::max(kv.n_registered, n_full);
  if (!local_) return;
  for (int i = std::max(kv.local_registered, kv.local_dropped); i < n_full; ++i)
    if (local_->enter(kv.local.blocks[i], kv.hashes[i], block_tokens(i))) ++stats_.registered;
  kv.local_registered = std::max(kv.local_registered, n_full);
}

void KvBlockManager::truncate(SeqKv& kv, int n_tokens) {
  TESSERA_CHECK(n_tokens >= 0 && n_tokens <= kv.table.n_tokens && !kv.swapped(), "KV: truncate of a sequence of ",
                kv.table.n_tokens, " tokens to ", n_tokens);
  TESSERA_CHECK(kv.n_registered <= n_tokens / block_size_, "KV: truncate to ", n_tokens,
                " tokens would cut into blocks offered to the prefix index");
  TESSERA_CHECK(kv.local_dropped <= local_first_live(n_tokens), "KV: truncate to ", n_tokens,
                " tokens would need local blocks already dropped");
  const int keep = blocks_for(n_tokens);
  auto& blocks = kv.table.blocks;
  while (static_cast<int>(blocks.size()) > keep) {
    full_.release(blocks.back());
    blocks.pop_back();
  }
  auto& local = kv.local.blocks;
  while (static_cast<int>(local.size()) > keep) {
    local_->release(local.back());
    local.pop_back();
  }
  if (static_cast<int>(kv.hashes.size()) > n_tokens / block_size_) kv.hashes.resize(n_tokens / block_size_);
  kv.local_registered = std::min(kv.local_registered, n_tokens / block_size_);
  kv.table.n_tokens = n_tokens;
  kv.local.n_tokens = n_tokens;
}

void KvBlockManager::fork(const SeqKv& parent, SeqKv& child) {
  TESSERA_CHECK(child.table.blocks.empty(), "KV: fork into a sequence that has KV");
  TESSERA_CHECK(!parent.swapped(), "KV: fork of a swapped-out sequence");
  for (int32_t b : parent.table.blocks) full_.retain(b);
  for (int i = parent.local_dropped; i < static_cast<int>(parent.local.blocks.size()); ++i)
    local_->retain(parent.local.blocks[i]);
  child = parent;
}

void KvBlockManager::free(SeqKv& kv) {
  for (auto it = kv.table.blocks.rbegin(); it != kv.table.blocks.rend(); ++it) full_.release(*it);
  for (int i = static_cast<int>(kv.local.blocks.size()) - 1; i >= kv.local_dropped; --i)
    local_->release(kv.local.blocks[i]);
  for (const auto* slots : {&kv.host_blocks, &kv.local_host_blocks})
    for (int32_t h : *slots) {
      TESSERA_CHECK(h >= 0 && h < n_host_blocks() && host_used_[h], "KV: free of unused host slot ", h);
      host_used_[h] = 0;
      host_free_.push_back(h);
    }
  kv.host_blocks.clear();
  kv.local_host_blocks.clear();
  kv.table.blocks.clear();
  kv.table.n_tokens = 0;
  kv.local.blocks.clear();
  kv.local.n_tokens = 0;
  kv.local_dropped = 0;
  kv.local_registered = 0;
  kv.hashes.clear();
  kv.n_registered = 0;
}

int KvBlockManager::host_slots_needed(const SeqKv& kv) const {
  const int n_local = static_cast<int>(kv.local.blocks.size());
  return kv.n_blocks() + std::max(0, n_local - std::max(kv.local_dropped, local_first_live(kv.table.n_tokens)));
}

int KvBlockManager::take_host_slot() {
  const int32_t h = host_free_.back();
  host_free_.pop_back();
  host_used_[h] = 1;
  return h;
}

bool KvBlockManager::swap_out(SeqKv& kv, std::vector<BlockSwap>& swaps) {
  TESSERA_CHECK(!kv.swapped(), "KV: swap-out of a sequence already swapped out");
  const int n = kv.n_blocks();
  if (n == 0 || host_slots_needed(kv) > n_host_free()) return false;
  for (int32_t b : kv.table.blocks) {
    const int32_t h = take_host_slot();
    kv.host_blocks.push_back(h);
    swaps.push_back({b, h});
  }
  for (auto it = kv.table.blocks.rbegin(); it != kv.table.blocks.rend(); ++it) full_.release(*it);
  kv.table.blocks.clear();  // n_tokens, hashes stay: the KV still exists, on the host
  int n_moved = n;
  if (local_) {
    drop_outside_window(kv);
    auto& local = kv.local.blocks;
    for (int i = kv.local_dropped; i < static_cast<int>(local.size()); ++i) {
      const int32_t h = take_host_slot();
      kv.local_host_blocks.push_back(h);
      swaps.push_back({local[i], h, /*local=*/true});
    }
    for (int i = static_cast<int>(local.size()) - 1; i >= kv.local_dropped; --i) local_->release(local[i]);
    n_moved += static_cast<int>(kv.local_host_blocks.size());
    local.clear();
  }
  ++swap_stats_.swap_outs;
  swap_stats_.blocks_out += n_moved;
  return true;
}

bool KvBlockManager::swap_in(SeqKv& kv, std::vector<BlockSwap>& swaps) {
  TESSERA_CHECK(kv.swapped() && kv.table.blocks.empty(), "KV: swap-in of a sequence that is not swapped out");
  TESSERA_CHECK(static_cast<int>(kv.host_blocks.size()) == blocks_for(kv.table.n_tokens), "KV: swapped sequence has ",
                kv.host_blocks.size(), " host blocks for ", kv.table.n_tokens, " tokens");
  const int n = static_cast<int>(kv.host_blocks.size());
  const int n_local = static_cast<int>(kv.local_host_blocks.size());
  if (n > n_free() || n_local > n_local_free()) return false;
  const auto give_back = [&](int32_t h) {
    host_used_[h] = 0;
    host_free_.push_back(h);
  };
  for (int32_t h : kv.host_blocks) {
    const int32_t b = full_.take();
    kv.table.blocks.push_back(b);
    swaps.push_back({b, h});
    give_back(h);
  }
  if (local_) {
    kv.local.blocks.assign(kv.local_dropped, kDropped);
    for (int32_t h : kv.local_host_blocks) {
      const int32_t b = local_->take();
      kv.local.blocks.push_back(b);
      swaps.push_back({b, h, /*local=*/true});
      give_back(h);
    }
  }
  kv.host_blocks.clear();
  kv.local_host_blocks.clear();
  kv.n_registered = 0;  // fresh blocks: offer them to the index again
  kv.local_registered = 0;
  ++swap_stats_.swap_ins;
  swap_stats_.blocks_in += n + n_local;
  return true;
}

void KvBlockManager::check_invariants() const {
  full_.check_invariants("full");
  if (local_) local_->check_invariants("local");
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

void KvBlockManager::check_local_table(const SeqKv& kv) const {
  if (!local_) {
    TESSERA_CHECK(kv.local.blocks.empty() && kv.local_host_blocks.empty() && kv.local_dropped == 0,
                  "KV invariant: a local table without a local pool");
    return;
  }
  const auto& local = kv.local.blocks;
  const int n = static_cast<int>(local.size());
  TESSERA_CHECK(kv.local.n_tokens == kv.table.n_tokens, "KV invariant: local table counts ", kv.local.n_tokens,
                " tokens, the full one ", kv.table.n_tokens);
  if (kv.swapped()) {
    TESSERA_CHECK(
        n == 0 && kv.local_dropped + static_cast<int>(kv.local_host_blocks.size()) == blocks_for(kv.table.n_tokens),
        "KV invariant: swapped sequence keeps ", kv.local_host_blocks.size(), " local blocks from ", kv.local_dropped,
        " for ", kv.table.n_tokens, " tokens");
    return;
  }
  TESSERA_CHECK(n == kv.n_blocks(), "KV invariant: local table of ", n, " blocks, full table of ", kv.n_blocks());
  TESSERA_CHECK(kv.local_dropped <= local_first_live(kv.table.n_tokens) || n == 0,
                "KV invariant: local blocks dropped up to ", kv.local_dropped, " but the window of token ",
                kv.table.n_tokens, " starts in block ", local_first_live(kv.table.n_tokens));
  for (int i = 0; i < n; ++i) {
    const bool dropped = i < kv.local_dropped;
    TESSERA_CHECK(dropped ? local[i] == kDropped : local[i] >= 0 && local[i] < n_local_blocks(),
                  "KV invariant: local table entry ", i, " is ", local[i], dropped ? " but dropped" : "");
  }
}

bool KvBlockManager::is_whole() const {
  return full_.is_whole() && (!local_ || local_->is_whole()) && n_host_free() == n_host_blocks();
}

int KvPlan::ref(int32_t b) const {
  const auto it = delta_.find(b);
  return m_.ref_count(b) + (it == delta_.end() ? 0 : it->second);
}

int KvPlan::local_ref(int32_t b) const {
  const auto it = local_delta_.find(b);
  return m_.local_ref_count(b) + (it == local_delta_.end() ? 0 : it->second);
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
  if (m_.windowed() && !reserve_local(kv, hits, n_new)) return false;
  free_ -= revived + fresh;
  for (int32_t b : hits) ++delta_[b];
  for (int32_t b : copied) --delta_[b];  // not credited to free_: see the class comment
  return true;
}

bool KvPlan::reserve_local(const SeqKv& kv, std::span<const int32_t> hits, int n_new) {
  const int bs = m_.block_size();
  const int n_tok = hits.empty() ? kv.table.n_tokens : static_cast<int>(hits.size()) * bs;
  const int need = m_.blocks_for(n_tok + n_new);
  const int first = m_.local_first_live(n_tok);
  std::vector<int32_t> adopted, dropped, copied;
  int revived = 0, freed = 0, fresh = 0;
  if (!hits.empty()) {
    adopted = m_.local_hits(hits);
    for (int32_t b : adopted)
      if (local_ref(b) == 0) ++revived;
    fresh = std::max(0, need - static_cast<int>(hits.size()));
  } else if (kv.swapped()) {
    fresh = need - kv.local_dropped;  // swap-in, then the new blocks; its drops were done at swap-out
  } else {
    const auto& local = kv.local.blocks;
    const int have = static_cast<int>(local.size());
    for (int i = kv.local_dropped; i < std::min(first, have); ++i) {
      dropped.push_back(local[i]);
      if (local_ref(local[i]) == 1) ++freed;
    }
    fresh = std::max(0, need - have);
    if (n_new > 0)
      for (int i = std::max(n_tok / bs, first); i < std::min(have, need); ++i)
        if (local_ref(local[i]) > 1) {
          ++fresh;
          copied.push_back(local[i]);
        }
  }
  if (revived + fresh > local_free_ + freed) return false;
  local_free_ += freed - revived - fresh;
  for (int32_t b : adopted) ++local_delta_[b];
  for (int32_t b : dropped) --local_delta_[b];
  for (int32_t b : copied) --local_delta_[b];
  return true;
}

bool KvPlan::swap_out(const SeqKv& kv) {
  const int n = m_.host_slots_needed(kv);
  if (kv.n_blocks() == 0 || n > host_free_) return false;
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
  for (int i = kv.local_dropped; i < static_cast<int>(kv.local.blocks.size()); ++i) {
    const int32_t b = kv.local.blocks[i];
    const int r = local_ref(b);
    TESSERA_CHECK(r > 0, "KV plan: release of free local block ", b);
    --local_delta_[b];
    if (r == 1) ++local_free_;
  }
}

}  // namespace tessera
