// Whole-model parity with llama.cpp on the same GGUF: teacher-forced logits of varied prompts
// (fixtures made by tools/fixtures/make_logit_fixtures.py with llama-cpp-python), and
// perplexity with llama.cpp's window rule (tools/fixtures/make_ppl_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "eval/perplexity.h"
#include "test_model.h"
#include "unit/model/parity_fixture.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using namespace tessera::test;

TEST(LlamaParity, TeacherForcedLogitsMatchLlamaCpp) {
  const std::string model = test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  int top_k = 0;
  const auto records = read_topk(std::string(TESSERA_FIXTURES_DIR) + "/llama/logits_smollm2_q4_1.bin", top_k);
  ASSERT_FALSE(records.empty());
  SessionOptions so;
  so.model = model;
  so.max_logits = 512;
  so.backend.threads = 1;  // ctest runs suites side by side on 2 cores
  Session session(so);
  const int n_vocab = session.config().n_vocab;
  // llama.cpp disagrees with itself on near-ties: flash attention on vs off moves its own top-1
  // at 3.3% of these positions (noise floor measured by the fixture generator). So top-1 is
  // held to 99% where llama.cpp's winner leads its runner-up by a clear margin, and overall
  // to that noise floor.
  constexpr double kClearMargin = 0.3;  // nats
  int64_t agree = 0, total = 0, clear_agree = 0, clear_total = 0;
  double kl_sum = 0;
  for (const Record& r : records) {
    // The same ids as llama.cpp's tokenizer first: the logits compare only on equal inputs.
    ASSERT_EQ(session.tokenizer().encode(r.text, r.add_special, r.parse_special), r.tokens) << r.name;
    SequenceBlocks seq;
    std::vector<float> logits;
    session.feed(seq, r.tokens, ForwardBatch::Logits::All, logits);
    seq.release_all(session.pool());
    for (size_t p = 0; p < r.tokens.size(); ++p) {
      const auto ours = log_softmax(logits.data() + p * n_vocab, n_vocab);
      const Position& ref = r.pos[p];
      const int32_t our_top = static_cast<int32_t>(std::max_element(ours.begin(), ours.end()) - ours.begin());
      agree += our_top == ref.top_ids[0];
      if (ref.top_logprobs[0] - ref.top_logprobs[1] >= kClearMargin) {
        ++clear_total;
        clear_agree += our_top == ref.top_ids[0];
      }
      if (our_top != ref.top_ids[0] && std::getenv("PARITY_DEBUG"))
        std::printf("%s pos %zu: ref %d (margin %.4f) ours %d (ref logprob of ours %.4f)\n", r.name.c_str(), p,
                    ref.top_ids[0], ref.top_logprobs[0] - ref.top_logprobs[1], our_top,
                    ref.top_ids[1] == our_top ? ref.top_logprobs[1] : -99.0f);
      // KL(ref || ours) over the reference's top-k plus one bucket for the rest.
      double kl = 0, ref_mass = 0, our_mass = 0;
      for (int k = 0; k < top_k; ++k) {
        const double lp = ref.top_logprobs[k];
        kl += std::exp(lp) * (lp - ours[ref.top_ids[k]]);
        ref_mass += std::exp(lp);
        our_mass += std::exp(ours[ref.top_ids[k]]);
      }
      const double ref_tail = std::max(1e-12, 1 - ref_mass), our_tail = std::max(1e-12, 1 - our_mass);
      kl += ref_tail * std::log(ref_tail / our_tail);
      kl_sum += kl;
      ++total;
    }
  }
  const double agreement = double(agree) / total, mean_kl = kl_sum / total;
  const double clear_agreement = double(clear_agree) / clear_total;
  std::printf(
      "parity with llama.cpp over %lld positions: top-1 agreement %.4f (%.4f over %lld clear positions), "
      "mean KL %.5f\n",
      static_cast<long long>(total), agreement, clear_agreement, static_cast<long long>(clear_total), mean_kl);
  EXPECT_GE(clear_agreement, 0.99);
  EXPECT_GE(agreement, 0.96);
  EXPECT_LE(mean_kl, 0.005);
}

TEST(LlamaParity, PerplexityMatchesLlamaCppWindowRule) {
  std::ifstream jf(std::string(TESSERA_FIXTURES_DIR) + "/llama/ppl_smollm2_q4_1_ctx512.json");
  ASSERT_TRUE(jf) << "missing perplexity fixture";
  const auto ref = nlohmann::json::parse(jf);
  const int window = ref.at("n_ctx").get<int>();
  std::ifstream tf(std::string(TESSERA_FIXTURES_DIR) + "/" + ref.at("corpus").get<std::string>().substr(15),
                   std::ios::binary);
  ASSERT_TRUE(tf) << "missing corpus";
  std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp reads -f files
  SessionOptions so;
  so.model = test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  so.backend.threads = 1;
  so.ctx = window;
  so.max_logits = window;
  Session session(so);
  const auto tokens = session.tokenizer().encode(text, true, false);
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), ref.at("n_corpus_tokens").get<int64_t>());
  // Four of the reference's chunks keep CI short; each chunk is independent, so the window
  // rule is exercised in full. The CLI runs them all (docs/benchmarks/cpu.md).
  constexpr int kChunks = 4;
  const PerplexityResult r = perplexity(session, tokens, window, kChunks);
  ASSERT_EQ(r.n_chunks, kChunks);
  double ref_nll = 0;
  for (int c = 0; c < kChunks; ++c) ref_nll += ref.at("chunk_nll_sums")[c].get<double>();
  const double ref_ppl = std::exp(ref_nll / r.n_scored);
  EXPECT_EQ(r.n_scored, kChunks * ref.at("scored_per_chunk").get<int64_t>());
  std::printf("perplexity over %d chunks of %d: tessera %.4f, llama.cpp %.4f\n", kChunks, window, r.ppl, ref_ppl);
  EXPECT_LT(std::fabs(r.ppl - ref_ppl) / ref_ppl, 0.005);
  EXPECT_EQ(session.pool().n_free(), session.pool().n_blocks());
}
