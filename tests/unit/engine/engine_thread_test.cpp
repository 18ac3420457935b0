// The threaded engine: submit/stream/abort from client threads, admission and
// backpressure, drain and stop. The simulator stands in for the model.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine/simulator.h"

using namespace tessera;

namespace {

// Lets the test decide when each step may run: execute() waits for a permit.
class GatedExecutor : public Executor {
 public:
  explicit GatedExecutor(SimulatedExecutor& inner) : inner_(inner) {}
  void add_sequence(SeqId s, const SamplingParams& p, std::span<const int32_t> t) override {
    inner_.add_sequence(s, p, t);
  }
  void remove_sequence(SeqId s) override { inner_.remove_sequence(s); }
  size_t n_sequences() const override { return inner_.n_sequences(); }
  void execute(const StepInput& in, StepOutput& out) override {
    std::unique_lock lock(mutex_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return permits_ > 0 || open_; });
    if (!open_) --permits_;
    --waiting_;
    lock.unlock();
    inner_.execute(in, out);
  }
  int max_batch_tokens() const override { return inner_.max_batch_tokens(); }
  int max_logits_rows() const override { return inner_.max_logits_rows(); }

  void permit(int n) {
    std::lock_guard lock(mutex_);
    permits_ += n;
    cv_.notify_all();
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // Blocks until the engine thread is inside execute(), waiting for a permit.
  void wait_for_step() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return waiting_ > 0; });
  }

 private:
  SimulatedExecutor& inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int permits_ = 0;
  int waiting_ = 0;
  bool open_ = false;
};

struct Fixture {
  SimulatorConfig sim_config;
  std::unique_ptr<SimulatedExecutor> sim;
  EngineConfig config;

  explicit Fixture(int n_blocks = 256) {
    sim_config.vocab_size = 500;
    sim_config.n_blocks = n_blocks;
    sim_config.block_size = 8;
    sim = std::make_unique<SimulatedExecutor>(sim_config);
    config.scheduler.max_num_batched_tokens = 64;
    config.scheduler.max_num_seqs = 8;
    config.scheduler.max_model_len = 1024;
    config.n_blocks = n_blocks;
    config.block_size = 8;
    config.vocab_size = 500;
    config.check_invariants = true;
  }

  std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int max_tokens) const {
    std::vector<int32_t> ctx = prompt, out;
    for (int i = 0; i < max_tokens; ++i) {
      out.push_back(sim->token_after(SimulatedExecutor::context_value(ctx), 0));
      ctx.push_back(out.back());
    }
    return out;
  }
};

Request greedy(std::vector<int32_t> prompt, int max_tokens, std::string tenant = "") {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.tenant = std::move(tenant);
  return r;
}

// Lets three steps run and reads their events (returned), then calls `action` while step 4
// is in flight and lets that step finish: the engine handles the action before step 5.
std::vector<StreamEvent> act_during_fourth_step(GatedExecutor& gate, RequestStream& stream, int events_in_three_steps,
                                                const std::function<void()>& action) {
  gate.permit(3);
  std::vector<StreamEvent> first(events_in_three_steps);
  for (StreamEvent& e : first) EXPECT_TRUE(stream.next(e));
  gate.wait_for_step();
  action();
  gate.permit(1);
  return first;
}

void expect_whole(Engine& engine) {
  engine.stop();
  EXPECT_EQ(engine.internal_error(), "");
  EXPECT_TRUE(engine.core().is_idle());
  EXPECT_EQ(engine.core().kv().n_free(), engine.core().kv().n_blocks());
  EXPECT_EQ(engine.n_in_flight(), 0u);
}

}  // namespace

