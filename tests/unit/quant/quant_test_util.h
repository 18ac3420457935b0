#pragma once
// Helpers shared by the quantization tests: fixture files, type names, bit comparisons.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera::quant_test {

inline std::string fixture_path(const std::string& name) {
  return std::string(TESSERA_FIXTURES_DIR) + "/quant/" + name;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ADD_FAILURE() << "cannot open fixture " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline std::vector<float> read_f32(const std::string& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  EXPECT_EQ(bytes.size() % 4, 0u) << path;
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// The formats of the quant contract, by GGML name.
inline const std::vector<DType>& block_and_plain_types() {
  static const std::vector<DType> all = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,
                                         DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                                         DType::Q8_1, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                         DType::Q8_K};
  return all;
}

inline DType dtype_from_name(const std::string& name) {
  for (DType t : block_and_plain_types()) {
    if (dtype_name(t) == name) return t;
  }
  return DType::Unknown;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Index of the first float whose bit pattern differs, or -1 (NaNs compare by bits too).
inline int64_t first_bit_mismatch(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (f32_bits(a[i]) != f32_bits(b[i])) return i;
  }
  return -1;
}

inline int64_t first_byte_mismatch(const uint8_t* a, const uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return -1;
}

// sum_i word_i * (2i + 1) mod 2^64, continued from `state` at word index `start`; the same
// checksum as tools/fixtures/make_quant_fixtures.py (odd multipliers: any one changed word
// changes the sum).
template <typename Word>
uint64_t checksum64(uint64_t state, const Word* words, int64_t n, uint64_t start) {
  for (int64_t i = 0; i < n; ++i) {
    state += static_cast<uint64_t>(words[i]) * (2 * (start + static_cast<uint64_t>(i)) + 1);
  }
  return state;
}

}  // namespace tessera::quant_test
