// CpuMatmul: picks the kernel family for this CPU, quantizes the shared input once per call
// and spreads the output rows of every target over the pool in one parallel region.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "quant/fp8_weight.h"
#include "quant/group_quant.h"

namespace tessera {

namespace {

enum class Isa { Scalar, Avx2, Avx512 };

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

bool cpu_supports(Isa isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
                    __builtin_cpu_supports("bmi2");
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return avx2;
    case Isa::Avx512:
      // The AVX-512 file is compiled with all of these, so the compiler may use any of them.
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

bool parse_isa(std::string_view s, Isa* out) {
  if (s == "scalar")
    *out = Isa::Scalar;
  else if (s == "avx2")
    *out = Isa::Avx2;
  else if (s == "avx512")
    *out = Isa::Avx512;
  else
    return false;
  return true;
}

// The best family this CPU runs, or the one TESSERA_ISA names.
Isa resolve_isa() {
  const char* env = std::getenv("TESSERA_ISA");
  if (env && *env) {
    Isa isa;
    if (!parse_isa(env, &isa)) fail("TESSERA_ISA='", env, "' is not one of scalar, avx2, avx512");
    if (!cpu_supports(isa)) fail("TESSERA_ISA=", env, " but this CPU lacks the instructions it needs");
    return isa;
  }
  if (cpu_supports(Isa::Avx512)) return Isa::Avx512;
  if (cpu_supports(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

const mm::KernelSet& kernel_set(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return mm::avx512_kernel_set();
    case Isa::Avx2:
      return mm::avx2_kernel_set();
    default:
      return mm::scalar_kernel_set();
  }
}

// Decode work units: the first three quarters of every weight matrix in units of about
// kDecodeBigChunkBytes (few claims on the shared counter: each claim bounces its cache line
// between the cores), then the last quarter of every matrix in units of about
// kDecodeChunkBytes, so all threads stay busy to the end of the call.
constexpr int64_t kDecodeBigChunkBytes = 96 * 1024;
constexpr int64_t kDecodeChunkBytes = 24 * 1024;
// Inputs at most this large are quantized by the calling thread before the parallel region.
constexpr int64_t kInlineQuantizeElems = 8192;

struct WorkItem {
  int32_t target;
  int64_t r0, r1;  // weight rows
  int64_t t0, t1;  // input rows
};

}  // namespace

int64_t mm::panel_scratch_bytes(const KernelSet& set, int64_t cols) {
  // Worst case over formats: f32 weights of panel_rows rows with the columns padded to a
  // multiple of 8 (float panels are built 8 columns at a time), or two quantized panels.
  // (and the group-quantized panel: 8 rows of codes as bytes over the width padded to 32, then
  // per group of at least 32 columns 8 scales and 8 zero points of 4 bytes).
  const int64_t gq_panel = 10 * ((cols + 31) / 32 * 32) + 64;
  return std::max({set.panel_rows * ((cols + 7) / 8 * 8) * 4, 2 * mm::panel_bytes(cols, set.panel_rows), gq_panel}) +
         256;
}

struct CpuMatmul::Impl {
  explicit Impl(ThreadPool& p) : pool(p), ks(&kernel_set(resolve_isa())), scratch(p.size()) {}

  ThreadPool& pool;
  const mm::KernelSet* ks;
  AlignedBuffer<uint8_t> act_q8, act_q8k;       // quantized input rows, reused between calls
  std::vector<AlignedBuffer<uint8_t>> scratch;  // per thread: repacked weight panels
  std::vector<WorkItem> items;
  std::vector<int64_t> split_rows;  // plan()'s scratch, kept to avoid an allocation per call
  // Group-quantized targets: Q8 activations over the padded input, one buffer per distinct
  // act-order permutation among the targets (null: none), and each target's buffer.
  std::vector<AlignedBuffer<uint8_t>> act_gq;
  std::vector<const int32_t*> act_gq_perm;
  std::vector<int> target_gq;
  std::vector<float> gq_row;  // one permuted, zero-padded input row

  void prepare_group_quant(const float* x, int64_t n_rows, int64_t ldx, std::span<const MatmulTarget> targets,
                           const mm::ActLayout& lay);
  void plan(std::span<const MatmulTarget> targets, int64_t n_rows, int64_t cols);
};

// Quantizes the input once per distinct permutation of the group-quantized targets (the
// calling thread; it is O(rows * cols), small beside the products).
void CpuMatmul::Impl::prepare_group_quant(const float* x, int64_t n_rows, int64_t ldx,
                                          std::span<const MatmulTarget> targets, const mm::ActLayout& lay) {
  act_gq_perm.clear();
  target_gq.assign(targets.size(), -1);
  const int64_t cols = targets[0].w.cols;
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    const WeightMatrix& w = targets[ti].w;
    if (!is_group_quant(w.dtype)) continue;
    const GroupQuantLayout gl = w.gq_layout();
    const int32_t* perm =
        gl.has_perm ? reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(w.data) + gl.off_perm) : nullptr;
    int found = -1;
    for (size_t i = 0; i < act_gq_perm.size() && found < 0; ++i) {
      const int32_t* p = act_gq_perm[i];
      if (p == perm || (p && perm && std::memcmp(p, perm, sizeof(int32_t) * cols) == 0)) found = static_cast<int>(i);
    }
    if (found < 0) {
      found = static_cast<int>(act_gq_perm.size());
      act_gq_perm.push_back(perm);
      if (act_gq.size() < act_gq_perm.size()) act_gq.emplace_back();
      AlignedBuffer<uint8_t>& buf = act_gq[found];
      const size_t bytes = static_cast<size_t>(n_rows * lay.row_bytes);
      if (buf.size() < bytes) buf.resize(bytes);
      gq_row.assign(static_cast<size_t>(lay.cols), 0.0f);
      for (int64_t t = 0; t < n_rows; ++t) {
        const float* xr = x + t * ldx;
        for (int64_t k = 0; k < cols; ++k) gq_row[k] = xr[perm ? perm[k] : k];
        ks->quantize_q8(gq_row.data(), buf.data() + t * lay.row_bytes, lay);
      }
    }
    target_gq[ti] = found;
  }
}

CpuMatmul::CpuMatmul(ThreadPool& pool) : impl_(std::make_unique<Impl>(pool)) {}
CpuMatmul::~CpuMatmul() = default;

const char* CpuMatmul::isa() { return isa_name(resolve_isa()); }

bool CpuMatmul::isa_supported(std::string_view name) {
  Isa isa;
  return parse_isa(name, &isa) && cpu_supports(isa);
}

void CpuMatmul::Impl::plan(std::span<const MatmulTarget> targets, int64_t n_rows, int64_t cols) {
  items.clear();
  const bool panels = ks->panel_rows > 1 && n_rows >= mm::kPanelMinRows;
  if (!panels) {
    auto rows_per = [](const WeightMatrix& w, int64_t bytes, int64_t max_rows) {
      return std::clamp<int64_t>(bytes / std::max<int64_t>(1, w.row_bytes()) / 8 * 8, 8, max_rows);
    };
    std::vector<int64_t>& split = split_rows;  // per target: rows covered by big units
    split.assign(targets.size(), 0);
    for (size_t ti = 0; ti < targets.size(); ++ti) {
      const WeightMatrix& w = targets[ti].w;
      const int64_t big = rows_per(w, kDecodeBigChunkBytes, 4096);
      const int64_t n_big = (w.rows * 3 / 4) / big;
      split[ti] = n_big * big;
      for (int64_t r = 0; r < split[ti]; r += big) items.push_back({static_cast<int32_t>(ti), r, r + big, 0, n_rows});
    }
    for (size_t ti = 0; ti < targets.size(); ++ti) {
      const WeightMatrix& w = targets[ti].w;
      const int64_t chunk = rows_per(w, kDecodeChunkBytes, 1024);
      for (int64_t r = split[ti]; r < w.rows; r += chunk)
        items.push_back({static_cast<int32_t>(ti), r, std::min(w.rows, r + chunk), 0, n_rows});
    }
    return;
  }
  // Input panels outermost: both threads work on the same panel of x (shared L3, each
  // one's L2), weight panels stream past it.
  const int64_t act_row_bytes = cols + cols / 8;  // about right for every format
  // Input panels of about 192 KB (half an L2), equal sizes in multiples of 12 (a whole
  // number of the microkernels' 3- or 4-row passes) so no panel is a short remainder.
  const int64_t max_panel = std::clamp<int64_t>((192 * 1024) / act_row_bytes, 16, 512);
  const int64_t n_panels = (n_rows + max_panel - 1) / max_panel;
  const int64_t x_panel = ((n_rows + n_panels - 1) / n_panels + 11) / 12 * 12;
  const int64_t w_chunk = ks->panel_rows * 4;
  for (int64_t t = 0; t < n_rows; t += x_panel) {
    for (size_t ti = 0; ti < targets.size(); ++ti) {
      const int64_t rows = targets[ti].w.rows;
      for (int64_t r = 0; r < rows; r += w_chunk)
        items.push_back({static_cast<int32_t>(ti), r, std::min(rows, r + w_chunk), t, std::min(n_rows, t + x_panel)});
    }
  }
}

void CpuMatmul::run(const float* x, int64_t n_rows, int64_t ldx, std::span<const MatmulTarget> targets) {
  Impl& s = *impl_;
  if (n_rows <= 0 || targets.empty()) return;
  TESSERA_CHECK(x != nullptr, "matmul: input is null");
  const int64_t cols = targets[0].w.cols;
  bool need_q8 = false, need_q8k = false, need_gq = false;
  for (const MatmulTarget& t : targets) {
    const WeightMatrix& w = t.w;
    const bool gq = is_group_quant(w.dtype);
    need_gq |= gq;
    TESSERA_CHECK(gq || is_fp8_weight(w.dtype) || mm::wkind_index(w.dtype) >= 0, "matmul: weight type ",
                  dtype_name(w.dtype), " is not supported");
    TESSERA_CHECK(w.cols == cols, "matmul: targets disagree on the input width (", w.cols, " vs ", cols, ")");
    if (gq) {
      const char* why = w.gq_layout().valid_reason();
      TESSERA_CHECK(!why, "matmul: ", dtype_name(w.dtype), " weight [", w.rows, ", ", w.cols, "] group size ",
                    w.group_size, ": ", why ? why : "");
    } else {
      TESSERA_CHECK(w.cols > 0 && w.cols % dtype_traits(w.dtype).block_elems == 0, "matmul: ", dtype_name(w.dtype),
                    " weight has ", w.cols, " columns, not a multiple of its block size");
    }
    TESSERA_CHECK(w.data != nullptr && t.y != nullptr, "matmul: null weight or output");
    TESSERA_CHECK(n_rows == 1 || t.ldy >= w.rows, "matmul: ldy ", t.ldy, " is less than the ", w.rows, " outputs");
    const mm::ActKind k = mm::act_kind(w.dtype);
    need_q8 |= k == mm::ActKind::Q8;
    need_q8k |= k == mm::ActKind::Q8K;
  }
  TESSERA_CHECK(n_rows == 1 || ldx >= cols, "matmul: ldx ", ldx, " is less than the input width ", cols);

  const mm::ActLayout lay_q8 = mm::ActLayout::make(cols, false);
  const mm::ActLayout lay_q8k = mm::ActLayout::make(cols, true);
  auto reserve = [n_rows](AlignedBuffer<uint8_t>& buf, const mm::ActLayout& l) {
    const size_t bytes = static_cast<size_t>(n_rows * l.row_bytes);
    if (buf.size() < bytes) buf.resize(bytes);  // grows only: no allocation per call after warm-up
  };
  if (need_q8) reserve(s.act_q8, lay_q8);
  if (need_q8k) reserve(s.act_q8k, lay_q8k);
  const mm::ActLayout lay_gq = mm::ActLayout::make((cols + 31) / 32 * 32, false);
  if (need_gq) s.prepare_group_quant(x, n_rows, ldx, targets, lay_gq);
  const bool scalar_gq = std::string_view(s.ks->name) == "scalar";

  s.plan(targets, n_rows, cols);
  const bool panels = s.ks->panel_rows > 1 && n_rows >= mm::kPanelMinRows;
  if (panels) {
    const size_t need = mm::panel_scratch_bytes(*s.ks, cols);
    for (auto& b : s.scratch)
      if (b.size() < need) b.resize(need);
  }

  // Quantization work: one unit per (format, input row).
  const int n_formats = static_cast<int>(need_q8) + static_cast<int>(need_q8k);
  const int64_t quant_units = n_formats * n_rows;
  auto quantize_unit = [&](int64_t u) {
    const bool q8 = need_q8 && u < n_rows;  // Q8 rows first, then Q8_K rows
    const int64_t t = u % n_rows;
    if (q8)
      s.ks->quantize_q8(x + t * ldx, s.act_q8.data() + t * lay_q8.row_bytes, lay_q8);
    else
      s.ks->quantize_q8k(x + t * ldx, s.act_q8k.data() + t * lay_q8k.row_bytes, lay_q8k);
  };
  const bool quantize_inline = quant_units * cols <= kInlineQuantizeElems || s.pool.size() == 1;
  if (quantize_inline)
    for (int64_t u = 0; u < quant_units; ++u) quantize_unit(u);

  std::atomic<int64_t> next_quant{0}, next_item{0};
  std::atomic<int> quantized{0};
  const int64_t n_items = static_cast<int64_t>(s.items.size());
  s.pool.run([&](int thread, int n_threads) {
    if (!quantize_inline) {
      for (int64_t u; (u = next_quant.fetch_add(1, std::memory_order_relaxed)) < quant_units;) quantize_unit(u);
      // Every thread takes part in every job, so all of them reach this barrier.
      quantized.fetch_add(1, std::memory_order_acq_rel);
      while (quantized.load(std::memory_order_acquire) < n_threads) __builtin_ia32_pause();
    }
    mm::MatmulTask task;
    task.cols = cols;
    task.ldx = ldx;
    task.scratch = panels ? s.scratch[thread].data() : nullptr;
    for (int64_t i; (i = next_item.fetch_add(1, std::memory_order_relaxed)) < n_items;) {
      const WorkItem& it = s.items[i];
      const MatmulTarget& tg = targets[it.target];
      const int64_t row_bytes = tg.w.row_bytes();
      task.w = static_cast<const uint8_t*>(tg.w.data) + it.r0 * row_bytes;
      task.w_stride = row_bytes;
      task.n_w = it.r1 - it.r0;
      task.n_x = it.t1 - it.t0;
      task.x = x + it.t0 * ldx;
      switch (mm::act_kind(tg.w.dtype)) {
        case mm::ActKind::Q8:
          task.act = s.act_q8.data() + it.t0 * lay_q8.row_bytes;
          task.act_layout = &lay_q8;
          break;
        case mm::ActKind::Q8K:
          task.act = s.act_q8k.data() + it.t0 * lay_q8k.row_bytes;
          task.act_layout = &lay_q8k;
          break;
        default:
          task.act = nullptr;
          task.act_layout = nullptr;
      }
      task.y = tg.y + it.t0 * tg.ldy + it.r0;
      task.ldy = tg.ldy;
      if (is_fp8_weight(tg.w.dtype)) {
        task.fp8_scales = tg.w.fp8_scales() + it.r0;
        mm::fp8_matmul_scalar(task);
        continue;
      }
      if (is_group_quant(tg.w.dtype)) {
        const GroupQuantLayout gl = tg.w.gq_layout();
        const auto* base = static_cast<const uint8_t*>(tg.w.data);
        task.act = s.act_gq[s.target_gq[it.target]].data() + it.t0 * lay_gq.row_bytes;
        task.act_layout = &lay_gq;
        task.gq_scales = reinterpret_cast<const uint16_t*>(base + gl.off_scales) + it.r0;
        task.gq_zeros = gl.has_zeros ? base + gl.off_zeros + it.r0 : nullptr;
        task.gq_ld = tg.w.rows;
        task.gq_group = gl.group_size;
        const bool w8 = tg.w.dtype == DType::W8G;
        if (scalar_gq)
          (w8 ? mm::gq_matmul_scalar_w8 : mm::gq_matmul_scalar_w4)(task);
        else
          (w8 ? mm::gq_matmul_avx2_w8 : mm::gq_matmul_avx2_w4)(task);
        continue;
      }
      const int k = mm::wkind_index(tg.w.dtype);
      (panels && s.ks->panel[k] ? s.ks->panel[k] : s.ks->direct[k])(task);
    }
  });
}

void cpu_get_rows(const WeightMatrix& w, const int32_t* ids, int64_t n, float* out) {
  if (is_fp8_weight(w.dtype)) {
    for (int64_t i = 0; i < n; ++i)
      fp8_dequantize_row(w.fp8_layout(), static_cast<const uint8_t*>(w.data), ids[i], out + i * w.cols);
    return;
  }
  if (is_group_quant(w.dtype)) {
    const GroupQuantLayout gl = w.gq_layout();
    for (int64_t i = 0; i < n; ++i)
      gq_dequantize_row(gl, static_cast<const uint8_t*>(w.data), ids[i], out + i * w.cols);
    return;
  }
  TESSERA_CHECK(mm::wkind_index(w.dtype) >= 0, "get_rows: weight type ", dtype_name(w.dtype), " is not supported");
  const int64_t row_bytes = w.row_bytes();
  for (int64_t i = 0; i < n; ++i)
    mm::dequantize_row_scalar(w.dtype, static_cast<const uint8_t*>(w.data) + ids[i] * row_bytes, out + i * w.cols,
                              w.cols);
}

}  // namespace tessera
