// Gemma 3 270M against llama.cpp on the same GGUF (fixtures from
// tools/fixtures/make_gemma3_fixtures.py): teacher-forced logits of prompts up to 700 tokens
// (past the 512-token sliding window), greedy continuations, and perplexity at a 1024-token
// window (every scored position past the local layers' window). The model file comes from
// `make test-models` (scripts/fetch-model.sh gemma3-270m); without it these tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "eval/perplexity.h"
#include "tokenizer/tokenizer.h"
#include "unit/model/parity_fixture.h"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr const char* kModelFile = "gemma-3-270m-q4_k_m.gguf";

// The cached model's path, or "" (the test then skips, naming the command that fetches it).
std::string gemma3_path() {
  const char* cache = std::getenv("TESSERA_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache && *cache ? cache : std::string(home ? home : ".") + "/.cache/tessera/models";
  const std::string path = dir + "/" + kModelFile;
  return std::filesystem::exists(path) ? path : "";
}

#define SKIP_WITHOUT_GEMMA3(path)                                                                             \
  if ((path).empty())                                                                                         \
  GTEST_SKIP() << kModelFile << " is not in the model cache: run `make test-models` (scripts/fetch-model.sh " \
               << "gemma3-270m)"

nlohmann::json read_index() {
  std::ifstream jf(std::string(TESSERA_FIXTURES_DIR) + "/gemma3/gemma3_270m_q4_k_m.json");
  if (!jf) throw std::runtime_error("missing fixture gemma3/gemma3_270m_q4_k_m.json");
  return nlohmann::json::parse(jf);
}

SessionOptions options(const std::string& path, int ctx, int max_logits) {
  SessionOptions so;
  so.model = path;
  so.backend.threads = 1;  // ctest runs suites side by side on 2 cores
  so.ctx = ctx;
  so.max_logits = max_logits;
  so.max_batch_tokens = std::max(max_logits, 128);
  return so;
}

}  // namespace

TEST(Gemma3Parity, TeacherForcedLogitsMatchLlamaCpp) {
  const std::string path = gemma3_path();
  SKIP_WITHOUT_GEMMA3(path);
  int top_k = 0;
  const auto records = read_topk(std::string(TESSERA_FIXTURES_DIR) + "/gemma3/logits_gemma3_270m_q4_k_m.bin", top_k);
  ASSERT_FALSE(records.empty());
  // Chunks of 128 rows: the long prompt's later chunks attend across the 512-token window
  // through the paged cache, as a chunked prefill does.
  constexpr int kChunk = 128;
  Session session(options(path, 1024, kChunk));
  const int n_vocab = session.config().n_vocab;
  constexpr double kClearMargin = 0.3;  // nats; below it llama.cpp's own top-1 moves with its settings
  int64_t agree = 0, total = 0, clear_agree = 0, clear_total = 0, past_window = 0;
  double kl_sum = 0, kl_past_window = 0;
  for (const Record& r : records) {
    ASSERT_EQ(session.tokenizer().encode(r.text, r.add_special, r.parse_special), r.tokens) << r.name;
    SequenceBlocks seq;
    double kl_prompt = 0;
    for (size_t done = 0; done < r.tokens.size(); done += kChunk) {
      const size_t n = std::min<size_t>(kChunk, r.tokens.size() - done);
      std::vector<float> logits;
      session.feed(seq, std::span<const int32_t>(r.tokens.data() + done, n), ForwardBatch::Logits::All, logits);
      for (size_t i = 0; i < n; ++i) {
        const size_t p = done + i;
        const auto ours = log_softmax(logits.data() + i * n_vocab, n_vocab);
        const Position& ref = r.pos[p];
        const int32_t our_top = static_cast<int32_t>(std::max_element(ours.begin(), ours.end()) - ours.begin());
        agree += our_top == ref.top_ids[0];
        if (ref.top_logprobs[0] - ref.top_logprobs[1] >= kClearMargin) {
          ++clear_total;
          clear_agree += our_top == ref.top_ids[0];
        } else if (our_top != ref.top_ids[0]) {
          std::printf("near-tie at %s pos %zu: llama.cpp %d (margin %.4f), tessera %d\n", r.name.c_str(), p,
                      ref.top_ids[0], ref.top_logprobs[0] - ref.top_logprobs[1], our_top);
        }
        const double kl = topk_kl(ref, ours);
        kl_sum += kl;
        kl_prompt += kl;
        if (p >= 512) {
          ++past_window;
          kl_past_window += kl;
        }
        ++total;
      }
    }
    std::printf("%-6s %4zu tokens: mean KL %.5f\n", r.name.c_str(), r.tokens.size(), kl_prompt / r.tokens.size());
    seq.release_all(session.pool());
  }
  const double agreement = double(agree) / total, mean_kl = kl_sum / total;
  const double clear_agreement = double(clear_agree) / clear_total;
  std::printf(
      "gemma3 parity with llama.cpp over %lld positions: top-1 %.4f (%.4f over %lld clear), mean KL %.5f "
      "(%.5f over %lld positions past the window)\n",
      static_cast<long long>(total), agreement, clear_agreement, static_cast<long long>(clear_total), mean_kl,
      past_window ? kl_past_window / past_window : 0.0, static_cast<long long>(past_window));
  ASSERT_GT(past_window, 100) << "the fixtures need a prompt longer than the window";
  // llama.cpp against itself on these prompts (tools/fixtures/gemma3_noise_floor.py: flash
  // attention off and an f32 KV cache against the fixtures' settings): mean KL 0.0053 by this
  // estimator, top-1 99.7% where its winner leads by >= 0.2 nats. tessera measures 0.0051:
  // the bound is that floor with a margin, not the 0.005 the SmolLM2 test holds.
  EXPECT_GE(clear_agreement, 0.99);
  EXPECT_LE(mean_kl, 0.006);
  EXPECT_LE(kl_past_window / past_window, 0.006);
}

