#include "backend/kv_codec.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>

#include "core/error.h"

namespace tessera {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform01(uint64_t& s) { return (static_cast<double>(splitmix64(s) >> 11) + 0.5) * 0x1.0p-53; }
double gaussian(uint64_t& s) {
  const double u = uniform01(s), v = uniform01(s);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

float f16_round(float x) { return fp16_to_f32(f32_to_fp16(x)); }
void put_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_fp16(x);
  std::memcpy(p, &h, 2);
}
float get_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// Index of the centroid nearest to t (centroids ascending).
int nearest(const float* code, int n_codes, float t) {
  int i = 0;
  while (i + 1 < n_codes && t > 0.5f * (code[i] + code[i + 1])) ++i;
  return i;
}

std::array<float, 256> build_fp8_table(KvCodec codec) {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) t[v] = fp8_to_f32(static_cast<uint8_t>(v), codec);
  return t;
}

}  // namespace

uint8_t f32_to_fp8(float x, KvCodec codec) {
  const bool e4m3 = codec == KvCodec::Fp8E4M3;
  const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::fabs(x);
  if (std::isnan(a)) return sign | (e4m3 ? 0x7F : 0x7F);
  a = std::min(a, fp8_max(codec));  // saturate (no infinities in the cache)
  // The grid spacing at a's binade (subnormals share the smallest normal binade's).
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : 1 - bias;
  e = std::max(e, 1 - bias);
  const float step = std::ldexp(1.0f, e - man_bits);
  float q = std::nearbyint(a / step) * step;  // nearest-even under the default rounding mode
  q = std::min(q, fp8_max(codec));
  if (q == 0) return sign;
  int qe = static_cast<int>(std::floor(std::log2(q)));
  if (qe < 1 - bias) {  // subnormal
    const int m = static_cast<int>(std::nearbyint(q / std::ldexp(1.0f, 1 - bias - man_bits)));
    return sign | static_cast<uint8_t>(m);
  }
  const int m = static_cast<int>(std::nearbyint((q / std::ldexp(1.0f, qe) - 1.0f) * (1 << man_bits)));
  return sign | static_cast<uint8_t>(((qe + bias) << man_bits) | m);
}

float fp8_to_f32(uint8_t v, KvCodec codec) {
  const bool e4m3 = codec == KvCodec::Fp8E4M3;
  const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int e = (v & 0x7F) >> man_bits, m = v & ((1 << man_bits) - 1);
  if (e4m3 && (v & 0x7F) == 0x7F) return std::nanf("");
  if (!e4m3 && e == 31) return m ? std::nanf("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), 1 - bias - man_bits);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / (1 << man_bits), e - bias);
}

const float* fp8_table(KvCodec codec) {
  static const std::array<float, 256> e4m3 = build_fp8_table(KvCodec::Fp8E4M3);
  static const std::array<float, 256> e5m2 = build_fp8_table(KvCodec::Fp8E5M2);
  return codec == KvCodec::Fp8E5M2 ? e5m2.data() : e4m3.data();
}

std::vector<double> turbo_codebook(int bits, int dim) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::vector<double>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& found = cache[{bits, dim}];
  if (!found.empty()) return found;
  // The density on a fine grid, then Lloyd's iterations from its quantiles.
  const double lim = std::min(std::sqrt(static_cast<double>(dim)), 9.0);
  const int n_grid = 20001;
  std::vector<double> t(n_grid), w(n_grid);
  double total = 0;
  for (int i = 0; i < n_grid; ++i) {
    t[i] = -lim + 2 * lim * i / (n_grid - 1);
    const double u = 1 - t[i] * t[i] / dim;
    w[i] = u > 0 ? std::pow(u, (dim - 3) / 2.0) : 0.0;
    total += w[i];
  }
  const int k = 1 << bits;
  std::vector<double> c(k);
  double acc = 0;
  for (int i = 0, j = 0; i < n_grid && j < k; ++i) {
    acc += w[i] / total;
    while (j < k && acc >= (j + 0.5) / k) c[j++] = t[i];
  }
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<double> num(k, 0), den(k, 0);
    int j = 0;
    for (int i = 0; i < n_grid; ++i) {
      while (j + 1 < k && t[i] > 0.5 * (c[j] + c[j + 1])) ++j;
      num[j] += w[i] * t[i];
      den[j] += w[i];
    }
    for (int q = 0; q < k; ++q)
      if (den[q] > 0) c[q] = num[q] / den[q];
    for (int q = 0; q < k / 2; ++q) {  // the density is even: keep the codebook exactly symmetric
      const double m = 0.5 * (c[k - 1 - q] - c[q]);
      c[q] = -m;
      c[k - 1 - q] = m;
    }
  }
  found = c;
  return c;
}

