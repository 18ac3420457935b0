#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "core/draft_tree.h"
#include "core/error.h"
#include "grammar/grammar.h"

namespace tessera {

EngineCore::EngineCore(const EngineConfig& config, Executor& executor)
    : config_(config),
      executor_(executor),
      trees_(executor.supports_draft_trees()),
      kv_({.n_blocks = config.n_blocks,
           .block_size = config.block_size,
           .prefix_caching = config.prefix_caching,
           .n_host_blocks = config.n_host_blocks,
           .window = config.window,
           .n_local_blocks = config.n_local_blocks}),
      scheduler_(config.scheduler, kv_) {
  TESSERA_CHECK(config.vocab_size >= 1, "engine: vocabulary size ", config.vocab_size);
  TESSERA_CHECK(config.max_n >= 1, "engine: max_n ", config.max_n, " must be at least 1");
  TESSERA_CHECK(config.scheduler.max_num_batched_tokens <= executor.max_batch_tokens(),
                "engine: max_num_batched_tokens ", config.scheduler.max_num_batched_tokens,
                " exceeds the executor's batch of ", executor.max_batch_tokens());
  TESSERA_CHECK(config.scheduler.logits_rows() <= executor.max_logits_rows(),
                "engine: ", config.scheduler.logits_rows(), " logits rows a step (max_num_seqs ",
                config.scheduler.max_num_seqs, ", max_logits_rows ", config.scheduler.max_logits_rows,
                ") exceed the executor's ", executor.max_logits_rows());
  // A local pool must hold one sequence's largest step: its window before the step's first
  // token and the step's tokens (the blocks behind the window are dropped first).
  const int local_step_blocks = (config.window - 1 + config.scheduler.max_num_batched_tokens) / config.block_size + 2;
  TESSERA_CHECK(config.window == 0 || config.n_local_blocks >= local_step_blocks, "engine: a local KV pool of ",
                config.n_local_blocks, " blocks cannot hold one step of ", config.scheduler.max_num_batched_tokens,
                " tokens after a window of ", config.window, " (", local_step_blocks, " blocks)");
  TESSERA_CHECK(config.n_host_blocks <= executor.n_host_blocks(), "engine: a host KV tier of ", config.n_host_blocks,
                " blocks but the executor has ", executor.n_host_blocks());
  TESSERA_CHECK(config.scheduler.preemption_mode != PreemptionMode::Swap || config.n_host_blocks > 0,
                "engine: swap preemption needs a host KV tier (swap space), which is empty");
  if (config.speculative.enabled())
    drafter_ = config.speculative.uses_model() && config.drafter ? config.drafter : make_drafter(config.speculative);
  if (drafter_) counters_.spec.accepted_per_pos.assign(config.speculative.num_speculative_tokens, 0);
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
  if (!(r.n >= 1 && r.n <= config_.max_n)) return invalid_request("n = ", r.n, " is outside [1, ", config_.max_n, "]");
  if (r.prompt.empty()) return invalid_request("the prompt is empty");
  // vLLM's rule: under FCFS a priority would be silently ignored, so it is refused.
  if (r.priority != 0 && config_.scheduler.policy != SchedulingPolicy::Priority)
    return invalid_request("priority ", r.priority, " needs the priority scheduling policy; this server schedules ",
                           scheduling_policy_name(config_.scheduler.policy),
                           " (start it with --scheduling-policy priority)");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (!(r.prompt[i] >= 0 && r.prompt[i] < config_.vocab_size))
      return invalid_request("prompt token ", i, " is ", r.prompt[i], ", outside the vocabulary [0, ",
                             config_.vocab_size, ")");
  try {
    r.sampling.validate(config_.vocab_size);
  } catch (const Error& e) {
    return invalid_request(e.what());
  }
  if (r.sampling.grammar && r.sampling.grammar->vocab_size() != config_.vocab_size)
    return invalid_request("the grammar was compiled for ", r.sampling.grammar->vocab_size(), " tokens, the model has ",
                           config_.vocab_size);
  if (!(r.prompt_logprobs >= -1 && r.prompt_logprobs <= SamplingParams::kMaxLogprobs))
    return invalid_request("prompt_logprobs = ", r.prompt_logprobs, " is outside [-1, ", SamplingParams::kMaxLogprobs,
                           "]");
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  const int64_t total = n_prompt + r.sampling.max_tokens;
  const int max_len = config_.scheduler.max_model_len;
  if (total > max_len)
    return invalid_request("prompt of ", n_prompt, " tokens + max_tokens ", r.sampling.max_tokens, " = ", total,
                           " exceeds the context of ", max_len, " tokens");
  // The last sampled token is never computed, so a choice holds at most total - 1 tokens.
  const int64_t blocks = (total - 1 + config_.block_size - 1) / config_.block_size;
  if (blocks > config_.n_blocks)
    return invalid_request("prompt of ", n_prompt, " tokens + max_tokens ", r.sampling.max_tokens, " needs ", blocks,
                           " KV blocks but the whole cache has ", config_.n_blocks, " (", config_.block_size,
                           " tokens each)");
  return validate_transfer(r);
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
  sr.prompt_logits = r.prompt_logprobs >= 0;
  if (r.kv_import) import_kv(id, r, sr.prefix_root);  // before the request exists: nothing to undo
  if (r.kv_lease_seconds > 0)
    lease_wanted_[id] = LeaseWanted{r.prompt, r.kv_lease_seconds, sr.prefix_root, r.tenant_salt, r.adapter_id};
  const SeqId first = scheduler_.add(std::move(sr));
  if (drafter_ && r.speculative && r.prompt_logprobs < 0) speculating_.insert(id);
  awaiting_first_token_[id] = static_cast<int32_t>(r.prompt.size());
  if (r.logprobs || r.prompt_logprobs >= 0)
    extras_[id] = Extras{r.logprobs, r.prompt_logprobs, static_cast<int32_t>(r.prompt.size()), {}, false};
  for (int c = 0; c < r.n; ++c) {
    SamplingParams p = r.sampling;
    if (p.seed) p.seed = *p.seed + static_cast<uint64_t>(c);
    if (speculating_.count(id)) draft_sampling_[first + c] = p;
    executor_.add_sequence(first + c, p, r.prompt);
  }
}

void EngineCore::forget_finished(const std::vector<SeqEvent>& events) {
  for (const SeqEvent& e : events) {
    if (e.token >= 0) {
      ++counters_.generated_tokens;
      if (const auto it = awaiting_first_token_.find(e.request); it != awaiting_first_token_.end()) {
        counters_.prompt_tokens += it->second;  // the prefill is complete
        awaiting_first_token_.erase(it);
      }
    }
    if (e.finish != FinishReason::None) {
      executor_.remove_sequence(e.seq);
      if (drafter_) {
        drafter_->remove(e.seq);
        draft_length_.erase(e.seq);
        drafts_.erase(e.seq);
        draft_sampling_.erase(e.seq);
      }
    }
    if (e.request_done) {
      lease_wanted_.erase(e.request);
      release_import_hold(e.request);
      speculating_.erase(e.request);
      extras_.erase(e.request);
      awaiting_first_token_.erase(e.request);  // ended before its first token
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

std::vector<SeqEvent> EngineCore::finish_choice(RequestId id, int32_t choice, FinishReason reason) {
  auto events = scheduler_.finish_choice(id, choice, reason);
  forget_finished(events);
  return events;
}

void EngineCore::build_batch(const SchedulerOutput& out) {
  batch_.clear();
  samples_.clear();
  prompt_targets_.clear();
  prompt_target_owner_.clear();
  for (const ScheduledSeq& sc : out.seqs) {
    const Sequence& s = scheduler_.sequence(sc.handle);
    const int first_row = batch_.n_tokens();
    if (sc.n_draft > 0) {
      // Query rows: the last token, then the draft; each row's logits check the next draft
      // token, and the last row's give the bonus token.
      chunk_.assign(1, s.tokens[sc.n_computed]);
      chunk_.insert(chunk_.end(), s.draft.begin(), s.draft.begin() + sc.n_draft);
      batch_.add_sequence(s.kv.table, config_.block_size, chunk_.data(), sc.n_new, ForwardBatch::Logits::None,
                          local_table(s.kv));
      const auto row = static_cast<int32_t>(batch_.logits_rows.size());
      for (int j = 0; j <= sc.n_draft; ++j) batch_.logits_rows.push_back(first_row + j);
      const auto d = drafts_.find(sc.seq);
      std::span<const std::vector<TokenProb>> probs;
      std::span<const int16_t> parents;
      if (d != drafts_.end()) {
        if (!d->second.probs.empty()) probs = std::span(d->second.probs).first(sc.n_draft);
        // The scheduler's cut of a tree may have left only the main chain: then it is one.
        if (d->second.is_tree()) parents = std::span(d->second.parents).first(sc.n_draft);
        if (is_draft_chain(parents)) parents = {};
      }
      if (!parents.empty()) batch_.set_tree(parents);
      const auto extras = extras_.find(sc.request);
      const bool logprobs = extras != extras_.end() && extras->second.logprobs;
      samples_.push_back({row, sc.seq, logprobs, std::span(s.draft).first(sc.n_draft), probs, parents});
      continue;
    }
    batch_.add_sequence(s.kv.table, config_.block_size, s.tokens.data() + sc.n_computed, sc.n_new,
                        ForwardBatch::Logits::None, local_table(s.kv));
    const auto extras = extras_.find(sc.request);
    if (sc.n_prompt_rows() > 0) {
      // Row of position p -> logprob of prompt token p + 1.
      TESSERA_CHECK(extras != extras_.end() && extras->second.prompt_logprobs >= 0, "engine: request ", sc.request,
                    " got prompt rows it did not ask for");
      for (int32_t p = sc.prompt_rows_begin; p < sc.prompt_rows_end; ++p) {
        const auto row = static_cast<int32_t>(batch_.logits_rows.size());
        batch_.logits_rows.push_back(first_row + (p - sc.n_computed));
        prompt_targets_.push_back({row, s.tokens[p + 1], extras->second.prompt_logprobs});
        prompt_target_owner_.push_back(sc.request);
      }
    }
    if (sc.sample_seqs.empty()) continue;
    const auto row = static_cast<int32_t>(batch_.logits_rows.size());
    batch_.logits_rows.push_back(first_row + sc.n_new - 1);
    const bool logprobs = extras != extras_.end() && extras->second.logprobs;
    for (SeqId id : sc.sample_seqs) samples_.push_back({row, id, logprobs});
  }
}

void EngineCore::gather_prompt_logprobs(const SchedulerOutput& out, StepResult& result) {
  TESSERA_CHECK(output_.prompt_logprobs.size() == prompt_targets_.size(), "engine: executor returned ",
                output_.prompt_logprobs.size(), " prompt logprobs for ", prompt_targets_.size(), " rows");
  for (size_t i = 0; i < prompt_targets_.size(); ++i)
    extras_.at(prompt_target_owner_[i]).prompt.push_back(std::move(output_.prompt_logprobs[i]));
  for (const ScheduledSeq& sc : out.seqs) {
    const auto it = extras_.find(sc.request);
    if (it == extras_.end()) continue;
    Extras& x = it->second;
    if (x.prompt_logprobs < 0 || x.published) continue;
    TESSERA_CHECK(static_cast<int32_t>(x.prompt.size()) <= x.n_prompt - 1, "engine: request ", sc.request, " has ",
                  x.prompt.size(), " prompt logprobs for a prompt of ", x.n_prompt, " tokens");
    if (static_cast<int32_t>(x.prompt.size()) < x.n_prompt - 1) continue;
    x.published = true;
    result.prompt_logprobs.emplace_back(sc.request, std::make_shared<const std::vector<Logprobs>>(std::move(x.prompt)));
    x.prompt = {};
  }
}

void EngineCore::attach_logprobs(std::vector<SeqEvent>& events) const {
  // update() emits one event per sample target, in target order, or, for a speculative
  // target (which never asks for logprobs), one per emitted token up to a stop.
  TESSERA_CHECK(events.size() >= samples_.size(), "engine: ", events.size(), " events for ", samples_.size(),
                " sample targets");
  size_t next = 0;
  size_t e = 0;
  for (size_t i = 0; i < samples_.size(); ++i, ++e) {
    TESSERA_CHECK(e < events.size() && events[e].seq == samples_[i].seq, "engine: no event for sample target ", i,
                  " of sequence ", samples_[i].seq);
    if (!samples_[i].draft.empty()) {
      // One Logprobs per emitted token; tokens after a stop were dropped, their logprobs too.
      const size_t emitted = output_.counts.empty() ? 1 : static_cast<size_t>(output_.counts[i]);
      size_t j = 0;
      for (;; ++e, ++j) {
        if (samples_[i].logprobs && j < emitted) {
          TESSERA_CHECK(next + j < output_.logprobs.size(), "engine: executor returned too few logprobs");
          if (events[e].token >= 0) events[e].logprobs = output_.logprobs[next + j];
        }
        if (!(e + 1 < events.size() && events[e + 1].seq == samples_[i].seq)) break;
      }
      if (samples_[i].logprobs) next += emitted;
      continue;
    }
    const size_t event_index = e;
    auto& ev = events[event_index];
    if (const auto it = extras_.find(ev.request); it != extras_.end() && it->second.prompt_logprobs >= 0)
      TESSERA_CHECK(it->second.published, "engine: request ", ev.request,
                    " got a token before its prompt logprobs were complete");
    if (!samples_[i].logprobs) continue;
    TESSERA_CHECK(next < output_.logprobs.size(), "engine: executor returned too few logprobs");
    // A choice finished before its fork drops its sampled token, and the token's logprobs.
    if (ev.token >= 0) ev.logprobs = output_.logprobs[next];
    ++next;
  }
  TESSERA_CHECK(e == events.size(), "engine: ", events.size(), " events for ", e, " sampled tokens");
  TESSERA_CHECK(next == output_.logprobs.size(), "engine: executor returned ", output_.logprobs.size(),
                " logprobs for ", next, " requested");
}

StepResult EngineCore::step() {
  StepResult result;
  if (!scheduler_.has_work()) return result;
  const auto now = std::chrono::steady_clock::now();
  propose_drafts();
  const SchedulerOutput out = scheduler_.schedule();
  for (RequestId id : out.started) {
    RequestStart start{id, 0, now};
    for (const ScheduledSeq& sc : out.seqs)
      if (sc.request == id) start.cached_prompt_tokens = sc.n_computed;  // its first chunk starts after the hits
    result.started.push_back(start);
    release_import_hold(id);  // it has adopted the imported blocks
  }
  if (out.empty()) return result;  // everything waits (cannot happen with a valid config)
  build_batch(out);
  try {
    // Swap-outs read blocks that swap-ins, copies and the forward may then overwrite.
    executor_.swap_out(out.swap_out);
    executor_.swap_in(out.swap_in);
    output_.counts.clear();  // an executor that knows no drafts leaves it empty: one token each
    const auto t0 = std::chrono::steady_clock::now();
    executor_.execute(StepInput{batch_, out.copies, samples_, prompt_targets_}, output_);
    if (drafter_)  // the cost per row count is what the draft plan reads
      step_cost_.observe(batch_.n_tokens(),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    gather_prompt_logprobs(out, result);
    count_verifications(out);
    result.events = scheduler_.update(out, output_.tokens, output_.counts);
    attach_logprobs(result.events);
    lease_finished(result.events, result);  // before anything else can reuse the freed blocks
  } catch (const std::exception& e) {
    result.error = e.what();
    result.prompt_logprobs.clear();
    result.events = scheduler_.fail(out);
  }
  counters_.block_copies += static_cast<int64_t>(out.copies.size());
  forget_finished(result.events);
  if (config_.check_invariants) check_invariants();
  return result;
}

void EngineCore::plan_adaptive_drafts(const std::vector<SeqHandle>& decoding, const std::vector<size_t>& cand,
                                      const std::vector<int>& cap, std::vector<int>& k) {
  const int base_rows = static_cast<int>(decoding.size());
  std::vector<DraftCandidate> dc(cand.size());
  std::vector<DraftLength*> rate(cand.size());
  for (size_t c = 0; c < cand.size(); ++c) {
    rate[c] = &draft_length_[scheduler_.sequence(decoding[cand[c]]).id];
    dc[c] = {rate[c]->rate(), cap[c]};
  }
  plan_draft_lengths(step_cost_, base_rows, base_rows, draft_seconds_per_pos_, dc, k);
  for (size_t c = 0; c < cand.size(); ++c)
    if (k[c] == 0) rate[c]->idle();
  // While the plan says "off", the costs of longer steps are no longer observed, so one slow
  // measurement could keep speculation off for good: every kExploreEvery-th step without
  // drafts, the most predictable sequence that has something to draft drafts all of it.
  if (std::any_of(k.begin(), k.end(), [](int x) { return x > 0; })) {
    plain_steps_ = 0;
  } else if (++plain_steps_ >= kExploreEvery) {
    size_t best = cand.size();
    for (size_t c = 0; c < cand.size(); ++c)
      if (cap[c] > 0 && (best == cand.size() || dc[c].acceptance > dc[best].acceptance)) best = c;
    if (best < cand.size()) {
      plain_steps_ = 0;
      k[best] = cap[best];
    }
  }
}

bool EngineCore::tree_allowed(RequestId request, const SamplingParams* sampling) const {
  if (!trees_ || (sampling && sampling->grammar)) return false;
  const auto x = extras_.find(request);  // logprobs follow a chain's rows
  return x == extras_.end() || !x->second.logprobs;
}

void EngineCore::check_draft(Draft& d, const DraftQuery& q) const {
  TESSERA_CHECK(d.probs.empty() || d.probs.size() == d.tokens.size(), "engine: drafter ", drafter_->name(),
                " proposed ", d.tokens.size(), " tokens with ", d.probs.size(), " distributions");
  if (!d.is_tree()) {
    TESSERA_CHECK(static_cast<int>(d.tokens.size()) <= q.max_tokens, "engine: drafter ", drafter_->name(), " proposed ",
                  d.tokens.size(), " tokens for at most ", q.max_tokens);
    return;
  }
  // A tree: max_tokens bounds its depth (the tokens one step can emit), not its nodes.
  TESSERA_CHECK(q.allow_tree && d.probs.empty() && d.parents.size() == d.tokens.size() &&
                    static_cast<int>(d.tokens.size()) <= kMaxDraftTreeNodes,
                "engine: drafter ", drafter_->name(), " proposed a tree of ", d.tokens.size(), " nodes (",
                d.parents.size(), " parents, ", d.probs.size(), " distributions) where ",
                q.allow_tree ? "a tree of point masses of at most 31 nodes" : "a chain", " was asked for");
  for (size_t j = 0; j < d.parents.size(); ++j) {
    TESSERA_CHECK(d.parents[j] >= -1 && d.parents[j] < static_cast<int>(j), "engine: drafter ", drafter_->name(),
                  " gave tree node ", j, " the parent ", d.parents[j]);
    // Verification takes the first sibling holding a token.
    TESSERA_CHECK(
        draft_tree_child(std::span(d.tokens).first(j), std::span(d.parents).first(j), d.parents[j], d.tokens[j]) < 0,
        "engine: drafter ", drafter_->name(), " gave tree node ", j, " a sibling with the same token");
  }
  TESSERA_CHECK(draft_tree_depth(d.parents) <= q.max_tokens, "engine: drafter ", drafter_->name(),
                " proposed a tree deeper than ", q.max_tokens);
}

std::vector<Draft> EngineCore::run_drafter(const std::vector<SeqHandle>& decoding, const std::vector<size_t>& cand,
                                           const std::vector<int>& k) {
  std::vector<Draft> drafts(cand.size());
  std::vector<size_t> asked;  // indices into cand
  std::vector<DraftQuery> queries;
  for (size_t c = 0; c < cand.size(); ++c) {
    if (k[c] <= 0) continue;
    const Sequence& s = scheduler_.sequence(decoding[cand[c]]);
    const auto params = draft_sampling_.find(s.id);
    asked.push_back(c);
    const SamplingParams* sampling = params != draft_sampling_.end() ? &params->second : nullptr;
    queries.push_back({.seq = s.id,
                       .tokens = s.tokens,
                       .max_tokens = k[c],
                       .sampling = sampling,
                       .n_prompt = s.n_prompt,
                       .allow_tree = tree_allowed(s.request, sampling)});
  }
  if (queries.empty()) return drafts;
  // A drafter over this engine's cache (early exit) reads each sequence's blocks and writes
  // scratch blocks lent from the free pool for this call only: the scheduler sees the same
  // free count afterwards (a lent block may have been a cached one, evicted like any
  // allocation would). A sequence gets no scratch when the pool is short (then no draft).
  std::vector<SeqKv> scratch;
  struct GiveBack {  // however propose() ends
    KvBlockManager& kv;
    std::vector<SeqKv>& lent;
    ~GiveBack() {
      // Fresh tables of device blocks only: free() has nothing here that can fail.
      for (SeqKv& s : lent) kv.free(s);
    }
  } give_back{kv_, scratch};
  if (drafter_->drafts_over_target_kv()) {
    scratch.resize(queries.size());
    std::vector<BlockCopy> none;  // fresh tables share nothing
    for (size_t i = 0; i < queries.size(); ++i) {
      DraftQuery& q = queries[i];
      const SeqKv& kv = scheduler_.sequence(decoding[cand[asked[i]]]).kv;
      q.target_kv_tokens = kv.n_computed();
      q.target_blocks = kv.table.blocks;
      q.target_local_blocks = kv.local.blocks;
      // Nothing lent to a query the drafter would refuse (no KV held, or none missing).
      if (kv.table.blocks.empty() || kv.n_computed() >= static_cast<int>(q.tokens.size())) continue;
      const int n =
          draft_scratch_blocks(kv.n_computed(), static_cast<int>(q.tokens.size()), q.max_tokens, config_.block_size);
      if (n <= 0 || !kv_.allocate_slots(scratch[i], n * config_.block_size, none)) continue;
      q.scratch_blocks = scratch[i].table.blocks;
      q.local_scratch_blocks = scratch[i].local.blocks;
    }
  }
  std::vector<Draft> out(queries.size());
  const auto t0 = std::chrono::steady_clock::now();
  drafter_->propose(queries, out);
  int longest = 0;
  for (const DraftQuery& q : queries) longest = std::max(longest, q.max_tokens);
  const double per_pos = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / longest;
  constexpr double kWeight = 0.25;  // of a new measurement in the running mean
  draft_seconds_per_pos_ = (1 - kWeight) * draft_seconds_per_pos_ + kWeight * per_pos;
  for (size_t i = 0; i < queries.size(); ++i) {
    Draft& d = out[i];
    check_draft(d, queries[i]);
    for (const int32_t t : d.tokens)
      TESSERA_CHECK(t >= 0 && t < config_.vocab_size, "engine: drafter ", drafter_->name(), " proposed token ", t,
                    " outside the vocabulary");
    drafts[asked[i]] = std::move(d);
  }
  return drafts;
}

void EngineCore::propose_drafts() {
  drafts_.clear();
  if (!drafter_) return;
  const SpeculativeConfig& sc = config_.speculative;
  // The manual off switch; the measured one is the plan below.
  const bool on = !speculating_.empty() && (sc.disable_by_batch_size == 0 ||
                                            static_cast<int>(scheduler_.n_running()) <= sc.disable_by_batch_size);
  const std::vector<SeqHandle> decoding = scheduler_.decoding_sequences();
  std::vector<size_t> cand;  // indices into decoding of the sequences that may draft
  for (size_t i = 0; i < decoding.size(); ++i)
    if (on && speculating_.count(scheduler_.sequence(decoding[i]).request)) cand.push_back(i);
  // Draft lengths, aligned with cand: k_max each, or (adaptive) what maximises the expected
  // tokens per second of the step under this engine's measured cost per row count, zero where
  // nothing pays (nothing measured yet: no drafts).
  std::vector<int> k(cand.size(), sc.num_speculative_tokens);
  std::vector<Draft> drafts;  // aligned with cand
  if (sc.adaptive && !cand.empty()) {
    std::vector<int> cap = k;
    if (drafter_->proposes_for_free()) {
      // Prompt lookup costs next to nothing: it proposes k_max for everyone first, and the
      // plan then weighs the drafts there really are (a short match, or none) instead of
      // assuming k_max rows for every candidate; the plan's cut is a prefix of each draft.
      drafts = run_drafter(decoding, cand, cap);
      for (size_t c = 0; c < cand.size(); ++c) cap[c] = static_cast<int>(drafts[c].tokens.size());
    }
    plan_adaptive_drafts(decoding, cand, cap, k);
    for (size_t c = 0; c < drafts.size(); ++c) {
      Draft& d = drafts[c];
      d.tokens.resize(std::min(d.tokens.size(), static_cast<size_t>(k[c])));
      if (!d.probs.empty()) d.probs.resize(d.tokens.size());
      if (d.is_tree()) d.parents.resize(d.tokens.size());  // a prefix of a tree is a tree
    }
  }
  if (drafts.empty()) drafts = run_drafter(decoding, cand, k);
  std::vector<Draft*> draft_of(decoding.size(), nullptr);
  for (size_t c = 0; c < cand.size(); ++c) draft_of[cand[c]] = &drafts[c];
  for (size_t i = 0; i < decoding.size(); ++i) {
    const SeqHandle h = decoding[i];
    const Sequence& s = scheduler_.sequence(h);
    Draft* d = draft_of[i];
    if (d == nullptr || d->tokens.empty()) {
      if (!s.draft.empty()) scheduler_.set_draft(h, {});  // a draft left from a step that did not schedule it
      continue;
    }
    scheduler_.set_draft(h, d->tokens, d->parents);
    drafts_[s.id] = std::move(*d);
  }
}

void EngineCore::count_verifications(const SchedulerOutput& out) {
  size_t target = 0;
  for (const ScheduledSeq& sc : out.seqs) {
    if (sc.n_draft > 0) {
      const int emitted = output_.counts.empty() ? 1 : output_.counts[target];
      const int accepted = std::min(sc.n_draft, std::max(0, emitted - 1));
      SpecDecodeStats& st = counters_.spec;
      ++st.drafts;
      if (!samples_[target].draft_parents.empty()) ++st.tree_drafts;
      st.draft_tokens += sc.n_draft;
      st.accepted_tokens += accepted;
      for (int j = 0; j < accepted && j < static_cast<int>(st.accepted_per_pos.size()); ++j) ++st.accepted_per_pos[j];
      // A tree is tried along one path at most: its depth is the positions tried.
      const auto d = drafts_.find(sc.seq);
      const int tried = d != drafts_.end() && d->second.is_tree()
                            ? draft_tree_depth(std::span(d->second.parents).first(sc.n_draft))
                            : sc.n_draft;
      draft_length_[sc.seq].observe(tried, accepted);
    }
    target += sc.sample_seqs.size();
  }
}

EngineStats EngineCore::stats() const {
  EngineStats s = counters_;
  const SchedulerStats& ss = scheduler_.stats();
  s.steps = ss.steps;
  s.scheduled_tokens = ss.scheduled_tokens;
  s.preemptions = ss.preemptions;
  s.swap_fallbacks = ss.swap_fallbacks;
  s.forks = ss.forks;
  s.prefix = kv_.stats();
  const KvSwapStats& sw = kv_.swap_stats();
  s.swaps_out = sw.swap_outs;
  s.swaps_in = sw.swap_ins;
  s.swap_out_bytes = sw.blocks_out * config_.kv_block_bytes;
  s.swap_in_bytes = sw.blocks_in * config_.kv_block_bytes;
  s.host_free_blocks = kv_.n_host_free();
  s.host_total_blocks = kv_.n_host_blocks();
  s.waiting = scheduler_.n_waiting();
  s.running = scheduler_.n_running();
  s.swapped = scheduler_.n_swapped();
  s.kv_free_blocks = kv_.n_free();
  s.kv_total_blocks = kv_.n_blocks();
  s.kv_window_free_blocks = kv_.n_local_free();
  s.kv_window_total_blocks = kv_.n_local_blocks();
  s.transfer = transfer_;
  s.transfer.active_leases = static_cast<int>(leases_.size());
  s.transfer.leased_blocks = 0;
  for (const auto& [id, lease] : leases_) s.transfer.leased_blocks += lease.kv.n_blocks();
  s.transfer.active_reservations = static_cast<int>(reservations_.size() + import_holds_.size());
  s.transfer.reserved_blocks = 0;
  for (const auto& [id, r] : reservations_) s.transfer.reserved_blocks += r.first.n_blocks();
  for (const auto& [id, kv] : import_holds_) s.transfer.reserved_blocks += kv.n_blocks();
  return s;
}

void EngineCore::check_invariants() const {
  scheduler_.check_invariants();
  TESSERA_CHECK(executor_.n_sequences() == scheduler_.n_live_choices(), "engine invariant: executor holds ",
                executor_.n_sequences(), " sequences for ", scheduler_.n_live_choices(), " live choices");
  for (const auto& [id, x] : extras_)
    TESSERA_CHECK(scheduler_.contains(id), "engine invariant: logprob state left for ended request ", id);
  for (const auto& [id, n] : awaiting_first_token_)
    TESSERA_CHECK(scheduler_.contains(id), "engine invariant: prompt count left for ended request ", id);
  for (const auto& [id, w] : lease_wanted_)
    TESSERA_CHECK(scheduler_.contains(id), "engine invariant: lease request left for ended request ", id);
  for (const auto& [id, kv] : import_holds_)
    TESSERA_CHECK(scheduler_.contains(id), "engine invariant: imported blocks held for ended request ", id);
  for (const RequestId id : speculating_)
    TESSERA_CHECK(scheduler_.contains(id), "engine invariant: speculation state left for ended request ", id);
  TESSERA_CHECK(draft_length_.size() <= scheduler_.n_live_choices(), "engine invariant: draft length state for ",
                draft_length_.size(), " sequences but ", scheduler_.n_live_choices(), " live choices");
  TESSERA_CHECK(draft_sampling_.size() <= scheduler_.n_live_choices(), "engine invariant: draft sampling state for ",
                draft_sampling_.size(), " sequences but ", scheduler_.n_live_choices(), " live choices");
}

bool EngineCore::is_idle() const {
  return scheduler_.is_idle() && executor_.n_sequences() == 0 && extras_.empty() && awaiting_first_token_.empty() &&
         speculating_.empty() && draft_length_.empty() && draft_sampling_.empty() && lease_wanted_.empty() &&
         leases_.empty() && reservations_.empty() && import_holds_.empty();
}

}  // namespace tessera
