#pragma once
// The `quantization_config` of a Hugging Face config.json, for the weight formats tessera loads
// (docs/design/weight-quant.md): GPTQ, AWQ (GEMM packing), compressed-tensors pack-quantized
// (integer) and float-quantized (FP8), and FP8 checkpoints (quant_method "fp8", vLLM /
// AutoFP8). Anything else that would change what the weights mean is an error naming the
// field and its value, never silently ignored.
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

enum class WeightQuantMethod { None, Gptq, Awq, CompressedTensors, Fp8 };

// Where an FP8 checkpoint's weight_scale lives. quant_method "fp8" does not say (scalar or one
// per output row are both read); compressed-tensors' strategy does.
enum class Fp8ScaleStrategy { Any, Tensor, Channel };

struct WeightQuantConfig {
  WeightQuantMethod method = WeightQuantMethod::None;
  int bits = 0;            // 4 or 8
  int64_t group_size = 0;  // columns per group; -1: one group per output row ("channel")
  bool symmetric = true;   // no zero points stored (GPTQ sym, AWQ without zero_point, CT symmetric)
  bool gptq_v2 = false;    // GPTQ checkpoint_format "gptq_v2": qzeros stored as is, not minus one
  bool act_order = false;  // GPTQ desc_act / CT actorder: g_idx tensors may permute the groups
  // FP8 (quant_method "fp8", CT float-quantized): `weight` F8_E4M3 [N, K] + `weight_scale`,
  // loaded into DType::FP8W. bits is 8, group_size -1.
  bool fp8 = false;
  Fp8ScaleStrategy fp8_scales = Fp8ScaleStrategy::Any;
  // Static activation scheme: every quantized layer must carry a valid `input_scale` (checked,
  // then unused: FP8W quantizes activations per token at run time, see the design doc).
  bool static_input_scale = false;
};

const char* weight_quant_method_name(WeightQuantMethod m);

// Reads root["quantization_config"] of config.json text (None when absent or null).
// `file` starts every error message.
WeightQuantConfig parse_weight_quant_config(std::string_view config_json, std::string_view file);
// Reads it from a model directory's config.json.
WeightQuantConfig load_weight_quant_config(const std::string& dir);

}  // namespace tessera
