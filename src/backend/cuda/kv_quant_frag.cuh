#pragma once
// Quantized KV pages decoded straight into mma.sync m16n8k16 B fragments (f16 pairs), for
// attention_quant_decode_frag.cu: no f16 copy of the tile in shared memory, so a lane's work
// per tile is a few shared loads of raw codes and scales, a few integer / conversion
// instructions per f16 pair, and the mma itself.
//
// A raw page sits in shared memory as stored, except that the codes (the first
// block_size · row_bytes bytes, a multiple of 128) are XOR-swizzled in 16-byte chunks within
// each 128-byte line (kv_swz), so that the fragment loads below fall in distinct banks.
//
// K (Q·Kᵀ, B[k][n] = K[key n][channel k]): lane (fr, fc) = (lane / 4, lane % 4) holds keys
// fr and fr + 8 of the tile and channels [fc · hd/4, (fc + 1) · hd/4): its k-step kk takes
// words 2kk (logical k 2fc, 2fc + 1) and 2kk + 1 (logical 2fc + 8, 2fc + 9). A dot product
// may take its channels in any order as long as Q takes the same one: kv_k_channel gives the
// channel of word w's half h, and the query A fragments are built with it.
// V (P·V, B[k][n] = V[key k][channel n]): lane (fr, fc) holds the key pairs (2fc, 2fc + 1)
// and (2fc + 8, 2fc + 9) and channels [fr · hd/8, (fr + 1) · hd/8): its word n is column fr
// of n-block n, so O's column c of n-block n is channel c · hd/8 + n (undone when O is
// stored).
//
// Scales: static fp8 scales (per tensor or KV head) are folded into Q (K) and into O (V);
// per-token K scales multiply the f32 scores; the others (per-token V scales, groups,
// KIVI's per-channel (scale, min)) are applied to the f16 pairs (one rounding, as the f16
// operand tile did). TurboQuant pages decode to f16 centroids by register lookups
// (TurboBook below); their per-token norm is a per-token scale like int8's, their
// 1/sqrt(hd) a static one. Keys meet the query rotated once per block (kv_prepare_queries);
// values stay in V's rotated basis, and the merge kernel rotates the output back.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/kv_quant.cuh"

namespace tessera::cuda {

// Byte offset within a page's codes -> offset in shared memory (16-byte chunk c of 128-byte
// line L goes to chunk c ^ (L mod 8)); 4-, 8- and 16-byte accesses stay within one chunk.
__device__ __forceinline__ uint32_t kv_swz(uint32_t o) { return o ^ (((o >> 7) & 7u) << 4); }

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<const __half2*>(&u); }
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t lds16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t lds8(const uint8_t* p) { return *p; }

// N 32-bit words of codes from code byte `off` of a page (16-, 8- or 4-byte aligned; a
// 16-byte chunk at a time).
template <int N>
__device__ __forceinline__ void lds_codes(const uint8_t* page, uint32_t off, uint32_t* w) {
  if constexpr (N >= 4) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 u = *reinterpret_cast<const uint4*>(page + kv_swz(off + 4 * i));
      w[i] = u.x, w[i + 1] = u.y, w[i + 2] = u.z, w[i + 3] = u.w;
    }
  } else if constexpr (N == 2) {
    const uint2 u = *reinterpret_cast<const uint2*>(page + kv_swz(off));
    w[0] = u.x, w[1] = u.y;
  } else {
    w[0] = lds32(page + kv_swz(off));
  }
}

// The helpers' template argument C names a side's format at compile time, codec and scale
// kind (frag_key; turbo: its two code widths too), so that no per-word branch is left in the
// tile loop; -1: read from f.
constexpr int frag_key(KvCodec c, KvScale s, int bits_hi = 0, int bits_lo = 0) {
  return 8 * static_cast<int>(c) + static_cast<int>(s == KvScale::Head ? KvScale::Tensor : s) +
         128 * (8 * bits_hi + bits_lo);
}
__device__ __forceinline__ KvCodec frag_codec(int C, const KvFormat& f) {
  return C < 0 ? f.codec : static_cast<KvCodec>(C % 128 / 8);
}
__device__ __forceinline__ KvScale frag_scale(int C, const KvFormat& f) {
  return C < 0 ? f.scale : static_cast<KvScale>(C % 8);
}
// A scale per token in the page's meta (f16, token-major): fp8/int8 :token and turbo's norm.
__device__ __forceinline__ bool frag_token_scaled(int C, const KvFormat& f) {
  return frag_scale(C, f) == KvScale::Token || frag_codec(C, f) == KvCodec::Turbo;
}
// Turbo: the bit planes a lane reads (the wider half's width, bits_hi >= bits_lo), at most 4.
__host__ __device__ constexpr int frag_planes(int C) { return C < 0 ? 4 : C / 1024; }

