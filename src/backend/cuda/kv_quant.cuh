#pragma once
// Quantized KV pages on the device (layouts: backend/kv_format.h, docs/design/kv-quant.md):
// where one K or V tensor's pages and constants are (KvSide, built on the host), and the
// decoders the attention kernels call to turn 8 channels of one token into f32 registers.
// The store kernel (kv_store_quant.cu) writes the same bytes as the CPU encoder
// (kv_codec.cpp); the decoders here compute the same values as kv_decode_rows.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_common.cuh"
#include "backend/kv_codec.h"
#include "backend/op_types.h"

namespace tessera::cuda {

// One of K or V of a layer, as the kernels take it (by value).
struct KvSide {
  const uint8_t* base = nullptr;  // page p at base + p * page_bytes
  KvFormat f;
  int64_t page_bytes = 0, row_bytes = 0, meta_offset = 0, plane_bytes = 0, qjl_offset = 0;
  const float* scales = nullptr;   // [n_kv_heads] static fp8 scales (consts), or null
  const float* code_hi = nullptr;  // turbo codebooks (unit-variance centroids)
  const float* code_lo = nullptr;
  const float* signs = nullptr;  // turbo: the query side's diagonal, [n_kv_heads, hd] (D; D∘s for equalized keys)
  const float* qjl = nullptr;    // turbo keys: S, [n_kv_heads, hd, hd]
  // A format that centers keys (kv_codec.h; V too, where μ is zeros): μ [n_kv_heads, hd], the
  // store's diagonal [n_kv_heads, hd] (D/s for equalized keys, else D), and for keys the first
  // key's center part [flag, n_kv_heads * hd] (flag 0: position 0 centered like the others).
  const float* mean = nullptr;
  const float* store_signs = nullptr;
  const float* first = nullptr;
};

inline KvSide kv_side(const KvLayerView& kv, bool is_key) {
  KvSide s;
  s.base = static_cast<const uint8_t*>(is_key ? kv.k : kv.v);
  s.f = is_key ? kv.k_fmt : kv.v_fmt;
  const KvPageLayout l = kv_page_layout(s.f, kv.block_size, kv.head_dim);
  s.page_bytes = is_key ? kv.k_page_bytes : kv.v_page_bytes;
  s.row_bytes = l.row_bytes;
  s.meta_offset = l.meta_offset;
  s.plane_bytes = l.plane_bytes;
  s.qjl_offset = l.qjl_offset;
  const float* c = is_key ? kv.k_consts : kv.v_consts;
  if (c) {
    const KvConstantsLayout cl = kv_constants_layout(s.f, kv.n_kv_heads, kv.head_dim);
    s.scales = c + cl.scales;
    if (s.f.codec == KvCodec::Turbo) {
      s.code_hi = c + cl.code_hi;
      s.code_lo = c + cl.code_lo;
      s.signs = c + cl.signs;
      if (s.f.qjl) s.qjl = c + cl.qjl;
    }
    if (s.f.centers_keys()) {
      s.mean = c + cl.mean;
      s.store_signs = c + cl.store_signs;
      if (is_key) s.first = c + cl.first;
    }
  }
  return s;
}

__device__ __forceinline__ float meta_f16(const uint8_t* page, int64_t meta_offset, int64_t i) {
  return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(page + meta_offset)[i]));
}

__device__ __forceinline__ float fp8_decode(uint8_t v, KvCodec c) {
  if (c == KvCodec::Fp8E4M3) {
    __nv_fp8_e4m3 x;
    x.__x = v;
    return static_cast<float>(x);
  }
  __nv_fp8_e5m2 x;
  x.__x = v;
  return static_cast<float>(x);
}

// Channels [d0, d0 + 8) of token j of one page (d0 a multiple of 8) in two halves: kv_load8
// issues the loads (codes and their scales, as stored), kv_convert8 forms f32 values, so a
// caller can have several keys' loads in flight while holding only their raw bytes. Turbo
// values are in the rotated basis (|x|/sqrt(hd) · centroid), as kv_decode_rows. `head`
// picks the static scale. C: the codec (a KvCodec value) when the caller knows it at compile
// time (the switches fold), -1 to read it from s. Groups of channels (int8:gN, int4:gN) are
// multiples of 8 on CUDA (supports_kv_format), so 8 channels share one scale.
struct Raw8 {
  uint4 a;                    // codes (f16: 16 bytes; f32: a and b; fp8/int8: 8; int4: 4; turbo: a plane per byte)
  uint4 b;                    // f32: the upper 4 floats; turbo: the QJL signs
  const uint8_t* meta;        // int4 per channel: the channels' (scale, min) pairs, read at conversion
  float s = 1.0f, mn = 0.0f;  // scale and min; turbo: |x|/sqrt(hd) and the QJL factor
};

