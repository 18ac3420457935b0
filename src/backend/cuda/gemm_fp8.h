#pragma once
// The FP8W path past the decode sizes for the shapes cuBLASLt's FP8 kernels do not take
// (gemm_fp8.cu; the W8A8 launches are declared in kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/tensor.h"

namespace tessera::cuda {

// FP8W weights as bf16, dense [rows, cols] (e4m3 * scale, rounded once), for the bf16 GEMM.
void launch_dequant_fp8_bf16(const WeightMatrix& w, uint16_t* out, cudaStream_t s);

}  // namespace tessera::cuda
