// Weights made resident on a backend: every matrix and vector uploaded once (a device
// backend copies; the CPU keeps the host pointers), shared pointers deduplicated so tied
// embeddings travel once.
#include <unordered_map>

#include "model/weights.h"

namespace tessera {

std::shared_ptr<const ModelWeights> make_resident(std::shared_ptr<const ModelWeights> host, Backend& backend) {
  auto w = std::make_shared<ModelWeights>();
  w->config = host->config;
  w->source = host->source;
  w->weight_bytes = host->weight_bytes;
  w->owners.push_back(host);  // the host copy stays alive (the CPU computes on it)
  std::unordered_map<const void*, const void*> done;
  auto put = [&](const void* p, size_t bytes) -> const void* {
    if (!p) return nullptr;
    if (auto it = done.find(p); it != done.end()) return it->second;
    std::shared_ptr<const void> copy = backend.upload(p, bytes);
    w->owners.push_back(copy);
    return done[p] = copy.get();
  };
  auto matrix = [&](const WeightMatrix& m) {
    WeightMatrix r = m;
    r.data = put(m.data, static_cast<size_t>(m.rows * m.row_bytes()));
    return r;
  };
  auto vec = [&](const float* v, int64_t n) { return static_cast<const float*>(put(v, sizeof(float) * n)); };
  const ModelConfig& c = host->config;
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  w->tok_embd = matrix(host->tok_embd);
  w->output = matrix(host->output);
  w->output_norm = vec(host->output_norm, c.n_embd);
  w->rope_freq_factors = vec(host->rope_freq_factors, c.rope_dim / 2);
  w->layers.resize(host->layers.size());
  for (size_t i = 0; i < host->layers.size(); ++i) {
    const LayerWeights& h = host->layers[i];
    LayerWeights& l = w->layers[i];
    l.attn_norm = vec(h.attn_norm, c.n_embd);
    l.wq = matrix(h.wq);
    l.wk = matrix(h.wk);
    l.wv = matrix(h.wv);
    l.wo = matrix(h.wo);
    l.bq = vec(h.bq, q_dim);
    l.bk = vec(h.bk, kv_dim);
    l.bv = vec(h.bv, kv_dim);
    l.ffn_norm = vec(h.ffn_norm, c.n_embd);
    l.w_gate = matrix(h.w_gate);
    l.w_up = matrix(h.w_up);
    l.w_down = matrix(h.w_down);
  }
  return w;
}

}  // namespace tessera
