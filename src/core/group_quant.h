#pragma once
// Byte layout of one group-quantized integer weight matrix (DType::W4G / W8G): 4- or 8-bit
// codes, f16 scales per group of input columns, optional zero points, optional act-order
// permutation, all in one buffer. docs/design/weight-quant.md is the contract; in short:
//
//   codes   [rows][code_row_bytes]   columns padded to a multiple of 32 (padding codes are 0)
//           W4G: per 32 columns 16 bytes, byte j = column j (low nibble) | column j+16 (high)
//           W8G: one unsigned byte per column
//   scales  [n_groups][rows] f16     group g covers stored columns [g*group_size, (g+1)*group_size)
//   zeros   [n_groups][rows] u8      only with has_zeros; otherwise the zero is 2^(bits-1)
//   perm    [cols] i32               only with has_perm: stored column j is input column perm[j]
//
// value(row r, stored column j) = (code - zero[g][r]) * scale[g][r],  g = j / group_size.
// Each plane starts at a multiple of 64 bytes.
#include <cstdint>

namespace tessera {

struct GroupQuantLayout {
  int bits = 0;
  int64_t rows = 0, cols = 0;
  int64_t group_size = 0;  // a multiple of 32, or == cols (one group per row: "per channel")
  bool has_zeros = false, has_perm = false;
  int64_t n_groups = 0;        // ceil(cols / group_size); the last group may be partial
  int64_t cols_padded = 0;     // cols rounded up to 32
  int64_t code_row_bytes = 0;  // cols_padded * bits / 8
  int64_t off_scales = 0, off_zeros = 0, off_perm = 0, total_bytes = 0;

  static GroupQuantLayout make(int bits, int64_t rows, int64_t cols, int64_t group_size, bool has_zeros,
                               bool has_perm) {
    auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
    GroupQuantLayout l;
    l.bits = bits;
    l.rows = rows;
    l.cols = cols;
    l.group_size = group_size;
    l.has_zeros = has_zeros;
    l.has_perm = has_perm;
    l.n_groups = group_size > 0 ? (cols + group_size - 1) / group_size : 0;
    l.cols_padded = (cols + 31) / 32 * 32;
    l.code_row_bytes = l.cols_padded * bits / 8;
    l.off_scales = up64(rows * l.code_row_bytes);
    l.off_zeros = l.off_scales + up64(l.n_groups * rows * 2);
    l.off_perm = l.off_zeros + (has_zeros ? up64(l.n_groups * rows) : 0);
    l.total_bytes = l.off_perm + (has_perm ? up64(cols * 4) : 0);
    return l;
  }
  // Whether the parameters describe a layout tessera computes with (see valid_reason).
  bool valid() const { return valid_reason() == nullptr; }
  // nullptr when valid, else what is wrong.
  const char* valid_reason() const {
    if (bits != 4 && bits != 8) return "bits must be 4 or 8";
    if (rows <= 0 || cols <= 0) return "rows and columns must be positive";
    if (group_size <= 0) return "group size must be positive";
    if (group_size != cols && group_size % 32 != 0) return "group size must be a multiple of 32 or the row length";
    return nullptr;
  }
  uint8_t zero_default() const { return static_cast<uint8_t>(1u << (bits - 1)); }
};

}  // namespace tessera
