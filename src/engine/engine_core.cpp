#include "engine/engine_core.h"

#include <sstream>

#include "core/error.h"

namespace tessera {

namespace {
template <typename... Parts>
Rejection invalid(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return Rejection{RejectReason::InvalidRequest, os.str()};
}
}  // namespace

EngineCore::EngineCore(const EngineConfig& config, Executor& executor)
    : config_(config),
      executor_(executor),
      kv_({.n_blocks = config.n_blocks, .block_size = config.block_size, .prefix_caching = config.prefix_caching}),
      scheduler_(config.scheduler, kv_) {
  TESSERA_CHECK(config.vocab_size >= 1, "engine: vocabulary size ", config.vocab_size);
  TESSERA_CHECK(config.max_n >= 1, "engine: max_n ", config.max_n, " must be at least 1");
  TESSERA_CHECK(config.scheduler.max_num_batched_tokens <= executor.max_batch_tokens(), "engine: max_num_batched_tokens ",
                config.scheduler.max_num_batched_tokens, " exceeds the executor's batch of ", executor.max_batch_tokens());
  TESSERA_CHECK(config.scheduler.max_num_seqs <= executor.max_logits_rows(), "engine: max_num_seqs ",
                config.scheduler.max_num_seqs, " exceeds the executor's ", executor.max_logits_rows(), " logits rows");
  TESSERA_CHECK(config.min_forward_rows >= 0 && config.min_forward_rows <= executor.max_batch_tokens(),
                "engine: min_forward_rows ", config.min_forward_rows, " is outside [0, ", executor.max_batch_tokens(), "]");
  for (int i = 0; i < config.n_pad_blocks(); ++i) pad_seq_.blocks.push_back(config.n_blocks + i);
  pad_tokens_.assign(config.min_forward_rows, 0);
}

EngineCore::~EngineCore() {
  // End what is left, so the executor's per-sequence state and the pool are clean.
  abort_all(FinishReason::Abort);
}

std::vector<SeqEvent> EngineCore::abort_all(FinishReason reason) {
  std::vector<SeqEvent> events;
  for (RequestId id : scheduler_.request_ids()) {
    auto more = abort(id, reason);
    events.insert(events.end(), more.begin(), more.end());
  }
  return events;
}

std::optional<Rejection> EngineCore::validate(const Request& r) const {
  if (!(r.n >= 1 && r.n <= config_.max_n)) return invalid("n = ", r.n, " is outside [1, ", config_.max_n, "]");
  if (r.prompt.empty()) return invalid("the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (!(r.prompt[i] >= 0 && r.prompt[i] < config_.vocab_size))
      return invalid("prompt token ", i, " is ", r.prompt[i], ", outside the vocabulary [0, ", config_.vocab_size, ")");
  try {
    r.sampling.validate(config_.vocab_size);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  const int64_t total = n_prompt + r.sampling.max_tokens;
  const int max_len = config_.scheduler.max_model_len;
  if (total > max_len)
    return invalid("prompt of ", n_prompt, " tokens + max_tokens ", r.sampling.max_tokens, " = ", total,
                   " exceeds the context of ", max_len, " tokens");
  // The last sampled token is never computed, so a choice holds at most total - 1 tokens.
  const int64_t blocks = (total - 1 + config_.block_size - 1) / config_.block_size;
  if (blocks > config_.n_blocks)
    return invalid("prompt of ", n_prompt, " tokens + max_tokens ", r.sampling.max_tokens, " needs ", blocks,
                   " KV blocks but the whole cache has ", config_.n_blocks, " (", config_.block_size, " tokens each)");
  return std::nullopt;
}

void EngineCore::add(RequestId id, const Request& r) {
  if (auto rejection = validate(r)) fail("request ", id, ": ", rejection->message);
  SchedRequest sr;
  sr.id = id;
  sr.prompt = r.prompt;
  sr.n = r.n;
  sr.priority = r.priority;
  sr.stop.max_tokens = r.sampling.max_tokens;
  sr.stop.stop_token_ids = r.sampling.stop_token_ids;
  sr.stop.ignore_eos = r.sampling.ignore_eos;
  sr.prefix_root = prefix_root_hash({config_.model_fingerprint, r.adapter_id, r.tenant_salt});
  const SeqId first = scheduler_.add(std::move(sr));
  for (int c = 0; c < r.n; ++c) {
    SamplingParams p = r.sampling;
    if (p.seed) p.seed = *p.seed + static_cast<uint64_t>(c);
    executor_.add_sequence(first + c, p, r.prompt);
  }
}

void EngineCore::forget_finished(const std::vector<SeqEvent>& events) {
  for (const SeqEvent& e : events) {
    if (e.token >= 0) ++counters_.generated_tokens;
    if (e.finish != FinishReason::None) executor_.remove_sequence(e.seq);
    if (e.request_done) {
      // A request counts by how its last choice ended (an abort or error ends all that are left).
      if (e.finish == FinishReason::Error)
        ++counters_.requests_failed;
      else if (e.finish == FinishReason::Abort)
        ++counters_.requests_aborted;
      else
        ++counters_.requests_finished;
    }
  }
}

std::vector<SeqEvent> EngineCore::abort(RequestId id, FinishReason reason) {
  auto events = scheduler_.abort(id, reason);
  forget_finished(events);
  return events;
}

StepResult EngineCore::step() {
  StepResult result;
  if (!scheduler_.has_work()) return result;
  const SchedulerOutput out = scheduler_.schedule();
  result.started = out.started;
  if (out.empty()) return result;  // everything waits (cannot happen with a valid config)
  batch_.clear();
  samples_.clear();
  for (const ScheduledSeq& sc : out.seqs) {
    const Sequence& s = scheduler_.sequence(sc.handle);
    const bool sample = !sc.sample_seqs.empty();
    batch_.add_sequence(s.kv.table, config_.block_size, s.tokens.data() + sc.n_computed, sc.n_new,
                        sample ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None);
    const int32_t row = static_cast<int32_t>(batch_.logits_rows.size()) - 1;
    for (SeqId id : sc.sample_seqs) samples_.push_back({row, id});
  }
  if (batch_.n_tokens() < config_.min_forward_rows)  // rows of its own, no logits
    batch_.add_sequence(pad_seq_, config_.block_size, pad_tokens_.data(),
                        config_.min_forward_rows - batch_.n_tokens(), ForwardBatch::Logits::None);
  try {
    executor_.execute(StepInput{batch_, out.copies, samples_}, tokens_);
    result.events = scheduler_.update(out, tokens_);
  } catch (const std::exception& e) {
    result.error = e.what();
    result.events = scheduler_.fail(out);
  }
  counters_.block_copies += static_cast<int64_t>(out.copies.size());
  forget_finished(result.events);
  if (config_.check_invariants) check_invariants();
  return result;
}

EngineStats EngineCore::stats() const {
  EngineStats s = counters_;
  const SchedulerStats& ss = scheduler_.stats();
  s.steps = ss.steps;
  s.scheduled_tokens = ss.scheduled_tokens;
  s.preemptions = ss.preemptions;
  s.forks = ss.forks;
  s.prefix = kv_.stats();
  s.waiting = scheduler_.n_waiting();
  s.running = scheduler_.n_running();
  s.kv_free_blocks = kv_.n_free();
  s.kv_total_blocks = kv_.n_blocks();
  return s;
}

void EngineCore::check_invariants() const {
  scheduler_.check_invariants();
  TESSERA_CHECK(executor_.n_sequences() == scheduler_.n_live_choices(), "engine invariant: executor holds ",
                executor_.n_sequences(), " sequences for ", scheduler_.n_live_choices(), " live choices");
}

bool EngineCore::is_idle() const { return scheduler_.is_idle() && executor_.n_sequences() == 0; }

}  // namespace tessera
