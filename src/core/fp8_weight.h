#pragma once
// Byte layout of one FP8 weight matrix (DType::FP8W): E4M3 codes with one f32 scale per
// output row ("per channel"), in one buffer. docs/design/weight-quant.md is the contract:
//
//   codes   [rows][row_bytes]   row_bytes = cols rounded up to 16 (padding codes 0x00 = +0)
//   scales  [rows] f32          at off_scales, a multiple of 64 bytes
//
// value(r, j) = e4m3_to_float(code(r, j)) * scale[r].
#include <cstdint>

namespace tessera {

struct Fp8WeightLayout {
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;  // cols rounded up to 16: every row starts 16-byte aligned
  int64_t off_scales = 0, total_bytes = 0;

  static Fp8WeightLayout make(int64_t rows, int64_t cols) {
    auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
    Fp8WeightLayout l;
    l.rows = rows;
    l.cols = cols;
    l.row_bytes = (cols + 15) / 16 * 16;
    l.off_scales = up64(rows * l.row_bytes);
    l.total_bytes = l.off_scales + up64(rows * 4);
    return l;
  }
};

}  // namespace tessera
