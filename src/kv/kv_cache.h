#pragma once
// Paged KV storage and its block accounting.
//
// KvCache owns the K/V storage of every layer (memory of the run, allocated through the
// backend): per layer, K and V are each [n_blocks, n_kv_heads] pages in their format
// (backend/kv_format.h; f16: [block_size, head_dim] elements a page), plus the layer's
// format constants (static scales, TurboQuant tables). A block is found by index only.
// BlockPool hands out block indices with reference counts; a sequence owns a block table
// (SequenceBlocks). Allocation is all-or-nothing.
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tessera {

struct KvCacheSpec {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int n_blocks = 0;
  KvFormat k_format = kv_format_of(DType::F16);
  KvFormat v_format = kv_format_of(DType::F16);
  uint64_t seed = 0x7e55e2a;  // TurboQuant rotations and sketches
  // Static scales (fp8 :tensor / :head), per layer: one value or one per KV head; empty =
  // 1.0 everywhere (vLLM's default without a checkpoint scale).
  std::vector<std::vector<float>> k_scales, v_scales;
  // Calibrated mean key per layer ([n_kv_heads * head_dim], head-major) for a key format that
  // centers keys (KvFormat::centers_keys); empty = no centering (μ = 0).
  std::vector<std::vector<float>> k_mean;
  // Per-channel key equalization s per layer ([n_kv_heads * head_dim], head-major; needs
  // k_mean): keys are stored as R ((k − μ)/s) and queries meet them as R (q∘s); empty = 1.
  std::vector<std::vector<float>> k_equal;
  // Position-aware key centering (k_rope_dim > 0): k_mean is the pre-RoPE mean m, and a key
  // at position p is stored relative to R(p)·m, R the RoPE of k_rope_dim channels (neox
  // pairs or not) with per-layer inverse frequencies k_rope_freq [n_layers][k_rope_dim / 2].
  int k_rope_dim = 0;
  bool k_rope_neox = false;
  std::vector<std::vector<float>> k_rope_freq;
  // The center of the key at position 0 per layer ([n_kv_heads * head_dim], head-major; needs
  // k_mean): that key is stored relative to it instead (KvRopeCentering::first); empty = none.
  std::vector<std::vector<float>> k_first;
  // Layer groups: the sliding-window layers marked in local_layers ([n_layers], 1 = local)
  // keep their K/V in a pool of their own, n_local_blocks blocks (the block manager drops
  // blocks behind the window from it). 0 = one group: every layer has n_blocks blocks.
  std::vector<uint8_t> local_layers;
  int n_local_blocks = 0;
  // A tensor-parallel rank's cache (docs/design/parallel.md) holds KV heads [kv_head_first,
  // kv_head_first + n_kv_heads) of a model with n_kv_heads_whole (0: the whole model). Its
  // TurboQuant signs and sketches are those heads' draws of the whole cache.
  int kv_head_first = 0;
  int n_kv_heads_whole = 0;
  // A pipeline stage's cache holds layers [layer_first, layer_first + n_layers) of the model:
  // its TurboQuant draws are those layers'.
  int layer_first = 0;

  // This cache restricted to KV heads [first, first + n) of its own: per-head static scales
  // and the key means and equalization (head-major) sliced to them, per-tensor scales kept.
  // Throws naming the numbers when the heads are not a range of this cache's.
  KvCacheSpec kv_heads(int first, int n) const;
  // This cache restricted to layers [first, first + n) of its own (a pipeline stage's): the
  // per-layer scales, key means, equalization, RoPE frequencies and group marks sliced.
  KvCacheSpec layers(int first, int n) const;

  // A cache with K and V both in `plain` (F16 or F32).
  static KvCacheSpec plain(int n_layers, int n_kv_heads, int head_dim, int block_size, int n_blocks, DType plain) {
    KvCacheSpec s;
    s.n_layers = n_layers;
    s.n_kv_heads = n_kv_heads;
    s.head_dim = head_dim;
    s.block_size = block_size;
    s.n_blocks = n_blocks;
    s.set_plain(plain);
    return s;
  }
  // Both K and V in `plain` (F16 or F32).
  void set_plain(DType plain) { k_format = v_format = kv_format_of(plain); }
  int64_t k_page_bytes() const { return kv_page_layout(k_format, block_size, head_dim).page_bytes; }
  int64_t v_page_bytes() const { return kv_page_layout(v_format, block_size, head_dim).page_bytes; }
  // Bytes of one layer's K (or V) part of a block: n_kv_heads pages.
  int64_t k_layer_block_bytes() const { return k_page_bytes() * n_kv_heads; }
  int64_t v_layer_block_bytes() const { return v_page_bytes() * n_kv_heads; }
  // Bytes of one block across all layers, K and V, scales included (a host swap slot).
  int64_t block_bytes() const { return (k_layer_block_bytes() + v_layer_block_bytes()) * n_layers; }
  // Mean bytes per token (block_bytes / block_size), for reports.
  double bytes_per_token() const { return static_cast<double>(block_bytes()) / block_size; }
  // Whether layer il is in the local group (its blocks are the local pool's).
  bool in_local_group(int il) const {
    return n_local_blocks > 0 && static_cast<size_t>(il) < local_layers.size() && local_layers[il] != 0;
  }
  int n_group_layers(bool local) const;
  // Blocks of layer il's K and V arrays.
  int layer_blocks(int il) const { return in_local_group(il) ? n_local_blocks : n_blocks; }
  // Bytes of one block of the full group's layers (all layers without a local group) and of
  // one block of the local group's layers.
  int64_t full_block_bytes() const { return (k_layer_block_bytes() + v_layer_block_bytes()) * n_group_layers(false); }
  int64_t local_block_bytes() const { return (k_layer_block_bytes() + v_layer_block_bytes()) * n_group_layers(true); }
  int64_t total_bytes() const { return full_block_bytes() * n_blocks + local_block_bytes() * n_local_blocks; }
  // "f16", or "k=int4:channel v=int4:g32" when K and V differ.
  std::string format_name() const;
  // A digest of the static constants the stored bytes depend on (k/v scales, key means,
  // key equalization): part of the prefix-cache fingerprint beside format_name(), so blocks
  // are never shared between caches whose stores differ.
  uint64_t constants_digest() const;
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
  void release();

  Backend& backend_;
  KvCacheSpec spec_;
  std::vector<void*> k_, v_;                // per layer
  std::vector<void*> k_consts_, v_consts_;  // per layer; null for formats without constants
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
