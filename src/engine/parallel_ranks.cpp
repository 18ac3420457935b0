#include "engine/parallel_ranks.h"

#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "parallel/local_comm.h"
#include "parallel/nccl/nccl_comm.h"

namespace tessera {

std::string ParallelLayout::flag() const {
  return pipelined() ? "--pipeline-parallel-size " + std::to_string(pipeline)
                     : "--tensor-parallel-size " + std::to_string(tensor);
}

ParallelRanks::ParallelRanks(std::shared_ptr<const ModelWeights> whole, const BackendOptions& backend,
                             ParallelLayout layout, int max_batch_tokens, int max_logits)
    : layout_(layout) {
  TESSERA_CHECK(whole != nullptr, "parallel ranks: no weights");
  TESSERA_CHECK(layout.tensor >= 1, "--tensor-parallel-size ", layout.tensor, " must be at least 1");
  TESSERA_CHECK(layout.pipeline >= 1, "--pipeline-parallel-size ", layout.pipeline, " must be at least 1");
  TESSERA_CHECK(layout.tensor == 1 || layout.pipeline == 1, "--tensor-parallel-size ", layout.tensor,
                " with --pipeline-parallel-size ", layout.pipeline,
                ": tensor and pipeline parallelism together are "
                "not built");
  const int size = layout.size();
  const std::string flag = layout.flag();
  try {
    if (layout.pipelined())
      pipeline_ = plan_pipeline(whole->config, size);
    else
      plan_ = plan_tensor_parallel(whole->config, size);
  } catch (const Error& e) {
    fail(flag, " with ", whole->source, ": ", e.what());
  }
  const bool cuda = backend.device.rfind("cuda", 0) == 0;
  TESSERA_CHECK(cuda || backend.device == "cpu", "parallel ranks: unknown device '", backend.device, "'");
  TESSERA_CHECK(!cuda || backend.device == "cuda" || size == 1, "--device ", backend.device, " with ", flag,
                ": rank r runs on cuda:r; pass --device cuda");
  // The collectives are not captured in graphs (docs/design/parallel.md, "Not built").
  TESSERA_CHECK(!cuda || !backend.cuda_graphs || size == 1, flag, " on CUDA runs without graphs: add --no-cuda-graphs");
  for (int r = 0; r < size; ++r) {
    ranks_.push_back(std::make_unique<Rank>());
    ranks_.back()->index = r;
  }
  for (int r = 0; r < size; ++r) threads_.emplace_back([this, r] { worker(r); });
  try {
    const int total = backend.threads > 0 ? backend.threads : ThreadPool::default_threads();
    run([&](Rank& rk) {
      BackendOptions o = backend;
      if (cuda) {
        o.device = "cuda:" + std::to_string(rk.index);
      } else {
        o.threads = std::max(1, total / size);
      }
      try {
        rk.backend = make_backend(o);
      } catch (const Error& e) {
        fail(flag, ": rank ", rk.index, " on ", o.device, ": ", e.what());
      }
    });
    if (cuda) {
      std::vector<Backend*> backends;
      for (auto& rk : ranks_) backends.push_back(rk->backend.get());
      devices_ = make_nccl_group(backends);
      comm_kind_ = "NCCL";
    } else {
      local_ = std::make_unique<LocalGroup>(size);
      comm_kind_ = "in-process group";
    }
    run([&](Rank& rk) {
      rk.weights =
          layout.pipelined() ? stage_weights(whole, pipeline_, rk.index) : shard_weights(whole, rk.index, size);
      Communicator* comm = size == 1 ? nullptr : cuda ? devices_[rk.index].get() : &local_->rank(rk.index);
      // A pipeline stage before the last computes no logits: one row's buffer is enough.
      const bool no_logits = layout.pipelined() && rk.index + 1 < size;
      rk.model = create_model(rk.weights, *rk.backend, max_batch_tokens, no_logits ? 1 : max_logits, comm);
    });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ParallelRanks::~ParallelRanks() {
  // Each rank's objects are freed on its own thread (a device backend's context is its).
  try {
    run([](Rank& rk) {
      rk.host.reset();
      rk.runner.reset();
      rk.kv.reset();
      rk.model.reset();
      rk.weights.reset();
    });
  } catch (...) {  // destruction does not throw; the rest is freed below
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
  devices_.clear();
  for (auto& rk : ranks_) rk->backend.reset();
}

KvCacheSpec ParallelRanks::rank_kv_spec(const KvCacheSpec& whole, int r) const {
  TESSERA_CHECK(r >= 0 && r < size(), "parallel ranks: rank ", r, " of ", size());
  if (layout_.pipelined()) return whole.layers(pipeline_.first_layer[r], pipeline_.n_layers(r));
  return whole.kv_heads(plan_.kv_head_first(r, whole.n_kv_heads), plan_.n_head_kv);
}

int64_t ParallelRanks::block_bytes(const KvCacheSpec& whole) const {
  int64_t bytes = 0;
  for (int r = 0; r < size(); ++r) bytes += kv_block_bytes(rank_kv_spec(whole, r));
  return bytes;
}

std::string ParallelRanks::describe() const {
  const std::string each = ", each " + ranks_[0]->backend->describe();
  if (layout_.pipelined())
    return std::to_string(size()) + " pipeline stages (" + pipeline_.describe() + "; " + comm_kind_ + ")" + each;
  return std::to_string(size()) + " tensor-parallel ranks (" + comm_kind_ + ")" + each;
}

void ParallelRanks::abort_group(const std::string& why) {
  if (local_) local_->abort(why);
  // NCCL has no abort here: a rank that fails before a collective leaves the others waiting in
  // it (docs/design/parallel.md). Every rank checks the same batch first, so they fail together.
}

void ParallelRanks::run(FunctionRef<void(Rank&)> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  TESSERA_CHECK(broken_.empty(), "parallel ranks: unusable after a failed step (", broken_, ")");
  job_ = &fn;
  n_done_ = 0;
  first_error_.clear();
  ++job_generation_;
  work_cv_.notify_all();
  done_cv_.wait(lock, [&] { return n_done_ == size(); });
  job_ = nullptr;
  if (first_error_.empty()) return;
  if (local_) local_->reset();  // every rank has left its collectives
  // NCCL cannot drop what a failed step left queued: pipeline stages may fail apart (only the
  // last one samples), leaving sends no receive will match, which the next step's receives
  // would take. The group is then refused rather than fed stale activations.
  if (!local_ && layout_.pipelined()) broken_ = first_error_;
  const std::string why = first_error_;
  lock.unlock();
  fail(why);
}

void ParallelRanks::worker(int r) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    work_cv_.wait(lock, [&] { return stop_ || job_generation_ != seen; });
    if (stop_) return;
    seen = job_generation_;
    const FunctionRef<void(Rank&)>* job = job_;
    lock.unlock();
    std::string error;
    try {
      (*job)(*ranks_[r]);
    } catch (const std::exception& e) {
      error = std::string(layout_.pipelined() ? "pipeline stage " : "tensor parallel rank ") + std::to_string(r) +
              ": " + e.what();
    }
    lock.lock();
    if (!error.empty() && first_error_.empty()) {
      first_error_ = error;
      abort_group(error);  // under mu_: LocalGroup::abort takes only its own lock
    }
    if (++n_done_ == size()) done_cv_.notify_all();
  }
}

}  // namespace tessera
