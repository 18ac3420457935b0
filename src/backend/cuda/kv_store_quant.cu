// Writes this step's keys and values into quantized pages, in place (kv_format.h layouts),
// computing what the CPU encoder (kv_codec.cpp, kv_encode_rows) computes, operation for
// operation: the same f32 divisions and f16 roundings, products and sums kept apart with
// __fmul_rn/__fadd_rn where nvcc would otherwise contract them into one FMA (the host code
// has none), sums of squares in double in the CPU's order. fp8 codes come from the hardware
// conversion (round to nearest even, saturating), as f32_to_fp8.
//
// Grid (n_tokens, n_kv_heads, 2: K then V), one block of round_up(hd, 32) threads, thread d
// owns channel d. Per-channel int4 keys (KIVI) need a page's tokens together: the block of
// the first token of each run (consecutive slots of one block) encodes the whole run, the
// others exit; its thread p owns channels 2p and 2p + 1 (one byte per token), re-codes the
// page's earlier tokens when the range widens, exactly as encode_int4_channel.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"

namespace tessera::cuda {

namespace {

constexpr int kMaxHd = 256;

__device__ __forceinline__ float f16_round(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ void put_f16(uint8_t* p, float x) {
  *reinterpret_cast<uint16_t*>(p) = __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float get_f16(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// int4 asymmetric grid over [lo, hi] (kv_codec.cpp): min on the f16 grid at or below lo,
// step on the f16 grid with min + 15 step >= hi. The per-channel encoder takes its first
// step from the min before that is lowered (step_first), the per-group one after.
__device__ __forceinline__ void int4_grid(float lo, float hi, float& mn, float& s, bool step_first) {
  mn = f16_round(lo);
  if (step_first) s = f16_round(__fsub_rn(hi, mn) / 15.0f);
  if (mn > lo) mn = f16_round(__fsub_rn(lo, __fmul_rn(fabsf(lo), 0x1.0p-10f)));
  if (!step_first) s = f16_round(__fsub_rn(hi, mn) / 15.0f);
  if (__fadd_rn(__fmul_rn(s, 15.0f), mn) < hi) s = f16_round(__fmul_rn(__fsub_rn(hi, mn) / 15.0f, 1.0f + 0x1.0p-10f));
}

__device__ __forceinline__ int int4_code(float x, float mn, float inv) {
  return min(max(static_cast<int>(rintf(__fmul_rn(__fsub_rn(x, mn), inv))), 0), 15);
}

__device__ __forceinline__ uint8_t fp8_encode(float x, KvCodec c) {
  return c == KvCodec::Fp8E4M3 ? __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
                               : __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}

// The KIVI keys of one run of n tokens (page offsets [offset, offset + n)).
__device__ void store_int4_channel(const KvSide& s, uint8_t* page, int offset, int n, const float* x, int64_t ldx,
                                   int hd) {
  const int p = threadIdx.x;
  if (2 * p >= hd) return;
  uint8_t* meta = page + s.meta_offset;
  for (int c = 0; c < 2; ++c) {
    const int d = 2 * p + c, sh = 4 * c;
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; ++j) {
      lo = fminf(lo, x[j * ldx + d]);
      hi = fmaxf(hi, x[j * ldx + d]);
    }
    float old_s = 0.0f, old_mn = 0.0f;
    if (offset > 0) {
      old_s = get_f16(meta + 4 * d);
      old_mn = get_f16(meta + 4 * d + 2);
      lo = fminf(lo, old_mn);
      hi = fmaxf(hi, __fadd_rn(old_mn, __fmul_rn(15.0f, old_s)));
    }
    float mn, sc;
    int4_grid(lo, hi, mn, sc, true);
    const float inv = sc > 0 ? 1.0f / sc : 0.0f;
    auto put = [&](int j, int q) {
      uint8_t* b = page + static_cast<int64_t>(j) * s.row_bytes + p;
      *b = static_cast<uint8_t>((*b & ~(15 << sh)) | (q << sh));
    };
    if (offset > 0 && (sc != old_s || mn != old_mn))
      for (int j = 0; j < offset; ++j) {  // the page's earlier tokens on the new grid
        const int code = (page[static_cast<int64_t>(j) * s.row_bytes + p] >> sh) & 15;
        put(j, int4_code(__fadd_rn(old_mn, __fmul_rn(static_cast<float>(code), old_s)), mn, inv));
      }
    for (int j = 0; j < n; ++j) put(offset + j, int4_code(x[j * ldx + d], mn, inv));
    put_f16(meta + 4 * d, sc);
    put_f16(meta + 4 * d + 2, mn);
  }
}

// Formats that center keys subtract the side's μ and rotate with its store diagonal (KvSide);
// keys at position 0 (positions) are centered on ks.first's center where its flag is set
// (kv_key_center).
__global__ void kv_store_quant_kernel(KvSide ks, KvSide vs, const float* __restrict__ k, int64_t ldk,
                                      const float* __restrict__ v, int64_t ldv, const int32_t* __restrict__ slots,
                                      const int32_t* __restrict__ positions, int n_tokens, int n_kv_heads,
                                      int block_size, int hd) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  __shared__ float xs[kMaxHd];       // the token's channels (turbo: rotated)
  __shared__ float rs[kMaxHd];       // turbo: residual
  __shared__ double sq[kMaxHd];      // squares, summed in order by thread 0
  __shared__ uint8_t codes[kMaxHd];  // int4 / turbo codes, QJL sign bits
  __shared__ uint8_t sbits[kMaxHd];
  __shared__ float shared_s[2];
  const int t = blockIdx.x, h = blockIdx.y;
  const bool is_key = blockIdx.z == 0;
  const KvSide& s = is_key ? ks : vs;
  const float* src = (is_key ? k : v);
  const int64_t ld = is_key ? ldk : ldv;
  const int slot = slots[t], blk = slot / block_size, off = slot % block_size;
  uint8_t* page = const_cast<uint8_t*>(s.base) + (static_cast<int64_t>(blk) * n_kv_heads + h) * s.page_bytes;
  uint8_t* meta = page + s.meta_offset;
  const float* x = src + t * ld + static_cast<int64_t>(h) * hd;
  const int d = threadIdx.x;
  const KvFormat f = s.f;

  if (f.codec == KvCodec::Int4 && f.scale == KvScale::Channel) {
    if (t > 0) {
      const int prev = slots[t - 1];
      if (prev / block_size == blk && prev % block_size + 1 == off) return;  // inside a run
    }
    int n = 1;
    while (t + n < n_tokens && slots[t + n] == slot + n && off + n < block_size) ++n;
    store_int4_channel(s, page, off, n, x, ld, hd);
    return;
  }
  uint8_t* row = page + static_cast<int64_t>(off) * s.row_bytes;
  const float xv = d < hd ? x[d] : 0.0f;
  if (d < hd) xs[d] = xv;
  __syncthreads();
  switch (f.codec) {
    case KvCodec::F32:
      if (d < hd) reinterpret_cast<float*>(row)[d] = xv;
      return;
    case KvCodec::F16:
      if (d < hd) reinterpret_cast<__half*>(row)[d] = __float2half_rn(xv);
      return;
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2: {
      float sc;
      if (f.scale == KvScale::Token) {
        float amax = 0.0f;
        for (int i = 0; i < hd; ++i) amax = fmaxf(amax, fabsf(xs[i]));
        sc = f16_round(amax / (f.codec == KvCodec::Fp8E5M2 ? 57344.0f : 448.0f));
        if (d == 0) put_f16(meta + 2 * off, sc);
      } else {
        sc = s.scales[h];
      }
      const float inv = sc > 0 ? 1.0f / sc : 0.0f;
      if (d < hd) row[d] = fp8_encode(xv * inv, f.codec);
      return;
    }
    case KvCodec::Int8: {
      if (d >= hd) return;
      const int g = f.scale == KvScale::Group ? f.group : hd, ng = hd / g, q = d / g;
      float amax = 0.0f;
      for (int i = q * g; i < (q + 1) * g; ++i) amax = fmaxf(amax, fabsf(xs[i]));
      const float sc = f16_round(amax / 127.0f);
      if (d % g == 0) put_f16(meta + 2 * (static_cast<int64_t>(off) * ng + q), sc);
      const float inv = sc > 0 ? 1.0f / sc : 0.0f;
      row[d] = static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(rintf(xv * inv), -127.0f), 127.0f)));
      return;
    }
    case KvCodec::Int4: {
      const int g = f.group, ng = hd / g, q = d / g;
      if (d < hd) {
        float lo = INFINITY, hi = -INFINITY;
        for (int i = q * g; i < (q + 1) * g; ++i) {
          lo = fminf(lo, xs[i]);
          hi = fmaxf(hi, xs[i]);
        }
        float mn, sc;
        int4_grid(lo, hi, mn, sc, false);
        if (d % g == 0) {
          uint8_t* m = meta + 4 * (static_cast<int64_t>(off) * ng + q);
          put_f16(m, sc);
          put_f16(m + 2, mn);
        }
        codes[d] = static_cast<uint8_t>(int4_code(xv, mn, sc > 0 ? 1.0f / sc : 0.0f));
      }
      __syncthreads();
      if (d < hd / 2) row[d] = static_cast<uint8_t>(codes[2 * d] | (codes[2 * d + 1] << 4));
      return;
    }
    case KvCodec::Turbo:
      break;
  }
  // Turbo: y = H·D·(x − μ) / sqrt(hd) (equalized keys: D/s in place of D); coordinates scaled by sqrt(hd)/|y| (|y| in f16) coded
  // with the nearest centroid (bit planes); the f16 scale that makes <ŷ, y> = |y|² (QJL keys:
  // |y|); keys with QJL: the signs of S·(y - ŷ) and |y - ŷ|.
  const float* mean = s.mean;
  const float* diag = mean ? s.store_signs : s.signs;
  if (mean && s.first && s.first[0] != 0.0f && positions[t] == 0) mean = s.first + 1;
  if (d < hd) xs[d] = __fmul_rn(mean ? __fsub_rn(xv, mean[h * hd + d]) : xv, diag[h * hd + d]);
  block_fwht(xs, hd, 1, hd);
  const float inv_sqrt = 1.0f / sqrtf(static_cast<float>(hd));
  float y = 0.0f;
  if (d < hd) {
    y = xs[d] * inv_sqrt;
    sq[d] = __dmul_rn(static_cast<double>(y), static_cast<double>(y));
  }
  __syncthreads();
  __shared__ double shared_ss;
  if (d == 0) {
    double ss = 0;
    for (int i = 0; i < hd; ++i) ss = __dadd_rn(ss, sq[i]);
    shared_ss = ss;
    shared_s[0] = f16_round(static_cast<float>(sqrt(ss)));
  }
  __syncthreads();
  const float norm = shared_s[0];
  const int meta_stride = f.qjl ? 4 : 2;
  const float to_unit = norm > 0 ? sqrtf(static_cast<float>(hd)) / norm : 0.0f;
  const int half = hd / 2;
  const float* code = d >= half ? s.code_lo : s.code_hi;
  int ci = 0;
  if (d < hd) {
    const int n_codes = 1 << (d >= half ? f.bits_lo : f.bits_hi);
    const float tv = __fmul_rn(y, to_unit);
    while (ci + 1 < n_codes && tv > 0.5f * (code[ci] + code[ci + 1])) ++ci;
    codes[d] = static_cast<uint8_t>(ci);
    sq[d] = __dmul_rn(static_cast<double>(code[ci]), static_cast<double>(y));
  }
  __syncthreads();
  // The stored scale (kv_codec.cpp, encode_turbo_row): without QJL, |y|² sqrt(hd) / <c, y>
  // so that <ŷ, y> = |y|²; QJL keys keep |y|. <c, y> summed in order by one thread.
  if (d == 0) {
    double dot = 0;
    for (int i = 0; i < hd; ++i) dot = __dadd_rn(dot, sq[i]);
    const double ss = shared_ss;
    const bool unbias = !f.qjl && ss > 0 && dot > 0;
    shared_s[1] =
        unbias ? f16_round(static_cast<float>(__ddiv_rn(__dmul_rn(ss, sqrt(static_cast<double>(hd))), dot))) : norm;
    put_f16(meta + static_cast<int64_t>(off) * meta_stride, shared_s[1]);
  }
  __syncthreads();
  const float from_unit = shared_s[1] / sqrtf(static_cast<float>(hd));
  if (d < hd) {
    const float r = __fsub_rn(y, __fmul_rn(code[ci], from_unit));
    rs[d] = r;
    sq[d] = __dmul_rn(static_cast<double>(r), static_cast<double>(r));
  }
  __syncthreads();
  if (f.qjl) {
    if (d == 0) {
      double rr = 0;
      for (int i = 0; i < hd; ++i) rr = __dadd_rn(rr, sq[i]);
      put_f16(meta + static_cast<int64_t>(off) * meta_stride + 2, static_cast<float>(sqrt(rr)));
    }
    if (d < hd) {  // sign of row d of S times r, summed in the CPU's order
      const float* srow = s.qjl + (static_cast<int64_t>(h) * hd + d) * hd;
      float dot = 0.0f;
      for (int i = 0; i < hd; ++i) dot = __fadd_rn(dot, __fmul_rn(srow[i], rs[i]));
      sbits[d] = dot >= 0.0f;
    }
    __syncthreads();
  }
  // Whole bytes: bit planes of each half, then (keys) the QJL signs.
  const int code_bytes = static_cast<int>(s.plane_bytes) * (f.bits_hi + f.bits_lo);
  const int row_bytes = static_cast<int>(s.row_bytes);
  for (int b = d; b < row_bytes; b += blockDim.x) {
    uint8_t byte = 0;
    if (b < code_bytes) {
      const int pb = static_cast<int>(s.plane_bytes);
      const int hh = b >= pb * f.bits_hi;
      const int rel = b - hh * pb * f.bits_hi, plane = rel / pb, c0 = hh * half + (rel % pb) * 8;
      for (int i = 0; i < 8; ++i) byte |= static_cast<uint8_t>(((codes[c0 + i] >> plane) & 1) << i);
    } else {
      const int c0 = (b - code_bytes) * 8;
      for (int i = 0; i < 8; ++i) byte |= static_cast<uint8_t>(sbits[c0 + i] << i);
    }
    row[b] = byte;
  }
}

}  // namespace

void launch_kv_store_quant(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                           const int32_t* slots, const int32_t* positions, int n_tokens, cudaStream_t st) {
  if (n_tokens <= 0) return;
  TESSERA_CHECK(kv.head_dim <= kMaxHd && kv.head_dim % 8 == 0, "cuda kv_store: head_dim ", kv.head_dim,
                " (a multiple of 8, at most ", kMaxHd, ", for quantized KV)");
  const int threads = static_cast<int>(round_up(kv.head_dim, 32));
  launch_pdl(kv_store_quant_kernel, dim3(n_tokens, kv.n_kv_heads, 2), dim3(threads), 0, st, kv_side(kv, true),
             kv_side(kv, false), k, ldk, v, ldv, slots, positions, n_tokens, kv.n_kv_heads, kv.block_size, kv.head_dim);
  TESSERA_CUDA_CHECK_LAUNCH("kv_store_quant");
}

}  // namespace tessera::cuda
