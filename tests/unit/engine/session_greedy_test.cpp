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
