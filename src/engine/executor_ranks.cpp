#include "engine/executor_ranks.h"

#include "core/error.h"
#include "kv/kv_host_ops.h"

namespace tessera {

ParallelExecutor::ParallelExecutor(ParallelRanks& ranks, int sampling_rank, int max_batch_tokens, int max_logits_rows,
                                   int n_host_blocks)
    : ranks_(ranks), sampling_rank_(sampling_rank), scratch_(ranks.size()) {
  ranks_.run([&](ParallelRanks::Rank& r) {
    TESSERA_CHECK(r.kv != nullptr, "parallel executor: rank ", r.index, " has no KV cache");
    if (r.index == sampling_rank_) {
      // No graphs with collectives or send/recv, so no padding block (-1).
      sampler_ = std::make_unique<ModelExecutor>(*r.model, *r.kv, *r.backend, max_batch_tokens, max_logits_rows,
                                                 n_host_blocks);
      return;
    }
    r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.backend);
    if (n_host_blocks > 0) r.host = std::make_unique<HostKvTier>(r.kv->spec(), n_host_blocks, *r.backend);
  });
}

ParallelExecutor::~ParallelExecutor() {
  try {
    ranks_.run([&](ParallelRanks::Rank& r) {
      if (r.index == sampling_rank_) sampler_.reset();
      r.runner.reset();
      r.host.reset();
    });
  } catch (...) {  // destruction does not throw; what is left goes with the ranks
  }
}

void ParallelExecutor::swap(std::span<const BlockSwap> swaps, bool out) {
  if (swaps.empty()) return;
  ranks_.run([&](ParallelRanks::Rank& r) {
    if (r.index == sampling_rank_) return out ? sampler_->swap_out(swaps) : sampler_->swap_in(swaps);
    TESSERA_CHECK(r.host != nullptr, "executor: swap without a host KV tier");
    if (out)
      swap_out_kv_blocks(*r.kv, *r.host, swaps);
    else
      swap_in_kv_blocks(*r.kv, *r.host, swaps);
  });
}

std::string ParallelExecutor::kv_transfer_refusal() const {
  return std::string("KV transfer between engines is not supported with ") + ranks_.layout().kind() + " parallelism (" +
         ranks_.layout().flag() + ")";
}

}  // namespace tessera
