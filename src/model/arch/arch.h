#pragma once
// Pieces the architecture files share (model/arch/*.cpp): activation buffers owned by the
// backend, the RoPE configuration a config asks for, and each architecture's constructor.
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace tessera {

// Backend buffers freed together (a model's activations).
class BackendBuffers {
 public:
  explicit BackendBuffers(Backend& be) : be_(be) {}
  BackendBuffers(const BackendBuffers&) = delete;
  BackendBuffers& operator=(const BackendBuffers&) = delete;
  ~BackendBuffers() {
    for (void* p : owned_) be_.free(p);
  }
  float* floats(int64_t n) {
    void* p = be_.alloc(sizeof(float) * static_cast<size_t>(n));
    owned_.push_back(p);
    return static_cast<float*>(p);
  }

 private:
  Backend& be_;
  std::vector<void*> owned_;
};

// RoPE as the config says, at base freq_base; with_scaling false leaves out the config's
// rope_scaling (Gemma 3's local layers rotate unscaled).
RopeConfig rope_config_for(const ModelConfig& c, float freq_base, const float* freq_factors, bool with_scaling);

std::unique_ptr<Model> make_llama_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                        int max_logits);
std::unique_ptr<Model> make_gemma3_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                         int max_logits);

}  // namespace tessera