template <int C = -1>
__device__ __forceinline__ void kv_load8(const KvSide& s, const uint8_t* page, int j, int d0, int hd, int head,
                                         Raw8& r) {
  const uint8_t* row = page + static_cast<int64_t>(j) * s.row_bytes;
  switch (C < 0 ? s.f.codec : static_cast<KvCodec>(C)) {
    case KvCodec::F32:
      r.a = *reinterpret_cast<const uint4*>(row + 4 * d0);
      r.b = *reinterpret_cast<const uint4*>(row + 4 * d0 + 16);
      return;
    case KvCodec::F16:
      r.a = *reinterpret_cast<const uint4*>(row + 2 * d0);
      return;
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2: {
      const uint2 u = *reinterpret_cast<const uint2*>(row + d0);
      r.a.x = u.x, r.a.y = u.y;
      r.s = s.f.scale == KvScale::Token ? meta_f16(page, s.meta_offset, j) : s.scales[head];
      return;
    }
    case KvCodec::Int8: {
      const uint2 u = *reinterpret_cast<const uint2*>(row + d0);
      r.a.x = u.x, r.a.y = u.y;
      const int g = s.f.scale == KvScale::Group ? s.f.group : hd;
      r.s = meta_f16(page, s.meta_offset, static_cast<int64_t>(j) * (hd / g) + d0 / g);
      return;
    }
    case KvCodec::Int4: {
      r.a.x = *reinterpret_cast<const uint32_t*>(row + d0 / 2);
      if (s.f.scale == KvScale::Channel) {  // (scale, min) of channels d0..d0+7: the page's, cached
        r.meta = page + s.meta_offset + 4 * d0;
        return;
      }
      const int64_t m = 2 * (static_cast<int64_t>(j) * (hd / s.f.group) + d0 / s.f.group);
      r.s = meta_f16(page, s.meta_offset, m);
      r.mn = meta_f16(page, s.meta_offset, m + 1);
      return;
    }
    case KvCodec::Turbo: {
      const int half = hd / 2, h = d0 >= half;
      const int bits = h ? s.f.bits_lo : s.f.bits_hi;
      const uint8_t* planes = row + (h ? s.plane_bytes * s.f.bits_hi : 0) + (d0 - h * half) / 8;
      uint32_t packed = 0;
      for (int p = 0; p < bits; ++p) packed |= static_cast<uint32_t>(planes[p * s.plane_bytes]) << (8 * p);
      r.a.x = packed;
      r.s = meta_f16(page, s.meta_offset, static_cast<int64_t>(j) * (s.f.qjl ? 2 : 1)) * rsqrtf(hd);
      if (s.f.qjl) {  // the sketch signs of these 8 channels and sqrt(pi/2)/hd · |r|
        r.b.x = row[s.qjl_offset + d0 / 8];
        r.mn = sqrtf(3.14159265358979f / 2.0f) / static_cast<float>(hd) *
               meta_f16(page, s.meta_offset, 2 * static_cast<int64_t>(j) + 1);
      }
      return;
    }
  }
}

template <int C = -1>
__device__ __forceinline__ void kv_convert8(const KvSide& s, const Raw8& r, int d0, int hd, float* out) {
  switch (C < 0 ? s.f.codec : static_cast<KvCodec>(C)) {
    case KvCodec::F32: {
      const float* f = reinterpret_cast<const float*>(&r.a);
      const float* g = reinterpret_cast<const float*>(&r.b);
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = f[i], out[4 + i] = g[i];
      return;
    }
    case KvCodec::F16: {
      const __half2* h = reinterpret_cast<const __half2*>(&r.a);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
      return;
    }
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2: {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&r.a);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = fp8_decode(b[i], s.f.codec) * r.s;
      return;
    }
    case KvCodec::Int8: {
      const int8_t* b = reinterpret_cast<const int8_t*>(&r.a);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(b[i]) * r.s;
      return;
    }
    case KvCodec::Int4: {
      if (s.f.scale == KvScale::Channel) {
        const uint4 b = *reinterpret_cast<const uint4*>(r.meta), c = *reinterpret_cast<const uint4*>(r.meta + 16);
        const __half* m0 = reinterpret_cast<const __half*>(&b);
        const __half* m1 = reinterpret_cast<const __half*>(&c);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const __half* m = i < 4 ? m0 + 2 * i : m1 + 2 * (i - 4);
          out[i] = __half2float(m[1]) + static_cast<float>((r.a.x >> (4 * i)) & 15u) * __half2float(m[0]);
        }
        return;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = r.mn + static_cast<float>((r.a.x >> (4 * i)) & 15u) * r.s;
      return;
    }
    case KvCodec::Turbo: {
      const float* code = d0 >= hd / 2 ? s.code_lo : s.code_hi;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        int idx = 0;
#pragma unroll
        for (int p = 0; p < 4; ++p) idx |= ((r.a.x >> (8 * p + i)) & 1) << p;  // unused planes are zero
        out[i] = code[idx] * r.s;  // global or (staged) shared memory: a generic load
      }
      return;
    }
  }
}

