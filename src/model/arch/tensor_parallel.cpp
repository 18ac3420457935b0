#include "model/arch/tensor_parallel.h"

#include <vector>

#include "core/error.h"

namespace tessera {

TensorParallelOps::TensorParallelOps(Backend& be, const ModelWeights& w, Communicator* comm, int max_logits)
    : be_(be), w_(w), bufs_(be) {
  const TensorShard& s = w.shard;
  if (s.size == 1) {
    TESSERA_CHECK(!comm || comm->size() == 1, w.config.arch, ": whole weights with a communicator of ", comm->size(),
                  " ranks; shard them first (model/tp/shard.h)");
    return;
  }
  TESSERA_CHECK(comm, w.config.arch, ": a shard of tensor-parallel rank ", s.rank, "/", s.size,
                " needs the group's communicator");
  TESSERA_CHECK(comm->size() == s.size && comm->rank() == s.rank, w.config.arch, ": the weights are rank ", s.rank,
                " of ", s.size, ", the communicator is rank ", comm->rank(), " of ", comm->size());
  // Pipeline stages of a shard: the first holds the embedding, the last the head.
  for (const WeightMatrix* m : {&w.tok_embd, &w.output})
    TESSERA_CHECK(!m->data || m->rows * s.size == w.config.n_vocab, w.config.arch, ": a vocabulary slice of ", m->rows,
                  " rows at tensor-parallel size ", s.size, " for a vocabulary of ", w.config.n_vocab);
  comm_ = comm;
  if (!w.output.data) return;
  const int64_t slice = w.output.rows;
  part_ = bufs_.floats(static_cast<int64_t>(max_logits) * slice);
  gathered_ = bufs_.floats(static_cast<int64_t>(max_logits) * slice * s.size);
}

void TensorParallelOps::embed(const int32_t* tokens, int n, float* x) {
  if (!comm_) {
    be_.embed(w_.tok_embd, tokens, n, x);
    return;
  }
  be_.embed_range(w_.tok_embd, w_.shard.vocab_first, tokens, n, x);
  comm_->all_reduce_sum(x, static_cast<int64_t>(n) * w_.config.n_embd);  // one nonzero term each: exact
}

float* TensorParallelOps::head(DecoderActivations& a, float* x, const ForwardInputs& in) {
  if (!comm_) return decoder_head(be_, w_, a, x, in);
  const int n_out = in.n_logits, e = w_.config.n_embd;
  if (n_out == 0) return a.logits;
  decoder_final_norm(be_, w_, a, x, in);  // a.rows: [n_out, e]
  const int64_t slice = w_.output.rows;
  const MatmulTarget out[] = {{w_.output, part_, slice}};
  be_.matmul(a.rows, n_out, e, out);  // part: [n_out, slice]
  if (n_out == 1) {                   // [size, 1, slice] is already the row
    comm_->all_gather(part_, a.logits, slice);
    return a.logits;
  }
  comm_->all_gather(part_, gathered_, n_out * slice);  // gathered: [size, n_out, slice]
  be_.gather_rows(gathered_, slice, permutation(n_out), n_out * comm_->size(), static_cast<int>(slice), a.logits);
  return a.logits;
}

const int32_t* TensorParallelOps::permutation(int n_out) {
  if (auto it = perms_.find(n_out); it != perms_.end()) return it->second;
  const int size = comm_->size();
  std::vector<int32_t> p(static_cast<size_t>(n_out) * size);
  for (int j = 0; j < n_out * size; ++j) p[j] = (j % size) * n_out + j / size;
  auto* dev = reinterpret_cast<int32_t*>(bufs_.floats(static_cast<int64_t>(p.size())));
  be_.copy_to_device(dev, p.data(), sizeof(int32_t) * p.size());
  return perms_[n_out] = dev;
}

}  // namespace tessera
