#pragma once
// Encoding and decoding of KV pages (layouts in kv_format.h), on the host: the CPU backend's
// store and attention use these, the tests check them against float64, and the CUDA kernels
// follow the same bit layouts. The decoders are static inline: each CPU ISA translation unit
// (cpu_ops_avx2.cpp, ...) compiles its own copy with its own instructions, and the linker
// never mixes them (an ordinary inline function would be one copy, of any ISA).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "backend/kv_format.h"
#include "core/fp16.h"

namespace tessera {

// ---- Layer constants: one float array per layer and K/V, in the backend's memory ----
// [scales: n_kv_heads] [code_hi: 16] [code_lo: 16] [signs: n_kv_heads * hd] [qjl: n_kv_heads * hd * hd]
// [mean: n_kv_heads * hd] [store_signs: n_kv_heads * hd]
// scales: the static fp8 scale of each head (1 when the format has none); code_*: turbo
// codebook centroids (unit-variance coordinates), signs: the diagonal the *query* side
// rotates with: turbo's random ±1 diagonal D, times the per-channel key equalization s for
// equalized keys (D∘s: q' = R (q∘s) costs nothing more than q' = R q); qjl: the QJL
// projection S (row-major [hd out][hd in], N(0, 1) entries); mean (formats that center
// keys, KvFormat::centers_keys): the calibrated mean key μ the store subtracts (zeros for V
// and without calibration); store_signs (same formats): the diagonal the store rotates
// with, D/s (D for V and without equalization), so keys are stored as R ((k − μ)/s) and
// (q∘s)·((k − μ)/s) = q·(k − μ); rope (same formats): [rot_dim, neox, inv_freq: hd/2] for
// position-aware centering: with rot_dim > 0, mean holds the pre-RoPE mean m and the store
// subtracts R(p)·m (R(p) the key's own RoPE rotation), which attention adds back as q·R(p)·m
// (rot_dim 0: static μ); first (same formats): [flag, n_kv_heads * hd] the center of the key
// at position 0 (flag 1: present), which the store subtracts there instead and attention
// adds back (q·first) for that one key. Absent parts have size 0; the centering parts come
// last so the other offsets do not depend on them.
struct KvConstantsLayout {
  int64_t scales = 0, code_hi = 0, code_lo = 0, signs = 0, qjl = 0, mean = 0, store_signs = 0, rope = 0, first = 0,
          total = 0;
};
// Centering by position for the keys of a format that centers them: the RoPE of
// position-aware centering (rot_dim 0: none; inv_freq [rot_dim / 2]) and the center of the
// key at position 0 (first: empty = that key centered like the others; else n_kv_heads * hd
// values, head-major). Position 0's key is the attention sink of most models: it sits far
// from the other keys' mean, every later query reads it strongly, and a code relative to
// its own norm spends the bits on that offset (docs/design/kv-quant.md, "The first key").
struct KvRopeCentering {
  int rot_dim = 0;
  bool neox = false;
  std::span<const float> inv_freq;
  std::span<const float> first;
};
KvConstantsLayout kv_constants_layout(const KvFormat& f, int n_kv_heads, int head_dim);
// Builds the constants of one layer's K (is_key) or V. Turbo's signs and S are drawn from a
// generator seeded by (seed, layer, is_key), so they are the same on every run and backend.
// static_scales: empty (1.0), one (per tensor) or n_kv_heads values (fp8 :tensor / :head).
// mean: empty (zeros) or n_kv_heads * head_dim values (head-major), for a format that
// centers keys; equal: empty (s = 1) or n_kv_heads * head_dim finite positive key
// equalization scales s (head-major; keys of a centering format only). Throws naming what is
// wrong otherwise.
// heads: the constants are those of KV heads [first, first + n_kv_heads) of a cache of
// `whole` heads (a tensor-parallel rank's slice; whole 0 = n_kv_heads): the random draws run
// over all `whole` heads and keep the slice's, so a rank stores what the whole cache stores.
struct KvHeadSlice {
  int first = 0;
  int whole = 0;
};
std::vector<float> make_kv_constants(const KvFormat& f, int n_kv_heads, int head_dim, int layer, bool is_key,
                                     uint64_t seed, std::span<const float> static_scales,
                                     std::span<const float> mean = {}, std::span<const float> equal = {},
                                     const KvRopeCentering& rope = {}, const KvHeadSlice& heads = {});
// Lloyd–Max centroids (ascending, 2^bits of them) for one coordinate of a uniformly random
// unit vector in `dim` dimensions scaled by sqrt(dim): density ∝ (1 - t²/dim)^((dim-3)/2).
std::vector<double> turbo_codebook(int bits, int dim);

// The constants of one head, as pointers into a layer's array.
struct KvHeadConstants {
  float scale = 1.0f;
  const float* code_hi = nullptr;
  const float* code_lo = nullptr;
  const float* signs = nullptr;        // [hd] the query side's diagonal (D, or D∘s for equalized keys)
  const float* store_signs = nullptr;  // [hd] the store's diagonal (D/s; = signs where there is no s)
  const float* qjl = nullptr;          // [hd, hd]
  const float* mean = nullptr;         // [hd] subtracted before encoding (formats that center keys)
  const float* rope_freq = nullptr;    // [rope_dim / 2] position-aware centering: mean is pre-RoPE
  const float* first = nullptr;        // [hd] the center of the key at position 0, or null
  int rope_dim = 0;
  bool rope_neox = false;
};
inline KvHeadConstants kv_head_constants(const KvFormat& f, const float* layer, int n_kv_heads, int hd, int head) {
  KvHeadConstants c;
  if (!layer) return c;
  const KvConstantsLayout l = kv_constants_layout(f, n_kv_heads, hd);
  c.scale = layer[l.scales + head];
  if (f.codec == KvCodec::Turbo) {
    c.code_hi = layer + l.code_hi;
    c.code_lo = layer + l.code_lo;
    c.signs = c.store_signs = layer + l.signs + static_cast<int64_t>(head) * hd;
    if (f.qjl) c.qjl = layer + l.qjl + static_cast<int64_t>(head) * hd * hd;
  }
  if (f.centers_keys()) {
    c.mean = layer + l.mean + static_cast<int64_t>(head) * hd;
    c.store_signs = layer + l.store_signs + static_cast<int64_t>(head) * hd;
    c.rope_dim = static_cast<int>(layer[l.rope]);
    c.rope_neox = layer[l.rope + 1] != 0;
    if (c.rope_dim > 0) c.rope_freq = layer + l.rope + 2;
    if (layer[l.first] != 0) c.first = layer + l.first + 1 + static_cast<int64_t>(head) * hd;
  }
  return c;
}

// out = R(pos)·in for the pairs of a RoPE of rot_dim channels (neox: (i, i + rot/2), else
// (2i, 2i + 1)); channels from rot_dim on are copied. cos_sin: [rot/2] cos then [rot/2] sin.
static inline void kv_rope_apply(const float* in, const float* cos_sin, int rot_dim, bool neox, int hd, float* out) {
  const int half = rot_dim / 2;
  const float* sn = cos_sin + half;
  for (int i = 0; i < half; ++i) {
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    out[a] = in[a] * cos_sin[i] - in[b] * sn[i];
    out[b] = in[a] * sn[i] + in[b] * cos_sin[i];
  }
  for (int d = rot_dim; d < hd; ++d) out[d] = in[d];
}
// cos_sin [rope_dim] of position pos for position-aware centering (angles in double).
static inline void kv_rope_angles(const KvHeadConstants& c, double pos, float* cos_sin) {
  const int half = c.rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = pos * static_cast<double>(c.rope_freq[i]);
    cos_sin[i] = static_cast<float>(std::cos(a));
    cos_sin[half + i] = static_cast<float>(std::sin(a));
  }
}
// The centering a key at position pos is stored relative to: the first key's center at
// position 0 (when given), R(pos)·m (position-aware), μ (static) or none. out: [hd]; cos_sin:
// [hd] scratch.
static inline void kv_key_center(const KvHeadConstants& c, int hd, int pos, float* cos_sin, float* out) {
  if (pos == 0 && c.first) {
    std::memcpy(out, c.first, sizeof(float) * hd);
  } else if (!c.mean) {
    std::memset(out, 0, sizeof(float) * hd);
  } else if (c.rope_dim == 0) {
    std::memcpy(out, c.mean, sizeof(float) * hd);
  } else {
    kv_rope_angles(c, pos, cos_sin);
    kv_rope_apply(c.mean, cos_sin, c.rope_dim, c.rope_neox, hd, out);
  }
}