TEST(Engine, ClientsOnManyThreadsGetExactOutputs) {
  Fixture f;
  Engine engine(f.config, *f.sim);
  std::vector<std::thread> clients;
  std::atomic<int> mismatches{0}, done{0};
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 25; ++i) {
        std::vector<int32_t> prompt(1 + rng() % 50);
        for (auto& x : prompt) x = rng() % 500;
        const int max_tokens = 1 + rng() % 30;
        SubmitResult r = engine.submit(greedy(prompt, max_tokens));
        ASSERT_TRUE(r.ok()) << r.rejection->message;
        const RequestOutput out = r.stream->collect();
        if (out.tokens[0] != f.reference(prompt, max_tokens) || out.finish[0] != FinishReason::Length) ++mismatches;
        ++done;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(done, 200);
  EXPECT_EQ(mismatches, 0);
  expect_whole(engine);
  EXPECT_EQ(engine.stats().requests_finished, 200);
}

TEST(Engine, StatsIncludeARequestOnceItsStreamHasEnded) {
  // The snapshot is published before the step's events end the streams (the e2e metrics
  // tests read /metrics right after a response; published after, they read it stale under
  // load). Many rounds, because the old order failed only when the client won the race.
  Fixture f;
  Engine engine(f.config, *f.sim);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  for (int i = 0; i < 2000; ++i) {
    SubmitResult r = engine.submit(greedy(prompt, 1));
    ASSERT_TRUE(r.ok());
    r.stream->collect();
    const EngineStats s = engine.stats();
    ASSERT_EQ(s.requests_finished, i + 1) << "round " << i;
    ASSERT_EQ(s.prefix.queried_tokens, int64_t{i + 1} * static_cast<int64_t>(prompt.size())) << "round " << i;
  }
  expect_whole(engine);
}

TEST(Engine, AbortTakesEffectWithinOneStep) {
  Fixture f;
  GatedExecutor gate(*f.sim);
  Engine engine(f.config, gate);
  SubmitResult r = engine.submit(greedy({1, 2, 3}, 500));
  ASSERT_TRUE(r.ok());
  const auto first = act_during_fourth_step(gate, *r.stream, 3, [&] { engine.abort(r.id); });
  for (int i = 0; i < 3; ++i) EXPECT_EQ(first[i].token, f.reference({1, 2, 3}, 3)[i]);
  StreamEvent e;
  int tokens_after_abort = 0;
  FinishReason finish = FinishReason::None;
  while (r.stream->next(e)) {
    if (e.token >= 0) ++tokens_after_abort;
    finish = e.finish;
  }
  EXPECT_LE(tokens_after_abort, 1);
  EXPECT_EQ(finish, FinishReason::Abort);
  gate.open();
  expect_whole(engine);
  EXPECT_EQ(engine.stats().requests_aborted, 1);
}

TEST(Engine, FinishSequenceEndsOneChoiceWithinOneStep) {
  Fixture f;
  GatedExecutor gate(*f.sim);
  Engine engine(f.config, gate);
  Request r = greedy({1, 2, 3}, 200);
  r.n = 2;  // greedy: both choices follow the reference
  SubmitResult s = engine.submit(r);
  ASSERT_TRUE(s.ok());
  // The prompt and fork, then two decode steps: three tokens for each choice.
  act_during_fourth_step(gate, *s.stream, 6, [&] { engine.finish_sequence(s.id, 0, FinishReason::Stop); });
  gate.open();
  StreamEvent e;
  std::vector<int32_t> tokens[2];
  FinishReason finish[2] = {FinishReason::None, FinishReason::None};
  while (s.stream->next(e)) {
    if (e.token >= 0) tokens[e.choice].push_back(e.token);
    if (e.finish != FinishReason::None) finish[e.choice] = e.finish;
  }
  EXPECT_LE(tokens[0].size(), 1u);  // step 4's, at most
  EXPECT_EQ(finish[0], FinishReason::Stop);
  const std::vector<int32_t> ref = f.reference({1, 2, 3}, 200);
  EXPECT_EQ(tokens[1], std::vector<int32_t>(ref.begin() + 3, ref.end()));
  EXPECT_EQ(finish[1], FinishReason::Length);
  engine.finish_sequence(s.id, 1, FinishReason::Stop);  // finished: ignored
  expect_whole(engine);
  EXPECT_EQ(engine.stats().requests_finished, 1);
  EXPECT_EQ(engine.stats().generated_tokens, static_cast<int64_t>(6 + tokens[0].size() + tokens[1].size()));
  EXPECT_EQ(engine.stats().prompt_tokens, 3);
}