template <int C = -1>
__device__ __forceinline__ void kv_decode8(const KvSide& s, const uint8_t* page, int j, int d0, int hd, int head,
                                           float* out) {
  Raw8 r;
  kv_load8<C>(s, page, j, d0, hd, head, r);
  kv_convert8<C>(s, r, d0, hd, out);
}

// Turbo keys: the QJL signs loaded by kv_load8 as ±(sqrt(pi/2)/hd · |r|), so q·r ≈ (S q') · these.
__device__ __forceinline__ void kv_convert_qjl8(const Raw8& r, float* out) {
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = ((r.b.x >> i) & 1) ? r.mn : -r.mn;
}

// In shared memory, in place: x[0..n) <- H x (unnormalized Walsh–Hadamard, the butterflies
// of kv_codec.h's fwht, so the sums are the same), for `rows` rows of stride ld at once.
// Every thread of the block calls it; it ends with a barrier.
__device__ __forceinline__ void block_fwht(float* x, int n, int rows, int ld) {
  for (int h = 1; h < n; h *= 2) {
    __syncthreads();
    for (int i = threadIdx.x; i < rows * (n / 2); i += blockDim.x) {
      const int r = i / (n / 2), p = i % (n / 2);
      const int j = (p / h) * 2 * h + p % h;
      float* row = x + r * ld;
      const float a = row[j], b = row[j + h];
      row[j] = a + b;
      row[j + h] = a - b;
    }
  }
  __syncthreads();
}

// 8 decoded channels into shared memory: f32 one by one (the CUDA-core kernel's rows are
// padded to an odd stride), f16 as one 16-byte store (the tensor-core kernel's rows are
// 16-byte aligned).
__device__ __forceinline__ void store8(float* dst, const float* v) {
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = v[i];
}
__device__ __forceinline__ void store8(__half* dst, const float* v) {
  uint4 u;
  u.x = pack_half2(v[0], v[1]);
  u.y = pack_half2(v[2], v[3]);
  u.z = pack_half2(v[4], v[5]);
  u.w = pack_half2(v[6], v[7]);
  *reinterpret_cast<uint4*>(dst) = u;
}

// One tile of keys [base, base + tile) of a sequence (block table `table`), KV head kvh,
// decoded into shared memory (T = float or __half): Ks[j * ldk + c] (c < hd; turbo keys with
// QJL add the scaled signs at c in [hd, 2 hd)) and Vs[j * ldv + c]; keys at or past `end` are
// zeros. All threads of the block take 8 channels of one key at a time. No barrier.
template <typename T>
__device__ __forceinline__ void kv_decode_tile(const KvSide& ks, const KvSide& vs, const int32_t* table, int n_kv_heads,
                                               int block_size, int kvh, int base, int end, int tile, int hd, T* Ks,
                                               int ldk, T* Vs, int ldv) {
  const int per_key = hd / 8;
  for (int it = threadIdx.x; it < tile * per_key; it += blockDim.x) {
    const int j = it / per_key, d0 = (it % per_key) * 8, key = base + j;
    float kf[8], vf[8], sg[8];
    if (key < end) {
      const int64_t page = static_cast<int64_t>(table[key / block_size]) * n_kv_heads + kvh;
      const int jj = key % block_size;
      Raw8 kr;
      kv_load8(ks, ks.base + page * ks.page_bytes, jj, d0, hd, kvh, kr);
      kv_convert8(ks, kr, d0, hd, kf);
      kv_decode8(vs, vs.base + page * vs.page_bytes, jj, d0, hd, kvh, vf);
      if (ks.f.qjl) kv_convert_qjl8(kr, sg);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) kf[i] = vf[i] = sg[i] = 0.0f;
    }
    store8(Ks + j * ldk + d0, kf);
    store8(Vs + j * ldv + d0, vf);
    if (ks.f.qjl) store8(Ks + j * ldk + hd + d0, sg);
  }
}

