#pragma once
// Test harness: an EngineCore over the simulated executor, stepped by hand, with the
// invariants checked after every step and per-request outputs gathered from the events.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/simulator.h"

namespace tessera::testing {

struct SimSetup {
  int n_blocks = 64;
  int block_size = 4;
  bool prefix_caching = true;
  int max_num_batched_tokens = 64;
  int max_num_seqs = 8;
  int max_partial_prefills = 2;
  int long_prefill_token_threshold = 0;
  int max_model_len = 512;
  SchedulingPolicy policy = SchedulingPolicy::Fcfs;
  int32_t vocab = 1000;
  int32_t eos = -1;
  int eos_one_in = 0;
  bool check_invariants = true;  // after every step
  PreemptionMode preemption = PreemptionMode::Recompute;
  int n_host_blocks = 0;               // host tier (swap)
  int max_logits_rows = 0;             // 0 = max_num_seqs
  SpeculativeConfig speculative = {};  // off unless a test sets it (needs max_logits_rows room)
  int window = 0;                      // a local (sliding-window) pool: its window and blocks
  int n_local_blocks = 0;
};

struct Collected {
  std::vector<std::vector<int32_t>> tokens;     // [n][...]
  std::vector<std::vector<Logprobs>> logprobs;  // [n][...] for tokens that carried them
  std::vector<FinishReason> finish;
  bool done = false;
  int64_t start_step = -1;
  int32_t cached_prompt_tokens = -1;
  std::shared_ptr<const std::vector<Logprobs>> prompt_logprobs;
};

inline void expect_same_logprobs(const Logprobs& got, const Logprobs& want, const std::string& where) {
  EXPECT_EQ(got.chosen.token, want.chosen.token) << where;
  EXPECT_EQ(got.chosen.logprob, want.chosen.logprob) << where;
  ASSERT_EQ(got.top.size(), want.top.size()) << where;
  for (size_t i = 0; i < got.top.size(); ++i) {
    EXPECT_EQ(got.top[i].token, want.top[i].token) << where << " top " << i;
    EXPECT_EQ(got.top[i].logprob, want.top[i].logprob) << where << " top " << i;
  }
}

class SimEngine {
 public:
  explicit SimEngine(const SimSetup& s) : setup_(s) {
    SimulatorConfig sc;
    sc.vocab_size = s.vocab;
    sc.n_blocks = s.n_blocks;
    sc.n_host_blocks = s.n_host_blocks;
    sc.max_logits_rows = s.max_logits_rows > 0 ? s.max_logits_rows : s.max_num_seqs;
    sc.block_size = s.block_size;
    sc.eos_token = s.eos;
    sc.eos_one_in = s.eos_one_in;
    sc.window = s.window;
    sc.n_local_blocks = s.n_local_blocks;
    sim_ = std::make_unique<SimulatedExecutor>(sc);
    EngineConfig ec;
    ec.scheduler.max_num_batched_tokens = s.max_num_batched_tokens;
    ec.scheduler.max_num_seqs = s.max_num_seqs;
    ec.scheduler.max_partial_prefills = s.max_partial_prefills;
    ec.scheduler.long_prefill_token_threshold = s.long_prefill_token_threshold;
    ec.scheduler.max_model_len = s.max_model_len;
    ec.scheduler.policy = s.policy;
    if (s.eos >= 0) ec.scheduler.is_eog = [eos = s.eos](int32_t t) { return t == eos; };
    ec.n_blocks = s.n_blocks;
    ec.block_size = s.block_size;
    ec.prefix_caching = s.prefix_caching;
    ec.model_fingerprint = "sim-model";
    ec.vocab_size = s.vocab;
    ec.check_invariants = s.check_invariants;
    ec.scheduler.preemption_mode = s.preemption;
    ec.scheduler.max_logits_rows = s.max_logits_rows;
    ec.n_host_blocks = s.n_host_blocks;
    ec.kv_block_bytes = 100;  // any: the byte counters are blocks x this
    ec.speculative = s.speculative;
    ec.window = s.window;
    ec.n_local_blocks = s.n_local_blocks;
    core_ = std::make_unique<EngineCore>(ec, *sim_);
  }

  RequestId add(const Request& r) {
    const RequestId id = next_id_++;
    core_->add(id, r);
    auto& c = out_[id];
    c.tokens.resize(r.n);
    c.logprobs.resize(r.n);
    c.finish.assign(r.n, FinishReason::None);
    return id;
  }

  void absorb(const std::vector<SeqEvent>& events) {
    for (const SeqEvent& e : events) {
      Collected& c = out_.at(e.request);
      ASSERT_FALSE(c.done) << "event after the request ended";
      ASSERT_EQ(c.finish[e.choice], FinishReason::None) << "event after the choice ended";
      if (e.token >= 0) c.tokens[e.choice].push_back(e.token);
      if (e.logprobs) {
        ASSERT_GE(e.token, 0) << "logprobs without a token";
        ASSERT_EQ(e.logprobs->chosen.token, e.token);
        c.logprobs[e.choice].push_back(*e.logprobs);
      }
      c.finish[e.choice] = e.finish;
      c.done = e.request_done;
      if (e.request_done) {
        ASSERT_FALSE(core_->contains(e.request));
      }
    }
  }

  // One step; the invariants are checked inside (EngineConfig::check_invariants).
  StepResult step() {
    StepResult r = core_->step();
    for (const RequestStart& st : r.started) {
      Collected& c = out_.at(st.id);
      EXPECT_EQ(c.start_step, -1) << "request " << st.id << " started twice";
      c.start_step = steps_;
      c.cached_prompt_tokens = st.cached_prompt_tokens;
    }
    for (const auto& [id, entries] : r.prompt_logprobs) {
      Collected& c = out_.at(id);
      EXPECT_EQ(c.prompt_logprobs, nullptr) << "prompt logprobs of request " << id << " published twice";
      for (const auto& t : c.tokens) EXPECT_TRUE(t.empty()) << "prompt logprobs after a token of request " << id;
      c.prompt_logprobs = entries;
    }
    absorb(r.events);
    ++steps_;
    return r;
  }