TEST(Engine, RejectionsAreTypedAndCountNothing) {
  Fixture f;
  f.config.admission.max_waiting_requests = 3;
  f.config.admission.max_waiting_tokens = 100;
  f.config.admission.max_requests_per_tenant = 2;
  GatedExecutor gate(*f.sim);
  Engine engine(f.config, gate);
  // Nothing starts while the gate is shut, so the waiting counts are exact.
  const auto reason = [](const SubmitResult& r) { return r.ok() ? std::string("ok") : r.rejection->message; };
  SubmitResult bad = engine.submit(greedy({}, 5));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(http_status(bad.rejection->reason), 400);
  SubmitResult a1 = engine.submit(greedy({1, 2}, 5, "a"));
  SubmitResult a2 = engine.submit(greedy({1, 2}, 5, "a"));
  ASSERT_TRUE(a1.ok() && a2.ok());
  SubmitResult a3 = engine.submit(greedy({1, 2}, 5, "a"));
  ASSERT_FALSE(a3.ok());
  EXPECT_EQ(a3.rejection->reason, RejectReason::TenantLimit);
  EXPECT_EQ(http_status(a3.rejection->reason), 429);
  SubmitResult big = engine.submit(greedy(std::vector<int32_t>(97, 1), 5, "b"));  // 4 + 97 > 100 tokens
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.rejection->reason, RejectReason::QueueFull);
  EXPECT_NE(big.rejection->message.find("100"), std::string::npos) << reason(big);
  SubmitResult b1 = engine.submit(greedy({3}, 5, "b"));
  ASSERT_TRUE(b1.ok());
  SubmitResult b2 = engine.submit(greedy({4}, 5, "c"));  // 4th waiting request: queue full
  ASSERT_FALSE(b2.ok());
  EXPECT_EQ(b2.rejection->reason, RejectReason::QueueFull);
  EXPECT_EQ(http_status(b2.rejection->reason), 429);

  gate.open();
  for (auto* r : {&a1, &a2, &b1}) EXPECT_EQ(r->stream->collect().finish[0], FinishReason::Length);
  // Everything finished: room again.
  SubmitResult again = engine.submit(greedy({1, 2}, 5, "a"));
  ASSERT_TRUE(again.ok());
  again.stream->collect();

  engine.drain(std::chrono::milliseconds(1000));
  SubmitResult late = engine.submit(greedy({1, 2}, 5, "a"));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.rejection->reason, RejectReason::Draining);
  EXPECT_EQ(http_status(late.rejection->reason), 503);
  expect_whole(engine);
}

TEST(Engine, DrainWaitsForRequestsThenAbortsAtTheTimeout) {
  Fixture f;
  GatedExecutor gate(*f.sim);
  Engine engine(f.config, gate);
  SubmitResult slow = engine.submit(greedy({1, 2, 3}, 400));
  ASSERT_TRUE(slow.ok());
  gate.permit(2);
  gate.wait_for_step();  // step 3 is stuck behind the gate: the request cannot finish
  std::thread drainer([&] { engine.drain(std::chrono::milliseconds(1)); });
  while (engine.n_queued_messages() == 0) std::this_thread::yield();  // the abort is queued
  gate.open();
  drainer.join();
  const RequestOutput out = slow.stream->collect();
  EXPECT_EQ(out.finish[0], FinishReason::Abort);
  EXPECT_EQ(out.tokens[0].size(), 3u);
  EXPECT_EQ(engine.n_in_flight(), 0u);
  expect_whole(engine);

  Fixture g;
  Engine quick(g.config, *g.sim);
  std::vector<SubmitResult> rs;
  for (int i = 0; i < 20; ++i) rs.push_back(quick.submit(greedy({i + 1, 2, 3}, 20)));
  quick.drain(std::chrono::seconds(60));  // ample: all finish normally
  for (auto& r : rs) EXPECT_EQ(r.stream->collect().finish[0], FinishReason::Length);
  expect_whole(quick);
}

