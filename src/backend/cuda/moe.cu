// Mixture-of-experts kernels (moe_kernels.h): the router product, the routing (softmax, top-k,
// renormalization) a warp per row, the grouping of the chosen (row, expert) pairs by expert
// in one block, the grouped expert products a warp per output feature, and the weighted sum.
// Nothing here depends on values the host must read: the launches are the same for every
// step of one shape, so a decode forward with them can be captured into a graph.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/quant_decode.cuh"
#include "core/error.h"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;  // warps per block (one output feature, or one routed row, each)
constexpr int kChunk = 8;  // input rows a warp takes through a weight row at once
// The weight-streaming kernels: at least 2 blocks (16 warps) per SM in flight (ptxas gave the
// router and down kernels ~200 registers without it: one block per SM). Not measured.
constexpr int kProductBlocksPerSm = 2;

// out[0..8) = elements e..e+7 (e a multiple of 8, below cols) of row r of a matrix of type T
// whose buffer starts at base. Unscaled FP8W codes (the caller scales the finished sum).
template <DType T>
__device__ __forceinline__ void decode_row8(const uint8_t* __restrict__ base, const MoeMatrixGeometry& g, int64_t r,
                                            int64_t e, float* out) {
  if constexpr (T == DType::W4G || T == DType::W8G) {
    // core/group_quant.h: 8 columns never straddle a group (groups are multiples of 32 or the row).
    const int64_t grp = e / g.group_size;
    const float s = half_bits_to_f32(load_u16(base + g.off_scales + 2 * (grp * g.rows + r)));
    const float z =
        g.off_zeros >= 0 ? static_cast<float>(base[g.off_zeros + grp * g.rows + r]) : (T == DType::W8G ? 128.0f : 8.0f);
    const uint8_t* codes = base + r * g.row_bytes;
    uint2 v;
    int shift = 0;
    if constexpr (T == DType::W8G) {
      v = *reinterpret_cast<const uint2*>(codes + e);  // one byte per column
    } else {
      // 16 bytes per 32 columns: byte j holds column j (low nibble) and column j + 16 (high).
      const int64_t j = e % 32;
      v = *reinterpret_cast<const uint2*>(codes + (e / 32) * 16 + (j % 16));
      shift = j >= 16 ? 4 : 0;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = ((i < 4 ? v.x : v.y) >> (8 * (i % 4))) & 0xFF;
      const int q = T == DType::W8G ? static_cast<int>(byte) : static_cast<int>((byte >> shift) & 0xF);
      out[i] = (static_cast<float>(q) - z) * s;
    }
  } else {
    decode8<T>(base + r * g.row_bytes, e, out);
  }
}

// The finished dot product of row r (FP8W: times the row's scale).
template <DType T>
__device__ __forceinline__ float row_scaled(const uint8_t* __restrict__ base, const MoeMatrixGeometry& g, int64_t r,
                                            float v) {
  if constexpr (T == DType::FP8W) return v * reinterpret_cast<const float*>(base + g.off_scales)[r];
  return v;
}

// acc[t] += W[r, :] · xr[t][:] for t < n (<= kChunk), this lane's share of the columns (8 per
// step); the caller sums the lanes.
template <DType T>
__device__ __forceinline__ void dot_rows(const uint8_t* __restrict__ base, const MoeMatrixGeometry& g, int64_t r,
                                         const float* const (&xr)[kChunk], int n, float (&acc)[kChunk]) {
  const int lane = threadIdx.x & 31;
  for (int64_t e = lane * 8; e < g.cols; e += 256) {
    float w8[8];
    decode_row8<T>(base, g, r, e, w8);
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      if (t >= n) break;
      const float* p = xr[t] + e;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t] = fmaf(w8[k], __ldg(p + k), acc[t]);
    }
  }
}

// y[i * ldy + r] = W[r, :] · in[i, :] for input rows i in [begin, end) (in: dense, g.cols
// wide), 8 rows per pass over the weight row; the warp's lane 0 writes.
template <DType T>
__device__ __forceinline__ void product_rows(const uint8_t* __restrict__ base, const MoeMatrixGeometry& g, int64_t r,
                                             const float* __restrict__ in, int begin, int end, float* __restrict__ y,
                                             int64_t ldy) {
  const int lane = threadIdx.x & 31;
  for (int i0 = begin; i0 < end; i0 += kChunk) {
    const int n = min(kChunk, end - i0);
    const float* xr[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) xr[t] = in + static_cast<int64_t>(i0 + min(t, n - 1)) * g.cols;
    float acc[kChunk] = {};
    dot_rows<T>(base, g, r, xr, n, acc);
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      if (t >= n) break;
      const float v = row_scaled<T>(base, g, r, warp_sum(acc[t]));
      if (lane == 0) y[static_cast<int64_t>(i0 + t) * ldy + r] = v;
    }
  }
}

