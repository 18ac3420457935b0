#include "core/error.h"
#include "model/weights.h"

namespace tessera {

std::shared_ptr<const ModelWeights> first_layers(std::shared_ptr<const ModelWeights> w, int n_layers) {
  TESSERA_CHECK(w != nullptr, "first_layers: no weights");
  const int total = w->config.n_layer;
  TESSERA_CHECK(n_layers >= 1 && n_layers <= total, w->source, ": ", n_layers, " layers requested, the model has ",
                total, " (valid: 1..", total, ")");
  if (n_layers == total) return w;
  auto t = std::make_shared<ModelWeights>(*w);  // matrices are views: copying the struct copies no data
  t->config.n_layer = n_layers;
  t->layers.resize(n_layers);
  if (t->k_scale.size() > static_cast<size_t>(n_layers)) t->k_scale.resize(n_layers);
  if (t->v_scale.size() > static_cast<size_t>(n_layers)) t->v_scale.resize(n_layers);
  t->source = w->source + "[:" + std::to_string(n_layers) + " layers]";
  t->owners.push_back(w);  // the views point into w's buffers
  return t;
}

}  // namespace tessera
