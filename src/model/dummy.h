#pragma once
// Dummy weights (like vLLM's --load-format dummy): any config at real size, filled from a
// seed, for speed tests and CPU/GPU parity without a model file.
#include <cstdint>
#include <memory>
#include <string>

#include "model/weights.h"

namespace tessera {

// spec = "<preset>[:<dtype>]", preset one of dummy_presets(), dtype one of f32, f16, bf16,
// q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (default f16), or group-quantized w4g<N>,
// w8g<N>, w4c, w8c (the decoder's linear layers in W4G/W8G with groups of N or one per row,
// random symmetric codes; embeddings and output head F16). Same spec and seed, same weights,
// on any machine.
std::shared_ptr<ModelWeights> make_dummy_weights(const std::string& spec, uint64_t seed);
ModelConfig dummy_preset(const std::string& name);  // throws listing the presets
const char* dummy_presets();                        // "smollm2-135m, llama-3.2-1b, llama-3.1-8b"

}  // namespace tessera