KvConstantsLayout kv_constants_layout(const KvFormat& f, int n_kv_heads, int head_dim) {
  KvConstantsLayout l;
  int64_t at = n_kv_heads;  // scales
  if (f.codec == KvCodec::Turbo) {
    l.code_hi = at;
    l.code_lo = at + 16;
    l.signs = at + 32;
    at = l.signs + static_cast<int64_t>(n_kv_heads) * head_dim;
    if (f.qjl) {
      l.qjl = at;
      at += static_cast<int64_t>(n_kv_heads) * head_dim * head_dim;
    }
  }
  if (f.centers_keys()) {
    l.mean = at;
    l.store_signs = at + static_cast<int64_t>(n_kv_heads) * head_dim;
    l.rope = l.store_signs + static_cast<int64_t>(n_kv_heads) * head_dim;
    l.first = l.rope + 2 + head_dim / 2;
    at = l.first + 1 + static_cast<int64_t>(n_kv_heads) * head_dim;
  }
  l.total = at;
  return l;
}

std::vector<float> make_kv_constants(const KvFormat& f, int n_kv_heads, int head_dim, int layer, bool is_key,
                                     uint64_t seed, std::span<const float> static_scales, std::span<const float> mean,
                                     std::span<const float> equal, const KvRopeCentering& rope,
                                     const KvHeadSlice& heads) {
  const KvConstantsLayout l = kv_constants_layout(f, n_kv_heads, head_dim);
  const int whole = heads.whole > 0 ? heads.whole : n_kv_heads;
  TESSERA_CHECK(heads.first >= 0 && heads.first + n_kv_heads <= whole, "KV constants: heads [", heads.first, ", ",
                heads.first + n_kv_heads, ") of a cache of ", whole);
  std::vector<float> out(l.total, 0.0f);
  TESSERA_CHECK(
      static_scales.empty() || static_scales.size() == 1 || static_scales.size() == static_cast<size_t>(n_kv_heads),
      "KV scales: ", static_scales.size(), " values for ", n_kv_heads, " KV heads (1 or one per head)");
  for (int h = 0; h < n_kv_heads; ++h) {
    const float s = static_scales.empty() ? 1.0f : static_scales[static_scales.size() == 1 ? 0 : h];
    TESSERA_CHECK(std::isfinite(s) && s > 0, "KV scale of layer ", layer, " head ", h, " is ", s, " (finite, > 0)");
    out[l.scales + h] = s;
  }
  if (!mean.empty()) {
    TESSERA_CHECK(f.centers_keys() && is_key, "KV key means given for ", is_key ? "K" : "V", " in ", kv_format_name(f),
                  ", which does not center ", is_key ? "its keys" : "values");
    TESSERA_CHECK(mean.size() == static_cast<size_t>(n_kv_heads) * head_dim, "KV key means of layer ", layer, ": ",
                  mean.size(), " values for ", n_kv_heads, " KV heads x head_dim ", head_dim);
    for (size_t i = 0; i < mean.size(); ++i) {
      TESSERA_CHECK(std::isfinite(mean[i]), "KV key mean of layer ", layer, " head ", i / head_dim, " channel ",
                    i % head_dim, " is ", mean[i], " (not finite)");
      out[l.mean + i] = mean[i];
    }
  }
  if (rope.rot_dim > 0) {
    TESSERA_CHECK(f.centers_keys() && is_key && !mean.empty(), "KV position-aware key centering of layer ", layer,
                  " needs pre-RoPE key means of a format that centers its keys");
    TESSERA_CHECK(rope.rot_dim % 2 == 0 && rope.rot_dim <= head_dim && rope.rot_dim <= 256,
                  "KV position-aware key centering of layer ", layer, ": RoPE dimension ", rope.rot_dim,
                  " is not even or exceeds head_dim ", head_dim, " or 256");
    TESSERA_CHECK(rope.inv_freq.size() == static_cast<size_t>(rope.rot_dim / 2),
                  "KV position-aware key centering of layer ", layer, ": ", rope.inv_freq.size(),
                  " RoPE frequencies for RoPE dimension ", rope.rot_dim, " (want half of it)");
    out[l.rope] = static_cast<float>(rope.rot_dim);
    out[l.rope + 1] = rope.neox ? 1.0f : 0.0f;
    for (size_t i = 0; i < rope.inv_freq.size(); ++i) {
      TESSERA_CHECK(std::isfinite(rope.inv_freq[i]) && rope.inv_freq[i] >= 0, "KV RoPE frequency ", i, " of layer ",
                    layer, " is ", rope.inv_freq[i]);
      out[l.rope + 2 + i] = rope.inv_freq[i];
    }
  }
  if (!rope.first.empty()) {
    TESSERA_CHECK(f.centers_keys() && is_key && !mean.empty(), "KV first-key center of layer ", layer,
                  " needs the key means of a format that centers its keys");
    TESSERA_CHECK(rope.first.size() == static_cast<size_t>(n_kv_heads) * head_dim, "KV first-key center of layer ",
                  layer, ": ", rope.first.size(), " values for ", n_kv_heads, " KV heads x head_dim ", head_dim);
    out[l.first] = 1.0f;
    for (size_t i = 0; i < rope.first.size(); ++i) {
      TESSERA_CHECK(std::isfinite(rope.first[i]), "KV first-key center of layer ", layer, " head ", i / head_dim,
                    " channel ", i % head_dim, " is ", rope.first[i], " (not finite)");
      out[l.first + 1 + i] = rope.first[i];
    }
  }
  if (!equal.empty()) {
    TESSERA_CHECK(f.centers_keys() && is_key, "KV key equalization given for ", is_key ? "K" : "V", " in ",
                  kv_format_name(f), ", which does not center ", is_key ? "its keys" : "values");
    TESSERA_CHECK(equal.size() == static_cast<size_t>(n_kv_heads) * head_dim, "KV key equalization of layer ", layer,
                  ": ", equal.size(), " values for ", n_kv_heads, " KV heads x head_dim ", head_dim);
    for (size_t i = 0; i < equal.size(); ++i)
      TESSERA_CHECK(std::isfinite(equal[i]) && equal[i] > 0, "KV key equalization of layer ", layer, " head ",
                    i / head_dim, " channel ", i % head_dim, " is ", equal[i], " (finite, > 0)");
  }
  if (f.codec != KvCodec::Turbo) return out;
  for (int half = 0; half < 2; ++half) {
    const std::vector<double> c = turbo_codebook(half == 0 ? f.bits_hi : f.bits_lo, head_dim);
    for (size_t i = 0; i < c.size(); ++i) out[(half == 0 ? l.code_hi : l.code_lo) + i] = static_cast<float>(c[i]);
  }
  uint64_t s =
      seed ^ (0x7475726230ull + (static_cast<uint64_t>(layer) << 1) + (is_key ? 1 : 0)) * 0x9E3779B97F4A7C15ull;
  // Drawn for every head of the whole cache in order; this slice keeps [first, first + n) of them.
  const int64_t hd = head_dim, sign0 = heads.first * hd, n_signs = static_cast<int64_t>(n_kv_heads) * hd;
  for (int64_t i = 0; i < whole * hd; ++i) {
    const float d = (splitmix64(s) >> 63) ? 1.0f : -1.0f;
    if (i >= sign0 && i < sign0 + n_signs) out[l.signs + i - sign0] = d;
  }
  // Equalized keys: the query rotates with D∘s, the store with D/s (layout comment in kv_codec.h).
  if (f.centers_keys())
    for (int64_t i = 0; i < static_cast<int64_t>(n_kv_heads) * head_dim; ++i) {
      const float d = out[l.signs + i];
      out[l.store_signs + i] = equal.empty() ? d : d / equal[i];
      if (!equal.empty()) out[l.signs + i] = d * equal[i];
    }
  if (f.qjl)
    for (int64_t i = 0; i < whole * hd * hd; ++i) {
      const auto g = static_cast<float>(gaussian(s));
      if (i >= sign0 * hd && i < (sign0 + n_signs) * hd) out[l.qjl + i - sign0 * hd] = g;
    }
  return out;
}

