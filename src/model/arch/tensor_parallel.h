#pragma once
// What a tensor-parallel shard (model/tp/shard.h) adds to a decoder's forward
// (docs/design/parallel.md): the vocabulary-parallel embedding, the all-reduce after each
// row-parallel product (attention's O, the FFN's down), and the vocabulary-parallel head.
// With whole weights every call is the plain op, or nothing.
#include <cstdint>
#include <map>

#include "model/arch/arch.h"

namespace tessera {

class TensorParallelOps {
 public:
  // comm: the group's communicator of this rank, on `be`; null (or of size 1) for whole weights.
  TensorParallelOps(Backend& be, const ModelWeights& w, Communicator* comm, int max_logits);

  bool sharded() const { return comm_ != nullptr; }
  // x = the embeddings of the tokens, whole on every rank: each rank embeds its vocabulary
  // rows (zeros for the others' tokens) and the ranks sum.                 x: [n, n_embd]
  void embed(const int32_t* tokens, int n, float* x);
  // y = the sum over ranks of y (each rank's partial output of a row-parallel product)    y: [n]
  void reduce(float* y, int64_t n) {
    if (comm_) comm_->all_reduce_sum(y, n);
  }
  // decoder_head's contract: the logits of the wanted rows over the whole vocabulary, on
  // every rank (each rank computes its vocabulary slice; an all-gather joins them).
  float* head(DecoderActivations& a, float* x, const ForwardInputs& in);

 private:
  // [n_out * size]: row j of the logits viewed as [n_out * size, slice] is row
  // (j % size) * n_out + j / size of the gathered [size, n_out, slice].
  const int32_t* permutation(int n_out);

  Backend& be_;
  const ModelWeights& w_;
  Communicator* comm_ = nullptr;
  BackendBuffers bufs_;
  float* part_ = nullptr;      // [max_logits, slice]: this rank's logits
  float* gathered_ = nullptr;  // [size, max_logits, slice]
  std::map<int, const int32_t*> perms_;
};

}  // namespace tessera
