#pragma once
// Paged KV storage and its block accounting.
//
// KvCache owns the K/V tensors of every layer (memory of the run, allocated through the
// backend): [n_blocks, n_kv_heads, block_size, head_dim] each. A block is found by index only.
// BlockPool hands out block indices with reference counts; a sequence owns a block table
// (SequenceBlocks). Allocation is all-or-nothing.
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace tessera {

struct KvCacheSpec {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int n_blocks = 0;
  DType dtype = DType::F16;  // F16 or F32
  // Bytes of K and V for one token across all layers.
  int64_t bytes_per_token() const;
  int64_t total_bytes() const { return bytes_per_token() * block_size * n_blocks; }
};

class KvCache {
 public:
  KvCache(Backend& backend, const KvCacheSpec& spec);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheSpec& spec() const { return spec_; }
  KvLayerView layer(int i) const;
  // The backend whose memory holds K and V (block copies and swaps go through it).
  Backend& backend() const { return backend_; }

 private:
  Backend& backend_;
  KvCacheSpec spec_;
  std::vector<void*> k_, v_;  // per layer
};

class BlockPool {
 public:
  explicit BlockPool(int n_blocks);

  int n_blocks() const { return static_cast<int>(ref_.size()); }
  int n_free() const { return static_cast<int>(free_.size()); }
  int ref_count(int32_t block) const { return ref_[block]; }

  // n fresh blocks with reference count 1, or false and no change when fewer are free.
  bool allocate(int n, std::vector<int32_t>& out);
  void retain(int32_t block);   // one more owner (sharing)
  void release(int32_t block);  // one owner fewer; the block is free at zero

 private:
  std::vector<int32_t> ref_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

// A sequence's view of its KV: the block table and how many tokens are stored.
struct SequenceBlocks {
  std::vector<int32_t> blocks;
  int n_tokens = 0;

  // Makes room for `extra` more tokens, all or nothing. False when the pool is short.
  bool reserve(BlockPool& pool, int block_size, int extra);
  // Gives every block back to the pool and empties the table.
  void release_all(BlockPool& pool);
  // Slot of the token at index i: block * block_size + offset.
  int32_t slot(int i, int block_size) const { return blocks[i / block_size] * block_size + i % block_size; }
};

}  // namespace tessera
