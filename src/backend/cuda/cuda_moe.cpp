// Mixture-of-experts FFN on the GPU (Backend::moe_ffn; the kernels are moe.cu). The router
// product, the routing (softmax, top-k, renormalization) and the grouping of the rows by
// expert run on the device. Then, up to kMoeGroupedMaxRows rows, the grouped kernels read the
// groups from device memory: no host round trip, the same launches every step, so decode
// forwards are captured into graphs; an expert without rows reads no weight byte. Past that
// (prefill), the per-expert counts come back to the host and each expert runs as one product
// over its gathered rows through the ordinary matmul (cuBLASLt), as the CPU backend does.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace tessera {

namespace {

using cuda::round_up;

// The runner captures decode batches of up to 128 sequences (ModelRunner::kMaxGraphBatch):
// those must take the grouped kernels. Not tuned: where the per-expert GEMMs overtake the
// grouped matrix-vector kernels has not been measured.
constexpr int kMoeGroupedMaxRows = 128;
constexpr int kGatherRowsPerLaunch = 32768;

// The grouped kernels' view of one kind of matrix (gate, up or down) of every expert: the
// geometry of expert 0, when every expert has the same type and shape. False otherwise, or
// when the kernels cannot read the type.
bool uniform_geometry(const WeightMatrix* w, int n_expert, cuda::MoeMatrixGeometry* g) {
  const WeightMatrix& w0 = w[0];
  for (int e = 1; e < n_expert; ++e) {
    const WeightMatrix& m = w[e];
    if (m.dtype != w0.dtype || m.rows != w0.rows || m.cols != w0.cols || m.group_size != w0.group_size ||
        m.gq_zeros != w0.gq_zeros || m.gq_perm != w0.gq_perm || !m.data)
      return false;
  }
  return cuda::moe_geometry(w0, g);
}

// Byte offsets of moe_ffn's buffers in one scratch allocation, each 256-byte aligned.
struct MoeLayout {
  size_t logits = 0, choice = 0, weight = 0, offsets = 0, active = 0, rows = 0, slot_of = 0, h = 0, y = 0, total = 0;

  MoeLayout(int n_rows, int dim, int n_ff, int n_expert, int n_used) {
    const size_t slots = static_cast<size_t>(n_rows) * n_used;
    auto carve = [&](size_t bytes) {
      const size_t at = total;
      total += round_up(std::max<size_t>(bytes, 1), 256);
      return at;
    };
    logits = carve(sizeof(float) * n_rows * static_cast<size_t>(n_expert));
    choice = carve(sizeof(int32_t) * slots);
    weight = carve(sizeof(float) * slots);
    offsets = carve(sizeof(int32_t) * (n_expert + 1));
    active = carve(sizeof(int32_t) * (n_expert + 1));
    rows = carve(sizeof(int32_t) * slots);
    slot_of = carve(sizeof(int32_t) * slots);
    h = carve(sizeof(float) * slots * n_ff);
    y = carve(sizeof(float) * slots * dim);
  }
};

}  // namespace

const cuda::MoeExpert* CudaBackend::moe_expert_table(const MoeFfnWeights& moe) {
  // Found by content, not by address: a model loaded later may reuse the host arrays' addresses.
  std::vector<cuda::MoeExpert>& want = moe_want_;
  want.resize(moe.n_expert);
  for (int e = 0; e < moe.n_expert; ++e)
    want[e] = {static_cast<const uint8_t*>(moe.gate[e].data), static_cast<const uint8_t*>(moe.up[e].data),
               static_cast<const uint8_t*>(moe.down[e].data)};
  const auto same = [](const cuda::MoeExpert& a, const cuda::MoeExpert& b) {
    return a.gate == b.gate && a.up == b.up && a.down == b.down;
  };
  for (const MoeTable& t : moe_tables_)
    if (std::equal(t.host.begin(), t.host.end(), want.begin(), want.end(), same)) return t.dev;
  // A graph holds the table's address: tables are made by the eager forward before a capture
  // and kept as long as the backend.
  TESSERA_CHECK(!capturing_,
                "cuda moe_ffn: an expert table is made inside a graph capture (run the forward eagerly "
                "first)");
  MoeTable t;
  t.host = want;
  const size_t bytes = sizeof(cuda::MoeExpert) * want.size();
  t.dev = static_cast<cuda::MoeExpert*>(alloc(bytes));
  copy_to_device(t.dev, want.data(), bytes);  // ordered on the stream, before the kernels that read it
  moe_tables_.push_back(std::move(t));
  return moe_tables_.back().dev;
}

