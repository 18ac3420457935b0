#pragma once
// Launchers of the mixture-of-experts kernels (moe.cu), beside kernels.h (same conventions:
// device pointers, enqueued on `s`, launches checked). CudaBackend::moe_ffn (cuda_moe.cpp)
// chains them; docs/design/cuda-backend.md, "Mixture of experts", tells the whole flow.
//
// Slots: routing slot i = r * n_used + j is row r's j-th chosen expert. Grouped slot g is a
// position in the slots sorted by expert: expert e owns grouped slots [offsets[e], offsets[e+1]).
// The order of the rows within an expert is unspecified (each row's result does not depend on
// it).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

// One expert's three matrices (device pointers to each matrix's own buffer).
struct MoeExpert {
  const uint8_t* gate = nullptr;  // [n_ff, dim]
  const uint8_t* up = nullptr;    // [n_ff, dim]
  const uint8_t* down = nullptr;  // [dim, n_ff]
};

// What the grouped kernels need to find row r of one matrix in its buffer; the same for every
// expert of one kind (gate, up or down). From moe_geometry().
struct MoeMatrixGeometry {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;   // stride of the rows (of the codes, for W4G/W8G)
  int64_t off_scales = 0;  // FP8W: f32 [rows]; W4G/W8G: f16 [n_groups][rows]; else unused
  int64_t off_zeros = -1;  // W4G/W8G with zero points: u8 [n_groups][rows]; -1 = the default zero
  int64_t group_size = 0;  // W4G/W8G
};

// The geometry of w, or false when the grouped kernels cannot read it: a type without a
// decoder here (formats of quant_decode.cuh, FP8W, W4G/W8G without act-order permutation), or
// columns not a multiple of 8.
bool moe_geometry(const WeightMatrix& w, MoeMatrixGeometry* g);

// logits[r, e] = x[r, :] · router[e, :] in f32 (the router decoded exactly, f32 accumulation:
// the choice of experts is discrete, so it is computed at the CPU's precision, not on bf16
// tensor cores).                          x: [n_rows, dim] dense; logits: [n_rows, n_expert]
void launch_moe_router(const float* x, int n_rows, const void* router, const MoeMatrixGeometry& g, float* logits,
                       cudaStream_t s);

// Per row, from its logits: p = softmax (exp in f32, the sum in double, as the CPU), the
// n_used largest (ties: lower index first) into choice[r * n_used + j] in order, weight = p /
// (sum of the chosen p in double) or p (renormalize false). logits is overwritten with p.
// n_expert <= kMoeMaxExperts.
constexpr int kMoeMaxExperts = 1024;
void launch_moe_route(float* logits, int n_rows, int n_expert, int n_used, bool renormalize, int32_t* choice,
                      float* weight, cudaStream_t s);

// Groups the slots by expert (one block): offsets [n_expert + 1]; active [n_expert + 1] with
// active[0] = how many experts have rows and active[1..] those experts in increasing order;
// rows[g] = the input row of grouped slot g; slot_of[i] = the grouped slot of routing slot i.
void launch_moe_group(const int32_t* choice, int n_rows, int n_used, int n_expert, int32_t* offsets, int32_t* active,
                      int32_t* rows, int32_t* slot_of, cudaStream_t s);

// The grouped products, reading the groups from device memory (so the grid depends on the
// shapes only and the launches can be captured into a graph): a block per (tile of output
// features, active expert); experts without rows read no weight byte. Rows go 8 at a time
// through each weight row (an expert with more rows reads its weights again, from L2).
// h[g, f] = silu(gate_e[f] · x[rows[g]]) * (up_e[f] · x[rows[g]])       x: [n_rows, dim] dense
// max_active: gridDim.y, at least the number of experts with rows (min(n_expert, slots)).
void launch_moe_gate_up(const float* x, int dim, int n_ff, const MoeExpert* experts, const MoeMatrixGeometry& gate,
                        const MoeMatrixGeometry& up, const int32_t* offsets, const int32_t* active, int max_active,
                        const int32_t* rows, float* h, cudaStream_t s);
// y[g, c] = down_e[c] · h[g]                                  h: [slots, n_ff]; y: [slots, dim]
void launch_moe_down(const float* h, int dim, int n_ff, const MoeExpert* experts, const MoeMatrixGeometry& down,
                     const int32_t* offsets, const int32_t* active, int max_active, float* y, cudaStream_t s);

// out[r, :] = sum over j < n_used, in order, of weight[r * n_used + j] * y[slot_of[r * n_used + j], :]
void launch_moe_combine(const float* y, int n_rows, int dim, int n_used, const float* weight, const int32_t* slot_of,
                        float* out, cudaStream_t s);

}  // namespace tessera::cuda
