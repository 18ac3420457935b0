#include "kv/kv_cache.h"

#include <cstring>

#include "core/error.h"

namespace tessera {

int64_t KvCacheSpec::bytes_per_token() const {
  const int64_t elem = dtype == DType::F32 ? 4 : 2;
  return 2 * static_cast<int64_t>(n_layers) * n_kv_heads * head_dim * elem;
}

KvCache::KvCache(Backend& backend, const KvCacheSpec& spec) : backend_(backend), spec_(spec) {
  TESSERA_CHECK(spec.dtype == DType::F16 || spec.dtype == DType::F32, "KV cache: unsupported dtype ",
                dtype_name(spec.dtype), " (F16 or F32)");
  TESSERA_CHECK(spec.block_size >= 1 && spec.block_size <= 1024, "KV cache: block size ", spec.block_size,
                " is outside [1, 1024]");
  TESSERA_CHECK(spec.n_blocks >= 1, "KV cache: needs at least one block");
  const size_t bytes =
      static_cast<size_t>(spec.bytes_per_token() / spec.n_layers / 2) * spec.block_size * spec.n_blocks;
  k_.resize(spec.n_layers, nullptr);
  v_.resize(spec.n_layers, nullptr);
  for (int i = 0; i < spec.n_layers; ++i) {
    k_[i] = backend_.alloc(bytes);
    v_[i] = backend_.alloc(bytes);
  }
}

KvCache::~KvCache() {
  for (void* p : k_) backend_.free(p);
  for (void* p : v_) backend_.free(p);
}

KvLayerView KvCache::layer(int i) const {
  return KvLayerView{k_[i], v_[i], spec_.dtype, spec_.n_blocks, spec_.block_size, spec_.n_kv_heads, spec_.head_dim};
}

BlockPool::BlockPool(int n_blocks) : ref_(n_blocks, 0) {
  free_.reserve(n_blocks);
  for (int i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

bool BlockPool::allocate(int n, std::vector<int32_t>& out) {
  if (n < 0 || n > n_free()) return false;
  for (int i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    ref_[b] = 1;
    out.push_back(b);
  }
  return true;
}

void BlockPool::retain(int32_t block) {
  TESSERA_CHECK(block >= 0 && block < n_blocks() && ref_[block] > 0, "block pool: retain of free block ", block);
  ++ref_[block];
}

void BlockPool::release(int32_t block) {
  TESSERA_CHECK(block >= 0 && block < n_blocks() && ref_[block] > 0, "block pool: release of free block ", block);
  if (--ref_[block] == 0) free_.push_back(block);
}

bool SequenceBlocks::reserve(BlockPool& pool, int block_size, int extra) {
  const int need_blocks = (n_tokens + extra + block_size - 1) / block_size;
  const int missing = need_blocks - static_cast<int>(blocks.size());
  return missing <= 0 || pool.allocate(missing, blocks);
}

void SequenceBlocks::release_all(BlockPool& pool) {
  for (int32_t b : blocks) pool.release(b);
  blocks.clear();
  n_tokens = 0;
}

}  // namespace tessera
