#include "kv/kv_cache.h"

#include <cstring>
#include <span>

#include "backend/kv_codec.h"

#include "core/error.h"

namespace tessera {

std::string KvCacheSpec::format_name() const {
  const std::string k = kv_format_name(k_format, true), v = kv_format_name(v_format);
  // int4's KIVI pair (per-channel keys, per-token values) is one name, as the flag takes it.
  if (k == v || (k == "int4:channel" && v == "int4:g32")) return k == v ? k : "int4";
  return "k=" + k + " v=" + v;
}

uint64_t KvCacheSpec::constants_digest() const {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the rows' lengths and bytes
  const auto add = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  };
  const int64_t rope[2] = {k_rope_dim, k_rope_neox ? 1 : 0};
  add(rope, sizeof rope);
  for (const auto* rows : {&k_scales, &v_scales, &k_mean, &k_equal, &k_rope_freq, &k_first}) {
    const uint64_t n = rows->size();
    add(&n, sizeof n);
    for (const auto& r : *rows) {
      const uint64_t m = r.size();
      add(&m, sizeof m);
      add(r.data(), sizeof(float) * r.size());
    }
  }
  return h;
}

KvCacheSpec KvCacheSpec::kv_heads(int first, int n) const {
  TESSERA_CHECK(first >= 0 && n >= 1 && first + n <= n_kv_heads, "KV cache: heads [", first, ", ", first + n,
                ") are not heads of a cache of ", n_kv_heads);
  KvCacheSpec s = *this;
  s.n_kv_heads = n;
  s.kv_head_first = kv_head_first + first;
  s.n_kv_heads_whole = n_kv_heads_whole > 0 ? n_kv_heads_whole : n_kv_heads;
  const auto per_head = [&](std::vector<std::vector<float>>& rows, int64_t width, const char* what) {
    for (std::vector<float>& row : rows) {
      if (width == 1 && row.size() == 1) continue;  // one scale for the whole tensor
      TESSERA_CHECK(row.size() == static_cast<size_t>(n_kv_heads * width), "KV cache: ", what, " rows of ", row.size(),
                    " values for ", n_kv_heads, " KV heads x ", width);
      row = std::vector<float>(row.begin() + first * width, row.begin() + (first + n) * width);
    }
  };
  per_head(s.k_scales, 1, "K scale");
  per_head(s.v_scales, 1, "V scale");
  per_head(s.k_mean, head_dim, "key mean");
  per_head(s.k_equal, head_dim, "key equalization");
  per_head(s.k_first, head_dim, "first-key center");
  return s;
}

KvCacheSpec KvCacheSpec::layers(int first, int n) const {
  TESSERA_CHECK(first >= 0 && n >= 1 && first + n <= n_layers, "KV cache: layers [", first, ", ", first + n,
                ") are not layers of a cache of ", n_layers);
  KvCacheSpec s = *this;
  s.n_layers = n;
  s.layer_first = layer_first + first;
  const auto per_layer = [&](auto& rows) {
    if (rows.size() == static_cast<size_t>(n_layers)) rows.assign(rows.begin() + first, rows.begin() + first + n);
  };
  per_layer(s.k_scales);
  per_layer(s.v_scales);
  per_layer(s.k_mean);
  per_layer(s.k_equal);
  per_layer(s.k_rope_freq);
  per_layer(s.k_first);
  per_layer(s.local_layers);
  return s;
}

int KvCacheSpec::n_group_layers(bool local) const {
  int n = 0;
  for (int il = 0; il < n_layers; ++il) n += in_local_group(il) == local;
  return n;
}

namespace {
// The layer's constants in backend memory, or null when the format has none.
void* upload_constants(Backend& backend, const KvCacheSpec& spec, const KvFormat& f, int layer, bool is_key) {
  if (f.is_plain()) return nullptr;
  const auto& scales = is_key ? spec.k_scales : spec.v_scales;
  TESSERA_CHECK(scales.empty() || scales.size() == static_cast<size_t>(spec.n_layers), "KV cache: ", is_key ? "K" : "V",
                " scales for ", scales.size(), " layers, the model has ", spec.n_layers);
  if (!scales.empty())
    TESSERA_CHECK(f.static_scale(), "KV cache: static ", is_key ? "K" : "V", " scales given, but ", kv_format_name(f),
                  " computes its scales per token");
  const std::span<const float> s = scales.empty() ? std::span<const float>() : std::span<const float>(scales[layer]);
  std::span<const float> mean;
  if (is_key && !spec.k_mean.empty()) {
    TESSERA_CHECK(f.centers_keys(), "KV cache: key means given, but ", kv_format_name(f, true),
                  " does not center its keys (TurboQuant keys do)");
    TESSERA_CHECK(spec.k_mean.size() == static_cast<size_t>(spec.n_layers), "KV cache: key means for ",
                  spec.k_mean.size(), " layers, the model has ", spec.n_layers);
    mean = spec.k_mean[layer];
  }
  std::span<const float> equal;
  if (is_key && !spec.k_equal.empty()) {
    TESSERA_CHECK(!spec.k_mean.empty(), "KV cache: key equalization given without key means");
    TESSERA_CHECK(spec.k_equal.size() == static_cast<size_t>(spec.n_layers), "KV cache: key equalization for ",
                  spec.k_equal.size(), " layers, the model has ", spec.n_layers);
    equal = spec.k_equal[layer];
  }
  KvRopeCentering rope;
  if (is_key && spec.k_rope_dim > 0) {
    TESSERA_CHECK(!spec.k_mean.empty() && spec.k_rope_freq.size() == static_cast<size_t>(spec.n_layers),
                  "KV cache: position-aware key centering needs pre-RoPE key means and RoPE frequencies for each of ",
                  spec.n_layers, " layers (got ", spec.k_rope_freq.size(), ")");
    TESSERA_CHECK(backend.supports_key_centering_by_position(), "KV cache: the ", backend.name(),
                  " backend does not read position-aware key centering (a calibration file with \"k_rope\"; "
                  "use --device cpu)");
    rope = {spec.k_rope_dim, spec.k_rope_neox, spec.k_rope_freq[layer], {}};
  }
  if (is_key && !spec.k_first.empty()) {
    TESSERA_CHECK(!spec.k_mean.empty() && spec.k_first.size() == static_cast<size_t>(spec.n_layers),
                  "KV cache: first-key centers need key means and one row for each of ", spec.n_layers, " layers (got ",
                  spec.k_first.size(), ")");
    rope.first = spec.k_first[layer];
  }
  const std::vector<float> host =
      make_kv_constants(f, spec.n_kv_heads, spec.head_dim, spec.layer_first + layer, is_key, spec.seed, s, mean, equal,
                        rope, {spec.kv_head_first, spec.n_kv_heads_whole});
  void* dev = backend.alloc(sizeof(float) * host.size());
  backend.copy_to_device(dev, host.data(), sizeof(float) * host.size());
  return dev;
}
}  // namespace

KvCache::KvCache(Backend& backend, const KvCacheSpec& spec) : backend_(backend), spec_(spec) {
  TESSERA_CHECK(spec.block_size >= 1 && spec.block_size <= 1024, "KV cache: block size ", spec.block_size,
                " is outside [1, 1024]");
  TESSERA_CHECK(spec.n_blocks >= 1, "KV cache: needs at least one block");
  TESSERA_CHECK(spec.n_local_blocks >= 0 &&
                    (spec.n_local_blocks == 0 || spec.local_layers.size() == static_cast<size_t>(spec.n_layers)),
                "KV cache: a local pool of ", spec.n_local_blocks, " blocks needs a local flag for each of the ",
                spec.n_layers, " layers (got ", spec.local_layers.size(), ")");
  for (const KvFormat& f : {spec.k_format, spec.v_format}) {
    check_kv_format(f, spec.head_dim, spec.block_size);
    TESSERA_CHECK(backend.supports_kv_format(f), "KV cache: the ", backend.name(), " backend does not store KV as ",
                  kv_format_name(f));
  }
  k_.resize(spec.n_layers, nullptr);
  v_.resize(spec.n_layers, nullptr);
  k_consts_.resize(spec.n_layers, nullptr);
  v_consts_.resize(spec.n_layers, nullptr);
  try {
    for (int i = 0; i < spec.n_layers; ++i) {
      k_[i] = backend_.alloc(static_cast<size_t>(spec.k_layer_block_bytes()) * spec.layer_blocks(i));
      v_[i] = backend_.alloc(static_cast<size_t>(spec.v_layer_block_bytes()) * spec.layer_blocks(i));
      k_consts_[i] = upload_constants(backend_, spec, spec.k_format, i, true);
      v_consts_[i] = upload_constants(backend_, spec, spec.v_format, i, false);
    }
  } catch (...) {
    release();
    throw;
  }
}

void KvCache::release() {
  for (auto* list : {&k_, &v_, &k_consts_, &v_consts_})
    for (void*& p : *list) {
      if (p) backend_.free(p);
      p = nullptr;
    }
}

KvCache::~KvCache() { release(); }

KvLayerView KvCache::layer(int i) const {
  KvLayerView view;
  view.k = k_[i];
  view.v = v_[i];
  view.k_fmt = spec_.k_format;
  view.v_fmt = spec_.v_format;
  view.n_blocks = spec_.layer_blocks(i);
  view.block_size = spec_.block_size;
  view.n_kv_heads = spec_.n_kv_heads;
  view.head_dim = spec_.head_dim;
  view.k_page_bytes = spec_.k_page_bytes();
  view.v_page_bytes = spec_.v_page_bytes();
  view.k_consts = static_cast<const float*>(k_consts_[i]);
  view.v_consts = static_cast<const float*>(v_consts_[i]);
  return view;
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
