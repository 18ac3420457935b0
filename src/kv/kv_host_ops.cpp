#include "kv/kv_host_ops.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"

namespace tessera {

void copy_kv_blocks_host(const KvCache& kv, std::span<const BlockCopy> copies) {
  const KvCacheSpec& spec = kv.spec();
  const size_t elem = spec.dtype == DType::F32 ? 4 : 2;
  const size_t block_bytes = static_cast<size_t>(spec.n_kv_heads) * spec.block_size * spec.head_dim * elem;
  for (const BlockCopy& c : copies)
    TESSERA_CHECK(c.src >= 0 && c.src < spec.n_blocks && c.dst >= 0 && c.dst < spec.n_blocks && c.src != c.dst,
                  "KV copy: block ", c.src, " -> ", c.dst, " outside [0, ", spec.n_blocks, ")");
  for (int l = 0; l < spec.n_layers; ++l) {
    const KvLayerView view = kv.layer(l);
    for (void* base : {view.k, view.v}) {
      auto* bytes = static_cast<uint8_t*>(base);
      for (const BlockCopy& c : copies)
        std::memcpy(bytes + c.dst * block_bytes, bytes + c.src * block_bytes, block_bytes);
    }
  }
}

int64_t kv_block_bytes(const KvCacheSpec& spec) { return spec.bytes_per_token() * spec.block_size; }

int kv_blocks_for_budget(const KvCacheSpec& spec, int64_t budget_bytes) {
  const int64_t per_block = kv_block_bytes(spec);
  TESSERA_CHECK(per_block > 0, "KV sizing: a block of this model takes ", per_block, " bytes");
  const int64_t n = budget_bytes / per_block;
  TESSERA_CHECK(n >= 1, "KV sizing: a budget of ", budget_bytes, " bytes holds no block of ", per_block, " bytes");
  return static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int32_t>::max() / spec.block_size));
}

int64_t host_available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value >> unit)
    if (key == "MemAvailable:") return value * 1024;
  return 0;
}

}  // namespace tessera
