#pragma once
// Group-quantized weights built at load time from whatever a model holds (round-to-nearest):
// a 16-bit or GGUF model served in W4G/W8G, as vLLM's --quantization does on the fly, and
// the spec names shared with dummy weights ("w4g128", "w8g64", "w4c", with an "a" suffix for
// zero points: "w4g128a").
#include <cstdint>
#include <string>

#include "model/weights.h"

namespace tessera {

struct WeightQuantSpec {
  int bits = 4;
  int64_t group = 128;  // 0: one group per output row
  bool asymmetric = false;
  bool fp8 = false;  // "fp8": E4M3 with a scale per output row (DType::FP8W); the rest unused
};

// Parses "w4g128", "w8g64a", "w4c", ..., and "fp8"; false when `s` is not such a name; throws
// when it is one with a bad group size (not a multiple of 32).
bool parse_weight_quant_spec(const std::string& s, WeightQuantSpec* out);

// Replaces every decoder linear layer of w (q, k, v, o, gate, up, down) by its RTN
// quantization (quantize_group_rtn, or quantize_fp8_rtn for fp8, over the decoded values, in parallel over the matrices);
// embeddings and the output head are kept. A width the group does not divide ends in a
// partial group. Throws for matrices already group-quantized or FP8.
void quantize_linear_weights(ModelWeights& w, const WeightQuantSpec& spec);

}  // namespace tessera
