#pragma once
// Operations on KV storage and its sizing: block copies for copy-on-write (host memcpy for
// the CPU backend, or through any backend's copy ops), the host tier swap preemption moves
// blocks to, and the number of blocks a memory budget holds.
#include <cstdint>
#include <memory>
#include <span>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"

namespace tessera {

// Copies block src to block dst in K and V of every layer, in order. Host memory only
// (the CPU backend's KvCache); each layer's K (or V) part of a block is its n_kv_heads pages,
// contiguous (scales included: a block is self-contained).
void copy_kv_blocks_host(const KvCache& kv, std::span<const BlockCopy> copies);
// The same on any backend: device → device copies through kv.backend(), ordered before the
// ops issued after them (one copy per layer, K and V, block). n_layers >= 0: only layers
// [0, n_layers) (an early-exit drafter's copy of the target's blocks).
void copy_kv_blocks(const KvCache& kv, std::span<const BlockCopy> copies, int n_layers = -1);

// Moves one token's K and V (its codes and its own scales) from one slot to another (slot =
// block * block_size + offset), in every layer of its group, in order. Tree verification
// moves the kept path's keys to the slots their positions name. Formats whose scales span a
// page's tokens (int4 KIVI keys) cannot move a token alone: kv_token_moves_supported says so.
struct KvTokenMove {
  int32_t src = -1;
  int32_t dst = -1;
  bool local = false;  // slots of the local layers' pool
};
bool kv_token_moves_supported(const KvCacheSpec& spec);
void move_kv_tokens(const KvCache& kv, std::span<const KvTokenMove> moves);

// The host-memory KV tier for swap preemption: n_slots blocks, each holding one device
// block's K and V for every layer, slot-major: [n_slots][n_layers][K pages, V pages] (one
// page per KV head, in the cache's formats). Memory is reserved, not touched, until a slot is written.
class HostKvTier {
 public:
  HostKvTier(const KvCacheSpec& spec, int n_slots);
  // Slots in backend.alloc_host() memory (page-locked for a device backend, so swaps are
  // DMA copies); allocated at once.
  HostKvTier(const KvCacheSpec& spec, int n_slots, Backend& backend);
  int n_slots() const { return n_slots_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot(int32_t h);
  const uint8_t* slot(int32_t h) const;

 private:
  int n_slots_;
  int64_t slot_bytes_;
  std::shared_ptr<void> data_;
};

// Swap copies between a host-memory KvCache (CPU backend) and the host tier, in order.
// Out: device block -> host slot; in: host slot -> device block. Throws on an index out of
// range (before copying anything).
void swap_out_kv_blocks_host(const KvCache& kv, HostKvTier& host, std::span<const BlockSwap> swaps);
void swap_in_kv_blocks_host(const KvCache& kv, const HostKvTier& host, std::span<const BlockSwap> swaps);
// The same on any backend: asynchronous copies through kv.backend(), then one synchronize().
void swap_out_kv_blocks(const KvCache& kv, HostKvTier& host, std::span<const BlockSwap> swaps);
void swap_in_kv_blocks(const KvCache& kv, const HostKvTier& host, std::span<const BlockSwap> swaps);

// Bytes of K and V one block takes across all layers.
int64_t kv_block_bytes(const KvCacheSpec& spec);
// Blocks that fit in budget_bytes (spec.n_blocks is ignored). Throws when not even one fits.
int kv_blocks_for_budget(const KvCacheSpec& spec, int64_t budget_bytes);
// The pools of a cache with a local group (spec.local_layers): the local pool holds what
// max_num_seqs sequences' windows and one step of max_batched_tokens can need at once, so it
// never binds before the full pool (and never more blocks than the full pool: a sequence
// holds no more local blocks than full ones); the full pool takes the rest of the budget, at
// most max_blocks. When the windows would not save anything, both pools get the blocks one
// pool of every layer would. Throws when the budget holds no block.
struct KvPoolSizes {
  int n_blocks = 0;
  int n_local_blocks = 0;
};
KvPoolSizes kv_pools_for_budget(const KvCacheSpec& spec, int64_t budget_bytes, int window, int max_num_seqs,
                                int max_batched_tokens, int64_t max_blocks);
// MemAvailable from /proc/meminfo, in bytes (0 when it cannot be read).
int64_t host_available_memory_bytes();

}  // namespace tessera