// The channel (from the lane's first) of half h of K word w: adjacent pairs, except int4
// (channels j and j + 4 of each 8: one shift and mask per pair) and turbo (the bit-plane
// gather below: word w = (hd/32)·i + m holds channels i + 8m and i + 8m + 4).
__host__ __device__ __forceinline__ int kv_k_channel(KvCodec c, int w, int h, int hd) {
  if (c == KvCodec::Turbo) return w / (hd / 32) + 8 * (w % (hd / 32)) + 4 * h;
  return c == KvCodec::Int4 ? 8 * (w / 4) + w % 4 + 4 * h : 2 * w + h;
}
// The channel (from the lane's first) of V word n: n, except turbo (word n = (hd/32)·i + m
// holds channel i + 4m).
__host__ __device__ __forceinline__ int kv_v_channel(KvCodec c, int n, int hd) {
  return c == KvCodec::Turbo ? n / (hd / 32) + 4 * (n % (hd / 32)) : n;
}

// fp8 pair (low 16 bits of x, the lower channel's code first) -> f16 pair, exact.
__device__ __forceinline__ uint32_t fp8x2_to_h2(KvCodec c, uint32_t x) {
  const __nv_fp8_interpretation_t kind = c == KvCodec::Fp8E4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xffffu), kind);
  return h2u(__half2(h));
}
// Bytes b0, b1 of x (signed codes XORed with 0x80) -> f16 pair, exact: 0x64XX is 1024 + XX.
// sel picks them: 0x4140 (bytes 0, 1), 0x4342 (bytes 2, 3).
__device__ __forceinline__ uint32_t s8x2_to_h2(uint32_t biased, uint32_t sel) {
  const uint32_t h = prmt(biased, 0x64646464u, sel);
  return h2u(__hsub2(u2h(h), __half2half2(__ushort_as_half(0x6480))));  // - 1152
}
// Nibbles at bits 0-3 and 16-19 of x -> f16 pair of the codes 0..15, exact.
__device__ __forceinline__ uint32_t u4x2_to_h2(uint32_t x) {
  const uint32_t h = (x & 0x000f000fu) | 0x64006400u;
  return h2u(__hsub2(u2h(h), __half2half2(__ushort_as_half(0x6400))));  // - 1024
}

// ---- TurboQuant: codebook lookups in registers ----
// A lane's slice of a turbo row lies in one half of the channels (K: hd/4 channels from
// fc·hd/4; V: hd/8 from fr·hd/8), so it needs one codebook, held as two 16-byte tables (the
// low and the high bytes of its 16 f16 centroids, entry e at byte e % 4 of word e / 4).
// Codes are bit planes (bit p of channel c at bit c of plane p's slice word); the gather
// takes channels i, i + 4, i + 8, ... into the nibbles of one word (a shift and a masked OR
// per plane), and `prmt` looks up four nibbles at a time: bytes 0-7 of the table by the low
// three bits, then entries 8-15 picked by the fourth (4-bit codes only).
struct TurboBook {
  uint32_t lo[4], hi[4];
};

__device__ __forceinline__ TurboBook turbo_book(const float* centroids) {
  TurboBook b{};
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const uint32_t h = __half_as_ushort(__float2half_rn(__ldg(centroids + e)));
    b.lo[e / 4] |= (h & 0xffu) << (8 * (e % 4));
    b.hi[e / 4] |= (h >> 8) << (8 * (e % 4));
  }
  return b;
}

// The NPL plane words of a row's slice of 8·BYTES channels from channel cb (within one half;
// the row at code byte `row`): w[p] = plane p's BYTES bytes (bit c = the slice's channel c),
// zero past the half's width.
template <int NPL, int HD, int BYTES>
__device__ __forceinline__ void turbo_planes(const KvFormat& f, const uint8_t* page, int row, int cb, uint32_t* w) {
  const int h = cb >= HD / 2, bits = h ? f.bits_lo : f.bits_hi;
  const uint32_t off = row + (h ? f.bits_hi * (HD / 16) : 0) + (cb - h * (HD / 2)) / 8;
#pragma unroll
  for (int p = 0; p < NPL; ++p) {
    const uint8_t* at = page + kv_swz(off + p * (HD / 16));
    w[p] = p >= bits ? 0u : BYTES == 4 ? lds32(at) : BYTES == 2 ? lds16(at) : lds8(at);
  }
}

