#pragma once
// Host-side operations on KV storage and its sizing: block copies for copy-on-write (CPU
// backend: K/V live in host memory) and the number of blocks a memory budget holds.
#include <cstdint>
#include <span>

#include "kv/block_manager.h"
#include "kv/kv_cache.h"

namespace tessera {

// Copies block src to block dst in K and V of every layer, in order. Host memory only
// (the CPU backend's KvCache); each block is [n_kv_heads, block_size, head_dim] contiguous.
void copy_kv_blocks_host(const KvCache& kv, std::span<const BlockCopy> copies);

// Bytes of K and V one block takes across all layers.
int64_t kv_block_bytes(const KvCacheSpec& spec);
// Blocks that fit in budget_bytes (spec.n_blocks is ignored). Throws when not even one fits.
int kv_blocks_for_budget(const KvCacheSpec& spec, int64_t budget_bytes);
// MemAvailable from /proc/meminfo, in bytes (0 when it cannot be read).
int64_t host_available_memory_bytes();

}  // namespace tessera
