// Structured output's token masks applied by the backend (Backend::apply_token_bitmask): on
// every device (the CPU here and in CI, CUDA where a device is visible) against a reference
// that tests each token's bit one by one, on vocabularies of real models and one that is not
// a multiple of 32, for a subset of the rows; then the masked rows' argmax through the planned
// readback; then a serving run whose requests are constrained by a grammar, on CUDA against
// the CPU (the GPU masks on the device, greedy rows come back as their argmax only).
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <regex>

#include "core/token_bitmask.h"
#include "cuda_test_util.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "unit/tokenizer/tokenizer_test_util.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

std::unique_ptr<Backend> make(const std::string& device) { return device == "cpu" ? make_cpu() : make_cuda(); }

// Masks of every kind of word: all allowed, none allowed (long runs, as a grammar gives),
// single bits and random bits.
std::vector<int32_t> random_masks(int n_masks, int words, std::mt19937& rng) {
  std::vector<int32_t> m(static_cast<size_t>(n_masks) * words);
  for (int i = 0; i < n_masks; ++i)
    for (int w = 0; w < words;) {
      const int run = 1 + static_cast<int>(rng() % (i == 0 ? 300 : 40));
      const int kind = static_cast<int>(rng() % 4);
      for (int k = 0; k < run && w < words; ++k, ++w) {
        uint32_t bits = kind == 0 ? 0xffffffffu : kind == 1 ? 0u : kind == 2 ? 1u << (rng() % 32) : rng();
        m[static_cast<size_t>(i) * words + w] = static_cast<int32_t>(bits);
      }
    }
  return m;
}

// The row with every token its mask forbids at -inf, one bit at a time.
std::vector<float> masked_reference(const float* row, int n_vocab, const int32_t* mask) {
  std::vector<float> r(row, row + n_vocab);
  for (int t = 0; t < n_vocab; ++t)
    if (!((static_cast<uint32_t>(mask[t / 32]) >> (t % 32)) & 1u)) r[t] = -std::numeric_limits<float>::infinity();
  return r;
}

int32_t first_max(const std::vector<float>& row) {
  int32_t best = -1;
  float v = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < row.size(); ++i)
    if (row[i] > v) v = row[i], best = static_cast<int32_t>(i);
  return best;
}

// rows_of[i]: the logits row mask i goes to (-1: skipped); `words` may exceed the vocabulary's.
void check_masks(int n_vocab, int words, const std::vector<int32_t>& rows_of) {
  SCOPED_TRACE("vocab " + std::to_string(n_vocab) + ", words " + std::to_string(words));
  constexpr int kRows = 6;
  std::mt19937 rng(static_cast<uint32_t>(n_vocab));
  const std::vector<float> logits = randn(static_cast<size_t>(kRows) * n_vocab, rng, 3.0f);
  const std::vector<int32_t> masks = random_masks(static_cast<int>(rows_of.size()), words, rng);
  std::vector<std::vector<float>> want(kRows);
  for (int r = 0; r < kRows; ++r)
    want[r].assign(logits.begin() + static_cast<ptrdiff_t>(r) * n_vocab,
                   logits.begin() + static_cast<ptrdiff_t>(r + 1) * n_vocab);
  for (size_t i = 0; i < rows_of.size(); ++i)
    if (rows_of[i] >= 0) {
      want[rows_of[i]] = masked_reference(want[rows_of[i]].data(), n_vocab, masks.data() + i * words);
      // The host routine the CPU backend and the engine's host path use agrees.
      std::vector<float> host(logits.begin() + static_cast<ptrdiff_t>(rows_of[i]) * n_vocab,
                              logits.begin() + static_cast<ptrdiff_t>(rows_of[i] + 1) * n_vocab);
      apply_token_bitmask(host, std::span<const int32_t>(masks.data() + i * words, static_cast<size_t>(words)));
      ASSERT_EQ(std::memcmp(host.data(), want[rows_of[i]].data(), sizeof(float) * n_vocab), 0) << "host, mask " << i;
    }
  for (const std::string& device : test_devices()) {
    SCOPED_TRACE(device);
    auto be = make(device);
    DeviceVec<float> dev(*be, logits);
    // Pinned masks (as the engine passes them), read back after the apply alone.
    const size_t mask_bytes = masks.size() * sizeof(int32_t);
    std::shared_ptr<void> pinned = be->alloc_host(mask_bytes);
    std::memcpy(pinned.get(), masks.data(), mask_bytes);
    be->apply_token_bitmask(dev.get(), n_vocab, rows_of, static_cast<const int32_t*>(pinned.get()), words);
    const std::vector<float> got = dev.read();
    for (int r = 0; r < kRows; ++r)
      EXPECT_EQ(std::memcmp(got.data() + static_cast<size_t>(r) * n_vocab, want[r].data(), sizeof(float) * n_vocab), 0)
          << "row " << r;
    // From fresh logits again, the apply then the planned readback, without a synchronization
    // between them: the argmax rows see the masks.
    dev.put(logits);
    be->apply_token_bitmask(dev.get(), n_vocab, rows_of, masks.data(), words);
    std::vector<uint8_t> argmax_only(kRows, 1);
    argmax_only[1] = 0;  // one row in full
    std::vector<int32_t> ids(kRows, -7);
    std::vector<float> host(logits.size(), 0.0f);
    be->read_logits(host.data(), dev.get(), kRows, n_vocab, {argmax_only.data(), ids.data()});
    for (int r = 0; r < kRows; ++r) {
      if (argmax_only[r])
        EXPECT_EQ(ids[r], first_max(want[r])) << "argmax of row " << r;
      else
        EXPECT_EQ(std::memcmp(host.data() + static_cast<size_t>(r) * n_vocab, want[r].data(), sizeof(float) * n_vocab),
                  0)
            << "row " << r;
    }
  }
}

}  // namespace

