#include "kv/kv_host_ops.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"

namespace tessera {

namespace {

void check_copies(const KvCacheSpec& spec, std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    const int n = c.local ? spec.n_local_blocks : spec.n_blocks;
    TESSERA_CHECK(c.src >= 0 && c.src < n && c.dst >= 0 && c.dst < n && c.src != c.dst,
                  "KV copy: ", c.local ? "local " : "", "block ", c.src, " -> ", c.dst, " outside [0, ", n, ")");
  }
}

// Calls copy(dst bytes, src bytes, n) for K and V of every layer of each copy's group.
template <typename Copy>
void for_each_copy_part(const KvCache& kv, std::span<const BlockCopy> copies, Copy copy, int n_layers = -1) {
  const KvCacheSpec& spec = kv.spec();
  const int layers = n_layers < 0 ? spec.n_layers : std::min(n_layers, spec.n_layers);
  for (int l = 0; l < layers; ++l) {
    const KvLayerView view = kv.layer(l);
    const bool local = spec.in_local_group(l);
    for (int part = 0; part < 2; ++part) {
      auto* bytes = static_cast<uint8_t*>(part == 0 ? view.k : view.v);
      const size_t block_bytes = part == 0 ? spec.k_layer_block_bytes() : spec.v_layer_block_bytes();
      for (const BlockCopy& c : copies)
        if (c.local == local) copy(bytes + c.dst * block_bytes, bytes + c.src * block_bytes, block_bytes);
    }
  }
}

}  // namespace

void copy_kv_blocks_host(const KvCache& kv, std::span<const BlockCopy> copies) {
  check_copies(kv.spec(), copies);
  for_each_copy_part(kv, copies, [](uint8_t* dst, const uint8_t* src, size_t n) { std::memcpy(dst, src, n); });
}

void copy_kv_blocks(const KvCache& kv, std::span<const BlockCopy> copies, int n_layers) {
  check_copies(kv.spec(), copies);
  Backend& be = kv.backend();
  for_each_copy_part(
      kv, copies, [&](uint8_t* dst, const uint8_t* src, size_t n) { be.copy_device(dst, src, n); }, n_layers);
}

bool kv_token_moves_supported(const KvCacheSpec& spec) {
  return spec.k_format.scale != KvScale::Channel && spec.v_format.scale != KvScale::Channel;
}

void move_kv_tokens(const KvCache& kv, std::span<const KvTokenMove> moves) {
  const KvCacheSpec& spec = kv.spec();
  TESSERA_CHECK(moves.empty() || kv_token_moves_supported(spec),
                "KV token move: int4 KIVI keys keep their scales per page, not per token");
  for (const KvTokenMove& m : moves) {
    const int64_t n = static_cast<int64_t>(m.local ? spec.n_local_blocks : spec.n_blocks) * spec.block_size;
    TESSERA_CHECK(m.src >= 0 && m.src < n && m.dst >= 0 && m.dst < n, "KV token move: ", m.local ? "local " : "",
                  "slot ", m.src, " -> ", m.dst, " outside [0, ", n, ")");
  }
  std::vector<KvSlotMove> full, local;
  for (const KvTokenMove& m : moves) (m.local ? local : full).push_back({m.src, m.dst});
  for (int l = 0; l < spec.n_layers; ++l) {
    const std::vector<KvSlotMove>& group = spec.in_local_group(l) ? local : full;
    if (!group.empty()) kv.backend().move_kv_tokens(kv.layer(l), group);
  }
}

namespace {

void check_swaps(const KvCacheSpec& spec, const HostKvTier& host, std::span<const BlockSwap> swaps) {
  TESSERA_CHECK(host.slot_bytes() == kv_block_bytes(spec), "KV swap: host slots of ", host.slot_bytes(),
                " bytes for blocks of ", kv_block_bytes(spec));
  for (const BlockSwap& s : swaps) {
    const int n = s.local ? spec.n_local_blocks : spec.n_blocks;
    TESSERA_CHECK(s.device >= 0 && s.device < n && s.host >= 0 && s.host < host.n_slots(),
                  "KV swap: ", s.local ? "local " : "", "block ", s.device, " <-> host slot ", s.host, " outside [0, ",
                  n, ") x [0, ", host.n_slots(), ")");
  }
}

// Calls copy(device bytes, host bytes, n) for K and V of every layer of each swap's group
// (a slot is laid out for all layers; a block of one group fills that group's layers).
template <typename Copy>
void for_each_swap_part(const KvCache& kv, uint8_t* host_base, int64_t slot_bytes, std::span<const BlockSwap> swaps,
                        Copy copy) {
  const KvCacheSpec& spec = kv.spec();
  const size_t kb = spec.k_layer_block_bytes(), vb = spec.v_layer_block_bytes();
  for (const BlockSwap& s : swaps) {
    uint8_t* slot = host_base + static_cast<size_t>(s.host) * slot_bytes;
    for (int l = 0; l < spec.n_layers; ++l) {
      if (spec.in_local_group(l) != s.local) continue;
      const KvLayerView view = kv.layer(l);
      copy(static_cast<uint8_t*>(view.k) + s.device * kb, slot + l * (kb + vb), kb);
      copy(static_cast<uint8_t*>(view.v) + s.device * vb, slot + l * (kb + vb) + kb, vb);
    }
  }
}
}  // namespace

HostKvTier::HostKvTier(const KvCacheSpec& spec, int n_slots) : n_slots_(n_slots), slot_bytes_(kv_block_bytes(spec)) {
  TESSERA_CHECK(n_slots >= 0, "host KV tier: negative slot count ", n_slots);
  TESSERA_CHECK(slot_bytes_ > 0, "host KV tier: a block of this model takes ", slot_bytes_, " bytes");
  if (n_slots > 0)
    data_ = std::shared_ptr<void>(new uint8_t[static_cast<size_t>(n_slots) * slot_bytes_],
                                  [](void* p) { delete[] static_cast<uint8_t*>(p); });
}