// Nibble k of idx = bits 0-2 of the code of the channel at bit i + 4k of the plane words
// w[p]; nibble k of top = 4 × bit 3 of it (the table half to pick). NPL planes (unread
// planes of a narrower half are zero).
template <int NPL>
__device__ __forceinline__ void turbo_gather(const uint32_t* w, int i, uint32_t& idx, uint32_t& top) {
  idx = 0;
  top = 0;
#pragma unroll
  for (int p = 0; p < NPL; ++p) {
    const int at = p < 3 ? p : 2;  // plane 3 lands on bit 2 of top's nibbles
    const uint32_t x = i >= at ? w[p] >> (i - at) : w[p] << (at - i);
    if (p < 3)
      idx |= x & (0x11111111u << at);
    else
      top = x & 0x44444444u;
  }
}

// The centroids of the four nibbles idx[0..16): their low bytes (lo) and high bytes (hi).
template <int NPL>
__device__ __forceinline__ void turbo_lookup4(const TurboBook& b, uint32_t idx, uint32_t top, uint32_t& lo,
                                              uint32_t& hi) {
  lo = prmt(b.lo[0], b.lo[1], idx);
  hi = prmt(b.hi[0], b.hi[1], idx);
  if constexpr (NPL == 4) {
    const uint32_t pick = 0x3210u | (top & 0x4444u);  // byte k of the first result, or of the second
    lo = prmt(lo, prmt(b.lo[2], b.lo[3], idx), pick);
    hi = prmt(hi, prmt(b.hi[2], b.hi[3], idx), pick);
  }
}

// ---- K: one key row's slice of a lane ----

// The raw codes of key row j, channels [cb, cb + HD/4): HD/8 words at most (f16).
template <int C, int HD>
__device__ __forceinline__ void kfrag_load(const KvFormat& f, const uint8_t* page, int row_bytes, int j, int cb,
                                           uint32_t (&raw)[HD / 8]) {
  switch (frag_codec(C, f)) {
    case KvCodec::F16:
      lds_codes<HD / 8>(page, j * row_bytes + 2 * cb, raw);
      return;
    case KvCodec::Int4:
      lds_codes<HD / 32>(page, j * row_bytes + cb / 2, raw);
      return;
    case KvCodec::Turbo:  // raw[p]: plane p of the lane's hd/4 channels (all in one half)
      turbo_planes<frag_planes(C), HD, HD / 32>(f, page, j * row_bytes, cb, raw);
      return;
    default:
      lds_codes<HD / 16>(page, j * row_bytes + cb, raw);
  }
}

// The row's group scales, one per 8 channels of the slice (groups are multiples of 8
// channels): int8 s, int4 (s, min) packed as stored. Unused for other scale kinds.
template <int C, int HD>
__device__ __forceinline__ void kfrag_group_scales(const KvFormat& f, const uint8_t* page, int meta_offset, int j,
                                                   int cb, uint32_t (&g)[HD / 32]) {
  if (frag_scale(C, f) != KvScale::Group) return;
  const int per_row = HD / f.group;
#pragma unroll
  for (int q = 0; q < HD / 32; ++q) {
    const int gi = j * per_row + (cb + 8 * q) / f.group;
    g[q] = frag_codec(C, f) == KvCodec::Int4 ? lds32(page + meta_offset + 4 * gi) : lds16(page + meta_offset + 2 * gi);
  }
}

