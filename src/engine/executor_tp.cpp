#include "engine/executor_tp.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kv/kv_host_ops.h"

namespace tessera {

void TensorParallelExecutor::execute(const StepInput& in, StepOutput& out) {
  const size_t rows = in.batch.logits_rows.size();
  ranks_.run([&](ParallelRanks::Rank& r) {
    if (r.index == 0) return sampler_->execute(in, out);  // copies, forward, sampling
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

}  // namespace tessera
