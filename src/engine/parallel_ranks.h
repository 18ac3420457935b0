#pragma once
// The ranks of an in-process parallel group (docs/design/parallel.md, "Engine"): N workers,
// each a thread that owns one rank's backend, weights, model and KV cache, joined by
// communicators: the in-process LocalGroup on the CPU (each rank a CpuBackend with its share of
// the threads), NCCL on CUDA (rank r on device cuda:r). Tensor parallelism: each rank a
// shard of every layer (its heads, its KV heads). Pipeline parallelism: each stage a range
// of whole layers (and the KV of those layers); both: each stage's layers sharded over its
// tensor ranks (ParallelLayout). Everything of rank r runs on rank r's
// thread; run() hands the same work to every rank and waits for all of them, as each step of
// the engine does.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/function_ref.h"
#include "engine/model_runner.h"
#include "kv/kv_cache.h"
#include "kv/kv_host_ops.h"
#include "model/model.h"
#include "model/pp/stage.h"
#include "model/tp/shard.h"
#include "parallel/communicator.h"

namespace tessera {

class LocalGroup;

// How the model is split: `pipeline` stages of consecutive layers, each stage `tensor` ranks
// sharding every one of its layers (Megatron's layout). Rank r is tensor rank r % tensor of
// stage r / tensor; tensor ranks of a stage meet in its collectives, and tensor rank t of
// stage s sends its residual stream to tensor rank t of stage s + 1.
struct ParallelLayout {
  int tensor = 1;
  int pipeline = 1;
  int size() const { return tensor * pipeline; }
  bool pipelined() const { return pipeline > 1; }
  int stage_of(int r) const { return r / tensor; }
  int tensor_rank_of(int r) const { return r % tensor; }
  // The ranks that compute logits (the last stage's: with tensor parallelism, each its
  // vocabulary slice, all-gathered), and the one of them that samples.
  bool computes_logits(int r) const { return stage_of(r) == pipeline - 1; }
  int sampling_rank() const { return (pipeline - 1) * tensor; }
  // "--tensor-parallel-size 2", "--pipeline-parallel-size 2", or both.
  std::string flag() const;
  // "tensor", "pipeline" or "tensor and pipeline" (parallelism).
  std::string kind() const;
  // Rank r as an error names it: "tensor parallel rank 1", "pipeline stage 0", or both.
  std::string rank_name(int r) const;
};

class ParallelRanks {
 public:
  struct Rank {
    int index = 0;
    std::unique_ptr<Backend> backend;
    std::shared_ptr<const ModelWeights> weights;  // this rank's shard or stage
    std::unique_ptr<Model> model;
    std::unique_ptr<KvCache> kv;          // its KV heads or layers; made by the engine once sized
    std::unique_ptr<ModelRunner> runner;  // the ranks whose forward is not their executor's
    std::unique_ptr<HostKvTier> host;     // those ranks: their part of the host swap slots
  };

  // Builds layout.size() ranks of `whole`: checks the split (plan_tensor_parallel: heads, KV
  // heads, FFN width, vocabulary, architecture; plan_pipeline: layers, architecture) and the
  // device (cpu, or cuda = cuda:0..size-1; cuda:N with N > 0 and CUDA graphs are refused),
  // then makes each rank's backend, weights and model for max_batch_tokens tokens and
  // max_logits rows per forward on its thread. CPU threads (backend.threads, 0 = all cores)
  // are split evenly, at least one a rank.
  ParallelRanks(std::shared_ptr<const ModelWeights> whole, const BackendOptions& backend, ParallelLayout layout,
                int max_batch_tokens, int max_logits);
  ~ParallelRanks();
  ParallelRanks(const ParallelRanks&) = delete;
  ParallelRanks& operator=(const ParallelRanks&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  const ParallelLayout& layout() const { return layout_; }
  const TensorParallelPlan& plan() const { return plan_; }
  const PipelinePlan& pipeline() const { return pipeline_; }
  Rank& rank(int r) { return *ranks_[r]; }
  // Rank r's part of a cache `whole` describes for the whole model: its KV heads (or the one
  // it shares when ranks outnumber KV heads), with their static scales and key means; or a
  // stage's layers with theirs.
  KvCacheSpec rank_kv_spec(const KvCacheSpec& whole, int r) const;
  // The rank whose cache is the largest (its block bytes set how many blocks a budget per
  // rank holds): 0 (shards are equal; the first stages take the extra layers).
  static constexpr int kLargestRank = 0;
  // Bytes of one block id over every rank's cache.
  int64_t block_bytes(const KvCacheSpec& whole) const;
  // "2 tensor-parallel ranks (in-process group), each cpu (1 threads, ...)".
  std::string describe() const;

  // Runs fn(rank) on every rank's thread at once and returns when all have. When a rank
  // throws, the group is aborted (ranks waiting in a collective for it give up), made usable
  // again once every rank has returned, and the first failure is rethrown naming its rank.
  // Pipeline stages over NCCL are not made usable again (messages of the failed step may be
  // left queued): later calls throw. Called from one thread at a time (the engine's).
  void run(FunctionRef<void(Rank&)> fn);

 private:
  void worker(int r);
  void abort_group(const std::string& why);

  ParallelLayout layout_;
  TensorParallelPlan plan_;  // tensor parallelism
  PipelinePlan pipeline_;    // pipeline parallelism
  std::vector<std::unique_ptr<Rank>> ranks_;
  // The CPU's groups: each stage's tensor ranks (tensor_groups_[s], of layout.tensor ranks) and
  // each tensor rank's stages (pipeline_groups_[t], of layout.pipeline); a group of one rank
  // is not made.
  std::vector<std::unique_ptr<LocalGroup>> tensor_groups_, pipeline_groups_;
  // NCCL, the same groups: rank r's communicator in its stage's and in its pipeline's (empty
  // off CUDA, and where that kind of group has one rank).
  std::vector<std::unique_ptr<Communicator>> device_tensor_, device_pipeline_;
  std::string comm_kind_;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const FunctionRef<void(Rank&)>* job_ = nullptr;
  uint64_t job_generation_ = 0;
  int n_done_ = 0;
  std::string first_error_;  // of the current job, the first rank to fail
  std::string broken_;       // why run() refuses: a failed step of NCCL pipeline stages
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera
