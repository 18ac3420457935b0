#include "quant/group_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"

namespace tessera {

namespace {

std::shared_ptr<uint8_t> alloc_zeroed(int64_t bytes) {
  const size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, n));
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, n);
  return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
}

void put_code(const GroupQuantLayout& l, uint8_t* buf, int64_t r, int64_t j, uint8_t q) {
  uint8_t* row = buf + r * l.code_row_bytes;
  if (l.bits == 8) {
    row[j] = q;
    return;
  }
  const int64_t b = j / 32, e = j % 32;
  uint8_t& byte = row[b * 16 + (e & 15)];
  byte = e < 16 ? static_cast<uint8_t>((byte & 0xF0) | q) : static_cast<uint8_t>((byte & 0x0F) | (q << 4));
}

}  // namespace

uint8_t gq_code(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, int64_t j) {
  const uint8_t* row = buf + r * l.code_row_bytes;
  if (l.bits == 8) return row[j];
  const int64_t b = j / 32, e = j % 32;
  const uint8_t byte = row[b * 16 + (e & 15)];
  return e < 16 ? byte & 0x0F : byte >> 4;
}

uint8_t gq_zero(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, int64_t g) {
  return l.has_zeros ? buf[l.off_zeros + g * l.rows + r] : l.zero_default();
}

uint16_t gq_scale_f16(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, int64_t g) {
  uint16_t h;
  std::memcpy(&h, buf + l.off_scales + 2 * (g * l.rows + r), 2);
  return h;
}

const int32_t* gq_perm(const GroupQuantLayout& l, const uint8_t* buf) {
  return l.has_perm ? reinterpret_cast<const int32_t*>(buf + l.off_perm) : nullptr;
}

void gq_dequantize_row(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, float* out) {
  const int32_t* perm = gq_perm(l, buf);
  for (int64_t j = 0; j < l.cols; ++j) {
    const int64_t g = j / l.group_size;
    const float s = fp16_to_f32(gq_scale_f16(l, buf, r, g));
    const int d = static_cast<int>(gq_code(l, buf, r, j)) - static_cast<int>(gq_zero(l, buf, r, g));
    out[perm ? perm[j] : j] = static_cast<float>(d) * s;
  }
}

GroupQuantMatrix build_group_quant(const GroupQuantSource& src, const std::string& what) {
  const int64_t rows = src.rows, cols = src.cols, gs = src.group_size;
  GroupQuantLayout probe = GroupQuantLayout::make(src.bits, rows, cols, gs, false, false);
  if (const char* why = probe.valid_reason())
    fail(what, ": ", why, " (bits ", src.bits, ", ", rows, " x ", cols, ", group size ", gs, ")");
  const int64_t n_groups = probe.n_groups;
  const int max_code = (1 << src.bits) - 1;
  TESSERA_CHECK(static_cast<int64_t>(src.codes.size()) == rows * cols, what, ": ", src.codes.size(),
                " codes, expected ", rows * cols);
  TESSERA_CHECK(static_cast<int64_t>(src.scales_f16.size()) == n_groups * rows, what, ": ", src.scales_f16.size(),
                " scales, expected ", n_groups * rows, " (", n_groups, " groups x ", rows, " rows)");
  TESSERA_CHECK(src.zeros.empty() || static_cast<int64_t>(src.zeros.size()) == n_groups * rows, what, ": ",
                src.zeros.size(), " zero points, expected ", n_groups * rows);
  TESSERA_CHECK(src.g_idx.empty() || static_cast<int64_t>(src.g_idx.size()) == cols, what, ": g_idx has ",
                src.g_idx.size(), " entries, expected ", cols);
  for (uint8_t z : src.zeros)
    TESSERA_CHECK(z <= max_code, what, ": zero point ", int(z), " is out of range for ", src.bits, " bits");
  for (uint16_t h : src.scales_f16) {
    const float s = fp16_to_f32(h);
    TESSERA_CHECK(std::isfinite(s), what, ": a scale is not finite (", s, ")");
  }

  // Act-order: stored column j is input column perm[j]; groups become contiguous.
  std::vector<int32_t> perm(static_cast<size_t>(cols));
  std::iota(perm.begin(), perm.end(), 0);
  bool identity = true;
  if (!src.g_idx.empty()) {
    for (int64_t k = 0; k < cols; ++k)
      TESSERA_CHECK(src.g_idx[k] >= 0 && src.g_idx[k] < n_groups, what, ": g_idx[", k, "] = ", src.g_idx[k],
                    " is not a group (", n_groups, " groups)");
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return src.g_idx[a] < src.g_idx[b]; });
    for (int64_t j = 0; j < cols; ++j) {
      TESSERA_CHECK(src.g_idx[perm[j]] == j / gs, what, ": g_idx puts ",
                    "a number of columns other than the group size ", gs, " in group ", src.g_idx[perm[j]],
                    " (unsupported: groups must hold group_size columns each, the last one the rest)");
      identity = identity && perm[j] == j;
    }
  }
  bool zeros = false;
  for (uint8_t z : src.zeros) zeros = zeros || z != probe.zero_default();

  GroupQuantMatrix m;
  m.layout = GroupQuantLayout::make(src.bits, rows, cols, gs, zeros, !identity);
  m.data = alloc_zeroed(m.layout.total_bytes);
  uint8_t* buf = m.data.get();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t q = src.codes[r * cols + perm[j]];
      TESSERA_CHECK(q <= max_code, what, ": code ", int(q), " at [", r, ", ", perm[j], "] is out of range for ",
                    src.bits, " bits");
      put_code(m.layout, buf, r, j, q);
    }
  std::memcpy(buf + m.layout.off_scales, src.scales_f16.data(), src.scales_f16.size() * 2);
  if (zeros) std::memcpy(buf + m.layout.off_zeros, src.zeros.data(), src.zeros.size());
  if (!identity) std::memcpy(buf + m.layout.off_perm, perm.data(), perm.size() * 4);
  return m;
}

int GroupGrid::code(float x) const {
  return std::clamp(static_cast<int>(std::nearbyint(x / scale)) + zero, 0, max_code);
}

GroupGrid group_grid(float lo, float hi, int bits, bool asymmetric) {
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  GroupGrid g;
  g.max_code = (1 << bits) - 1;
  g.zero = 1 << (bits - 1);
  const float scale = asymmetric ? (hi - lo) / static_cast<float>(g.max_code)
                                 : std::max(-lo, hi) / (static_cast<float>(g.max_code) / 2.0f);
  g.scale_f16 = f32_to_fp16(scale);
  g.scale = fp16_to_f32(g.scale_f16);
  if (!(g.scale > 0)) g.scale_f16 = f32_to_fp16(1.0f), g.scale = 1.0f;  // an all-zero group: any scale decodes to 0
  if (asymmetric) g.zero = std::clamp(static_cast<int>(std::nearbyint(-lo / g.scale)), 0, g.max_code);
  return g;
}

GroupQuantMatrix quantize_group_rtn(const float* w, int64_t rows, int64_t cols, int bits, int64_t group_size,
                                    bool asymmetric) {
  const GroupQuantLayout probe = GroupQuantLayout::make(bits, rows, cols, group_size, false, false);
  if (const char* why = probe.valid_reason()) fail("quantize: ", why);
  const int64_t n_groups = probe.n_groups;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  std::vector<uint16_t> scales(static_cast<size_t>(n_groups * rows));
  std::vector<uint8_t> zeros(asymmetric ? static_cast<size_t>(n_groups * rows) : 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t k0 = g * group_size, k1 = std::min(cols, k0 + group_size);
      float lo = 0, hi = 0;
      for (int64_t k = k0; k < k1; ++k) lo = std::min(lo, w[r * cols + k]), hi = std::max(hi, w[r * cols + k]);
      const GroupGrid grid = group_grid(lo, hi, bits, asymmetric);
      scales[g * rows + r] = grid.scale_f16;
      if (asymmetric) zeros[g * rows + r] = static_cast<uint8_t>(grid.zero);
      for (int64_t k = k0; k < k1; ++k) codes[r * cols + k] = static_cast<uint8_t>(grid.code(w[r * cols + k]));
    }
  GroupQuantSource src;
  src.bits = bits;
  src.rows = rows;
  src.cols = cols;
  src.group_size = group_size;
  src.codes = codes;
  src.scales_f16 = scales;
  src.zeros = zeros;
  return build_group_quant(src, "quantize");
}

}  // namespace tessera