// Gemma's and SmolLM's 49,152, Llama 3's 128,256 and Qwen 2.5's 151,936 tokens, and GPT-2's
// 50,257 (a last word of one token); masks on rows 4, 0, 2 and 1 in that order, one skipped.
TEST(CudaTokenBitmask, DeviceMasksMatchABitByBitReference) {
  const std::vector<int32_t> rows = {4, -1, 0, 2, 1};
  for (const int n_vocab : {49152, 128256, 151936, 50257}) check_masks(n_vocab, token_bitmask_words(n_vocab), rows);
  check_masks(50257, token_bitmask_words(50257) + 3, rows);  // words past the vocabulary are ignored
  check_masks(128256, token_bitmask_words(128256), {5});
}

TEST(CudaTokenBitmask, MasksNarrowerThanTheVocabularyAreRefused) {
  for (const std::string& device : test_devices()) {
    auto be = make(device);
    DeviceVec<float> dev(*be, 64);
    const std::vector<int32_t> mask(1, 0), rows = {0};
    EXPECT_THROW(be->apply_token_bitmask(dev.get(), 64, rows, mask.data(), 1), Error) << device;
  }
}

namespace {

// Bytes as tokens (GPT-2's byte-level spelling), then an end-of-text token: the grammars'
// vocabulary. The model's other ids are never allowed.
std::unique_ptr<Tokenizer> byte_tokenizer() {
  VocabSpec spec = test::byte_vocab_spec();
  spec.tokens.push_back("<|end|>");
  spec.token_types.assign(spec.tokens.size(), 1);
  spec.token_types.back() = 3;
  spec.special_ids["eos"] = 256;
  return Tokenizer::from_spec(spec);
}

ModelEngineOptions grammar_engine_options(const std::string& device) {
  ModelEngineOptions o;
  o.session.model = "dummy:smollm2-135m:f32";
  o.session.backend.device = device;
  o.session.backend.threads = 2;
  // Exact token equality with the CPU (cuda_serving_test.cpp): f32 KV.
  o.session.k_format = o.session.v_format = kv_format_of(DType::F32);
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 128;
  o.kv_cache_bytes = 32ll << 20;
  return o;
}

constexpr const char* kWords = "[a-z]{2,6}( [a-z]{2,6}){2,4}\\.";

struct GrammarRun {
  std::map<std::pair<RequestId, int>, std::vector<int32_t>> tokens;  // (request, choice)
  std::vector<int32_t> logprob_tokens;
};

// Greedy and sampled constrained requests, two choices of one (their first row shared: masked
// on the host), one with logprobs, and a free greedy one beside them.
GrammarRun run_grammar_engine(ModelEngine& engine, const Tokenizer& tok) {
  const GrammarCompiler compiler(tok, engine.config().vocab_size);
  const auto grammar = compiler.compile({GrammarSpec::Kind::Regex, kWords, {}});
  EngineCore core(engine.config(), engine.executor());
  for (RequestId id = 1; id <= 5; ++id) {
    Request r;
    for (int i = 0; i < 5 + static_cast<int>(id); ++i)
      r.prompt.push_back(static_cast<int32_t>((id * 7919 + i * 104729) % 256));
    r.sampling.temperature = id == 2 || id == 3 ? 1.0f : 0.0f;
    r.sampling.seed = id;
    r.sampling.max_tokens = 40;
    if (id != 5) {
      r.sampling.grammar = grammar;
      r.sampling.stop_token_ids = {256};  // the grammar's end (the dummy model has no tokenizer)
    }
    if (id == 3) r.n = 2;
    if (id == 4) {
      r.logprobs = true;
      r.sampling.n_logprobs = 2;
    }
    core.add(id, r);
  }
  GrammarRun run;
  while (core.has_work()) {
    const StepResult s = core.step();
    EXPECT_EQ(s.error, "");
    for (const SeqEvent& e : s.events) {
      if (e.token >= 0) run.tokens[{e.request, e.choice}].push_back(e.token);
      if (e.logprobs) run.logprob_tokens.push_back(e.logprobs->chosen.token);
    }
  }
  return run;
}

}  // namespace

TEST(CudaTokenBitmask, ConstrainedServingOnCudaGivesTheCpuTokens) {
  const auto tok = byte_tokenizer();
  ModelEngine cpu(grammar_engine_options("cpu"));
  const GrammarRun c = run_grammar_engine(cpu, *tok);
  const std::regex words(kWords);
  for (const auto& [key, tokens] : c.tokens) {
    if (key.first == 5) continue;  // the free request
    std::vector<int32_t> text = tokens;
    if (!text.empty() && text.back() == 256) text.pop_back();
    EXPECT_TRUE(std::regex_match(tok->decode(text, false), words))
        << "request " << key.first << " choice " << key.second << ": " << tok->decode(text, false);
  }
  EXPECT_EQ(c.tokens.size(), 6u);
  EXPECT_FALSE(c.logprob_tokens.empty());
  TESSERA_REQUIRE_CUDA();
  ModelEngine gpu(grammar_engine_options("cuda"));
  const GrammarRun g = run_grammar_engine(gpu, *tok);
  EXPECT_EQ(g.tokens, c.tokens);
  EXPECT_EQ(g.logprob_tokens, c.logprob_tokens);
}
