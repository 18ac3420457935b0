#include "model/pp/stage.h"

#include "core/error.h"

namespace tessera {

std::string PipelinePlan::describe() const {
  std::string out = "layers ";
  for (int s = 0; s < size(); ++s) {
    if (s > 0) out += " | ";
    out += std::to_string(first_layer[s]) + "-" + std::to_string(first_layer[s + 1] - 1);
  }
  return out;
}

PipelinePlan plan_pipeline(const ModelConfig& c, int size) {
  TESSERA_CHECK(size >= 1, "pipeline parallel size ", size, " must be at least 1");
  TESSERA_CHECK(size <= c.n_layer, "pipeline parallel size ", size, " is more stages than the model's ", c.n_layer,
                " layers");
  TESSERA_CHECK(c.arch != "gemma3", "pipeline parallelism does not split ", c.arch,
                " (its layers alternate local and global attention by index)");
  TESSERA_CHECK(c.sliding_window <= 0 || c.sliding_window_pattern == 0, "pipeline parallelism does not split ", c.arch,
                " with a sliding-window pattern of ", c.sliding_window_pattern, " (its layers differ by index)");
  PipelinePlan p;
  p.first_layer.push_back(0);
  for (int s = 0; s < size; ++s)
    p.first_layer.push_back(p.first_layer.back() + c.n_layer / size + (s < c.n_layer % size ? 1 : 0));
  return p;
}

std::shared_ptr<ModelWeights> stage_weights(std::shared_ptr<const ModelWeights> whole, const PipelinePlan& plan,
                                            int stage) {
  TESSERA_CHECK(whole != nullptr, "pipeline stage: no weights");
  TESSERA_CHECK(stage >= 0 && stage < plan.size(), "pipeline stage ", stage, " of ", plan.size());
  TESSERA_CHECK(plan.first_layer.back() == whole->config.n_layer, "pipeline plan of ", plan.first_layer.back(),
                " layers for a model of ", whole->config.n_layer);
  auto w = std::make_shared<ModelWeights>(*whole);  // matrices are views: copying the struct copies no data
  const int first = plan.first_layer[stage], n = plan.n_layers(stage);
  w->stage = {.index = stage, .size = plan.size(), .first_layer = first};
  w->config.n_layer = n;
  w->layers.assign(whole->layers.begin() + first, whole->layers.begin() + first + n);
  const auto slice = [&](std::vector<float>& v) {
    if (v.size() == whole->layers.size()) v.assign(v.begin() + first, v.begin() + first + n);
  };
  slice(w->k_scale);
  slice(w->v_scale);
  // What another stage computes is not this one's to hold (a device backend would upload it).
  if (!w->stage.first()) w->tok_embd = {};
  if (!w->stage.last()) {
    w->output = {};
    w->output_norm = nullptr;
  }
  w->source = whole->source + "[stage " + std::to_string(stage) + ": layers " + std::to_string(first) + "-" +
              std::to_string(first + n - 1) + "]";
  w->owners.push_back(whole);  // the views point into whole's buffers
  return w;
}

}  // namespace tessera