// Word w of the row as an f16 pair, scaled where the scale is per group or per channel.
// chs: KIVI's per-channel (scale, min) pairs of the slice's channels in shared memory (int4
// Channel only; the same for both rows of a lane, so the loads are shared). book: the
// lane's turbo codebook (turbo only; the per-token norm goes on the scores).
template <int C, int HD>
__device__ __forceinline__ uint32_t kfrag_word(const KvFormat& f, const uint32_t (&raw)[HD / 8],
                                               const uint32_t (&g)[HD / 32], const uint8_t* chs, const TurboBook& book,
                                               int w) {
  const KvCodec c = frag_codec(C, f);
  switch (c) {
    case KvCodec::F16:
      return raw[w];
    case KvCodec::Turbo: {  // w = (hd/32)·i + m: channels i + 8m, i + 8m + 4 (kv_k_channel)
      constexpr int NPI = HD / 32;
      uint32_t idx, top, lo, hi;
      turbo_gather<frag_planes(C)>(raw, w / NPI, idx, top);  // channels i + 4k, k = 0..7
      const int sh = 16 * ((w % NPI) / 2);                   // nibbles 0-3 or 4-7
      turbo_lookup4<frag_planes(C)>(book, idx >> sh, top >> sh, lo, hi);
      return prmt(lo, hi, w % 2 ? 0x7362 : 0x5140);  // the first two channels' f16, or the last two
    }
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2:
      return fp8x2_to_h2(c, raw[w / 2] >> (16 * (w % 2)));
    case KvCodec::Int8: {
      const uint32_t v = s8x2_to_h2(raw[w / 2] ^ 0x80808080u, w % 2 ? 0x4342 : 0x4140);
      if (frag_scale(C, f) != KvScale::Group) return v;  // per token: on the scores
      return h2u(__hmul2(u2h(v), __half2half2(__ushort_as_half(static_cast<uint16_t>(g[w / 4])))));
    }
    case KvCodec::Int4: {
      const uint32_t v = u4x2_to_h2(raw[w / 4] >> (4 * (w % 4)));
      uint32_t s, m;
      if (frag_scale(C, f) == KvScale::Channel) {  // channels 8q + j and 8q + j + 4
        const uint32_t a = lds32(chs + 4 * (8 * (w / 4) + w % 4)), b = lds32(chs + 4 * (8 * (w / 4) + w % 4 + 4));
        s = prmt(a, b, 0x5410);
        m = prmt(a, b, 0x7632);
      } else {
        s = prmt(g[w / 4], 0, 0x1010);
        m = prmt(g[w / 4], 0, 0x3232);
      }
      return h2u(__hfma2(u2h(v), u2h(s), u2h(m)));
    }
    default:
      return 0;
  }
}

// ---- V: one key pair (a, a + 1) of a lane, channels [cb, cb + HD/8) ----

template <int C, int HD>
__device__ __forceinline__ void vfrag_load(const KvFormat& f, const uint8_t* page, int row_bytes, int a, int cb,
                                           uint32_t (&ra)[HD / 16], uint32_t (&rb)[HD / 16]) {
  switch (frag_codec(C, f)) {
    case KvCodec::F16:
      lds_codes<HD / 16>(page, a * row_bytes + 2 * cb, ra);
      lds_codes<HD / 16>(page, (a + 1) * row_bytes + 2 * cb, rb);
      return;
    case KvCodec::Int4:
      lds_codes<HD / 64>(page, a * row_bytes + cb / 2, ra);
      lds_codes<HD / 64>(page, (a + 1) * row_bytes + cb / 2, rb);
      return;
    case KvCodec::Turbo:  // ra[p] / rb[p]: plane p of the lane's hd/8 channels of keys a, a + 1
      turbo_planes<frag_planes(C), HD, HD / 64>(f, page, a * row_bytes, cb, ra);
      turbo_planes<frag_planes(C), HD, HD / 64>(f, page, (a + 1) * row_bytes, cb, rb);
      return;
    default:
      lds_codes<HD / 32>(page, a * row_bytes + cb, ra);
      lds_codes<HD / 32>(page, (a + 1) * row_bytes + cb, rb);
  }
}

// The pair's scales: sc[q] / mn[q] for the 8-channel block q of the slice, as f16 pairs
// (key a low, a + 1 high; per channel: the channel's own pair duplicated; turbo: the norms).
// Static fp8 scales (and turbo's 1/sqrt(hd)) are applied to O instead: sc = 1.
template <int C, int HD>
__device__ __forceinline__ void vfrag_scales(const KvFormat& f, const uint8_t* page, int meta_offset, int a, int cb,
                                             uint32_t (&sc)[HD / 64 > 0 ? HD / 64 : 1],
                                             uint32_t (&mn)[HD / 64 > 0 ? HD / 64 : 1]) {
  constexpr int NQ = HD / 64 > 0 ? HD / 64 : 1;
  const KvCodec c = frag_codec(C, f);
  const uint8_t* meta = page + meta_offset;
#pragma unroll
  for (int q = 0; q < NQ; ++q) {
    sc[q] = 0x3c003c00u;  // (1, 1)
    mn[q] = 0;
    if (frag_token_scaled(C, f)) {
      sc[q] = lds32(meta + 2 * a);
    } else if (frag_scale(C, f) == KvScale::Group) {
      const int per_row = HD / f.group, gq = (cb + 8 * q) / f.group;
      if (c == KvCodec::Int4) {
        const uint32_t x = lds32(meta + 4 * (a * per_row + gq)), y = lds32(meta + 4 * ((a + 1) * per_row + gq));
        sc[q] = prmt(x, y, 0x5410);
        mn[q] = prmt(x, y, 0x7632);
      } else {
        sc[q] = prmt(lds16(meta + 2 * (a * per_row + gq)), lds16(meta + 2 * ((a + 1) * per_row + gq)), 0x5410);
      }
    }
  }
}