// ---- Scalar pieces ----
uint8_t f32_to_fp8(float x, KvCodec codec);  // round to nearest even, saturating
float fp8_to_f32(uint8_t v, KvCodec codec);
const float* fp8_table(KvCodec codec);  // [256] decoded values
// In place, unnormalized: x <- H x (n a power of two).
static inline void fwht(float* x, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}
// y = R x = H·D·x / sqrt(n), and its inverse x = D·H·y / sqrt(n).
static inline void turbo_rotate(const float* x, const float* signs, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] = x[i] * signs[i];
  fwht(y, n);
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) y[i] *= s;
}
static inline void turbo_unrotate(float* y, const float* signs, int n) {
  fwht(y, n);
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) y[i] *= s * signs[i];
}

// ---- Encoding (kv_codec.cpp) ----
// Writes tokens [offset, offset + n) of one page from rows x[i * ldx + c] (f32). For the
// per-channel int4 keys, the page's tokens [0, offset) are re-coded when the new tokens
// widen a channel's range (one more rounding for them), and offset 0 starts a fresh page.
// scratch: at least kv_encode_scratch_floats(hd) floats. positions: the rows' positions,
// needed (non-null) when the keys are centered by position (c.rope_dim > 0 or c.first).
void kv_encode_rows(const KvFormat& f, const KvPageLayout& l, int head_dim, const KvHeadConstants& c, uint8_t* page,
                    int offset, int n, const float* x, int64_t ldx, float* scratch, const int32_t* positions = nullptr);
