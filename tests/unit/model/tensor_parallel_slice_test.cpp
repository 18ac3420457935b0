// Row and column slices of stored weight matrices (model/tp/slice.h) against the whole
// matrix decoded to f32: a slice must decode to exactly the whole's rows or columns.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/dummy.h"
#include "model/tp/slice.h"
#include "quant/fp8_weight.h"
#include "quant/group_quant.h"
#include "quant/quant.h"

using namespace tessera;

namespace {

std::vector<float> decode(const WeightMatrix& m) {  // [rows][cols]
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const auto* p = static_cast<const uint8_t*>(m.data);
  for (int64_t r = 0; r < m.rows; ++r) {
    float* row = out.data() + r * m.cols;
    if (is_group_quant(m.dtype))
      gq_dequantize_row(m.gq_layout(), p, r, row);
    else if (is_fp8_weight(m.dtype))
      fp8_dequantize_row(m.fp8_layout(), p, r, row);
    else
      dequantize_row(m.dtype, p + r * m.row_bytes(), row, m.cols);
  }
  return out;
}

void expect_slices_decode_exactly(const WeightMatrix& m, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                  const std::string& what) {
  ModelWeights owner;
  const std::vector<float> whole = decode(m);
  const std::vector<float> by_rows = decode(slice_rows(m, row0, rows, owner, what));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c)
      ASSERT_EQ(by_rows[r * m.cols + c], whole[(row0 + r) * m.cols + c]) << what << " row " << r << " col " << c;
  const WeightMatrix sc = slice_cols(m, col0, cols, owner, what);
  ASSERT_EQ(sc.cols, cols);
  const std::vector<float> by_cols = decode(sc);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(by_cols[r * cols + c], whole[r * m.cols + col0 + c]) << what << " row " << r << " col " << c;
}

}  // namespace

TEST(TensorParallelSlice, EveryFormatSlicesToTheWholesRowsAndColumns) {
  // llama3-tiny's down: [1024, 2816]; cut rows and columns at the second of two ranks.
  for (const char* fmt : {"f32", "f16", "bf16", "q8_0", "q4_0", "q6_k", "w4g128", "w8g64", "w4c", "w8c", "fp8"}) {
    auto w = make_dummy_weights(std::string("llama3-tiny:") + fmt, 5);
    const WeightMatrix& down = w->layers[1].w_down;
    const bool k_quant = dtype_traits(down.dtype).block_elems == 256;
    // K-quants cut at 256 columns: 2816 = 11 blocks, so take blocks 6..10
    const int64_t col0 = k_quant ? 1536 : 1408, cols = k_quant ? 1280 : 1408;
    expect_slices_decode_exactly(down, 512, 512, col0, cols, std::string(fmt) + " down");
  }
}

TEST(TensorParallelSlice, CutsInsideABlockOrGroupAreNamed) {
  auto q8 = make_dummy_weights("llama3-tiny:q8_0", 5);
  ModelWeights owner;
  try {
    slice_cols(q8->layers[0].w_down, 16, 1408, owner, "layer 0 down");
    ADD_FAILURE() << "accepted a cut inside a q8_0 block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 down: columns [16, 1424) cut a Q8_0 block of 32 elements"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(slice_rows(q8->layers[0].w_down, 1000, 100, owner, "down"), Error);  // past the last row
}
