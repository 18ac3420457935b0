#include "engine/parallel_ranks.h"

#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "parallel/local_comm.h"
#include "parallel/nccl/nccl_comm.h"

namespace tessera {

std::string ParallelLayout::flag() const {
  const std::string t = "--tensor-parallel-size " + std::to_string(tensor);
  const std::string p = "--pipeline-parallel-size " + std::to_string(pipeline);
  return !pipelined() ? t : tensor == 1 ? p : t + " " + p;
}

std::string ParallelLayout::kind() const {
  return !pipelined() ? "tensor" : tensor == 1 ? "pipeline" : "tensor and pipeline";
}

std::string ParallelLayout::rank_name(int r) const {
  const std::string t = "tensor parallel rank " + std::to_string(tensor_rank_of(r));
  const std::string s = "pipeline stage " + std::to_string(stage_of(r));
  return !pipelined() ? t : tensor == 1 ? s : s + ", " + t;
}

ParallelRanks::ParallelRanks(std::shared_ptr<const ModelWeights> whole, const BackendOptions& backend,
                             ParallelLayout layout, int max_batch_tokens, int max_logits)
    : layout_(layout) {
  TESSERA_CHECK(whole != nullptr, "parallel ranks: no weights");
  TESSERA_CHECK(layout.tensor >= 1, "--tensor-parallel-size ", layout.tensor, " must be at least 1");
  TESSERA_CHECK(layout.pipeline >= 1, "--pipeline-parallel-size ", layout.pipeline, " must be at least 1");
  const int size = layout.size();
  const std::string flag = layout.flag();
  try {
    if (layout.pipeline > 1) pipeline_ = plan_pipeline(whole->config, layout.pipeline);
    if (layout.tensor > 1) plan_ = plan_tensor_parallel(whole->config, layout.tensor);
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
    // Stage s's tensor ranks are s*T .. s*T + T-1; tensor rank t's stages are t, t + T, ...
    const int T = layout.tensor, P = layout.pipeline;
    const auto members = [&](bool tensor_group, int g) {
      std::vector<Backend*> b;
      for (int i = 0; i < (tensor_group ? T : P); ++i)
        b.push_back(ranks_[tensor_group ? g * T + i : i * T + g]->backend.get());
      return b;
    };
    if (cuda) {
      if (T > 1) device_tensor_.resize(size);
      if (P > 1) device_pipeline_.resize(size);
      for (int s = 0; T > 1 && s < P; ++s) {
        auto group = make_nccl_group(members(true, s));
        for (int i = 0; i < T; ++i) device_tensor_[s * T + i] = std::move(group[i]);
      }
      for (int t = 0; P > 1 && t < T; ++t) {
        auto group = make_nccl_group(members(false, t));
        for (int i = 0; i < P; ++i) device_pipeline_[i * T + t] = std::move(group[i]);
      }
      comm_kind_ = "NCCL";
    } else {
      for (int s = 0; T > 1 && s < P; ++s) tensor_groups_.push_back(std::make_unique<LocalGroup>(T));
      for (int t = 0; P > 1 && t < T; ++t) pipeline_groups_.push_back(std::make_unique<LocalGroup>(P));
      comm_kind_ = "in-process group";
    }
    run([&](Rank& rk) {
      const int s = layout.stage_of(rk.index), t = layout.tensor_rank_of(rk.index);
      std::shared_ptr<const ModelWeights> w = whole;
      if (P > 1) w = stage_weights(w, pipeline_, s);
      if (T > 1) w = shard_weights(w, t, T);
      rk.weights = std::move(w);
      ModelComms comms;
      if (T > 1) comms.tensor = cuda ? device_tensor_[rk.index].get() : &tensor_groups_[s]->rank(t);
      if (P > 1) comms.pipeline = cuda ? device_pipeline_[rk.index].get() : &pipeline_groups_[t]->rank(s);
      // A pipeline stage before the last computes no logits: one row's buffer is enough.
      rk.model = create_model(rk.weights, *rk.backend, max_batch_tokens,
                              layout.computes_logits(rk.index) ? max_logits : 1, comms);
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
  device_tensor_.clear();
  device_pipeline_.clear();
  for (auto& rk : ranks_) rk->backend.reset();
}

KvCacheSpec ParallelRanks::rank_kv_spec(const KvCacheSpec& whole, int r) const {
  TESSERA_CHECK(r >= 0 && r < size(), "parallel ranks: rank ", r, " of ", size());
  const int s = layout_.stage_of(r), t = layout_.tensor_rank_of(r);
  const KvCacheSpec stage = layout_.pipelined() ? whole.layers(pipeline_.first_layer[s], pipeline_.n_layers(s)) : whole;
  return layout_.tensor > 1 ? stage.kv_heads(plan_.kv_head_first(t, whole.n_kv_heads), plan_.n_head_kv) : stage;
}

int64_t ParallelRanks::block_bytes(const KvCacheSpec& whole) const {
  int64_t bytes = 0;
  for (int r = 0; r < size(); ++r) bytes += kv_block_bytes(rank_kv_spec(whole, r));
  return bytes;
}

std::string ParallelRanks::describe() const {
  const std::string each = ", each " + ranks_[0]->backend->describe();
  if (!layout_.pipelined()) return std::to_string(size()) + " tensor-parallel ranks (" + comm_kind_ + ")" + each;
  const std::string stages =
      std::to_string(layout_.pipeline) + " pipeline stages (" + pipeline_.describe() + "; " + comm_kind_ + ")";
  if (layout_.tensor == 1) return stages + each;
  return stages + " of " + std::to_string(layout_.tensor) + " tensor-parallel ranks" + each;
}

void ParallelRanks::abort_group(const std::string& why) {
  for (auto& g : tensor_groups_) g->abort(why);
  for (auto& g : pipeline_groups_) g->abort(why);
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
  // Every rank has left its collectives.
  for (auto& g : tensor_groups_) g->reset();
  for (auto& g : pipeline_groups_) g->reset();
  // NCCL cannot drop what a failed step left queued: pipeline stages may fail apart (only the
  // last one samples), leaving sends no receive will match, which the next step's receives
  // would take. The group is then refused rather than fed stale activations.
  if (!device_pipeline_.empty()) broken_ = first_error_;  // NCCL pipeline groups
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
      error = layout_.rank_name(r) + ": " + e.what();
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
