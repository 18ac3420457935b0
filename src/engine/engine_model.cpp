#include "engine/engine_model.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "engine/executor_pp.h"
#include "engine/executor_tp.h"
#include "engine/kv_scales.h"
#include "engine/model_drafter.h"
#include "kv/kv_host_ops.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

ModelEngine::ModelEngine(ModelEngineOptions o) {
  SchedulerConfig& sc = o.scheduler;
  // The session's own KV (one block) is unused: the engine's cache is sized below, after
  // the weights and the runner's activations (sized for a full step) exist.
  o.session.ctx = o.session.block_size;
  o.session.max_batch_tokens = sc.max_num_batched_tokens;
  TESSERA_CHECK(o.prompt_logprob_rows >= 0, "prompt logprob rows ", o.prompt_logprob_rows, " is negative");
  o.speculative.validate();
  // Each speculating sequence verifies up to k draft tokens (a tree: its nodes), a logits row each; only
  // sequences up to the off switch's batch size speculate.
  const int spec_seqs = o.speculative.disable_by_batch_size > 0
                            ? std::min(o.speculative.disable_by_batch_size, sc.max_num_seqs)
                            : sc.max_num_seqs;
  const int spec_rows = o.speculative.enabled() ? spec_seqs * o.speculative.max_draft_nodes() : 0;
  if (sc.max_logits_rows <= 0)
    sc.max_logits_rows = std::min(sc.max_num_seqs + o.prompt_logprob_rows + spec_rows,
                                  std::max(sc.max_num_batched_tokens, sc.max_num_seqs));
  o.session.max_logits = sc.max_logits_rows;
  const ParallelLayout layout{.tensor = o.tensor_parallel_size, .pipeline = o.pipeline_parallel_size};
  TESSERA_CHECK(layout.tensor >= 1, "--tensor-parallel-size ", layout.tensor, " must be at least 1");
  TESSERA_CHECK(layout.pipeline >= 1, "--pipeline-parallel-size ", layout.pipeline, " must be at least 1");
  const int n_ranks = layout.size();
  // The engine's ranks are its own (the executor drives them); a session with ranks of its
  // own would be a second group.
  TESSERA_CHECK(o.session.tensor_parallel_size == 1 && o.session.pipeline_parallel_size == 1,
                "engine: parallel ranks are ModelEngineOptions::", "tensor/pipeline_parallel_size, not the session's (",
                o.session.tensor_parallel_size, ", ", o.session.pipeline_parallel_size, ")");
  if (n_ranks > 1) {
    TESSERA_CHECK(!o.speculative.enabled() || !o.speculative.uses_model(),
                  "--speculative-config: ", describe_speculative_config(o.speculative),
                  " drafts with a model, which is not supported with ", layout.kind(), " parallelism (", layout.flag(),
                  "); the ngram method is");
    o.session.weights_only = true;  // the ranks run shards or stages of the weights on backends of their own
  }
  session_ = std::make_unique<Session>(o.session);
  const ModelConfig& mc = session_->config();
  if (n_ranks > 1)
    ranks_ = std::make_unique<ParallelRanks>(session_->shared_weights(), o.session.backend, layout,
                                             sc.max_num_batched_tokens,
                                             std::min(sc.max_logits_rows, sc.max_num_batched_tokens));
  if (sc.max_model_len <= 0) sc.max_model_len = mc.n_ctx_train;
  TESSERA_CHECK(sc.max_model_len >= 2, "--max-model-len ", sc.max_model_len, " must be at least 2");
  // Positions past the trained context are out of the model's distribution (vLLM refuses too).
  TESSERA_CHECK(sc.max_model_len <= mc.n_ctx_train, "--max-model-len ", sc.max_model_len,
                " is over the model's trained context of ", mc.n_ctx_train, " tokens");
  if (session_->has_tokenizer()) {
    const Tokenizer* tok = &session_->tokenizer();
    sc.is_eog = [tok](int32_t t) { return tok->is_eog(t); };
  }

  KvCacheSpec spec;
  spec.n_layers = mc.n_layer;
  spec.n_kv_heads = mc.n_head_kv;
  spec.head_dim = mc.head_dim;
  spec.block_size = o.session.block_size;
  spec.k_format = o.session.k_format;
  spec.v_format = o.session.v_format;
  spec.k_scales = o.session.k_scales;
  spec.v_scales = o.session.v_scales;
  spec.k_mean = o.session.k_mean;
  spec.k_equal = o.session.k_equal;
  spec.k_rope_dim = o.session.k_rope_dim;
  spec.k_rope_neox = o.session.k_rope_neox;
  spec.k_rope_freq = o.session.k_rope_freq;
  spec.k_first = o.session.k_first;
  apply_checkpoint_kv_scales(session_->weights(), spec);
  const bool local_group = o.hybrid_kv_cache && mc.sliding_window > 0;
  if (local_group) {
    spec.local_layers.resize(mc.n_layer);
    for (int il = 0; il < mc.n_layer; ++il) spec.local_layers[il] = mc.is_local_layer(il) ? 1 : 0;
    // Sized below; until then (warm-up) as many blocks as the full pool.
    spec.n_local_blocks = 1;
  }
  Backend& backend = this->backend();
  // The largest step the engine will run, once, so a budget that cannot hold its
  // activations fails here and not under load. Its KV lands in the first blocks of `kv`.
  // logits: false on a pipeline stage before the last (it computes none).
  const auto warm_up_one = [&](Model& model, KvCache& kv, Backend& be, bool with_logits) {
    const int n = std::min({sc.max_num_batched_tokens, sc.max_model_len - 1, kv.spec().n_blocks * spec.block_size});
    SequenceBlocks seq;
    seq.blocks.resize((n + spec.block_size - 1) / spec.block_size);
    std::iota(seq.blocks.begin(), seq.blocks.end(), 0);
    std::vector<int32_t> tokens(n, 0);
    ForwardBatch batch;
    // The local pool holds at least one step (kv_local_blocks_for): the same block ids.
    batch.add_sequence(seq, spec.block_size, tokens.data(), n,
                       with_logits ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None,
                       kv.spec().n_local_blocks > 0 ? &seq : nullptr);
    std::vector<float> logits(mc.n_vocab);
    ModelRunner(model, kv, be).forward(batch, logits.data());
  };
  // With parallel ranks every rank runs it (the collectives and stages need them all), each
  // over its part of a cache that `whole_kv` describes: the ranks' own caches, or ones made here.
  const auto warm_up = [&](const KvCacheSpec& whole_kv, bool own_kv) {
    if (!ranks_) {
      if (own_kv) return warm_up_one(session_->model(), *kv_, backend, true);
      KvCache kv(backend, whole_kv);
      return warm_up_one(session_->model(), kv, backend, true);
    }
    ranks_->run([&](ParallelRanks::Rank& r) {
      const bool logits = ranks_->layout().computes_logits(r.index);
      if (own_kv) return warm_up_one(*r.model, *r.kv, *r.backend, logits);
      KvCache kv(*r.backend, ranks_->rank_kv_spec(whole_kv, r.index));
      warm_up_one(*r.model, kv, *r.backend, logits);
    });
  };
  // A rank's cache stores its KV heads or layers only: the block count for a budget is the
  // largest rank's.
  const auto rank_spec = [&](const KvCacheSpec& whole) {
    return ranks_ ? ranks_->rank_kv_spec(whole, ParallelRanks::kLargestRank) : whole;
  };
  // A device backend sizes its KV pool from the device memory left after a warm-up forward
  // (weights, activations and the GEMM's scratch are resident by then).
  const bool on_device = backend.device_free_bytes() > 0;
  bool warmed_up = false;
  int64_t budget = o.kv_cache_bytes;
  if (budget <= 0 && on_device) {
    TESSERA_CHECK(o.device_kv_fraction > 0 && o.device_kv_fraction <= 0.98, "device KV fraction ", o.device_kv_fraction,
                  " is outside (0, 0.98]");
    if (o.warmup) {
      KvCacheSpec tmp = spec;
      tmp.n_blocks = (std::max(1, std::min(sc.max_num_batched_tokens, sc.max_model_len - 1)) + spec.block_size - 1) /
                     spec.block_size;
      if (local_group) tmp.n_local_blocks = tmp.n_blocks;
      warm_up(tmp, false);
      warmed_up = true;
    }
    // Every rank's device holds the same shapes: the fullest one sets the budget. Each rank
    // asks on its own thread (a CUDA backend answers for the thread's current device).
    size_t free_min = 0;
    if (ranks_) {
      std::vector<size_t> free_of(ranks_->size());
      ranks_->run([&](ParallelRanks::Rank& r) { free_of[r.index] = r.backend->device_free_bytes(); });
      free_min = *std::min_element(free_of.begin(), free_of.end());
    } else {
      free_min = backend.device_free_bytes();
    }
    const auto free_bytes = static_cast<double>(free_min);
    budget = static_cast<int64_t>(o.device_kv_fraction * free_bytes) - o.device_reserve_bytes;
    TESSERA_CHECK(budget > 0, "KV sizing: ", static_cast<int64_t>(free_bytes),
                  " bytes of device memory are free after ", "the warm-up, less than the ", o.device_reserve_bytes,
                  " bytes kept in reserve");
  } else if (budget <= 0) {
    TESSERA_CHECK(o.kv_memory_fraction > 0 && o.kv_memory_fraction <= 0.95, "KV memory fraction ", o.kv_memory_fraction,
                  " is outside (0, 0.95]");
    // The ranks of a CPU group share the host's memory.
    budget = static_cast<int64_t>(o.kv_memory_fraction * static_cast<double>(host_available_memory_bytes())) / n_ranks;
  }
  // More than every sequence at full length is waste.
  const int64_t useful =
      static_cast<int64_t>(sc.max_num_seqs) * ((sc.max_model_len + spec.block_size - 1) / spec.block_size);
  const int64_t cap = std::min<int64_t>(std::max<int64_t>(useful, 1), o.max_kv_blocks > 0 ? o.max_kv_blocks : useful);
  if (local_group) {
    const KvPoolSizes sizes = kv_pools_for_budget(rank_spec(spec), budget, mc.sliding_window, sc.max_num_seqs,
                                                  sc.max_num_batched_tokens, cap);
    spec.n_blocks = sizes.n_blocks;
    spec.n_local_blocks = sizes.n_local_blocks;
  } else {
    spec.n_blocks = static_cast<int>(std::min<int64_t>(kv_blocks_for_budget(rank_spec(spec), budget), cap));
  }
  // One sequence of max_model_len tokens must fit (vLLM refuses to start otherwise): never
  // clamp the context silently. Its last sampled token is not stored, hence - 1.
  const int64_t kv_tokens = static_cast<int64_t>(spec.n_blocks) * spec.block_size;
  if (kv_tokens < sc.max_model_len - 1) {
    const bool fixed_budget = o.kv_cache_bytes > 0;
    fail("the KV cache holds ", kv_tokens, " tokens (", spec.n_blocks, " blocks of ", spec.block_size, ", ",
         kv_block_bytes(rank_spec(spec)), " bytes each, from a budget of ", budget, " bytes",
         n_ranks > 1 ? " per rank" : "", "), fewer than one sequence of ", "--max-model-len ", sc.max_model_len,
         " tokens: lower --max-model-len to at most ", kv_tokens + 1,
         fixed_budget ? ", or raise --kv-cache-memory" : ", or give the KV cache more memory (--kv-cache-memory)",
         o.max_kv_blocks > 0 ? " (the pool is capped at max_kv_blocks)" : "");
  }
  config_.block_size = spec.block_size;
  config_.n_blocks = spec.n_blocks;
  if (local_group) {
    config_.window = mc.sliding_window;
    config_.n_local_blocks = spec.n_local_blocks;
  }
  // A block id costs every rank its heads' or layers' bytes; the swap space, like the KV
  // budget, is a rank's (the largest rank's block bytes set the host slots).
  const int64_t rank_block_bytes = kv_block_bytes(rank_spec(spec));
  config_.kv_block_bytes = ranks_ ? ranks_->block_bytes(spec) : rank_block_bytes;
  TESSERA_CHECK(o.swap_space_bytes >= 0, "swap space of ", o.swap_space_bytes, " bytes is negative");
  config_.n_host_blocks = static_cast<int>(std::min<int64_t>(o.swap_space_bytes / rank_block_bytes, 1 << 30));
  if (sc.preemption_mode == PreemptionMode::Swap)
    TESSERA_CHECK(config_.n_host_blocks > 0, "swap preemption needs swap space for at least one KV block of ",
                  rank_block_bytes, " bytes (got ", o.swap_space_bytes, ")");
  // On a backend that records graphs the pool has one block more than the engine hands out:
  // the padding sequences of decode steps the runner pads to a graph size write there.
  int pad_block = -1, pad_local_block = -1;
  KvCacheSpec pool = spec;
  if (backend.supports_graphs()) {
    pad_block = spec.n_blocks;
    pool.n_blocks = spec.n_blocks + 1;
    if (local_group) {
      pad_local_block = spec.n_local_blocks;
      pool.n_local_blocks = spec.n_local_blocks + 1;
    }
  }
  if (ranks_) {
    ranks_->run([&](ParallelRanks::Rank& r) {
      r.kv = std::make_unique<KvCache>(*r.backend, ranks_->rank_kv_spec(pool, r.index));
    });
    if (layout.pipelined())
      executor_ = std::make_unique<PipelineParallelExecutor>(*ranks_, sc.max_num_batched_tokens, sc.max_logits_rows,
                                                             config_.n_host_blocks);
    else
      executor_ = std::make_unique<TensorParallelExecutor>(*ranks_, sc.max_num_batched_tokens, sc.max_logits_rows,
                                                           config_.n_host_blocks);
  } else {
    kv_ = std::make_unique<KvCache>(backend, pool);
    executor_ = std::make_unique<ModelExecutor>(session_->model(), *kv_, backend, sc.max_num_batched_tokens,
                                                sc.max_logits_rows, config_.n_host_blocks, pad_block, pad_local_block);
  }
  config_.scheduler = sc;
  config_.prefix_caching = o.prefix_caching;
  std::ostringstream fp;
  fp << session_->weights().source << '|' << mc.n_vocab << '|' << mc.n_layer << '|' << session_->weights().weight_bytes
     << '|' << spec.format_name() << '|' << std::hex << spec.constants_digest();
  config_.model_fingerprint = fp.str();
  config_.vocab_size = mc.n_vocab;
  config_.admission = o.admission;
  config_.max_n = o.max_n;
  config_.speculative = o.speculative;
  if (o.speculative.enabled() && o.speculative.uses_model()) {
    // A draft model's own paged KV: as many blocks as the target's, plus each speculating
    // sequence's draft positions. Early exit runs over this engine's cache instead, writing
    // blocks the engine lends it per step. A drafter short of blocks drafts nothing for a sequence.
    const int k_blocks = (o.speculative.num_speculative_tokens + spec.block_size - 1) / spec.block_size + 1;
    config_.drafter = make_model_drafter(o.speculative, *session_,
                                         {.block_size = spec.block_size,
                                          .n_blocks = config_.n_blocks + spec_seqs * k_blocks,
                                          .max_batch_tokens = sc.max_num_batched_tokens,
                                          .max_seqs = spec_seqs},
                                         kv_.get());
  }

  if (o.warmup && !warmed_up) warm_up(pool, true);
}

std::vector<const KvCacheSpec*> ModelEngine::kv_specs() {
  if (!ranks_) return {&kv_->spec()};
  std::vector<const KvCacheSpec*> out;
  for (int r = 0; r < ranks_->size(); ++r) out.push_back(&ranks_->rank(r).kv->spec());
  return out;
}

ModelEngine::~ModelEngine() = default;

}  // namespace tessera
