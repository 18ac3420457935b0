// Backend::move_kv_tokens' default: each moved token's codes and its own scales, head by
// head, through copy_device (a memcpy on the host; a device backend has its own kernel).
#include "backend/backend.h"

namespace tessera {

void Backend::move_kv_tokens(const KvLayerView& kv, std::span<const KvSlotMove> moves) {
  const int bs = kv.block_size;
  for (int part = 0; part < 2; ++part) {
    const KvFormat& f = part == 0 ? kv.k_fmt : kv.v_fmt;
    const KvPageLayout pl = kv_page_layout(f, bs, kv.head_dim);
    const int64_t page_bytes = part == 0 ? kv.k_page_bytes : kv.v_page_bytes;
    const int64_t meta = pl.meta_bytes / bs;  // one token's scales (token-major in the page)
    auto* bytes = static_cast<uint8_t*>(part == 0 ? kv.k : kv.v);
    for (const KvSlotMove& m : moves)
      for (int h = 0; h < kv.n_kv_heads; ++h) {
        uint8_t* src = bytes + (static_cast<int64_t>(m.src / bs) * kv.n_kv_heads + h) * page_bytes;
        uint8_t* dst = bytes + (static_cast<int64_t>(m.dst / bs) * kv.n_kv_heads + h) * page_bytes;
        copy_device(dst + (m.dst % bs) * pl.row_bytes, src + (m.src % bs) * pl.row_bytes, pl.row_bytes);
        if (meta > 0)
          copy_device(dst + pl.meta_offset + (m.dst % bs) * meta, src + pl.meta_offset + (m.src % bs) * meta, meta);
      }
  }
}

}  // namespace tessera
