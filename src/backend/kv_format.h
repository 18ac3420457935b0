#pragma once
// The storage formats of the paged KV cache (docs/design/kv-quant.md).
//
// K and V each have a format. A layer's K (or V) storage is an array of pages, one per
// (block, KV head): page p = block * n_kv_heads + head starts at byte p * page_bytes. A page
// holds the block's `block_size` tokens of that head, token-major (`row_bytes` each), then the
// page's own scales ("meta"), so a page -- and therefore a block -- is self-contained: prefix
// sharing, copy-on-write, swap and copies between tiers move bytes and never re-encode.
// Static scales (per tensor, per KV head) and the TurboQuant constants belong to the layer,
// not to a page: they are the same for every block (KvLayerConstants).
//
// Codecs and their pages ([bs] tokens of [hd] channels):
//   f32, f16     data only
//   fp8_e4m3/e5m2  1-byte codes; scale per tensor / per KV head (static, layer constants,
//                default 1.0 as vLLM), or per token-head (dynamic, f16 in the page)
//   int8         symmetric codes; f16 scale per token-head, or per token per group of channels
//   int4         asymmetric (scale, min as f16 pairs), two codes per byte (low nibble first):
//                per token per group of channels, or KIVI's per channel over the page's tokens
//   turbo        TurboQuant: x (keys: x − μ, the calibrated mean key, when given) rotated by
//                R = H·D/sqrt(hd) (random signs D, Walsh–Hadamard H), coordinates scaled by
//                sqrt(hd)/|x| and coded with a Lloyd–Max codebook of the sphere's marginal
//                (bits_hi for channels [0, hd/2), bits_lo for the rest), codes as bit planes;
//                keys with :qjl add a 1-bit QJL sketch sign(S·r) of the residual r and |r|, so
//                q·k is estimated without bias. Meta: f16 scale making <x̂, x> = |x|²
//                (:qjl keys: |x|, and f16 |r|).
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace tessera {

enum class KvCodec : uint8_t { F32, F16, Fp8E4M3, Fp8E5M2, Int8, Int4, Turbo };

enum class KvScale : uint8_t {
  None,     // f32 / f16 / turbo
  Tensor,   // fp8: one static scale per layer (layer constants)
  Head,     // fp8: one static scale per KV head (layer constants)
  Token,    // fp8, int8: one f16 scale per token-head (page meta)
  Group,    // int8: f16 scale, int4: (f16 scale, f16 min), per token per `group` channels
  Channel,  // int4 (KIVI keys): (f16 scale, f16 min) per channel over the page's tokens
};

// Trivially copyable: kernels take it by value.
struct KvFormat {
  KvCodec codec = KvCodec::F16;
  KvScale scale = KvScale::None;
  int16_t group = 0;   // channels per group (KvScale::Group)
  int8_t bits_hi = 0;  // turbo: codebook bits of channels [0, hd/2) ...
  int8_t bits_lo = 0;  // ... and of [hd/2, hd) (K: the MSE part; QJL adds one bit)
  bool qjl = false;    // turbo keys: 1-bit QJL sketch of the residual

  bool is_plain() const { return codec == KvCodec::F32 || codec == KvCodec::F16; }
  bool is_fp8() const { return codec == KvCodec::Fp8E4M3 || codec == KvCodec::Fp8E5M2; }
  bool static_scale() const { return scale == KvScale::Tensor || scale == KvScale::Head; }
  // Keys in this format are stored centered, k − μ, when calibrated means are given (layer
  // constants): TurboQuant codes each key relative to its norm, which a large per-channel
  // offset would dominate. Scores shift by q·μ for every key of a query: softmax unchanged.
  bool centers_keys() const { return codec == KvCodec::Turbo; }
  // F16 / F32 for the plain codecs, Unknown otherwise.
  DType plain_dtype() const;
  bool operator==(const KvFormat&) const = default;
};

// The plain formats.
KvFormat kv_format_of(DType plain);  // F16 or F32

// Parses a format name as --kv-cache-dtype takes it (docs/design/kv-quant.md):
//   f16 | f32 | auto (= f16)
//   fp8 | fp8_e4m3 | fp8_e5m2 [:tensor | :head | :token]     default :tensor (vLLM's meaning)
//   int8 [:token | :gN]                                       default :token
//   int4 [:kivi | :gN]        default kivi: K per channel, V per token in groups of 32
//   turbo2.5 | turbo3 | turbo3.5 | turbo4 [:mse | :qjl]   keys: :mse (default) codes only,
//                                                         :qjl with the QJL sketch
// `for_keys` picks the K half of the pair formats (int4 KIVI, turbo's QJL). Throws with the
// accepted names on anything else.
KvFormat parse_kv_format(std::string_view name, bool for_keys);
// The canonical name: parse_kv_format(kv_format_name(f, k), k) == f.
std::string kv_format_name(const KvFormat& f, bool for_keys = false);
// Checks that a format can store heads of `head_dim` channels in blocks of `block_size`
// tokens (group divides head_dim, turbo needs a power of two >= 16, ...); throws naming why.
void check_kv_format(const KvFormat& f, int head_dim, int block_size);

// Where things are in one page.
struct KvPageLayout {
  int64_t row_bytes = 0;    // one token's codes (turbo keys: codes then QJL signs)
  int64_t meta_offset = 0;  // = block_size * row_bytes
  int64_t meta_bytes = 0;
  int64_t page_bytes = 0;  // meta_offset + meta_bytes, rounded up to 16 unless plain
  // Turbo: bytes of one bit plane of a half ([hd/2] bits) and where the QJL signs start.
  int64_t plane_bytes = 0;
  int64_t qjl_offset = 0;
};
KvPageLayout kv_page_layout(const KvFormat& f, int block_size, int head_dim);
// Storage bits per element, meta included (what the capacity gain is computed from).
double kv_bits_per_element(const KvFormat& f, int block_size, int head_dim);

// Largest finite magnitude of the fp8 codecs (448 for e4m3, 57344 for e5m2).
float fp8_max(KvCodec codec);

}  // namespace tessera