namespace {

void encode_int4_channel(const KvPageLayout& l, int hd, uint8_t* page, int offset, int n, const float* x, int64_t ldx) {
  uint8_t* meta = page + l.meta_offset;
  for (int d = 0; d < hd; ++d) {
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; ++j) {
      lo = std::min(lo, x[j * ldx + d]);
      hi = std::max(hi, x[j * ldx + d]);
    }
    float old_s = 0, old_mn = 0;
    if (offset > 0) {
      old_s = get_f16(meta + 4 * d);
      old_mn = get_f16(meta + 4 * d + 2);
      lo = std::min(lo, old_mn);
      hi = std::max(hi, old_mn + 15 * old_s);
    }
    float mn = f16_round(lo), s = f16_round((hi - mn) / 15);
    if (mn > lo) mn = f16_round(lo - std::fabs(lo) * 0x1.0p-10f);  // keep the minimum on the grid
    if (s * 15 + mn < hi) s = f16_round((hi - mn) / 15 * (1 + 0x1.0p-10f));
    const float inv = s > 0 ? 1 / s : 0;
    auto code_at = [&](int j) -> uint8_t& { return page[static_cast<int64_t>(j) * l.row_bytes + d / 2]; };
    auto put = [&](int j, int q) {
      const int sh = 4 * (d & 1);
      code_at(j) = static_cast<uint8_t>((code_at(j) & ~(15 << sh)) | (q << sh));
    };
    if (offset > 0 && (s != old_s || mn != old_mn))
      for (int j = 0; j < offset; ++j) {  // re-code the page's earlier tokens on the new grid
        const float v = old_mn + static_cast<float>((code_at(j) >> (4 * (d & 1))) & 15) * old_s;
        put(j, std::clamp(static_cast<int>(std::nearbyint((v - mn) * inv)), 0, 15));
      }
    for (int j = 0; j < n; ++j)
      put(offset + j, std::clamp(static_cast<int>(std::nearbyint((x[j * ldx + d] - mn) * inv)), 0, 15));
    put_f16(meta + 4 * d, s);
    put_f16(meta + 4 * d + 2, mn);
  }
}