// ---- Router ----

// Block (feature tile, chunk of 8 rows); a warp per expert.
template <DType T>
__global__ void __launch_bounds__(kWarps * 32, kProductBlocksPerSm)
    moe_router_kernel(const float* __restrict__ x, int n_rows, const uint8_t* __restrict__ w, MoeMatrixGeometry g,
                      float* __restrict__ logits) {
  const int64_t f = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int r0 = blockIdx.y * kChunk;
  if (f >= g.rows || r0 >= n_rows) return;
  product_rows<T>(w, g, f, x, r0, min(r0 + kChunk, n_rows), logits, g.rows);
}

// ---- Routing ----

// The better of two candidates (value, expert): larger value, then lower index; -1 = none.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

// A warp per row. Lane l owns experts l, l + 32, ...: bit i of `taken` is expert l + 32 i.
__global__ void __launch_bounds__(kWarps * 32)
    moe_route_kernel(float* __restrict__ logits, int n_rows, int n_expert, int n_used, bool renormalize,
                     int32_t* __restrict__ choice, float* __restrict__ weight) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (r >= n_rows) return;
  float* p = logits + static_cast<int64_t>(r) * n_expert;
  float mx = -INFINITY;
  for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, p[e]);
  mx = warp_max(mx);
  double sum = 0;
  for (int e = lane; e < n_expert; e += 32) {
    const float v = expf(p[e] - mx);
    p[e] = v;
    sum += v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  for (int e = lane; e < n_expert; e += 32) p[e] = static_cast<float>(static_cast<double>(p[e]) / sum);
  // Each lane re-reads only the entries it wrote itself: no synchronization needed.
  uint32_t taken = 0;
  double chosen = 0;
  int32_t* my_choice = choice + static_cast<int64_t>(r) * n_used;
  float* my_weight = weight + static_cast<int64_t>(r) * n_used;
  for (int j = 0; j < n_used; ++j) {
    float bv = 0.0f;
    int bi = -1;
    for (int i = 0, e = lane; e < n_expert; ++i, e += 32)
      if (!((taken >> i) & 1u) && better(p[e], e, bv, bi)) {
        bv = p[e];
        bi = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    // Lane 0's pick for every lane (with NaNs the lanes' reductions could disagree).
    bv = __shfl_sync(0xffffffffu, bv, 0);
    bi = __shfl_sync(0xffffffffu, bi, 0);
    if (bi < 0) bi = 0;  // unreachable: n_used <= n_expert leaves an expert to take
    if (lane == (bi & 31)) taken |= 1u << (bi >> 5);
    chosen += static_cast<double>(bv);
    if (lane == 0) {
      my_choice[j] = bi;
      my_weight[j] = bv;
    }
  }
  if (lane == 0)
    for (int j = 0; j < n_used; ++j)
      my_weight[j] = static_cast<float>(static_cast<double>(my_weight[j]) / (renormalize ? chosen : 1.0));
}

// ---- Grouping ----

// One block: counts per expert in shared memory, their prefix sums (one thread: a few hundred
// experts), then every slot placed after its expert's earlier ones.
constexpr int kGroupThreads = 1024;

__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* __restrict__ choice, int slots, int n_used, int n_expert,
                     int32_t* __restrict__ offsets, int32_t* __restrict__ active, int32_t* __restrict__ rows,
                     int32_t* __restrict__ slot_of) {
  extern __shared__ int32_t sm[];
  int32_t* count = sm;             // [n_expert]
  int32_t* start = sm + n_expert;  // [n_expert]
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < slots; i += blockDim.x) atomicAdd(&count[choice[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0, n_active = 0;
    for (int e = 0; e < n_expert; ++e) {
      start[e] = at;
      offsets[e] = at;
      if (count[e] > 0) active[1 + n_active++] = e;
      at += count[e];
      count[e] = 0;  // reused below as each expert's fill
    }
    offsets[n_expert] = at;
    active[0] = n_active;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < slots; i += blockDim.x) {
    const int e = choice[i];
    const int32_t g = start[e] + atomicAdd(&count[e], 1);
    rows[g] = i / n_used;
    slot_of[i] = g;
  }
}

// ---- Expert products ----

// Block (tile of kWarps gate/up rows, active expert a); every warp loops over the expert's
// rows a chunk at a time.
template <DType T>
__global__ void __launch_bounds__(kWarps * 32, kProductBlocksPerSm)
    moe_gate_up_kernel(const float* __restrict__ x, int n_ff, const MoeExpert* __restrict__ experts,
                       MoeMatrixGeometry gg, MoeMatrixGeometry ug, const int32_t* __restrict__ offsets,
                       const int32_t* __restrict__ active, const int32_t* __restrict__ rows, float* __restrict__ h) {
  const int lane = threadIdx.x & 31;
  const int a = blockIdx.y;
  const int f = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (a >= active[0] || f >= n_ff) return;
  const int e = active[1 + a];
  const MoeExpert ex = experts[e];
  const int begin = offsets[e], end = offsets[e + 1];
  for (int g0 = begin; g0 < end; g0 += kChunk) {
    const int n = min(kChunk, end - g0);
    const float* xr[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) xr[t] = x + static_cast<int64_t>(rows[g0 + min(t, n - 1)]) * gg.cols;
    float ga[kChunk] = {}, ua[kChunk] = {};
    dot_rows<T>(ex.gate, gg, f, xr, n, ga);
    dot_rows<T>(ex.up, ug, f, xr, n, ua);
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      if (t >= n) break;
      const float gv = row_scaled<T>(ex.gate, gg, f, warp_sum(ga[t]));
      const float uv = row_scaled<T>(ex.up, ug, f, warp_sum(ua[t]));
      if (lane == 0) h[static_cast<int64_t>(g0 + t) * n_ff + f] = silu_times(gv, uv);
    }
  }
}