// Query rows in K's basis, in shared memory: Qs[r * ldq + c] holds the scaled query; turbo
// keys rotate it (q' = R q; equalized keys R (q∘s), s folded into the signs) and, with QJL, put S q' at c in [hd, 2 hd) (rows from live_rows
// on are zero queries: their S q' is set to zero, not computed). All threads call it (a
// multiple of 32); it ends with a barrier.
// first_terms (shared, [rows], or null where the block's keys do not hold position 0; block-
// uniform): each row's score term of the key at position 0,
// first_mul · q·(first − μ) from the query before its rotation, where that key is stored
// around its own center (ks.first's flag; the softmax drops the q·μ every other key lacks,
// not this difference; docs/design/kv-quant.md, "The first key"); 0 where it is not.
__device__ __forceinline__ void kv_prepare_queries(const KvSide& ks, int kvh, int hd, float* Qs, int ldq, int rows,
                                                   int live_rows = -1, float* first_terms = nullptr,
                                                   float first_mul = 1.0f) {
  __syncthreads();
  if (first_terms) {
    const bool first = ks.first && ks.first[0] != 0.0f;
    const float* fc = first ? ks.first + 1 + static_cast<int64_t>(kvh) * hd : nullptr;
    const float* mu = first ? ks.mean + static_cast<int64_t>(kvh) * hd : nullptr;
    const int lane = threadIdx.x & 31;
    for (int r = threadIdx.x >> 5; r < rows; r += blockDim.x >> 5) {  // a warp per row
      float acc = 0.0f;
      if (first)
        for (int d = lane; d < hd; d += 32) acc = fmaf(Qs[r * ldq + d], __ldg(fc + d) - __ldg(mu + d), acc);
#pragma unroll
      for (int m = 16; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
      if (lane == 0) first_terms[r] = acc * first_mul;
    }
    __syncthreads();  // the rotation below overwrites the rows read here
  }
  if (ks.f.codec != KvCodec::Turbo) return;
  const float* signs = ks.signs + static_cast<int64_t>(kvh) * hd;
  for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) Qs[(i / hd) * ldq + i % hd] *= signs[i % hd];
  block_fwht(Qs, hd, rows, ldq);
  const float inv_sqrt = 1.0f / sqrtf(static_cast<float>(hd));
  for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) Qs[(i / hd) * ldq + i % hd] *= inv_sqrt;
  __syncthreads();
  if (!ks.f.qjl) return;
  // S q': a warp per row o of S, read once and coalesced (lane c + 32k), a dot product per
  // query row reduced across the warp. (A thread per (row, o) walking S's row alone was a
  // chain of 2·hd dependent loads and FMAs per output: 734 against 182 us at 1 × 32k.)
  const float* S = ks.qjl + static_cast<int64_t>(kvh) * hd * hd;
  const int lane = threadIdx.x & 31, live = live_rows < 0 ? rows : live_rows;
  for (int o = threadIdx.x >> 5; o < hd; o += blockDim.x >> 5) {
    float sv[8];  // hd <= 256
#pragma unroll
    for (int k = 0; k < 8; ++k) sv[k] = 32 * k < hd ? __ldg(S + static_cast<int64_t>(o) * hd + lane + 32 * k) : 0.0f;
    for (int r = 0; r < rows; ++r) {
      float acc = 0.0f;
      if (r < live) {
        const float* qr = Qs + r * ldq + lane;
#pragma unroll
        for (int k = 0; k < 8; ++k)
          if (32 * k < hd) acc = fmaf(sv[k], qr[32 * k], acc);
#pragma unroll
        for (int m = 16; m > 0; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
      }
      if (lane == 0) Qs[r * ldq + hd + o] = acc;
    }
  }
  __syncthreads();
}

// The operand-tile tensor-core decode kernel (attention_quant_decode_mma.cu) of what the
// fragment kernel (kv_quant_frag.cuh) declines: turbo keys with the QJL sketch, f32 on a side.
// head_dim 64/128, at most 16 query heads per KV head. Writes the partials of every split
// (launch_attention_quant_decode then runs its merge).
bool attention_quant_decode_mma_applies(const KvLayerView& kv, int n_heads);
void launch_attention_quant_decode_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                       int n_heads, float scale, int split_len, int max_splits, float* partials,
                                       cudaStream_t s);

}  // namespace tessera::cuda
