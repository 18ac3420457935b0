#include "engine/executor_tp.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kv/kv_host_ops.h"

namespace tessera {

TensorParallelExecutor::TensorParallelExecutor(ParallelRanks& ranks, int max_batch_tokens, int max_logits_rows,
                                               int n_host_blocks)
    : ranks_(ranks), scratch_(ranks.size()) {
  // Each rank's objects are made on its thread (a device backend's context is its own).
  ranks_.run([&](ParallelRanks::Rank& r) {
    TESSERA_CHECK(r.kv != nullptr, "tensor parallel: rank ", r.index, " has no KV cache");
    if (r.index == 0) {
      // No graphs with collectives, so no padding block (-1).
      rank0_ = std::make_unique<ModelExecutor>(*r.model, *r.kv, *r.backend, max_batch_tokens, max_logits_rows,
                                               n_host_blocks);
      return;
    }
    r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.backend);
    if (n_host_blocks > 0) r.host = std::make_unique<HostKvTier>(r.kv->spec(), n_host_blocks, *r.backend);
  });
}

TensorParallelExecutor::~TensorParallelExecutor() {
  try {
    ranks_.run([&](ParallelRanks::Rank& r) {
      if (r.index == 0) rank0_.reset();
      r.runner.reset();
      r.host.reset();
    });
  } catch (...) {  // destruction does not throw; what is left goes with the ranks
  }
}

void TensorParallelExecutor::add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) {
  rank0_->add_sequence(seq, params, prompt);
}

void TensorParallelExecutor::remove_sequence(SeqId seq) { rank0_->remove_sequence(seq); }

void TensorParallelExecutor::execute(const StepInput& in, StepOutput& out) {
  const size_t rows = in.batch.logits_rows.size();
  ranks_.run([&](ParallelRanks::Rank& r) {
    if (r.index == 0) return rank0_->execute(in, out);  // copies, forward, sampling
    if (!in.copies.empty()) copy_kv_blocks(*r.kv, in.copies);
    // The same forward (its collectives meet rank 0's); the logits are rank 0's to sample, so
    // only their argmax comes back here.
    Scratch& s = scratch_[r.index];
    s.logits.resize(rows * static_cast<size_t>(r.model->config().n_vocab));
    s.argmax_only.assign(rows, 1);
    s.argmax.assign(rows, -1);
    r.runner->forward(in.batch, s.logits.data(), {s.argmax_only.data(), s.argmax.data()});
  });
}

void TensorParallelExecutor::swap(std::span<const BlockSwap> swaps, bool out) {
  if (swaps.empty()) return;
  ranks_.run([&](ParallelRanks::Rank& r) {
    if (r.index == 0) return out ? rank0_->swap_out(swaps) : rank0_->swap_in(swaps);
    TESSERA_CHECK(r.host != nullptr, "executor: swap without a host KV tier");
    if (out)
      swap_out_kv_blocks(*r.kv, *r.host, swaps);
    else
      swap_in_kv_blocks(*r.kv, *r.host, swaps);
  });
}

std::string TensorParallelExecutor::kv_transfer_refusal() const {
  return "KV transfer between engines is not supported with tensor parallelism (--tensor-parallel-size " +
         std::to_string(ranks_.size()) + ")";
}

}  // namespace tessera
