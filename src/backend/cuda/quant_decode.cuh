#pragma once
// Decoding of GGUF weight rows on the device, 8 consecutive elements at a time: every block
// format's blocks hold a multiple of 8 elements, so such a group never straddles blocks.
// The arithmetic follows GGML's dequantize_row_* (and tessera's quant/quant*.cpp) exactly:
// the same products in the same order, so decoded values equal the CPU's bit for bit.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "core/dtype.h"
#include "quant/blocks.h"

namespace tessera::cuda {

__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// Q4_K/Q5_K packed 6-bit scale and min of sub-block j (GGML's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Four E4M3 codes (one 32-bit word, lowest byte first) as floats: two hardware
// cvt.f16x2.e4m3x2, exact (every E4M3 value is an f16).
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float* out) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFF), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  out[0] = half_bits_to_f32(lo.x);
  out[1] = half_bits_to_f32(lo.y);
  out[2] = half_bits_to_f32(hi.x);
  out[3] = half_bits_to_f32(hi.y);
}

// out[0..8) = elements e .. e+7 of a row starting at `row` (e a multiple of 8). FP8W: the
// codes only (the caller applies the row's scale to the finished sum).
template <DType T>
__device__ __forceinline__ void decode8(const uint8_t* __restrict__ row, int64_t e, float* out) {
  if constexpr (T == DType::FP8W) {
    const uint2 v = *reinterpret_cast<const uint2*>(row + e);
    e4m3x4_to_f32(v.x, out);
    e4m3x4_to_f32(v.y, out + 4);
  } else if constexpr (T == DType::F32) {
    const float4* p = reinterpret_cast<const float4*>(row + e * 4);
    const float4 a = p[0], b = p[1];
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
    out[4] = b.x;
    out[5] = b.y;
    out[6] = b.z;
    out[7] = b.w;
  } else if constexpr (T == DType::F16 || T == DType::BF16) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + e * 2);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = static_cast<uint16_t>(w[i] & 0xffff), hi = static_cast<uint16_t>(w[i] >> 16);
      if constexpr (T == DType::F16) {
        out[2 * i] = half_bits_to_f32(lo);
        out[2 * i + 1] = half_bits_to_f32(hi);
      } else {
        out[2 * i] = bf16_bits_to_f32(lo);
        out[2 * i + 1] = bf16_bits_to_f32(hi);
      }
    }
  } else if constexpr (T == DType::Q4_0 || T == DType::Q4_1) {
    constexpr int kBytes = T == DType::Q4_0 ? 18 : 20;
    const uint8_t* b = row + (e / 32) * kBytes;
    const int w = static_cast<int>(e % 32);
    const float d = half_bits_to_f32(load_u16(b));
    const uint8_t* qs = b + (T == DType::Q4_0 ? 2 : 4);
    const int base = w & 15;
    const int shift = w >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = (qs[base + i] >> shift) & 0xF;
      if constexpr (T == DType::Q4_0)
        out[i] = static_cast<float>(q - 8) * d;
      else
        out[i] = static_cast<float>(q) * d + half_bits_to_f32(load_u16(b + 2));
    }
  } else if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
    constexpr int kBytes = T == DType::Q5_0 ? 22 : 24;
    const uint8_t* b = row + (e / 32) * kBytes;
    const int w = static_cast<int>(e % 32);
    const float d = half_bits_to_f32(load_u16(b));
    const uint8_t* qh8 = b + (T == DType::Q5_0 ? 2 : 4);
    const uint32_t qh = qh8[0] | (qh8[1] << 8) | (qh8[2] << 16) | (static_cast<uint32_t>(qh8[3]) << 24);
    const uint8_t* qs = qh8 + 4;
    const int base = w & 15;
    const int shift = w >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = ((qs[base + i] >> shift) & 0xF) | (((qh >> (w + i)) & 1) << 4);
      if constexpr (T == DType::Q5_0)
        out[i] = static_cast<float>(q - 16) * d;
      else
        out[i] = static_cast<float>(q) * d + half_bits_to_f32(load_u16(b + 2));
    }
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* b = row + (e / 32) * 34;
    const float d = half_bits_to_f32(load_u16(b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2) + e % 32;
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(qs[i]) * d;
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    constexpr int kBytes = T == DType::Q4_K ? 144 : 176;
    const uint8_t* b = row + (e / 256) * kBytes;
    const int w = static_cast<int>(e % 256);
    const int j = w / 64, hi = (w % 64) >= 32 ? 1 : 0, l0 = w % 32;
    int sc, mn;
    scale_min_k4(2 * j + hi, b + 4, sc, mn);
    const float dd = half_bits_to_f32(load_u16(b)) * static_cast<float>(sc);
    const float mm = half_bits_to_f32(load_u16(b + 2)) * static_cast<float>(mn);
    const uint8_t* qs = b + 4 + 12 + (T == DType::Q5_K ? 32 : 0) + 32 * j + l0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int q = hi ? (qs[i] >> 4) : (qs[i] & 0xF);
      if constexpr (T == DType::Q5_K) q += (b[16 + l0 + i] >> (2 * j + hi)) & 1 ? 16 : 0;
      out[i] = dd * static_cast<float>(q) - mm;
    }
  } else if constexpr (T == DType::Q6_K) {
    const uint8_t* b = row + (e / 256) * 210;
    const int w = static_cast<int>(e % 256);
    const int half = w / 128, r = w % 128, quarter = r / 32, l0 = r % 32;
    const uint8_t* ql = b + 64 * half + (quarter & 1) * 32 + l0;
    const uint8_t* qh = b + 128 + 32 * half + l0;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * half + l0 / 16 + 2 * quarter;
    const float d = half_bits_to_f32(load_u16(b + 208));
    const int ql_shift = quarter >= 2 ? 4 : 0, qh_shift = 2 * quarter;
    const float ds = d * static_cast<float>(*sc);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = (((ql[i] >> ql_shift) & 0xF) | (((qh[i] >> qh_shift) & 3) << 4)) - 32;
      out[i] = ds * static_cast<float>(q);
    }
  }
}

// Calls f.template operator()<T>() for the runtime type t; false when t has no decoder.
template <typename F>
bool dispatch_weight_type(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      f.template operator()<DType::F32>();
      return true;
    case DType::F16:
      f.template operator()<DType::F16>();
      return true;
    case DType::BF16:
      f.template operator()<DType::BF16>();
      return true;
    case DType::Q4_0:
      f.template operator()<DType::Q4_0>();
      return true;
    case DType::Q4_1:
      f.template operator()<DType::Q4_1>();
      return true;
    case DType::Q5_0:
      f.template operator()<DType::Q5_0>();
      return true;
    case DType::Q5_1:
      f.template operator()<DType::Q5_1>();
      return true;
    case DType::Q8_0:
      f.template operator()<DType::Q8_0>();
      return true;
    case DType::Q4_K:
      f.template operator()<DType::Q4_K>();
      return true;
    case DType::Q5_K:
      f.template operator()<DType::Q5_K>();
      return true;
    case DType::Q6_K:
      f.template operator()<DType::Q6_K>();
      return true;
    default:
      return false;
  }
}

}  // namespace tessera::cuda