template <DType T>
__global__ void __launch_bounds__(kWarps * 32, kProductBlocksPerSm)
    moe_down_kernel(const float* __restrict__ h, int dim, const MoeExpert* __restrict__ experts, MoeMatrixGeometry dg,
                    const int32_t* __restrict__ offsets, const int32_t* __restrict__ active, float* __restrict__ y) {
  const int a = blockIdx.y;
  const int c = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (a >= active[0] || c >= dim) return;
  const int e = active[1 + a];
  product_rows<T>(experts[e].down, dg, c, h, offsets[e], offsets[e + 1], y, dim);
}

__global__ void moe_combine_kernel(const float* __restrict__ y, int dim, int n_used, const float* __restrict__ weight,
                                   const int32_t* __restrict__ slot_of, float* __restrict__ out) {
  const int64_t r = blockIdx.x;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    float o = 0.0f;
    for (int j = 0; j < n_used; ++j) {
      const int64_t i = r * n_used + j;
      o += weight[i] * y[static_cast<int64_t>(slot_of[i]) * dim + c];
    }
    out[r * dim + c] = o;
  }
}

// f.template operator()<T>() for every type decode_row8 reads; false for the rest.
template <typename F>
bool dispatch_moe_type(DType t, F&& f) {
  switch (t) {
    case DType::FP8W:
      f.template operator()<DType::FP8W>();
      return true;
    case DType::W4G:
      f.template operator()<DType::W4G>();
      return true;
    case DType::W8G:
      f.template operator()<DType::W8G>();
      return true;
    default:
      return dispatch_weight_type(t, f);
  }
}

}  // namespace

bool moe_geometry(const WeightMatrix& w, MoeMatrixGeometry* g) {
  if (w.cols % 8 != 0 || w.rows <= 0 || !w.data) return false;
  bool known = false;
  dispatch_moe_type(w.dtype, [&]<DType>() { known = true; });
  if (!known) return false;
  MoeMatrixGeometry r;
  r.dtype = w.dtype;
  r.rows = w.rows;
  r.cols = w.cols;
  r.row_bytes = w.row_bytes();
  if (is_fp8_weight(w.dtype)) {
    r.off_scales = w.fp8_layout().off_scales;
  } else if (is_group_quant(w.dtype)) {
    const GroupQuantLayout l = w.gq_layout();
    if (!l.valid() || l.has_perm) return false;  // act-order: the per-expert matmul path
    r.off_scales = l.off_scales;
    r.off_zeros = l.has_zeros ? l.off_zeros : -1;
    r.group_size = l.group_size;
  }
  *g = r;
  return true;
}

void launch_moe_router(const float* x, int n_rows, const void* router, const MoeMatrixGeometry& g, float* logits,
                       cudaStream_t s) {
  if (n_rows <= 0) return;
  const dim3 grid(blocks_for(g.rows, kWarps), blocks_for(n_rows, kChunk));
  TESSERA_CHECK(grid.y <= 65535u, "cuda moe router: ", n_rows, " rows in one call (at most ", 65535 * kChunk, ")");
  const auto* w = static_cast<const uint8_t*>(router);
  const bool known = dispatch_moe_type(g.dtype, [&]<DType T>() {
    moe_router_kernel<T><<<grid, kWarps * 32, 0, s>>>(x, n_rows, w, g, logits);
    TESSERA_CUDA_CHECK_LAUNCH("moe_router");
  });
  TESSERA_CHECK(known, "cuda moe router: weight type ", dtype_name(g.dtype), " has no decoder");
}

