#pragma once
// AVX2 decoders of quantized KV pages into f32 tiles, for the fused attention of
// cpu_ops_impl.h (included there, inside its namespace; the baseline build has no AVX2 and
// returns false, so the caller uses the portable decoders of kv_codec.h). Each produces
// exactly what kv_decode_rows / kv_decode_qjl produce (tested in kv_quant_test.cpp on both
// ISA paths through the backend).
//
// fp8 goes through F16C: an e5m2 code is the top byte of the f16 with the same value, and an
// e4m3 code placed as sign | exp:man << 7 is an f16 of value / 256 (subnormals included).

#if defined(__AVX2__) && defined(__F16C__)
static inline float simd_meta_f16(const uint8_t* meta, int64_t i) {
  uint16_t h;
  std::memcpy(&h, meta + 2 * i, 2);
  return tessera::fp16_to_f32(h);
}

// 16 fp8 codes → 16 floats × s.
static inline void simd_fp8_16(const uint8_t* codes, bool e4m3, float s, float* out) {
  __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  if (e4m3)
    w = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
  else
    w = _mm256_slli_epi16(w, 8);
  const __m256 sv = _mm256_set1_ps(e4m3 ? s * 256.0f : s);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(w)), sv));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(w, 1)), sv));
}

// 8 bytes of int4 codes (16 channels, low nibble first) → 16 floats: mn + code × s, with
// per-channel s and mn vectors (16 each).
static inline void simd_int4_16(const uint8_t* codes, const float* s, const float* mn, float* out) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
  const __m128i inter = _mm_unpacklo_epi8(lo, hi);  // channel order
  const __m256 c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(inter));
  const __m256 c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(inter, 8)));
  _mm256_storeu_ps(out, _mm256_fmadd_ps(c0, _mm256_loadu_ps(s), _mm256_loadu_ps(mn)));
  _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(c1, _mm256_loadu_ps(s + 8), _mm256_loadu_ps(mn + 8)));
}

// Bit c (c = 0..7) of one byte in lane c, as 0/1 ints.
static inline __m256i simd_bits_of(uint8_t byte) {
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(byte), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                          _mm256_set1_epi32(1));
}

// Tokens [0, n) of a quantized page into out[j * hd + c]; false when this format or shape
// has no SIMD path here (the caller falls back to kv_decode_rows).
static inline bool simd_decode_rows(const tessera::KvFormat& f, const tessera::KvPageLayout& l, int hd,
                                    const tessera::KvHeadConstants& c, const uint8_t* page, int n, float* out) {
  using tessera::KvCodec;
  using tessera::KvScale;
  const uint8_t* meta = page + l.meta_offset;
  if (f.is_fp8()) {
    if (hd % 16) return false;
    for (int j = 0; j < n; ++j) {
      const float s = f.scale == KvScale::Token ? simd_meta_f16(meta, j) : c.scale;
      for (int d = 0; d < hd; d += 16)
        simd_fp8_16(page + j * l.row_bytes + d, f.codec == KvCodec::Fp8E4M3, s, out + j * hd + d);
    }
    return true;
  }
  if (f.codec == KvCodec::Int4) {
    const int g = f.scale == KvScale::Channel ? 16 : f.group;
    if (hd % 16 || g % 16 || hd > 256) return false;
    alignas(32) float s[256], mn[256];
    if (f.scale == KvScale::Channel)  // one (scale, min) per channel for the whole page
      for (int d = 0; d < hd; ++d) {
        s[d] = simd_meta_f16(meta, 2 * d);
        mn[d] = simd_meta_f16(meta, 2 * d + 1);
      }
    const int ng = hd / g;
    for (int j = 0; j < n; ++j) {
      if (f.scale == KvScale::Group)
        for (int q = 0; q < ng; ++q) {
          const float sq = simd_meta_f16(meta, 2 * (int64_t(j) * ng + q)),
                      mq = simd_meta_f16(meta, 2 * (int64_t(j) * ng + q) + 1);
          for (int d = q * g; d < (q + 1) * g; ++d) {
            s[d] = sq;
            mn[d] = mq;
          }
        }
      for (int d = 0; d < hd; d += 16) simd_int4_16(page + j * l.row_bytes + d / 2, s + d, mn + d, out + j * hd + d);
    }
    return true;
  }
  if (f.codec == KvCodec::Turbo) {
    const int half = hd / 2;
    if (half % 8) return false;
    const __m256 hi_lo = _mm256_loadu_ps(c.code_hi), hi_hi = _mm256_loadu_ps(c.code_hi + 8);
    const __m256 lo_lo = _mm256_loadu_ps(c.code_lo), lo_hi = _mm256_loadu_ps(c.code_lo + 8);
    const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int j = 0; j < n; ++j) {
      const uint8_t* r = page + j * l.row_bytes;
      const __m256 norm = _mm256_set1_ps(simd_meta_f16(meta, int64_t(j) * (f.qjl ? 2 : 1)) * inv_sqrt);
      for (int h = 0; h < 2; ++h) {
        const int bits = h == 0 ? f.bits_hi : f.bits_lo;
        const uint8_t* planes = r + (h == 0 ? 0 : l.plane_bytes * f.bits_hi);
        const __m256 t0 = h == 0 ? hi_lo : lo_lo, t1 = h == 0 ? hi_hi : lo_hi;
        for (int d = 0; d < half; d += 8) {
          __m256i idx = _mm256_setzero_si256();
          for (int p = 0; p < bits; ++p)
            idx = _mm256_or_si256(idx, _mm256_slli_epi32(simd_bits_of(planes[p * l.plane_bytes + d / 8]), p));
          __m256 v = _mm256_permutevar8x32_ps(t0, idx);
          if (bits == 4) {  // 16 centroids: the upper 8 where bit 3 is set
            const __m256 upper = _mm256_permutevar8x32_ps(t1, idx);
            const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));  // bit 3 → sign bit
            v = _mm256_blendv_ps(v, upper, pick);
          }
          _mm256_storeu_ps(out + j * hd + h * half + d, _mm256_mul_ps(v, norm));
        }
      }
    }
    return true;
  }
  return false;
}

// Turbo keys' QJL signs as ±1 rows and per-token factors (kv_decode_qjl's contract).
static inline bool simd_decode_qjl(const tessera::KvPageLayout& l, int hd, const uint8_t* page, int n, float* sgn,
                                   float* coef) {
  if (hd % 8) return false;
  const float k = std::sqrt(static_cast<float>(M_PI) / 2.0f) / static_cast<float>(hd);
  const __m256 two = _mm256_set1_ps(2.0f), one = _mm256_set1_ps(1.0f);
  for (int j = 0; j < n; ++j) {
    const uint8_t* bits = page + j * l.row_bytes + l.qjl_offset;
    for (int i = 0; i < hd; i += 8)
      _mm256_storeu_ps(sgn + j * hd + i,
                       _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(simd_bits_of(bits[i / 8])), two), one));
    coef[j] = k * simd_meta_f16(page + l.meta_offset, 2 * int64_t(j) + 1);
  }
  return true;
}
#else
static inline bool simd_decode_rows(const tessera::KvFormat&, const tessera::KvPageLayout&, int,
                                    const tessera::KvHeadConstants&, const uint8_t*, int, float*) {
  return false;
}
static inline bool simd_decode_qjl(const tessera::KvPageLayout&, int, const uint8_t*, int, float*, float*) {
  return false;
}
#endif
