// Ending one choice of a request early (EngineCore::finish_choice, what the server does
// when a choice stops on a stop string): the choice stops consuming steps at once, its own
// KV blocks are freed while the blocks its siblings share stay, the siblings' outputs are
// those of a run without the early finish, and the request ends with its last choice.
// Also the engine's prompt-token counter, which counts a request when its prefill completes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "unit/engine/sim_harness.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

// 37 prompt tokens in 16-token blocks: two full blocks and a partial one the choices share
// after the fork.
const SimSetup kSetup{.n_blocks = 64, .block_size = 16, .max_num_batched_tokens = 256};

Request sampled_request(int n, int max_tokens, int prompt_len = 37) {
  std::mt19937 rng(5);
  Request r;
  r.prompt = random_tokens(rng, prompt_len, 1000);
  r.n = n;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 1000;
  r.sampling.max_tokens = max_tokens;
  return r;
}

int used_blocks(SimEngine& e) { return e.core().kv().n_blocks() - e.core().kv().n_free(); }

}  // namespace

TEST(EngineSimFinishChoice, OneChoiceStopsAtOnceAndItsSiblingsAreUnchanged) {
  SimEngine e(kSetup);
  const Request r = sampled_request(4, 30);
  const RequestId id = e.add(r);
  for (int i = 0; i < 5; ++i) e.step();  // the prompt and fork, then four decode steps
  const Collected& o = e.out(id);
  for (int c = 0; c < 4; ++c) ASSERT_EQ(o.tokens[c].size(), 5u);
  // Two shared prompt blocks, plus each choice's own copy of the partial third block.
  ASSERT_EQ(used_blocks(e), 2 + 4);

  const std::vector<SeqEvent> events = e.finish_choice(id, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].choice, 1);
  EXPECT_EQ(events[0].token, -1);
  EXPECT_EQ(events[0].finish, FinishReason::Stop);
  EXPECT_FALSE(events[0].request_done);
  EXPECT_EQ(used_blocks(e), 2 + 3);  // its own block is free now; the shared ones stay
  EXPECT_EQ(e.core().scheduler().n_live_choices(), 3u);
  e.core().check_invariants();

  e.run();
  const std::vector<int32_t> ref1 = e.reference(r, 1);
  EXPECT_EQ(o.tokens[1], std::vector<int32_t>(ref1.begin(), ref1.begin() + 5));
  EXPECT_EQ(o.finish[1], FinishReason::Stop);
  for (int c : {0, 2, 3}) {
    EXPECT_EQ(o.tokens[c], e.reference(r, c)) << "choice " << c;
    EXPECT_EQ(o.finish[c], FinishReason::Length) << "choice " << c;
  }
  EXPECT_TRUE(o.done);
  // Computed tokens: the prompt once, 29 decode tokens for each choice that ran to the end
  // (the last sampled token is never computed), and the 4 the stopped choice computed.
  const EngineStats st = e.core().stats();
  EXPECT_EQ(st.scheduled_tokens, 37 + 3 * 29 + 4);
  EXPECT_EQ(st.generated_tokens, 3 * 30 + 5);
  EXPECT_EQ(st.requests_finished, 1);  // ended by its last choice's length, not aborted
  EXPECT_EQ(st.requests_aborted, 0);
  e.expect_whole();
}

