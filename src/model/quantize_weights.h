#pragma once
// Group-quantized weights built at load time from whatever a model holds (round-to-nearest):
// a 16-bit or GGUF model served in W4G/W8G, as vLLM's --quantization does on the fly, and
// the spec names shared with dummy weights ("w4g128", "w8g64", "w4c", with an "a" suffix for
// zero points: "w4g128a").
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/quantize_calibrated.h"
#include "model/weights.h"

namespace tessera {

struct WeightQuantSpec {
  int bits = 4;
  int64_t group = 128;  // 0: one group per output row
  bool asymmetric = false;
  bool fp8 = false;  // "fp8": E4M3 with a scale per output row (DType::FP8W); the rest unused
  // GPTQ/AWQ at load ("gptq-w4g128,calib=FILE[,tokens=N][,window=N][,damp=X][,act-order]"):
  std::string method = "rtn";  // rtn | gptq | awq
  std::string calib_file;      // calibration text, tokenized with the model's tokenizer
  int calib_tokens = 8192;     // at most this many tokens of it
  int window = 512;            // tokens per calibration sequence
  double damp = 0.01;
  bool act_order = false;
};

// Parses "fp8", or "w4g128", "w8g64a", "w4c", ..., optionally after "rtn-", "gptq-" or "awq-" and followed
// by ",key=value" calibration settings; false when `s` is not such a name; throws when it is
// one with a bad group size (not a multiple of 32), an unknown setting, or GPTQ/AWQ without
// calib=FILE.
bool parse_weight_quant_spec(const std::string& s, WeightQuantSpec* out);

// Replaces every decoder linear layer of w (q, k, v, o, gate, up, down) by its RTN
// quantization (quantize_group_rtn, or quantize_fp8_rtn for fp8, over the decoded values, in parallel over the matrices);
// embeddings and the output head are kept. A width the group does not divide ends in a
// partial group. Throws for matrices already group-quantized or FP8.
void quantize_linear_weights(ModelWeights& w, const WeightQuantSpec& spec);

// GPTQ/AWQ at load: reads spec.calib_file, tokenizes it with `tokenize`, keeps the first
// spec.calib_tokens tokens and runs quantize_calibrated on the CPU backend `be`.
void quantize_linear_weights_calibrated(ModelWeights& w, const WeightQuantSpec& spec,
                                        const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                                        Backend& be,
                                        const std::function<void(const CalibratedLayerReport&)>& on_layer = {});

// One line for a layer's report: time, and per matrix the output error against RTN's.
std::string describe_calibrated_layer(const CalibratedLayerReport& r);

}  // namespace tessera
