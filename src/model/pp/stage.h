#pragma once
// Pipeline-parallel stages of a Llama-family model (docs/design/parallel.md, "Pipeline
// parallelism"): the layers split into N consecutive ranges, one per stage. Stage 0 holds the
// token embedding, the last stage the final norm and output head; between stages travels the
// residual stream [n_tokens, n_embd] of the batch (one send/recv per stage boundary).
#include <memory>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tessera {

struct PipelinePlan {
  std::vector<int> first_layer;  // [size + 1]: stage s runs layers [first_layer[s], first_layer[s + 1])
  int size() const { return static_cast<int>(first_layer.size()) - 1; }
  int n_layers(int s) const { return first_layer[s + 1] - first_layer[s]; }
  // "layers 0-14 | 15-29".
  std::string describe() const;
};

// The plan for `c` at `size` stages: layers split as evenly as they go, the earlier stages
// taking one more where they do not divide (the last stage also runs the output head).
// Throws tessera::Error naming what is refused: more stages than layers, an architecture
// whose layers differ by index (Gemma 3's, or a sliding-window pattern: a stage's layer 0 is
// not the model's).
PipelinePlan plan_pipeline(const ModelConfig& c, int size);

// Stage `stage`'s weights of `whole`: views of its layers (no copy), the embedding only on
// stage 0, the final norm and head only on the last stage; config.n_layer is the stage's.
// The result keeps `whole` alive.
std::shared_ptr<ModelWeights> stage_weights(std::shared_ptr<const ModelWeights> whole, const PipelinePlan& plan,
                                            int stage);

}  // namespace tessera
