#pragma once
// Scalar conversions between f32 and the 16-bit float formats (IEEE half, bfloat16).
// Vector code uses F16C / AVX-512 BF16 instructions; these are the reference and the
// fallback, and they round to nearest even like the hardware does.
#include <cstdint>
#include <cstring>

namespace tessera {

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t bits_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float fp16_to_f32(uint16_t h) {
  // Exact: every half is representable in f32. Denormals go through the magic-number trick.
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = f32_from_bits(0x7800000u);  // 2^-112
  const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? bits_from_f32(denormalized) : bits_from_f32(normalized));
  return f32_from_bits(result);
}

inline uint16_t f32_to_fp16(float f) {
  const float scale_to_inf = f32_from_bits(0x77800000u);   // 2^112
  const float scale_to_zero = f32_from_bits(0x08800000u);  // 2^-110
  float base = (f < 0 ? -f : f) * scale_to_inf * scale_to_zero;
  const uint32_t w = bits_from_f32(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_from_f32(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1);                                                     // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tessera
