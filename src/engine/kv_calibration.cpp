#include "engine/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

namespace {

// Max |x| over a page's first n tokens (plain f16 / f32 rows of head_dim).
float page_absmax(const uint8_t* page, DType dtype, int n, int head_dim) {
  float m = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(n) * head_dim; ++i) {
    float x;
    if (dtype == DType::F32) {
      std::memcpy(&x, page + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, page + 2 * i, 2);
      x = fp16_to_f32(h);
    }
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

std::vector<std::vector<float>> rows_for(const std::vector<std::vector<float>>& amax, const KvFormat& f) {
  std::vector<std::vector<float>> rows;
  if (!f.static_scale()) return rows;
  TESSERA_CHECK(f.is_fp8(), "KV calibration: static scales are for fp8 formats, not ", kv_format_name(f));
  for (const auto& heads : amax) {
    std::vector<float> r;
    const auto scale = [&](float a) { return a > 0 ? a / fp8_max(f.codec) : 1.0f; };
    if (f.scale == KvScale::Tensor)
      r.push_back(scale(*std::max_element(heads.begin(), heads.end())));
    else
      for (float a : heads) r.push_back(scale(a));
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

KvAbsMax measure_kv_absmax(Session& session, std::span<const int32_t> tokens, int window, int max_chunks) {
  KvCache& kv = session.kv();
  const KvCacheSpec& spec = kv.spec();
  const DType dtype = spec.k_format == spec.v_format ? spec.k_format.plain_dtype() : DType::Unknown;
  TESSERA_CHECK(dtype != DType::Unknown, "KV calibration needs an f16 or f32 cache, not ", spec.format_name());
  TESSERA_CHECK(window >= 2 && window <= session.ctx(), "KV calibration window ", window, " is outside [2, ",
                session.ctx(), "]");
  int n_chunks = static_cast<int>(tokens.size() / window);
  TESSERA_CHECK(n_chunks >= 1, "KV calibration needs at least ", window, " tokens, the text has ", tokens.size());
  if (max_chunks > 0) n_chunks = std::min(n_chunks, max_chunks);
  session.provision_kv(window);
  const bool add_bos = session.has_tokenizer() && session.tokenizer().add_bos();
  const int bs = spec.block_size;

  KvAbsMax r;
  r.k.assign(spec.n_layers, std::vector<float>(spec.n_kv_heads, 0.0f));
  r.v = r.k;
  std::vector<int32_t> chunk(window);
  std::vector<uint8_t> host;
  std::vector<float> no_logits;  // feed() wants a buffer; Logits::None fills nothing
  for (int c = 0; c < n_chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<int64_t>(c) * window, window, chunk.begin());
    if (add_bos) chunk[0] = session.tokenizer().bos_id();
    SequenceBlocks seq;
    no_logits.clear();
    session.feed(seq, chunk, ForwardBatch::Logits::None, no_logits);
    session.backend().synchronize();
    // Read every layer's pages of this sequence back (a device cache through the backend).
    for (int l = 0; l < spec.n_layers; ++l) {
      const KvLayerView view = kv.layer(l);
      for (int part = 0; part < 2; ++part) {
        const int64_t page_bytes = part == 0 ? view.k_page_bytes : view.v_page_bytes;
        const auto* base = static_cast<const uint8_t*>(part == 0 ? view.k : view.v);
        auto& out = part == 0 ? r.k[l] : r.v[l];
        host.resize(static_cast<size_t>(page_bytes) * spec.n_kv_heads);
        for (size_t b = 0; b < seq.blocks.size(); ++b) {
          const int n = std::min<int>(bs, window - static_cast<int>(b) * bs);
          session.backend().copy_to_host(host.data(), base + seq.blocks[b] * page_bytes * spec.n_kv_heads, host.size());
          for (int h = 0; h < spec.n_kv_heads; ++h)
            out[h] = std::max(out[h], page_absmax(host.data() + h * page_bytes, dtype, n, spec.head_dim));
        }
      }
    }
    seq.release_all(session.pool());
    r.tokens += window;
  }
  return r;
}

KvScales kv_scales_from_absmax(const KvAbsMax& amax, const KvFormat& k_format, const KvFormat& v_format) {
  KvScales s;
  s.k = rows_for(amax.k, k_format);
  s.v = rows_for(amax.v, v_format);
  return s;
}

}  // namespace tessera