void encode_turbo_row(const KvFormat& f, const KvPageLayout& l, int hd, const KvHeadConstants& c, uint8_t* row,
                      uint8_t* meta, const float* x, int pos, float* scratch) {
  float* y = scratch;   // [hd] rotated
  float* r = y + hd;    // [hd] residual
  float* xc = r + hd;   // [hd] centered: x − μ, or x − R(pos)·m
  float* mu = xc + hd;  // [hd] the centering
  float* cs = mu + hd;  // [hd] cos/sin of pos
  kv_key_center(c, hd, pos, cs, mu);
  for (int d = 0; d < hd; ++d) xc[d] = x[d] - mu[d];
  turbo_rotate(xc, c.store_signs, hd, y);
  double ss = 0;
  for (int d = 0; d < hd; ++d) ss += static_cast<double>(y[d]) * y[d];
  const float norm = f16_round(static_cast<float>(std::sqrt(ss)));
  std::memset(row, 0, l.row_bytes);
  const float to_unit = norm > 0 ? std::sqrt(static_cast<float>(hd)) / norm : 0.0f;
  const int half = hd / 2;
  uint8_t idx[256];  // hd <= 256 (check_kv_format)
  double dot = 0;    // <centroids, y>, in channel order
  for (int h = 0; h < 2; ++h) {
    const int bits = h == 0 ? f.bits_hi : f.bits_lo;
    const float* code = h == 0 ? c.code_hi : c.code_lo;
    uint8_t* planes = row + (h == 0 ? 0 : l.plane_bytes * f.bits_hi);
    for (int d = 0; d < half; ++d) {
      const int i = nearest(code, 1 << bits, y[h * half + d] * to_unit);
      idx[h * half + d] = static_cast<uint8_t>(i);
      for (int p = 0; p < bits; ++p)
        if ((i >> p) & 1) planes[p * l.plane_bytes + d / 8] |= static_cast<uint8_t>(1 << (d & 7));
      dot += static_cast<double>(code[i]) * y[h * half + d];
    }
  }
  // Without QJL the stored scale makes <ŷ, y> = |y|² (ŷ = centroids · scale / sqrt(hd)):
  // Lloyd–Max codes shrink a vector along itself by about (1 − D), which would scale every
  // score of a query by that factor (a softmax temperature); corrected, what is left of the
  // error is noise orthogonal to y. QJL keys keep |y| (the sketch corrects the residual).
  const bool unbias = !f.qjl && ss > 0 && dot > 0;
  const float scale = unbias ? f16_round(static_cast<float>(ss * std::sqrt(static_cast<double>(hd)) / dot)) : norm;
  put_f16(meta, scale);
  const float from_unit = scale / std::sqrt(static_cast<float>(hd));
  for (int d = 0; d < hd; ++d) r[d] = y[d] - (d < half ? c.code_hi : c.code_lo)[idx[d]] * from_unit;
  if (!f.qjl) return;
  double rr = 0;
  for (int d = 0; d < hd; ++d) rr += static_cast<double>(r[d]) * r[d];
  put_f16(meta + 2, static_cast<float>(std::sqrt(rr)));
  uint8_t* bits = row + l.qjl_offset;
  for (int i = 0; i < hd; ++i) {
    const float* s = c.qjl + static_cast<int64_t>(i) * hd;
    float dot = 0;
    for (int d = 0; d < hd; ++d) dot += s[d] * r[d];
    if (dot >= 0) bits[i / 8] |= static_cast<uint8_t>(1 << (i & 7));
  }
}

}  // namespace

