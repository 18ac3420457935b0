#pragma once
// Helpers shared by the quantization tests: fixture files, type names, bit comparisons.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
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
  static const std::vector<DType> all = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                                         DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1, DType::Q4_K,
                                         DType::Q5_K, DType::Q6_K, DType::Q8_K};
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

// Counter-based splitmix64, as in tools/fixtures/make_quant_fixtures.py.
inline uint64_t splitmix64(uint64_t stream, uint64_t index) {
  uint64_t z = stream + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// sum_i word_i * (splitmix64(7, i) | 1) mod 2^64, continued from `state` at word index
// `start`: the generator's checksum64.
template <typename Word>
uint64_t checksum64(uint64_t state, const Word* words, int64_t n, uint64_t start) {
  for (int64_t i = 0; i < n; ++i) {
    state += static_cast<uint64_t>(words[i]) * (splitmix64(7, start + static_cast<uint64_t>(i)) | 1);
  }
  return state;
}

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The generator's bulk_inputs(): exact float64 arithmetic on hashed integers, one f32 rounding.
inline std::vector<float> bulk_inputs(int64_t n_blocks) {
  const int64_t n = n_blocks * 256;
  std::vector<float> x(static_cast<size_t>(n));
  auto unit = [](uint64_t stream, uint64_t idx) {
    return static_cast<double>(splitmix64(stream, idx) >> 40) * 0x1p-24;
  };
  for (int64_t k = 0; k < n; ++k) {
    const auto i = static_cast<uint64_t>(k), sub = i / 32, blk = i / 256;
    const double noise = unit(1, 4 * i) + unit(1, 4 * i + 1) + unit(1, 4 * i + 2) + unit(1, 4 * i + 3) - 2.0;
    const uint64_t mode = splitmix64(2, blk) >> 62;
    const int e_block = static_cast<int>(splitmix64(3, blk) >> 60) - 10;
    const int e_sub = static_cast<int>(splitmix64(4, sub) >> 60) - 10;
    const int e = (mode & 1) ? e_sub : e_block;
    const double offset = (mode & 2) ? std::ldexp(unit(5, sub) - 0.5, e + 2) : 0.0;
    const bool zero = (splitmix64(6, i) & 63) == 0;
    x[static_cast<size_t>(k)] = zero ? 0.0f : static_cast<float>(std::ldexp(noise, e) + offset);
  }
  return x;
}

}  // namespace tessera::quant_test
