#include "model/tp/slice.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace tessera {

namespace {

// A zeroed, 64-byte aligned buffer that lives as long as `owner`.
uint8_t* owned_bytes(ModelWeights& owner, int64_t bytes) {
  const size_t n = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, n > 0 ? n : 64);
  if (!p) fail("tensor parallel: out of memory slicing ", bytes, " bytes");
  std::memset(p, 0, n > 0 ? n : 64);
  owner.owners.push_back(std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); }));
  return static_cast<uint8_t*>(p);
}

// Copies [rows] entries of `elem` bytes from plane rows [row0, row0 + rows) of each of n_planes planes.
void copy_plane_rows(const uint8_t* src, int64_t src_rows, uint8_t* dst, int64_t row0, int64_t rows, int64_t n_planes,
                     int64_t elem) {
  for (int64_t g = 0; g < n_planes; ++g)
    std::memcpy(dst + g * rows * elem, src + (g * src_rows + row0) * elem, static_cast<size_t>(rows * elem));
}

}  // namespace

WeightMatrix slice_rows(const WeightMatrix& m, int64_t row0, int64_t rows, ModelWeights& owner,
                        const std::string& name) {
  TESSERA_CHECK(row0 >= 0 && rows >= 1 && row0 + rows <= m.rows, name, ": rows [", row0, ", ", row0 + rows,
                ") of a matrix of ", m.rows);
  WeightMatrix out = m;
  out.rows = rows;
  const auto* src = static_cast<const uint8_t*>(m.data);
  if (is_group_quant(m.dtype)) {
    const GroupQuantLayout s = m.gq_layout(), d = out.gq_layout();
    uint8_t* dst = owned_bytes(owner, d.total_bytes);
    std::memcpy(dst, src + row0 * s.code_row_bytes, static_cast<size_t>(rows * s.code_row_bytes));
    copy_plane_rows(src + s.off_scales, m.rows, dst + d.off_scales, row0, rows, s.n_groups, 2);
    if (s.has_zeros) copy_plane_rows(src + s.off_zeros, m.rows, dst + d.off_zeros, row0, rows, s.n_groups, 1);
    if (s.has_perm) std::memcpy(dst + d.off_perm, src + s.off_perm, static_cast<size_t>(m.cols * 4));
    out.data = dst;
  } else if (is_fp8_weight(m.dtype)) {
    const Fp8WeightLayout s = m.fp8_layout(), d = out.fp8_layout();
    uint8_t* dst = owned_bytes(owner, d.total_bytes);
    std::memcpy(dst, src + row0 * s.row_bytes, static_cast<size_t>(rows * s.row_bytes));
    std::memcpy(dst + d.off_scales, src + s.off_scales + row0 * 4, static_cast<size_t>(rows * 4));
    out.data = dst;
  } else {
    out.data = src + row0 * m.row_bytes();  // rows are contiguous: a view
  }
  return out;
}

WeightMatrix slice_cols(const WeightMatrix& m, int64_t col0, int64_t cols, ModelWeights& owner,
                        const std::string& name) {
  TESSERA_CHECK(col0 >= 0 && cols >= 1 && col0 + cols <= m.cols, name, ": columns [", col0, ", ", col0 + cols,
                ") of a matrix of ", m.cols);
  WeightMatrix out = m;
  out.cols = cols;
  const auto* src = static_cast<const uint8_t*>(m.data);
  if (is_group_quant(m.dtype)) {
    const GroupQuantLayout s = m.gq_layout();
    TESSERA_CHECK(!s.has_perm, name, ": a group-quantized matrix with an act-order permutation cannot be split by ",
                  "columns (its stored columns are permuted); quantize without act-order for tensor parallelism");
    const bool per_row = s.group_size == m.cols;  // one scale per row holds for any column slice
    const int64_t unit = per_row ? 32 : s.group_size;
    TESSERA_CHECK(col0 % unit == 0 && (cols % unit == 0 || col0 + cols == m.cols), name, ": columns [", col0, ", ",
                  col0 + cols, ") cut a ", per_row ? "32-column code block" : "quant group", " of ", unit, " columns (",
                  dtype_name(m.dtype), ")");
    out.group_size = per_row ? cols : s.group_size;
    const GroupQuantLayout d = out.gq_layout();
    uint8_t* dst = owned_bytes(owner, d.total_bytes);
    const int64_t byte0 = col0 * s.bits / 8;
    for (int64_t r = 0; r < m.rows; ++r)
      std::memcpy(dst + r * d.code_row_bytes, src + r * s.code_row_bytes + byte0,
                  static_cast<size_t>(d.code_row_bytes));
    const int64_t g0 = per_row ? 0 : col0 / s.group_size;
    copy_plane_rows(src + s.off_scales, m.rows * s.n_groups, dst + d.off_scales, g0 * m.rows, d.n_groups * m.rows, 1,
                    2);
    if (s.has_zeros)
      copy_plane_rows(src + s.off_zeros, m.rows * s.n_groups, dst + d.off_zeros, g0 * m.rows, d.n_groups * m.rows, 1,
                      1);
    out.data = dst;
    return out;
  }
  if (is_fp8_weight(m.dtype)) {
    const Fp8WeightLayout s = m.fp8_layout(), d = out.fp8_layout();
    uint8_t* dst = owned_bytes(owner, d.total_bytes);
    for (int64_t r = 0; r < m.rows; ++r)
      std::memcpy(dst + r * d.row_bytes, src + r * s.row_bytes + col0, static_cast<size_t>(cols));
    std::memcpy(dst + d.off_scales, src + s.off_scales, static_cast<size_t>(m.rows * 4));
    out.data = dst;
    return out;
  }
  const DTypeTraits& t = dtype_traits(m.dtype);
  TESSERA_CHECK(col0 % t.block_elems == 0 && cols % t.block_elems == 0, name, ": columns [", col0, ", ", col0 + cols,
                ") cut a ", t.name, " block of ", t.block_elems, " elements");
  const int64_t byte0 = dtype_row_bytes(m.dtype, col0), row_bytes = out.row_bytes(), src_row = m.row_bytes();
  uint8_t* dst = owned_bytes(owner, row_bytes * m.rows);
  for (int64_t r = 0; r < m.rows; ++r)
    std::memcpy(dst + r * row_bytes, src + r * src_row + byte0, static_cast<size_t>(row_bytes));
  out.data = dst;
  return out;
}

}  // namespace tessera
