#pragma once
// Quantized linear layers of a Hugging Face checkpoint: integer ones (GPTQ, AWQ,
// compressed-tensors pack-quantized) loaded into tessera's group-quantized format (W4G/W8G),
// FP8 ones (quant_method "fp8", compressed-tensors float-quantized) into FP8W.
#include <cstdint>
#include <string>

#include "format/safetensors.h"
#include "model/quant_config.h"
#include "model/weights.h"

namespace tessera {

// When the linear layer `prefix` (e.g. "model.layers.0.self_attn.q_proj", weight [rows, cols])
// is stored quantized as cfg says, builds it (owned by w) into *out and returns true; false when
// it is stored plainly (prefix.weight in F32/F16/BF16: layers the quantizer skipped). Throws tessera::Error
// naming the tensor on a malformed or unsupported layer.
bool load_quantized_linear(const SafetensorsModel& st, const WeightQuantConfig& cfg, const std::string& prefix,
                           int64_t rows, int64_t cols, ModelWeights& w, WeightMatrix* out);

}  // namespace tessera
