// Weights made resident on a backend: every matrix and vector uploaded once (a device
// backend copies; the CPU keeps the host pointers), shared pointers deduplicated so tied
// embeddings travel once.
#include <cstring>
#include <initializer_list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/weights.h"

namespace tessera {

std::shared_ptr<const ModelWeights> make_resident(std::shared_ptr<const ModelWeights> host, Backend& backend) {
  if (host->resident_on == &backend) return host;
  TESSERA_CHECK(host->resident_on == nullptr, host->source, ": weights resident on another backend");
  auto w = std::make_shared<ModelWeights>();
  w->resident_on = &backend;
  w->config = host->config;
  w->source = host->source;
  w->shard = host->shard;
  w->stage = host->stage;
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
    r.data = put(m.data, static_cast<size_t>(m.bytes()));
    return r;
  };
  auto vec = [&](const float* v, int64_t n) { return static_cast<const float*>(put(v, sizeof(float) * n)); };
  // On a device backend the matrices that share an input (Q, K, V; gate, up) of one type and
  // width go into one allocation, back to back, so the backend can run them as one product.
  // The CPU computes on the host copy and gains nothing from it. Group-quantized matrices are
  // planes (codes, then scales) that do not concatenate by rows: they travel apart.
  const bool device = backend.device_free_bytes() > 0;
  auto matrices = [&](std::initializer_list<std::pair<const WeightMatrix*, WeightMatrix*>> parts) {
    auto bytes = [](const WeightMatrix* m) { return static_cast<size_t>(m->bytes()); };
    const WeightMatrix& first = *parts.begin()->first;
    bool fuse = device;
    size_t total = 0;
    for (const auto& [h, d] : parts) {
      fuse = fuse && h->data && !is_group_quant(h->dtype) && h->dtype == first.dtype && h->cols == first.cols &&
             !done.count(h->data);
      total += bytes(h);
    }
    if (!fuse) {
      for (const auto& [h, d] : parts) *d = matrix(*h);
      return;
    }
    std::vector<uint8_t> joined(total);
    size_t off = 0;
    for (const auto& [h, d] : parts) {
      std::memcpy(joined.data() + off, h->data, bytes(h));
      off += bytes(h);
    }
    std::shared_ptr<const void> copy = backend.upload(joined.data(), total);
    w->owners.push_back(copy);
    off = 0;
    for (const auto& [h, d] : parts) {
      *d = *h;
      d->data = static_cast<const uint8_t*>(copy.get()) + off;
      done[h->data] = d->data;
      off += bytes(h);
    }
  };
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
    matrices({{&h.wq, &l.wq}, {&h.wk, &l.wk}, {&h.wv, &l.wv}});
    l.wo = matrix(h.wo);
    l.bq = vec(h.bq, q_dim);
    l.bk = vec(h.bk, kv_dim);
    l.bv = vec(h.bv, kv_dim);
    l.ffn_norm = vec(h.ffn_norm, c.n_embd);
    matrices({{&h.w_gate, &l.w_gate}, {&h.w_up, &l.w_up}});
    l.w_down = matrix(h.w_down);
    l.router = matrix(h.router);
    for (const WeightMatrix& m : h.gate_exps) l.gate_exps.push_back(matrix(m));
    for (const WeightMatrix& m : h.up_exps) l.up_exps.push_back(matrix(m));
    for (const WeightMatrix& m : h.down_exps) l.down_exps.push_back(matrix(m));
    l.q_norm = vec(h.q_norm, c.head_dim);
    l.k_norm = vec(h.k_norm, c.head_dim);
    l.post_attn_norm = vec(h.post_attn_norm, c.n_embd);
    l.post_ffn_norm = vec(h.post_ffn_norm, c.n_embd);
  }
  return w;
}

}  // namespace tessera
