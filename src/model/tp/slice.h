#pragma once
// Row and column slices of a stored weight matrix, for tensor-parallel shards.
#include <cstdint>
#include <string>

#include "model/weights.h"

namespace tessera {

// Rows [row0, row0 + rows): a view for formats whose rows are contiguous; a copy (owned by
// `owner`) for W4G/W8G and FP8W, whose scales sit in planes after the codes.
WeightMatrix slice_rows(const WeightMatrix& m, int64_t row0, int64_t rows, ModelWeights& owner,
                        const std::string& name);
// Columns [col0, col0 + cols) of every row, copied (owned by `owner`). Cuts fall on whole
// quant blocks (block formats) or whole groups (W4G/W8G); throws naming `name` otherwise.
WeightMatrix slice_cols(const WeightMatrix& m, int64_t col0, int64_t cols, ModelWeights& owner,
                        const std::string& name);

}  // namespace tessera
