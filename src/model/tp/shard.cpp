#include "model/tp/shard.h"

#include <string>
#include <utility>

#include "core/error.h"
#include "model/tp/slice.h"

namespace tessera {

TensorParallelPlan plan_tensor_parallel(const ModelConfig& c, int size) {
  TESSERA_CHECK(size >= 1 && size <= kMaxHeads, "tensor parallel: size ", size, " is outside [1, ", kMaxHeads, "]");
  TESSERA_CHECK(c.arch != "gemma3", "tensor parallel: gemma3 is not sharded (built for the Llama family only)");
  TESSERA_CHECK(c.n_expert == 0, "tensor parallel: ", c.arch, " has mixture-of-experts layers (", c.n_expert,
                " experts), which are not sharded");
  TESSERA_CHECK(c.n_head % size == 0, "tensor parallel: ", c.n_head, " attention heads do not split over ", size,
                " ranks (", c.n_head, " % ", size, " = ", c.n_head % size, ")");
  TESSERA_CHECK(c.n_head_kv >= size ? c.n_head_kv % size == 0 : size % c.n_head_kv == 0,
                "tensor parallel: ", c.n_head_kv, " KV heads and ", size,
                " ranks: one must divide the other (KV heads split, or each ", "shared by size / n_head_kv ranks)");
  TESSERA_CHECK(c.n_ff % size == 0, "tensor parallel: FFN width ", c.n_ff, " does not split over ", size, " ranks (",
                c.n_ff, " % ", size, " = ", c.n_ff % size, ")");
  TESSERA_CHECK(c.n_vocab % size == 0, "tensor parallel: vocabulary of ", c.n_vocab, " does not split over ", size,
                " ranks (", c.n_vocab, " % ", size, " = ", c.n_vocab % size, ")");
  TensorParallelPlan p;
  p.size = size;
  p.n_head = c.n_head / size;
  p.kv_replicated = c.n_head_kv < size;
  p.n_head_kv = p.kv_replicated ? 1 : c.n_head_kv / size;
  p.n_ff = c.n_ff / size;
  p.n_vocab = c.n_vocab / size;
  return p;
}

std::shared_ptr<ModelWeights> shard_weights(std::shared_ptr<const ModelWeights> whole, int rank, int size) {
  TESSERA_CHECK(whole && whole->shard.size == 1, "tensor parallel: the weights to shard must be a whole model");
  const ModelConfig& c = whole->config;
  const TensorParallelPlan p = plan_tensor_parallel(c, size);
  TESSERA_CHECK(rank >= 0 && rank < size, "tensor parallel: rank ", rank, " of ", size);
  if (size == 1) {  // the whole model, as a copy of the struct (views, no data copied)
    auto w = std::make_shared<ModelWeights>(*whole);
    w->owners.push_back(whole);
    return w;
  }
  auto w = std::make_shared<ModelWeights>();
  w->owners.push_back(whole);  // the row views point into whole's buffers
  w->config = c;
  w->stage = whole->stage;  // a pipeline stage's layers may be sharded too
  w->config.n_head = p.n_head;
  w->config.n_head_kv = p.n_head_kv;
  w->config.n_ff = static_cast<int>(p.n_ff);
  w->shard = {rank, size, rank * p.n_vocab, p.head_first(rank), p.kv_head_first(rank, c.n_head_kv), rank * p.n_ff};
  w->k_scale = whole->k_scale;
  w->v_scale = whole->v_scale;
  w->source = whole->source + " [tp " + std::to_string(rank) + "/" + std::to_string(size) + "]";
  const int64_t hd = c.head_dim, q0 = w->shard.head_first * hd, q_rows = p.n_head * hd;
  const int64_t kv0 = w->shard.kv_head_first * hd, kv_rows = p.n_head_kv * hd;
  const int64_t ff0 = w->shard.ff_first;
  auto bytes = [](const WeightMatrix& m) { return m.data ? m.bytes() : 0; };

  // A pipeline stage holds the embedding (the first) or the head (the last) or neither; a
  // last stage of a tied model holds the head as a view of the embedding rows.
  const bool embd = whole->tok_embd.data != nullptr, out = whole->output.data != nullptr;
  const bool shared = c.tied_embeddings && embd && out;
  if (embd) w->tok_embd = slice_rows(whole->tok_embd, w->shard.vocab_first, p.n_vocab, *w, "token embedding");
  if (out) w->output = shared ? w->tok_embd : slice_rows(whole->output, w->shard.vocab_first, p.n_vocab, *w, "output");
  w->output_norm = whole->output_norm;
  w->rope_freq_factors = whole->rope_freq_factors;
  int64_t total = bytes(w->tok_embd) + (shared ? 0 : bytes(w->output));
  w->layers.resize(whole->layers.size());
  for (size_t i = 0; i < whole->layers.size(); ++i) {
    const LayerWeights& h = whole->layers[i];
    LayerWeights& l = w->layers[i];
    const std::string name = "layer " + std::to_string(i) + " ";
    l = h;  // norms (and Q/K norms) replicated; the matrices and biases replaced below
    l.wq = slice_rows(h.wq, q0, q_rows, *w, name + "Q");
    l.wk = slice_rows(h.wk, kv0, kv_rows, *w, name + "K");
    l.wv = slice_rows(h.wv, kv0, kv_rows, *w, name + "V");
    l.wo = slice_cols(h.wo, q0, q_rows, *w, name + "O");
    if (h.bq) {
      l.bq = h.bq + q0;
      l.bk = h.bk + kv0;
      l.bv = h.bv + kv0;
    }
    l.w_gate = slice_rows(h.w_gate, ff0, p.n_ff, *w, name + "gate");
    l.w_up = slice_rows(h.w_up, ff0, p.n_ff, *w, name + "up");
    l.w_down = slice_cols(h.w_down, ff0, p.n_ff, *w, name + "down");
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) total += bytes(*m);
  }
  w->weight_bytes = total;
  return w;
}

}  // namespace tessera