HostKvTier::HostKvTier(const KvCacheSpec& spec, int n_slots, Backend& backend)
    : n_slots_(n_slots), slot_bytes_(kv_block_bytes(spec)) {
  TESSERA_CHECK(n_slots >= 0, "host KV tier: negative slot count ", n_slots);
  TESSERA_CHECK(slot_bytes_ > 0, "host KV tier: a block of this model takes ", slot_bytes_, " bytes");
  if (n_slots > 0) data_ = backend.alloc_host(static_cast<size_t>(n_slots) * slot_bytes_);
}

uint8_t* HostKvTier::slot(int32_t h) {
  TESSERA_CHECK(h >= 0 && h < n_slots_, "host KV tier: slot ", h, " outside [0, ", n_slots_, ")");
  return static_cast<uint8_t*>(data_.get()) + static_cast<size_t>(h) * slot_bytes_;
}

const uint8_t* HostKvTier::slot(int32_t h) const { return const_cast<HostKvTier*>(this)->slot(h); }

void swap_out_kv_blocks_host(const KvCache& kv, HostKvTier& host, std::span<const BlockSwap> swaps) {
  check_swaps(kv.spec(), host, swaps);
  if (swaps.empty()) return;
  for_each_swap_part(kv, host.slot(0), host.slot_bytes(), swaps,
                     [](uint8_t* device, uint8_t* slot, size_t n) { std::memcpy(slot, device, n); });
}

void swap_in_kv_blocks_host(const KvCache& kv, const HostKvTier& host, std::span<const BlockSwap> swaps) {
  check_swaps(kv.spec(), host, swaps);
  if (swaps.empty()) return;
  for_each_swap_part(kv, const_cast<uint8_t*>(host.slot(0)), host.slot_bytes(), swaps,
                     [](uint8_t* device, uint8_t* slot, size_t n) { std::memcpy(device, slot, n); });
}

void swap_out_kv_blocks(const KvCache& kv, HostKvTier& host, std::span<const BlockSwap> swaps) {
  check_swaps(kv.spec(), host, swaps);
  if (swaps.empty()) return;
  Backend& be = kv.backend();
  for_each_swap_part(kv, host.slot(0), host.slot_bytes(), swaps,
                     [&](uint8_t* device, uint8_t* slot, size_t n) { be.copy_to_host_async(slot, device, n); });
  be.synchronize();
}

void swap_in_kv_blocks(const KvCache& kv, const HostKvTier& host, std::span<const BlockSwap> swaps) {
  check_swaps(kv.spec(), host, swaps);
  if (swaps.empty()) return;
  Backend& be = kv.backend();
  for_each_swap_part(kv, const_cast<uint8_t*>(host.slot(0)), host.slot_bytes(), swaps,
                     [&](uint8_t* device, uint8_t* slot, size_t n) { be.copy_to_device_async(device, slot, n); });
  be.synchronize();
}

int64_t kv_block_bytes(const KvCacheSpec& spec) { return spec.block_bytes(); }

int kv_blocks_for_budget(const KvCacheSpec& spec, int64_t budget_bytes) {
  const int64_t per_block = kv_block_bytes(spec);
  TESSERA_CHECK(per_block > 0, "KV sizing: a block of this model takes ", per_block, " bytes");
  const int64_t n = budget_bytes / per_block;
  TESSERA_CHECK(n >= 1, "KV sizing: a budget of ", budget_bytes, " bytes holds no block of ", per_block, " bytes");
  return static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int32_t>::max() / spec.block_size));
}

KvPoolSizes kv_pools_for_budget(const KvCacheSpec& spec, int64_t budget_bytes, int window, int max_num_seqs,
                                int max_batched_tokens, int64_t max_blocks) {
  TESSERA_CHECK(window >= 1 && max_num_seqs >= 1 && max_batched_tokens >= 1 && max_blocks >= 1, "KV sizing: window ",
                window, ", ", max_num_seqs, " sequences, ", max_batched_tokens, " tokens a step, at most ", max_blocks,
                " blocks");
  KvCacheSpec with_group = spec;
  with_group.n_local_blocks = std::max(with_group.n_local_blocks, 1);  // makes the group count
  const int bs = spec.block_size;
  const int64_t full = with_group.full_block_bytes(), local = with_group.local_block_bytes();
  const int64_t limit = std::min<int64_t>(max_blocks, std::numeric_limits<int32_t>::max() / bs);
  // One sequence's step: its window before the first new token, the new tokens, and the
  // partial blocks at both ends; every sequence at once: one window each plus one step.
  const int64_t step = (window - 1 + max_batched_tokens) / bs + 2;
  const int64_t all_windows = static_cast<int64_t>(max_num_seqs) * ((window - 1) / bs + 3) + max_batched_tokens / bs;
  const int64_t one_pool = budget_bytes / (full + local);
  KvPoolSizes sizes;
  if (all_windows >= one_pool) {
    TESSERA_CHECK(one_pool >= 1, "KV sizing: a budget of ", budget_bytes, " bytes holds no block of ", full + local,
                  " bytes");
    sizes.n_blocks = sizes.n_local_blocks = static_cast<int>(std::min(one_pool, limit));
    return sizes;
  }
  const int64_t n_full = full > 0 ? (budget_bytes - local * all_windows) / full : limit;
  sizes.n_blocks = static_cast<int>(std::min(n_full, limit));
  sizes.n_local_blocks = static_cast<int>(std::max(step, std::min<int64_t>(all_windows, sizes.n_blocks)));
  return sizes;
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