inline int64_t kv_encode_scratch_floats(int head_dim) { return 6 * static_cast<int64_t>(head_dim); }

// ---- Decoding ----
// Tokens [0, n) of a page as f32 rows out[j * hd + c]. Turbo: in the rotated basis
// (stored scale / sqrt(hd) · centroid, the scale about |x|); multiply rotated queries with it,
// rotate outputs back.
static inline void kv_decode_rows(const KvFormat& f, const KvPageLayout& l, int hd, const KvHeadConstants& c,
                                  const uint8_t* page, int n, float* out) {
  const uint8_t* meta = page + l.meta_offset;
  auto meta_f16 = [&](int64_t i) {
    uint16_t h;
    std::memcpy(&h, meta + 2 * i, 2);
    return fp16_to_f32(h);
  };
  switch (f.codec) {
    case KvCodec::F32:
      std::memcpy(out, page, sizeof(float) * n * hd);
      return;
    case KvCodec::F16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(page);
      for (int64_t i = 0; i < static_cast<int64_t>(n) * hd; ++i) out[i] = fp16_to_f32(h[i]);
      return;
    }
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2: {
      const float* lut = fp8_table(f.codec);
      for (int j = 0; j < n; ++j) {
        const float s = f.scale == KvScale::Token ? meta_f16(j) : c.scale;
        const uint8_t* r = page + static_cast<int64_t>(j) * l.row_bytes;
        for (int d = 0; d < hd; ++d) out[j * hd + d] = lut[r[d]] * s;
      }
      return;
    }
    case KvCodec::Int8: {
      const int g = f.scale == KvScale::Group ? f.group : hd, ng = hd / g;
      for (int j = 0; j < n; ++j) {
        const int8_t* r = reinterpret_cast<const int8_t*>(page + static_cast<int64_t>(j) * l.row_bytes);
        for (int q = 0; q < ng; ++q) {
          const float s = meta_f16(static_cast<int64_t>(j) * ng + q);
          for (int d = q * g; d < (q + 1) * g; ++d) out[j * hd + d] = static_cast<float>(r[d]) * s;
        }
      }
      return;
    }
    case KvCodec::Int4: {
      if (f.scale == KvScale::Channel) {
        for (int j = 0; j < n; ++j) {
          const uint8_t* r = page + static_cast<int64_t>(j) * l.row_bytes;
          for (int d = 0; d < hd; ++d) {
            const int code = (r[d / 2] >> (4 * (d & 1))) & 15;
            out[j * hd + d] = meta_f16(2 * d + 1) + static_cast<float>(code) * meta_f16(2 * d);
          }
        }
        return;
      }
      const int g = f.group, ng = hd / g;
      for (int j = 0; j < n; ++j) {
        const uint8_t* r = page + static_cast<int64_t>(j) * l.row_bytes;
        for (int q = 0; q < ng; ++q) {
          const int64_t m = 2 * (static_cast<int64_t>(j) * ng + q);
          const float s = meta_f16(m), mn = meta_f16(m + 1);
          for (int d = q * g; d < (q + 1) * g; ++d)
            out[j * hd + d] = mn + static_cast<float>((r[d / 2] >> (4 * (d & 1))) & 15) * s;
        }
      }
      return;
    }
    case KvCodec::Turbo: {
      const int half = hd / 2;
      const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
      for (int j = 0; j < n; ++j) {
        const uint8_t* r = page + static_cast<int64_t>(j) * l.row_bytes;
        const float norm = meta_f16(static_cast<int64_t>(j) * (f.qjl ? 2 : 1)) * inv_sqrt;
        for (int h = 0; h < 2; ++h) {
          const int bits = h == 0 ? f.bits_hi : f.bits_lo;
          const float* code = h == 0 ? c.code_hi : c.code_lo;
          const uint8_t* planes = r + (h == 0 ? 0 : l.plane_bytes * f.bits_hi);
          for (int d = 0; d < half; ++d) {
            int idx = 0;
            for (int p = 0; p < bits; ++p) idx |= ((planes[p * l.plane_bytes + d / 8] >> (d & 7)) & 1) << p;
            out[j * hd + h * half + d] = code[idx] * norm;
          }
        }
      }
      return;
    }
  }
}

// Turbo keys: the QJL sketch of tokens [0, n) as ±1 rows sgn[j * hd + i] and each token's
// factor coef[j] = sqrt(pi/2) / hd · |r_j|, so q·r_j ≈ coef[j] · ((S·q) · sgn_j).
static inline void kv_decode_qjl(const KvPageLayout& l, int hd, const uint8_t* page, int n, float* sgn, float* coef) {
  const float k = std::sqrt(static_cast<float>(M_PI) / 2.0f) / static_cast<float>(hd);
  for (int j = 0; j < n; ++j) {
    const uint8_t* bits = page + static_cast<int64_t>(j) * l.row_bytes + l.qjl_offset;
    for (int i = 0; i < hd; ++i) sgn[j * hd + i] = ((bits[i / 8] >> (i & 7)) & 1) ? 1.0f : -1.0f;
    uint16_t h;
    std::memcpy(&h, page + l.meta_offset + 4 * static_cast<int64_t>(j) + 2, 2);
    coef[j] = k * fp16_to_f32(h);
  }
}

}  // namespace tessera