TEST(Engine, StopAbortsWhatIsLeftAndClosesEveryStream) {
  Fixture f;
  GatedExecutor gate(*f.sim);
  auto engine = std::make_unique<Engine>(f.config, gate);
  std::vector<SubmitResult> rs;
  for (int i = 0; i < 10; ++i) {
    Request r = greedy({i + 1, 7}, 100);
    r.n = 1 + i % 3;
    rs.push_back(engine->submit(r));
  }
  gate.permit(5);
  gate.wait_for_step();
  std::thread stopper([&] { engine->stop(); });
  while (!engine->stopping()) std::this_thread::yield();
  gate.open();
  stopper.join();
  for (auto& r : rs) {
    const RequestOutput out = r.stream->collect();
    for (FinishReason fr : out.finish) EXPECT_EQ(fr, FinishReason::Abort);
  }
  EXPECT_TRUE(engine->core().is_idle());
  EXPECT_FALSE(engine->submit(greedy({1}, 1)).ok());
}

// A thousand streams from several threads, most cancelled at random points: every stream
// ends, survivors are exact, and the pool is whole afterwards.
TEST(Engine, CancellingMostOfAThousandStreams) {
  Fixture f(96);  // tight: preemption happens
  f.config.scheduler.max_num_seqs = 16;
  Engine engine(f.config, *f.sim);
  std::atomic<int> exact{0}, survivors{0}, aborted{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::vector<std::tuple<SubmitResult, std::vector<int32_t>, int>> mine;
      for (int i = 0; i < 250; ++i) {
        std::vector<int32_t> prompt(1 + rng() % 60);
        for (auto& x : prompt) x = rng() % 500;
        const int max_tokens = 1 + rng() % 40;
        SubmitResult r = engine.submit(greedy(prompt, max_tokens));
        ASSERT_TRUE(r.ok()) << r.rejection->message;
        mine.emplace_back(std::move(r), prompt, max_tokens);
      }
      for (auto& [r, prompt, max_tokens] : mine) {
        std::vector<int32_t> tokens;
        FinishReason finish = FinishReason::None;
        StreamEvent e;
        const bool cancel = rng() % 4 != 0;
        int read_before_cancel = cancel ? static_cast<int>(rng() % 3) : -1;
        while (r.stream->next(e)) {
          if (e.token >= 0) tokens.push_back(e.token);
          if (e.finish != FinishReason::None) finish = e.finish;
          if (read_before_cancel-- == 0) engine.abort(r.id);
        }
        if (cancel && read_before_cancel >= 0) engine.abort(r.id);  // it ended first: a no-op
        const auto ref = f.reference(prompt, max_tokens);
        if (finish == FinishReason::Abort) {
          ++aborted;
          if (tokens.size() <= ref.size() && std::equal(tokens.begin(), tokens.end(), ref.begin())) ++exact;
        } else {
          ++survivors;
          if (finish == FinishReason::Length && tokens == ref) ++exact;
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(aborted + survivors, 1000);
  // How many cancellations land before their request ends depends on how far the engine runs
  // ahead of the readers: 84 of ~750 on a loaded 2-core CI machine, where 100 was once asked.
  EXPECT_GT(aborted, 20);
  EXPECT_EQ(exact, 1000);  // survivors whole, aborted ones a prefix of the reference
  expect_whole(engine);
}

// Progress is published on the stream when the request is first scheduled, and prompt
// logprobs before the first token event; token events carry logprobs when asked.
TEST(Engine, ProgressAndPromptLogprobsComeBeforeTheFirstToken) {
  Fixture f;
  GatedExecutor gate(*f.sim);
  Engine engine(f.config, gate);
  Request first = greedy({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, 3);
  // Taken before submit: the engine may schedule the request (and stamp scheduled_at) before
  // the gate opens; it publishes the progress only after the gated forward.
  const auto before = std::chrono::steady_clock::now();
  SubmitResult a = engine.submit(first);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a.stream->progress()->scheduled_at.has_value());
  gate.open();
  a.stream->collect();
  const RequestProgress pa = *a.stream->progress();
  ASSERT_TRUE(pa.scheduled_at.has_value());
  EXPECT_GE(*pa.scheduled_at, before);
  EXPECT_EQ(pa.cached_prompt_tokens, 0);
  EXPECT_EQ(pa.prompt_logprobs, nullptr);

  // The same prompt again: two blocks of 8 are cached.
  Request again = first;
  again.logprobs = true;
  again.sampling.n_logprobs = 2;
  SubmitResult b = engine.submit(again);
  ASSERT_TRUE(b.ok());
  StreamEvent e;
  int n_tokens = 0;
  while (b.stream->next(e)) {
    if (e.token < 0) continue;
    ++n_tokens;
    ASSERT_TRUE(e.logprobs.has_value());
    EXPECT_EQ(e.logprobs->chosen.token, e.token);
    EXPECT_EQ(e.logprobs->top.size(), 2u);
  }
  EXPECT_EQ(n_tokens, 3);
  EXPECT_EQ(b.stream->progress()->cached_prompt_tokens, 16);

  // Prompt logprobs: set before the first event can be read.
  Request echo = first;
  echo.prompt_logprobs = 1;
  SubmitResult c = engine.submit(echo);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.stream->next(e));
  const RequestProgress pc = *c.stream->progress();
  ASSERT_NE(pc.prompt_logprobs, nullptr);
  EXPECT_EQ(pc.prompt_logprobs->size(), first.prompt.size() - 1);
  for (size_t i = 0; i < pc.prompt_logprobs->size(); ++i) {
    const Logprobs& lp = (*pc.prompt_logprobs)[i];
    EXPECT_EQ(lp.chosen.token, first.prompt[i + 1]);
    EXPECT_EQ(lp.top.size(), 1u);
    const std::vector<int32_t> ctx(first.prompt.begin(), first.prompt.begin() + i + 1);
    EXPECT_EQ(lp.chosen.logprob,
              f.sim->fake_logprobs(SimulatedExecutor::context_value(ctx), first.prompt[i + 1], 1).chosen.logprob);
  }
  EXPECT_EQ(pc.cached_prompt_tokens, 0);  // no prefix hits for prompt logprobs
  c.stream->collect();
  expect_whole(engine);
}

TEST(Engine, PerTenantTokenLimitIsTypedAndReleased) {
  Fixture f;
  f.config.admission.max_tokens_per_tenant = 40;
  GatedExecutor gate(*f.sim);
  Engine engine(f.config, gate);
  Request r = greedy({1, 2, 3, 4}, 8, "t");  // 4 + 8 x 2 = 20 tokens
  r.n = 2;
  SubmitResult a = engine.submit(r);
  SubmitResult b = engine.submit(r);
  ASSERT_TRUE(a.ok() && b.ok());
  SubmitResult c = engine.submit(greedy({1}, 1, "t"));  // 40 + 2 > 40
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.rejection->reason, RejectReason::TenantLimit);
  EXPECT_NE(c.rejection->message.find("40 tokens in flight + 2"), std::string::npos) << c.rejection->message;
  SubmitResult other = engine.submit(greedy({1}, 1, "u"));
  EXPECT_TRUE(other.ok());
  SubmitResult huge = engine.submit(greedy({1}, 40, "u"));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(http_status(huge.rejection->reason), 400);
  gate.open();
  for (auto* s : {&a, &b, &other}) s->stream->collect();
  SubmitResult d = engine.submit(greedy({1}, 1, "t"));  // released
  EXPECT_TRUE(d.ok());
  d.stream->collect();
  expect_whole(engine);
}