void CudaBackend::moe_ffn(const float* x, int n_rows, int dim, const MoeFfnWeights& moe, float* out) {
  check_moe_ffn(moe, dim);
  const int n_exp = moe.n_expert, k = moe.n_used, ff = moe.n_ff;
  TESSERA_CHECK(n_exp <= cuda::kMoeMaxExperts, "cuda moe_ffn: ", n_exp, " experts (the routing kernel takes at most ",
                cuda::kMoeMaxExperts, ")");
  if (n_rows <= 0) return;
  cuda::OpScope op_scope(profiler_.get(), [&] {
    return "moe_ffn " + std::string(dtype_name(moe.gate[0].dtype)) + " [" + std::to_string(n_rows) + " x " +
           std::to_string(dim) + "] " + std::to_string(k) + " of " + std::to_string(n_exp) + " experts";
  });
  const int slots = n_rows * k;
  const MoeLayout l(n_rows, dim, ff, n_exp, k);
  auto* base = static_cast<uint8_t*>(scratch(moe_buf_, moe_buf_cap_, l.total));
  auto* logits = reinterpret_cast<float*>(base + l.logits);
  auto* choice = reinterpret_cast<int32_t*>(base + l.choice);
  auto* weight = reinterpret_cast<float*>(base + l.weight);
  auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  auto* active = reinterpret_cast<int32_t*>(base + l.active);
  auto* rows = reinterpret_cast<int32_t*>(base + l.rows);
  auto* slot_of = reinterpret_cast<int32_t*>(base + l.slot_of);
  auto* h = reinterpret_cast<float*>(base + l.h);
  auto* y = reinterpret_cast<float*>(base + l.y);

  // Routing: logits [n_rows, n_expert] -> choice / weight [n_rows, k] -> groups by expert.
  cuda::MoeMatrixGeometry rg;
  if (cuda::moe_geometry(moe.router, &rg)) {
    cuda::launch_moe_router(x, n_rows, moe.router.data, rg, logits, stream_);
  } else {
    const MatmulTarget route[] = {{moe.router, logits, n_exp}};
    matmul(x, n_rows, dim, route);
  }
  cuda::launch_moe_route(logits, n_rows, n_exp, k, moe.renormalize, choice, weight, stream_);
  cuda::launch_moe_group(choice, n_rows, k, n_exp, offsets, active, rows, slot_of, stream_);

  // Expert products: y [slots, dim], grouped slot order.
  cuda::MoeMatrixGeometry gg, ug, dg;
  const bool grouped = n_rows <= kMoeGroupedMaxRows && uniform_geometry(moe.gate, n_exp, &gg) &&
                       uniform_geometry(moe.up, n_exp, &ug) && uniform_geometry(moe.down, n_exp, &dg) &&
                       gg.dtype == ug.dtype;
  if (grouped) {
    const cuda::MoeExpert* table = moe_expert_table(moe);
    const int max_active = std::min(n_exp, slots);
    cuda::launch_moe_gate_up(x, dim, ff, table, gg, ug, offsets, active, max_active, rows, h, stream_);
    cuda::launch_moe_down(h, dim, ff, table, dg, offsets, active, max_active, y, stream_);
  } else {
    TESSERA_CHECK(!capturing_, "cuda moe_ffn: ", n_rows, " rows of ", dtype_name(moe.gate[0].dtype), "/",
                  dtype_name(moe.down[0].dtype),
                  " experts run per expert, which reads the routing back to the host: not inside a graph capture "
                  "(turn CUDA graphs off for this model)");
    std::vector<int32_t>& start = moe_start_;
    start.assign(n_exp + 1, 0);
    copy_to_host(start.data(), offsets, sizeof(int32_t) * (n_exp + 1));
    // xg [slots, dim]: the input rows in grouped order; gu [slots, ff | ff]: gate | up.
    const size_t xg_bytes = round_up(sizeof(float) * slots * dim, 256);
    auto* big = static_cast<uint8_t*>(
        scratch(moe_gather_, moe_gather_cap_, xg_bytes + sizeof(float) * static_cast<size_t>(slots) * 2 * ff));
    auto* xg = reinterpret_cast<float*>(big);
    auto* gu = reinterpret_cast<float*>(big + xg_bytes);
    // gather_rows takes a grid row per output row: at most 65,535 per launch.
    for (int i = 0; i < slots; i += kGatherRowsPerLaunch)
      gather_rows(x, dim, rows + i, std::min(kGatherRowsPerLaunch, slots - i), dim, xg + static_cast<size_t>(i) * dim);
    for (int e = 0; e < n_exp; ++e) {
      const int m = start[e + 1] - start[e];
      TESSERA_CHECK(m >= 0 && start[e + 1] <= slots, "cuda moe_ffn: bad routing counts read back");
      if (m == 0) continue;
      const size_t o = start[e];
      float* g = gu + o * 2 * ff;  // [m, ff | ff]
      const MatmulTarget gate_up[] = {{moe.gate[e], g, 2 * ff}, {moe.up[e], g + ff, 2 * ff}};
      matmul(xg + o * dim, m, dim, gate_up);
      const MatmulTarget down[] = {{moe.down[e], y + o * dim, dim}};
      swiglu_matmul(g, g + ff, 2 * ff, h + o * ff, m, ff, down);
    }
  }
  // out[r] = sum over j of weight[r, j] * y[slot_of[r, j]], j in routing order.
  cuda::launch_moe_combine(y, n_rows, dim, k, weight, slot_of, out, stream_);
}

}  // namespace tessera
