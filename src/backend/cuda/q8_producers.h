#pragma once
// Kernels that write their output straight as the integer decode kernels' Q8 input (Q8Rows,
// kernels.h; numerics in q8_rows.cuh), so the product after them needs no quantize launch
// (CudaBackend::add_rms_norm_matmul and swiglu_matmul with group-quantized or GGUF block weights).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

// out row t = Q8(silu(gate[t, j]) * up[t, j] for j < dim): SwiGLU straight into the integer
// kernels' input, the values of launch_swiglu then launch_quantize_q8_rows.
void launch_swiglu_q8(const float* gate, const float* up, int64_t ld_in, int n_rows, int64_t dim, Q8Rows out,
                      cudaStream_t s);
// x_out = x + residual; out row t = Q8(rms_norm(x_out[t]) * w) (dense rows [n_rows, dim]): the
// values of launch_add_rms_norm_into's f32 output, quantized without an f32 round trip.
void launch_add_rms_norm_q8(const float* x, const float* residual, const float* w, float* x_out, int n_rows, int dim,
                            float eps, Q8Rows out, cudaStream_t s);

}  // namespace tessera::cuda
