// Whole-model parity on a real GGUF model (SmolLM2-135M-Instruct Q4_1: Q4_1 matrices, a Q8_0
// token embedding tied to the output, F32 norms). Skipped without a GPU or without the model
// file ($TESSERA_CACHE or ~/.cache/tessera/models); scripts/gpu-check.sh brings the file to
// the GPU machine in two parts.
//
// 1. Exact path: the GPU runs the Q4_1 file fed one token per forward (its matrix-vector
//    kernel decodes the weights to f32 and keeps the activations in f32) against the CPU
//    running the same weights dequantized to f32 on the host (f32 everywhere). Both compute
//    the same function up to f32 summation order: the same 64 greedy tokens, logits within
//    1e-3 (the f32 dummy models measure ~1e-4).
// 2. Serving path against the CPU's own Q4_1 path: the prompt through the GPU's bf16 GEMM,
//    and the CPU's int8 dot products, which round the activations to 8 bits per 32-element
//    block. On this model (large activation outliers) that rounding alone moves the logits
//    by ~0.1 relative (measured here: the CPU's int8 path against its own f32 run), so this
//    comparison is reported, with a bound on top-1 agreement, not held to f32 tolerance.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "cuda_test_util.h"
#include "engine/session.h"
#include "format/gguf.h"
#include "quant/quant.h"
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
  o.k_format = o.v_format = kv_format_of(DType::F16);
  return o;
}

struct Trace {
  std::vector<int32_t> tokens;             // greedy picks
  std::vector<std::vector<float>> logits;  // per step, [n_vocab]
};

template <typename Runner>
Trace greedy(Runner& s, const std::vector<int32_t>& prompt, int steps, const std::vector<int32_t>* forced) {
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

// The model's matrices dequantized to f32 on the host (the CPU then runs f32 throughout).
std::shared_ptr<ModelWeights> dequantized_f32(std::shared_ptr<ModelWeights> w) {
  auto out = std::make_shared<ModelWeights>(*w);
  auto to_f32 = [&](WeightMatrix& m) {
    if (m.dtype == DType::F32) return;
    float* dst = out->make_f32(static_cast<size_t>(m.rows) * m.cols);
    const auto* src = static_cast<const uint8_t*>(m.data);
    for (int64_t r = 0; r < m.rows; ++r) dequantize_row(m.dtype, src + r * m.row_bytes(), dst + r * m.cols, m.cols);
    m = WeightMatrix{dst, DType::F32, m.rows, m.cols};
  };
  const bool tied = w->output.data == w->tok_embd.data;
  to_f32(out->tok_embd);
  if (tied)
    out->output = out->tok_embd;
  else
    to_f32(out->output);
  for (LayerWeights& l : out->layers)
    for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) to_f32(*m);
  return out;
}

// A CPU model over given weights with Session::feed's interface.
class F32Reference {
 public:
  explicit F32Reference(std::shared_ptr<ModelWeights> w)
      : backend_(make_cpu()), weights_(std::move(w)), model_(create_model(weights_, *backend_, 128, 1)) {
    const ModelConfig& c = weights_->config;
    KvCacheSpec spec;
    spec.n_layers = c.n_layer;
    spec.n_kv_heads = c.n_head_kv;
    spec.head_dim = c.head_dim;
    spec.block_size = kBlock;
    spec.n_blocks = 512 / kBlock;
    spec.set_plain(DType::F16);
    kv_ = std::make_unique<KvCache>(*backend_, spec);
    runner_ = std::make_unique<ModelRunner>(*model_, *kv_, *backend_);
    pool_ = std::make_unique<BlockPool>(spec.n_blocks);
  }
  BlockPool& pool() { return *pool_; }
  void feed(SequenceBlocks& seq, std::span<const int32_t> tokens, ForwardBatch::Logits mode,
            std::vector<float>& logits) {
    EXPECT_TRUE(seq.reserve(*pool_, kBlock, static_cast<int>(tokens.size())));
    batch_.clear();
    batch_.add_sequence(seq, kBlock, tokens.data(), static_cast<int>(tokens.size()), mode);
    logits.resize(static_cast<size_t>(weights_->config.n_vocab));
    runner_->forward(batch_, logits.data());
    seq.n_tokens += static_cast<int>(tokens.size());
  }

 private:
  static constexpr int kBlock = 16;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<ModelWeights> weights_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BlockPool> pool_;
  ForwardBatch batch_;
};

}  // namespace

TEST(CudaRealModel, OneTokenPerForwardMatchesAnF32CpuRunOfTheSameWeights) {
  TESSERA_REQUIRE_CUDA();
  const std::string path = real_model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model file not found: " << path;
  Session cpu_q(real_options(path, "cpu"));  // for its tokenizer and the int8-path comparison
  F32Reference ref(dequantized_f32(load_gguf_weights(GGUFFile::open(path))));
  SessionOptions go = real_options(path, "cuda");
  go.max_batch_tokens = 1;  // every forward one row: the f32 matrix-vector path
  Session gpu(go);
  const int steps = 64;
  const char* texts[] = {"The capital of France is",
                         "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"};
  for (const char* text : texts) {
    const std::vector<int32_t> prompt = cpu_q.tokenizer().encode(text, true, true);
    const Trace r = greedy(ref, prompt, steps, nullptr);
    const Trace g = greedy(gpu, prompt, steps, nullptr);
    const Trace c = greedy(cpu_q, prompt, steps, &r.tokens);  // the CPU's int8 path, teacher-forced
    double rel = 0, rel_int8 = 0;
    int int8_top1 = 0;
    for (int i = 0; i < steps; ++i) {
      ASSERT_EQ(g.tokens[i], r.tokens[i]) << text << " step " << i;
      rel = std::max(rel, rel_err(g.logits[i], r.logits[i]));
      rel_int8 = std::max(rel_int8, rel_err(c.logits[i], r.logits[i]));
      int8_top1 += c.tokens[i] == r.tokens[i];
    }
    std::printf(
        "[real-parity] f32 path, prompt of %zu tokens: GPU greedy tokens equal the f32 CPU's for %d/%d steps, "
        "logits rel err %.3g; the CPU's own int8 path against the same f32 run: rel err %.3g, top-1 %d/%d\n",
        prompt.size(), steps, steps, rel, rel_int8, int8_top1, steps);
    // Measured 1.3e-3 and 1.9e-3 (2026-11-29, H200): f32 summation-order differences that the
    // f16 KV cache turns into whole f16 steps (2^-11 relative) where a value sits near a
    // rounding boundary; the CPU's int8 path is ~0.1 away from the same run.
    EXPECT_LT(rel, 5e-3) << text;
  }
}

TEST(CudaRealModel, ServingPathAgainstTheCpuInt8Path) {
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
    std::printf(
        "[real-parity] prompt of %zu tokens: greedy tokens equal for %d/%d steps; teacher-forced logits "
        "rel err %.3g, max abs diff %.3g\n",
        prompt.size(), same, steps, rel, abs_diff);
    worst_rel = std::max(worst_rel, rel);
    worst_abs = std::max(worst_abs, abs_diff);
  }
  std::printf("[real-parity] SmolLM2-135M Q4_1: worst rel err %.3g, max abs diff %.3g, top-1 agreement %d/%d\n",
              worst_rel, worst_abs, top1_agree, top1_total);
  // Measured 2026-11-29 on the H200: worst 0.16, top-1 182/192 (every miss at a near tie).
  EXPECT_LT(worst_rel, 0.3);
  EXPECT_GE(top1_agree, 0.9 * top1_total);
  EXPECT_LE(near_tie_misses, top1_total - top1_agree);
}
