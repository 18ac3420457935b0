#pragma once
// Byte layouts of the GGUF block formats, identical to GGML's so that tensors from a GGUF
// file are used in place. QK = elements per block.
#include <cstdint>

namespace tessera {

constexpr int kQK4_0 = 32, kQK4_1 = 32, kQK5_0 = 32, kQK5_1 = 32, kQK8_0 = 32, kQK8_1 = 32;
constexpr int kQK_K = 256;        // super-block of the K-quants
constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K

#pragma pack(push, 1)
// x = (q - 8) * d; qs[j] low nibble is element j, high nibble element j + 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};
// x = q * d + m
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK4_1 / 2];
};
// x = (q - 16) * d; the 5th bit of element j is bit j of qh.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK5_0 / 2];
};
// x = q * d + m
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
// x = q * d
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
// x = q * d; s = d * sum(qs) (lets Q4_1/Q5_1 dots fold in their offset m)
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQK8_1];
};
// 8 sub-blocks of 32, each with a 6-bit scale and min: x = d * sc * q - dmin * m
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16 with int8 scales: x = d * sc * (q - 32)
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
// Activation format for K-quant dots: f32 scale, int8 values, sums of each group of 16.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace tessera