// Word n of the pair: (V[a][ch], V[a + 1][ch]) as an f16 pair, scaled, ch = cb +
// kv_v_channel(n) (cb + n but for turbo).
template <int C, int HD>
__device__ __forceinline__ uint32_t vfrag_word(const KvFormat& f, const uint32_t (&ra)[HD / 16],
                                               const uint32_t (&rb)[HD / 16], const uint32_t* sc, const uint32_t* mn,
                                               const uint8_t* chmeta, const TurboBook& book, int n) {
  const KvCodec c = frag_codec(C, f);
  switch (c) {
    case KvCodec::Turbo: {  // n = (hd/32)·i + m: channel i + 4m (kv_v_channel)
      constexpr int NPI = HD / 32, NPL = frag_planes(C);
      uint32_t w[NPL > 0 ? NPL : 1];  // bytes (a's channels 0-7, a + 1's 0-7, a's 8-15, a + 1's 8-15) of each plane
#pragma unroll
      for (int p = 0; p < NPL; ++p) w[p] = prmt(ra[p], rb[p], 0x5140);
      uint32_t idx, top, lo, hi;
      turbo_gather<NPL>(w, n / NPI, idx, top);  // nibbles: a's i, i + 4, then a + 1's (then 8 + i, 12 + i)
      const int sh = 16 * ((n % NPI) / 2);
      turbo_lookup4<NPL>(book, idx >> sh, top >> sh, lo, hi);
      const uint32_t v = prmt(lo, hi, n % 2 ? 0x7351 : 0x6240);  // (a, a + 1) of one channel
      return h2u(__hmul2(u2h(v), u2h(sc[0])));
    }
    case KvCodec::F16:
      return prmt(ra[n / 2], rb[n / 2], n % 2 ? 0x7632 : 0x5410);
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2: {
      const uint32_t t = prmt(ra[n / 4], rb[n / 4], n % 4 < 2 ? 0x5140 : 0x7362);  // (a_k, b_k, a_k+1, b_k+1)
      const uint32_t v = fp8x2_to_h2(c, t >> (16 * (n % 2)));
      return frag_scale(C, f) == KvScale::Token ? h2u(__hmul2(u2h(v), u2h(sc[n / 8]))) : v;
    }
    case KvCodec::Int8: {
      const uint32_t t = prmt(ra[n / 4] ^ 0x80808080u, rb[n / 4] ^ 0x80808080u, n % 4 < 2 ? 0x5140 : 0x7362);
      return h2u(__hmul2(u2h(s8x2_to_h2(t, n % 2 ? 0x4342 : 0x4140)), u2h(sc[n / 8])));
    }
    case KvCodec::Int4: {
      const uint32_t t = prmt(ra[n / 8], rb[n / 8], n % 8 < 4 ? 0x5410 : 0x7632);  // a's 4 channels, then b's
      const uint32_t v = u4x2_to_h2(t >> (4 * (n % 4)));
      if (frag_scale(C, f) == KvScale::Channel) {
        const uint32_t x = lds32(chmeta + 4 * n);
        return h2u(__hfma2(u2h(v), u2h(prmt(x, 0, 0x1010)), u2h(prmt(x, 0, 0x3232))));
      }
      return h2u(__hfma2(u2h(v), u2h(sc[n / 8]), u2h(mn[n / 8])));
    }
    default:
      return 0;
  }
}

// Whether, with max_splits splits, the kernel writes the normalized output itself (one split,
// values not turbo) rather than partials for the merge.
bool attention_quant_decode_frag_direct(const KvLayerView& kv, int max_splits);
// The kernel (attention_quant_decode_frag.cu; applies: kernels.h): head_dim 64/128, blocks of
// 16, at most 16 query heads per KV head, K and V each f16, fp8, int8, int4 or turbo (keys
// without QJL). With one split and V not turbo it writes the normalized output, else the
// partials of every split (launch_attention_quant_decode then runs its merge, which rotates
// turbo values back). max_rows > 1: a verification batch, as launch_attention_decode_mma's
// (kernels.h): chunks of 16 / group query rows, partials per query row.
void launch_attention_quant_decode_frag(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                        int n_heads, float scale, int split_len, int max_splits, float* partials,
                                        float* out, int64_t ldo, cudaStream_t s, int max_rows = 1);

}  // namespace tessera::cuda
