// Session::decode_greedy (the greedy step `tessera bench model` times) against feeding the
// same tokens and taking the argmax of the full logits row on the host: the same tokens for
// 24 steps on two sequences of one session, and the KV grows by one token a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/session.h"

using namespace tessera;

TEST(SessionGreedy, DecodeGreedyPicksTheHostArgmaxOfTheFullRow) {
  SessionOptions o;
  o.model = "dummy:llama3-tiny";
  o.backend.threads = 2;
  o.ctx = 64;
  o.max_batch_tokens = 32;
  Session session(o);
  const std::vector<int32_t> prompt = {5, 17, 42, 99, 3, 250, 7};
  SequenceBlocks full, greedy;
  std::vector<float> logits;
  session.feed(full, prompt, ForwardBatch::Logits::Last, logits);
  std::vector<float> unused;
  session.feed(greedy, std::span<const int32_t>(prompt.data(), prompt.size() - 1), ForwardBatch::Logits::None, unused);
  int32_t a = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  int32_t b = session.decode_greedy(greedy, prompt.back());
  ASSERT_EQ(a, b);
  for (int step = 0; step < 24; ++step) {
    logits.clear();
    session.feed(full, std::span<const int32_t>(&a, 1), ForwardBatch::Logits::Last, logits);
    a = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    b = session.decode_greedy(greedy, b);
    ASSERT_EQ(a, b) << "step " << step;
    EXPECT_EQ(greedy.n_tokens, full.n_tokens);
  }
  EXPECT_EQ(greedy.n_tokens, static_cast<int>(prompt.size()) + 24);
  full.release_all(session.pool());
  greedy.release_all(session.pool());
}

// At tensor parallelism 2 (qwen3-tiny F32: its two KV heads split, one a rank) every rank runs
// the greedy step and rank 0's argmax comes back: TP 1's greedy tokens.
TEST(SessionGreedy, DecodeGreedyAtTensorParallelTwoGivesOneRanksTokens) {
  const auto run = [](int tp) {
    SessionOptions o;
    o.model = "dummy:qwen3-tiny:f32";
    o.dummy_seed = 7;
    o.backend.threads = 2;
    o.ctx = 64;
    o.max_batch_tokens = 16;
    o.tensor_parallel_size = tp;
    Session session(o);
    SequenceBlocks seq;
    std::vector<float> unused;
    const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35};
    session.feed(seq, std::span<const int32_t>(prompt.data(), prompt.size() - 1), ForwardBatch::Logits::None, unused);
    std::vector<int32_t> out = {session.decode_greedy(seq, prompt.back())};
    for (int step = 0; step < 16; ++step) out.push_back(session.decode_greedy(seq, out.back()));
    seq.release_all(session.pool());
    return out;
  };
  EXPECT_EQ(run(2), run(1));
}