TEST(EngineSimFinishChoice, ChoicesFinishedBeforeTheForkEndAsItForks) {
  SimSetup s = kSetup;
  s.max_num_batched_tokens = 16;  // the prompt takes three steps
  SimEngine e(s);
  Request r = sampled_request(3, 20);
  r.logprobs = true;  // the dropped tokens' logprobs must go too
  r.sampling.n_logprobs = 2;
  const RequestId id = e.add(r);
  e.step();
  // Choice 0's sequence still computes the prompt the others need: nothing ends yet.
  EXPECT_TRUE(e.finish_choice(id, 0).empty());
  EXPECT_TRUE(e.finish_choice(id, 2, FinishReason::Abort).empty());
  EXPECT_EQ(e.core().scheduler().n_live_choices(), 3u);
  e.run();
  const Collected& o = e.out(id);
  EXPECT_EQ(e.core().stats().forks, 1);
  EXPECT_TRUE(o.tokens[0].empty());
  EXPECT_EQ(o.finish[0], FinishReason::Stop);
  EXPECT_TRUE(o.tokens[2].empty());
  EXPECT_EQ(o.finish[2], FinishReason::Abort);
  EXPECT_EQ(o.tokens[1], e.reference(r, 1));
  EXPECT_EQ(o.finish[1], FinishReason::Length);
  const std::vector<Logprobs> want = e.reference_logprobs(r, o.tokens[1]);
  ASSERT_EQ(o.logprobs[1].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    expect_same_logprobs(o.logprobs[1][i], want[i], "token " + std::to_string(i));
  EXPECT_EQ(e.core().stats().generated_tokens, 20);
  EXPECT_EQ(e.core().stats().scheduled_tokens, 37 + 19);
  e.expect_whole();
}

TEST(EngineSimFinishChoice, TheLastChoiceEndsTheRequestAndEverythingElseIsIgnored) {
  SimEngine e(kSetup);
  const RequestId id = e.add(sampled_request(2, 30));
  e.step();
  e.step();
  EXPECT_TRUE(e.finish_choice(id, 5).empty());  // no such choice
  EXPECT_TRUE(e.finish_choice(id, -1).empty());
  EXPECT_TRUE(e.finish_choice(id + 100, 0).empty());  // no such request
  EXPECT_THROW(e.core().finish_choice(id, 0, FinishReason::None), Error);
  ASSERT_EQ(e.finish_choice(id, 0).size(), 1u);
  EXPECT_TRUE(e.finish_choice(id, 0).empty());  // already ended
  const std::vector<SeqEvent> last = e.finish_choice(id, 1, FinishReason::Length);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_TRUE(last[0].request_done);
  EXPECT_FALSE(e.core().has_work());
  EXPECT_EQ(e.core().stats().requests_finished, 1);

  // n = 1: the one sequence ends at once.
  const RequestId single = e.add(sampled_request(1, 30));
  e.step();
  const std::vector<SeqEvent> one = e.finish_choice(single, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].request_done);
  EXPECT_EQ(e.out(single).tokens[0].size(), 1u);
  e.expect_whole();
}

TEST(EngineSimPromptTokens, CountedOncePerRequestWhenItsPrefillCompletes) {
  SimSetup s = kSetup;
  s.max_num_batched_tokens = 16;
  SimEngine e(s);
  const RequestId id = e.add(sampled_request(3, 5));
  e.step();
  e.step();
  EXPECT_EQ(e.core().stats().prompt_tokens, 0);  // 32 of 37 computed: not yet
  e.step();                                      // the prompt completes; three choices fork
  ASSERT_EQ(e.out(id).tokens[0].size(), 1u);
  EXPECT_EQ(e.core().stats().prompt_tokens, 37);  // the request's prompt, once
  e.run();
  EXPECT_EQ(e.core().stats().prompt_tokens, 37);

  // Aborted mid-prefill: its prefill never completed, so it is not counted.
  Request other = sampled_request(1, 5, 40);
  for (int32_t& t : other.prompt) t = (t + 1) % 1000;  // no prefix hit: 16 of 40 computed
  const RequestId aborted = e.add(other);
  e.step();
  e.abort(aborted);
  // A prefix-cache hit still counts the whole prompt (as vLLM).
  Request again = sampled_request(1, 5);
  e.add(again);
  e.run();
  EXPECT_GT(e.core().stats().prefix.hit_tokens, 0);
  EXPECT_EQ(e.core().stats().prompt_tokens, 37 + 37);
  e.expect_whole();
}