  void abort(RequestId id) { absorb(core_->abort(id)); }
  // Ends one choice early; returns the events it produced (also absorbed).
  std::vector<SeqEvent> finish_choice(RequestId id, int32_t choice, FinishReason reason = FinishReason::Stop) {
    std::vector<SeqEvent> events = core_->finish_choice(id, choice, reason);
    absorb(events);
    return events;
  }

  // Steps until idle; fails the test if it takes more than max_steps.
  void run(int64_t max_steps = 1000000) {
    while (core_->has_work()) {
      ASSERT_LT(steps_, max_steps) << "no progress";
      step();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  // The pool is whole and no request state is left anywhere.
  void expect_whole() const {
    EXPECT_TRUE(core_->is_idle());
    EXPECT_EQ(core_->kv().n_free(), core_->kv().n_blocks());
    for (int b = 0; b < core_->kv().n_blocks(); ++b) ASSERT_EQ(core_->kv().ref_count(b), 0) << "block " << b;
    EXPECT_EQ(core_->scheduler().n_requests(), 0u);
    EXPECT_EQ(core_->scheduler().n_live_choices(), 0u);
    EXPECT_EQ(sim_->n_sequences(), 0u);
    EXPECT_EQ(core_->kv().n_host_free(), core_->kv().n_host_blocks());
    for (int h = 0; h < core_->kv().n_host_blocks(); ++h) ASSERT_FALSE(core_->kv().host_used(h)) << "host slot " << h;
    core_->check_invariants();
  }

  // The logprobs a request's tokens should carry, and its prompt logprobs: the simulator's
  // stand-ins over each context, computed directly.
  std::vector<Logprobs> reference_logprobs(const Request& r, const std::vector<int32_t>& output) const {
    std::vector<int32_t> ctx = r.prompt;
    std::vector<Logprobs> out;
    for (int32_t t : output) {
      out.push_back(sim_->fake_logprobs(SimulatedExecutor::context_value(ctx), t, r.sampling.n_logprobs));
      ctx.push_back(t);
    }
    return out;
  }
  std::vector<Logprobs> reference_prompt_logprobs(const Request& r) const {
    std::vector<Logprobs> out;
    for (size_t p = 1; p < r.prompt.size(); ++p)
      out.push_back(sim_->fake_logprobs(SimulatedExecutor::context_value(std::span(r.prompt).first(p)), r.prompt[p],
                                        r.prompt_logprobs));
    return out;
  }

  // What choice `choice` of a request produces run alone: the simulator's chain over its
  // context, computed directly, with no paging at all. Non-greedy requests need a seed.
  std::vector<int32_t> reference(const Request& r, int choice = 0) const {
    SamplingParams p = r.sampling;
    if (p.seed) p.seed = *p.seed + choice;
    const uint64_t seed = SimulatedExecutor::sampling_seed(p, 0);
    std::vector<int32_t> ctx = r.prompt, out;
    while (static_cast<int>(out.size()) < r.sampling.max_tokens &&
           static_cast<int>(ctx.size()) < setup_.max_model_len) {
      const int32_t t = sim_->token_after(SimulatedExecutor::context_value(ctx), seed);
      out.push_back(t);
      ctx.push_back(t);
      if (t == setup_.eos && !r.sampling.ignore_eos) break;
      bool stop = false;
      for (int32_t s : r.sampling.stop_token_ids) stop |= s == t;
      if (stop) break;
    }
    return out;
  }

  EngineCore& core() { return *core_; }
  SimulatedExecutor& sim() { return *sim_; }
  const Collected& out(RequestId id) const { return out_.at(id); }
  const std::map<RequestId, Collected>& outputs() const { return out_; }
  int64_t steps() const { return steps_; }
  const SimSetup& setup() const { return setup_; }

 private:
  SimSetup setup_;
  std::unique_ptr<SimulatedExecutor> sim_;
  std::unique_ptr<EngineCore> core_;
  std::map<RequestId, Collected> out_;
  RequestId next_id_ = 1;
  int64_t steps_ = 0;
};

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// After a workload: every choice equals its run alone and ended by Stop or Length, except
// choices cut short (their request aborted, or the choice itself finished early), which are
// prefixes of it and ended somehow.
inline void expect_exact_or_prefix(const SimEngine& e, const std::vector<std::pair<RequestId, Request>>& reqs,
                                   const std::set<RequestId>& aborted,
                                   const std::set<std::pair<RequestId, int>>& finished_early = {}) {
  for (const auto& [id, r] : reqs) {
    const Collected& o = e.out(id);
    ASSERT_TRUE(o.done) << id;
    for (int c = 0; c < r.n; ++c) {
      const auto ref = e.reference(r, c);
      if (aborted.count(id) || finished_early.count({id, c})) {
        ASSERT_LE(o.tokens[c].size(), ref.size());
        EXPECT_TRUE(std::equal(o.tokens[c].begin(), o.tokens[c].end(), ref.begin())) << id << " choice " << c;
        EXPECT_NE(o.finish[c], FinishReason::None);
      } else {
        EXPECT_EQ(o.tokens[c], ref) << id << " choice " << c;
        EXPECT_TRUE(o.finish[c] == FinishReason::Stop || o.finish[c] == FinishReason::Length);
      }
    }
  }
}

inline Request greedy_request(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

}  // namespace tessera::testing