TEST(Gemma3Parity, GreedyContinuationsMatchLlamaCppUpToNearTies) {
  const std::string path = gemma3_path();
  SKIP_WITHOUT_GEMMA3(path);
  const auto index = read_index();
  Session session(options(path, 256, 1));
  const int n_vocab = session.config().n_vocab;
  for (const auto& g : index.at("greedy")) {
    const auto prompt = g.at("prompt_tokens").get<std::vector<int32_t>>();
    const auto want = g.at("continuation").get<std::vector<int32_t>>();
    ASSERT_EQ(session.tokenizer().encode(g.at("text").get<std::string>(), true, g.at("parse_special").get<bool>()),
              prompt);
    SequenceBlocks seq;
    std::vector<float> logits;
    session.feed(seq, prompt, ForwardBatch::Logits::Last, logits);
    size_t same = 0;
    for (; same < want.size(); ++same) {
      const auto lp = log_softmax(logits.data(), n_vocab);
      const int32_t ours = static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
      if (ours != want[same]) {
        // A divergence is allowed only at a near-tie: our pick leads llama.cpp's by less than
        // llama.cpp's own top-1 moves with its settings (0.30 nats, the noise floor above).
        // Past it the texts differ and no longer compare.
        const double margin = lp[ours] - lp[want[same]];
        std::printf("%s: diverges at token %zu (tessera %d, llama.cpp %d, margin %.4f nats in tessera)\n",
                    g.at("name").get<std::string>().c_str(), same, ours, want[same], margin);
        EXPECT_LT(margin, 0.3) << g.at("name");
        break;
      }
      logits.clear();
      const int32_t next[] = {ours};
      session.feed(seq, next, ForwardBatch::Logits::Last, logits);
    }
    std::printf("%s: %zu of %zu greedy tokens equal to llama.cpp's\n", g.at("name").get<std::string>().c_str(), same,
                want.size());
    seq.release_all(session.pool());
  }
}

TEST(Gemma3Parity, PerplexityPastTheWindowMatchesLlamaCpp) {
  const std::string path = gemma3_path();
  SKIP_WITHOUT_GEMMA3(path);
  const auto ref = read_index().at("ppl");
  const int window = ref.at("n_ctx").get<int>();
  const int chunks = ref.at("n_chunks").get<int>();
  std::ifstream tf(std::string(TESSERA_FIXTURES_DIR) + "/" + ref.at("corpus").get<std::string>(), std::ios::binary);
  ASSERT_TRUE(tf) << "missing corpus";
  std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp reads -f files
  Session session(options(path, window, 128));
  const auto tokens = session.tokenizer().encode(text, true, false);
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), ref.at("n_corpus_tokens").get<int64_t>());
  const PerplexityResult r = perplexity(session, tokens, window, chunks);
  ASSERT_EQ(r.n_chunks, chunks);
  EXPECT_EQ(r.n_scored, chunks * ref.at("scored_per_chunk").get<int64_t>());
  const double ref_ppl = ref.at("ppl").get<double>();
  std::printf("gemma3 perplexity over %d chunks of %d: tessera %.4f, llama.cpp %.4f (%+.3f%%)\n", chunks, window, r.ppl,
              ref_ppl, 100 * (r.ppl - ref_ppl) / ref_ppl);
  EXPECT_LT(std::fabs(r.ppl - ref_ppl) / ref_ppl, 0.005);
}
