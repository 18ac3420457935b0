// Whole-model parity on a real GGUF model (SmolLM2-135M-Instruct Q4_1: Q4_1 matrices, a Q8_0
// token embedding tied to the output, F32 norms), CPU against CUDA. Skipped without a GPU or
// without the model file ($TESSERA_CACHE or ~/.cache/tessera/models); scripts/gpu-check.sh
// brings the file to the GPU machine in two parts.
//
// The two backends do not compute the same function to the bit: the CPU's Q4_1/Q8_0 dot
// products round the activations to 8 bits per 32-element block (its int8 path), the GPU
// decodes the weights to f32 (decode, n <= 8 rows) or bf16 (prefill GEMM) and keeps the
// activations in f32 / bf16. An 8-bit activation rounding perturbs each dot product by
// about 2^-9 of its terms' magnitude (relative ~1e-3 per product); through 30 layers of
// residual stream this grows to ~1e-2 relative on the logits, which is why the tolerance
// is 5e-2 (the same as the quantized dummy models) and why greedy picks may differ where the
// CPU's own top two logits are closer than the error.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "cuda_test_util.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

std::string real_model_path() {
  const char* cache = std::getenv("TESSERA_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache && *cache ? cache : std::string(home ? home : ".") + "/.cache/tessera/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

SessionOptions real_options(const std::string& path, const std::string& device) {
  SessionOptions o;
  o.model = path;
  o.backend.device = device;
  o.backend.threads = 0;
  o.ctx = 512;
  o.max_batch_tokens = 128;
  o.kv_dtype = DType::F16;
  return o;
}

struct Trace {
  std::vector<int32_t> tokens;             // greedy picks
  std::vector<std::vector<float>> logits;  // per step, [n_vocab]
};

Trace greedy(Session& s, const std::vector<int32_t>& prompt, int steps, const std::vector<int32_t>* forced) {
  Trace t;
  SequenceBlocks seq;
  std::vector<float> logits;
  s.feed(seq, prompt, ForwardBatch::Logits::Last, logits);
  for (int i = 0; i < steps; ++i) {
    const auto pick = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    t.tokens.push_back(pick);
    t.logits.push_back(logits);
    const int32_t next = forced ? (*forced)[i] : pick;
    logits.clear();
    s.feed(seq, std::span<const int32_t>(&next, 1), ForwardBatch::Logits::Last, logits);
  }
  seq.release_all(s.pool());
  return t;
}

float top2_margin(const std::vector<float>& l) {
  std::vector<float> v(l);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

}  // namespace

TEST(CudaRealModel, SmolLm2Q4_1MatchesCpu) {
  TESSERA_REQUIRE_CUDA();
  const std::string path = real_model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model file not found: " << path;
  Session cpu(real_options(path, "cpu"));
  Session gpu(real_options(path, "cuda"));
  const int steps = 64;
  // Prompts of 6..40 tokens: all above 8 rows, so the prefill runs the GPU's GEMM path and
  // the decode its matrix-vector path.
  const char* texts[] = {
      "The capital of France is",
      "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
  };
  double worst_rel = 0, worst_abs = 0;
  int top1_agree = 0, top1_total = 0, near_tie_misses = 0;
  for (const char* text : texts) {
    const std::vector<int32_t> prompt = cpu.tokenizer().encode(text, true, true);
    ASSERT_GE(prompt.size(), 5u) << text;
    const Trace c = greedy(cpu, prompt, steps, nullptr);
    const Trace g_free = greedy(gpu, prompt, steps, nullptr);
    // Free-running: the same tokens until the first difference, which is acceptable only at
    // a near tie of the CPU's own logits (checked below, teacher-forced).
    int same = 0;
    while (same < steps && g_free.tokens[same] == c.tokens[same]) ++same;
    // Teacher-forced: the GPU fed the CPU's tokens, logits compared at every step.
    const Trace g = greedy(gpu, prompt, steps, &c.tokens);
    double rel = 0, abs_diff = 0;
    for (int i = 0; i < steps; ++i) {
      rel = std::max(rel, rel_err(g.logits[i], c.logits[i]));
      for (size_t v = 0; v < c.logits[i].size(); ++v)
        abs_diff = std::max(abs_diff, std::fabs(double(g.logits[i][v]) - c.logits[i][v]));
      ++top1_total;
      if (g.tokens[i] == c.tokens[i]) {
        ++top1_agree;
      } else {
        // A different top-1 only where the CPU's margin is within the measured logit error.
        EXPECT_LT(top2_margin(c.logits[i]), 2 * abs_diff + 1e-3) << text << " step " << i;
        ++near_tie_misses;
      }
    }
    if (same < steps) {
      EXPECT_LT(top2_margin(c.logits[same]), 2 * abs_diff + 1e-3)
          << "free-running picks diverge at step " << same << " where the CPU's pick is not a near tie: " << text;
    }
    std::printf("[real-parity] prompt of %zu tokens: greedy tokens equal for %d/%d steps; teacher-forced logits "
                "rel err %.3g, max abs diff %.3g\n",
                prompt.size(), same, steps, rel, abs_diff);
    worst_rel = std::max(worst_rel, rel);
    worst_abs = std::max(worst_abs, abs_diff);
  }
  std::printf("[real-parity] SmolLM2-135M Q4_1: worst rel err %.3g, max abs diff %.3g, top-1 agreement %d/%d\n",
              worst_rel, worst_abs, top1_agree, top1_total);
  EXPECT_LT(worst_rel, 5e-2);
  EXPECT_LE(near_tie_misses, 3);
}