void kv_encode_rows(const KvFormat& f, const KvPageLayout& l, int hd, const KvHeadConstants& c, uint8_t* page,
                    int offset, int n, const float* x, int64_t ldx, float* scratch, const int32_t* positions) {
  if (n <= 0) return;
  TESSERA_CHECK((c.rope_dim == 0 && !c.first) || positions, "KV store: key centering by position without positions");
  uint8_t* meta = page + l.meta_offset;
  if (f.codec == KvCodec::Int4 && f.scale == KvScale::Channel) {
    encode_int4_channel(l, hd, page, offset, n, x, ldx);
    return;
  }
  for (int j = 0; j < n; ++j) {
    const int t = offset + j;
    const float* xr = x + j * ldx;
    uint8_t* row = page + static_cast<int64_t>(t) * l.row_bytes;
    switch (f.codec) {
      case KvCodec::F32:
        std::memcpy(row, xr, sizeof(float) * hd);
        break;
      case KvCodec::F16: {
        for (int d = 0; d < hd; ++d) {
          const uint16_t h = f32_to_fp16(xr[d]);
          std::memcpy(row + 2 * d, &h, 2);
        }
        break;
      }
      case KvCodec::Fp8E4M3:
      case KvCodec::Fp8E5M2: {
        float s = c.scale;
        if (f.scale == KvScale::Token) {
          float amax = 0;
          for (int d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(xr[d]));
          s = f16_round(amax / fp8_max(f.codec));
          put_f16(meta + 2 * t, s);
        }
        const float inv = s > 0 ? 1 / s : 0;
        for (int d = 0; d < hd; ++d) row[d] = f32_to_fp8(xr[d] * inv, f.codec);
        break;
      }
      case KvCodec::Int8: {
        const int g = f.scale == KvScale::Group ? f.group : hd, ng = hd / g;
        for (int q = 0; q < ng; ++q) {
          float amax = 0;
          for (int d = q * g; d < (q + 1) * g; ++d) amax = std::max(amax, std::fabs(xr[d]));
          const float s = f16_round(amax / 127);
          put_f16(meta + 2 * (static_cast<int64_t>(t) * ng + q), s);
          const float inv = s > 0 ? 1 / s : 0;
          for (int d = q * g; d < (q + 1) * g; ++d)
            row[d] =
                static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(xr[d] * inv), -127.0f, 127.0f)));
        }
        break;
      }
      case KvCodec::Int4: {
        const int g = f.group, ng = hd / g;
        std::memset(row, 0, l.row_bytes);
        for (int q = 0; q < ng; ++q) {
          float lo = INFINITY, hi = -INFINITY;
          for (int d = q * g; d < (q + 1) * g; ++d) {
            lo = std::min(lo, xr[d]);
            hi = std::max(hi, xr[d]);
          }
          float mn = f16_round(lo);
          if (mn > lo) mn = f16_round(lo - std::fabs(lo) * 0x1.0p-10f);
          float s = f16_round((hi - mn) / 15);
          if (s * 15 + mn < hi) s = f16_round((hi - mn) / 15 * (1 + 0x1.0p-10f));
          uint8_t* m = meta + 4 * (static_cast<int64_t>(t) * ng + q);
          put_f16(m, s);
          put_f16(m + 2, mn);
          const float inv = s > 0 ? 1 / s : 0;
          for (int d = q * g; d < (q + 1) * g; ++d) {
            const int code = std::clamp(static_cast<int>(std::nearbyint((xr[d] - mn) * inv)), 0, 15);
            row[d / 2] |= static_cast<uint8_t>(code << (4 * (d & 1)));
          }
        }
        break;
      }
      case KvCodec::Turbo:
        encode_turbo_row(f, l, hd, c, row, meta + static_cast<int64_t>(t) * (f.qjl ? 4 : 2), xr,
                         positions ? positions[j] : 0, scratch);
        break;
    }
  }
}

}  // namespace tessera
