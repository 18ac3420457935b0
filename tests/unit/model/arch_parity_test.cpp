// Qwen3 and Phi-3 (fused projections, LongRoPE) against llama.cpp: tiny random
// GGUF models written by gguf-py and the logits llama.cpp computed on them, every position
// teacher forced (tests/fixtures/arch, tools/fixtures/make_arch_fixtures.py). tiny_llama_test.cpp
// checks the same architectures against tessera's own float64 reading of them; this checks that
// reading against an independent engine's. Phi-3's sliding window is not among them: llama.cpp
// ignores phi3.attention.sliding_window (Hugging Face and tessera apply it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "engine/model_runner.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/weights.h"
#include "quantized_model_util.h"

using namespace tessera;

namespace {

struct Fixture {
  std::vector<int32_t> tokens;
  int n_vocab = 0;
  std::vector<float> logits;  // [n_tokens][n_vocab]
};

Fixture read_fixture(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("missing fixture " + path);
  int32_t n = 0;
  Fixture fx;
  f.read(reinterpret_cast<char*>(&n), 4);
  f.read(reinterpret_cast<char*>(&fx.n_vocab), 4);
  fx.tokens.resize(n);
  fx.logits.resize(static_cast<size_t>(n) * fx.n_vocab);
  f.read(reinterpret_cast<char*>(fx.tokens.data()), 4 * n);
  f.read(reinterpret_cast<char*>(fx.logits.data()), static_cast<std::streamsize>(4 * fx.logits.size()));
  if (!f) throw std::runtime_error("short fixture " + path);
  return fx;
}

// tessera's logits for every position, the sequence run as chunks of `chunk` tokens.
// `path`: a .gguf file or a Hugging Face directory.
std::vector<float> run(const std::string& path, const std::vector<int32_t>& toks, int chunk) {
  auto weights = path.ends_with(".gguf") ? load_gguf_weights(std::shared_ptr<GGUFFile>(GGUFFile::open(path)))
                                         : load_safetensors_weights(path);
  return testing_util::run_logits(weights, toks, chunk);
}

// "name": name.gguf; "name_hf": the same weights as a Hugging Face checkpoint (written from the
// GGUF by the fixture script), checked against llama.cpp's logits on the GGUF.
class ArchParity : public ::testing::TestWithParam<const char*> {};

TEST_P(ArchParity, LogitsMatchLlamaCpp) {
  const std::string name = GetParam(), dir = std::string(TESSERA_FIXTURES_DIR) + "/arch/";
  const bool hf = name.ends_with("_hf");
  const std::string base = dir + (hf ? name.substr(0, name.size() - 3) : name);
  const Fixture fx = read_fixture(base + ".logits.bin");
  for (int chunk : {14, 5, 1}) {  // one prefill, chunked prefill, one token per step
    const std::vector<float> got = run(hf ? dir + name : base + ".gguf", fx.tokens, chunk);
    ASSERT_EQ(got.size(), fx.logits.size());
    double num = 0, den = 0, worst = 0;
    size_t argmax_equal = 0;
    for (size_t t = 0; t < fx.tokens.size(); ++t) {
      const float* g = got.data() + t * fx.n_vocab;
      const float* r = fx.logits.data() + t * fx.n_vocab;
      for (int v = 0; v < fx.n_vocab; ++v) {
        const double d = double(g[v]) - r[v];
        num += d * d;
        den += double(r[v]) * r[v];
        worst = std::max(worst, std::fabs(d));
      }
      argmax_equal += std::max_element(g, g + fx.n_vocab) - g == std::max_element(r, r + fx.n_vocab) - r;
    }
    const double rel = std::sqrt(num / den);
    std::printf("[arch] %s chunk %d: logits rel err %.3g, worst %.3g, argmax equal %zu/%zu\n", GetParam(), chunk, rel,
                worst, argmax_equal, fx.tokens.size());
    // Both engines in f32 (weights, activations, KV): differences are summation order only.
    EXPECT_LT(rel, 1e-5) << GetParam() << " chunk " << chunk;
    EXPECT_EQ(argmax_equal, fx.tokens.size()) << GetParam() << " chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ArchParity,
                         ::testing::Values("qwen3", "phi3", "phi3_longrope", "mixtral", "qwen3moe", "mixtral_hf",
                                           "qwen3moe_hf"));

}  // namespace