void launch_moe_route(float* logits, int n_rows, int n_expert, int n_used, bool renormalize, int32_t* choice,
                      float* weight, cudaStream_t s) {
  TESSERA_CHECK(n_expert >= 1 && n_expert <= kMoeMaxExperts && n_used >= 1 && n_used <= n_expert,
                "cuda moe routing: ", n_used, " of ", n_expert, " experts (at most ", kMoeMaxExperts, " experts)");
  if (n_rows <= 0) return;
  moe_route_kernel<<<blocks_for(n_rows, kWarps), kWarps * 32, 0, s>>>(logits, n_rows, n_expert, n_used, renormalize,
                                                                      choice, weight);
  TESSERA_CUDA_CHECK_LAUNCH("moe_route");
}

void launch_moe_group(const int32_t* choice, int n_rows, int n_used, int n_expert, int32_t* offsets, int32_t* active,
                      int32_t* rows, int32_t* slot_of, cudaStream_t s) {
  TESSERA_CHECK(n_expert >= 1 && n_expert <= kMoeMaxExperts, "cuda moe grouping: ", n_expert, " experts");
  const int slots = n_rows * n_used;
  const size_t smem = sizeof(int32_t) * 2 * static_cast<size_t>(n_expert);
  moe_group_kernel<<<1, kGroupThreads, smem, s>>>(choice, slots, n_used, n_expert, offsets, active, rows, slot_of);
  TESSERA_CUDA_CHECK_LAUNCH("moe_group");
}

void launch_moe_gate_up(const float* x, int dim, int n_ff, const MoeExpert* experts, const MoeMatrixGeometry& gate,
                        const MoeMatrixGeometry& up, const int32_t* offsets, const int32_t* active, int max_active,
                        const int32_t* rows, float* h, cudaStream_t s) {
  TESSERA_CHECK(gate.dtype == up.dtype && gate.cols == dim && up.cols == dim && gate.rows == n_ff && up.rows == n_ff,
                "cuda moe gate/up: ", dtype_name(gate.dtype), " [", gate.rows, ", ", gate.cols, "] and ",
                dtype_name(up.dtype), " [", up.rows, ", ", up.cols, "] for width ", dim, " and ", n_ff, " features");
  TESSERA_CHECK(max_active >= 1 && max_active <= 65535, "cuda moe gate/up: ", max_active, " active experts");
  const dim3 grid(blocks_for(n_ff, kWarps), max_active);
  const bool known = dispatch_moe_type(gate.dtype, [&]<DType T>() {
    moe_gate_up_kernel<T><<<grid, kWarps * 32, 0, s>>>(x, n_ff, experts, gate, up, offsets, active, rows, h);
    TESSERA_CUDA_CHECK_LAUNCH("moe_gate_up");
  });
  TESSERA_CHECK(known, "cuda moe gate/up: weight type ", dtype_name(gate.dtype), " has no decoder");
}

void launch_moe_down(const float* h, int dim, int n_ff, const MoeExpert* experts, const MoeMatrixGeometry& down,
                     const int32_t* offsets, const int32_t* active, int max_active, float* y, cudaStream_t s) {
  TESSERA_CHECK(down.cols == n_ff && down.rows == dim, "cuda moe down: [", down.rows, ", ", down.cols, "] for width ",
                dim, " and ", n_ff, " features");
  TESSERA_CHECK(max_active >= 1 && max_active <= 65535, "cuda moe down: ", max_active, " active experts");
  const dim3 grid(blocks_for(dim, kWarps), max_active);
  const bool known = dispatch_moe_type(down.dtype, [&]<DType T>() {
    moe_down_kernel<T><<<grid, kWarps * 32, 0, s>>>(h, dim, experts, down, offsets, active, y);
    TESSERA_CUDA_CHECK_LAUNCH("moe_down");
  });
  TESSERA_CHECK(known, "cuda moe down: weight type ", dtype_name(down.dtype), " has no decoder");
}

void launch_moe_combine(const float* y, int n_rows, int dim, int n_used, const float* weight, const int32_t* slot_of,
                        float* out, cudaStream_t s) {
  if (n_rows <= 0) return;
  moe_combine_kernel<<<n_rows, 256, 0, s>>>(y, dim, n_used, weight, slot_of, out);
  TESSERA_CUDA_CHECK_LAUNCH("moe_combine");
}

}  // namespace tessera::cuda
