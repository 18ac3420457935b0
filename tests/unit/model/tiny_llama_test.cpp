// A tiny random Llama written as GGUF, run through the real loader, runner and CPU backend,
// against a dense float64 implementation of the same architecture written here from the
// paper's equations. Also: model-level checks a bad file must fail.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/model_runner.h"
#include "gguf_builder.h"
#include "model/dummy.h"
#include "model/model.h"
#include "engine/kv_scales.h"

using namespace tessera;
using namespace tessera::test;

namespace {

struct Tiny {
  int vocab = 37, embd = 24, layers = 2, heads = 6, kv_heads = 2, head_dim = 4, ff = 40;
  float eps = 1e-5f, base = 10000.0f;
  bool qwen2 = false;     // QKV biases and rotation of halves (GGUF arch "qwen2")
  bool qwen3 = false;     // per-head Q/K RMS norms, rotation of halves, no biases (GGUF arch "qwen3")
  int window = 0;         // keys each query sees (Mistral's sliding window; Hugging Face only); 0 = all
  float yarn_factor = 0;  // YaRN RoPE scaling over an original context of yarn_original_ctx; 0 = off
  int yarn_original_ctx = 4096;
  // Phi-3 (GGUF arch "phi3"): fused QKV and gate|up tensors, rotation of halves, the window on
  // every layer, LongRoPE divisors over an original context of 16 (the file says 64).
  bool phi3 = false;
  std::vector<float> long_factors;
  // Hugging Face "dynamic" RoPE scaling, as vLLM runs it: the base stretched for the full
  // scaled context, base · (f² - f + 1)^(d / (d - 2)).
  float dynamic_ntk = 0;
  std::mt19937 rng{7};
  std::map<std::string, std::vector<float>> t;

  std::vector<float> rand(size_t n, float scale) {
    std::normal_distribution<float> d(0, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  GGUFBuilder build(bool tied = false) {
    GGUFBuilder b;
    const std::string a = qwen2 ? "qwen2" : qwen3 ? "qwen3" : phi3 ? "phi3" : "llama";
    b.string("general.architecture", a)
        .u32(a + ".block_count", layers)
        .u32(a + ".embedding_length", embd)
        .u32(a + ".feed_forward_length", ff)
        .u32(a + ".attention.head_count", heads)
        .u32(a + ".attention.head_count_kv", kv_heads)
        .u32(a + ".context_length", 64)
        .f32(a + ".rope.freq_base", base)
        .f32(a + ".attention.layer_norm_rms_epsilon", eps)
        .u32(a + ".vocab_size", vocab);
    if (yarn_factor > 0)
      b.string(a + ".rope.scaling.type", "yarn")
          .f32(a + ".rope.scaling.factor", yarn_factor)
          .u32(a + ".rope.scaling.original_context_length", yarn_original_ctx);
    if (phi3) {
      b.u32(a + ".attention.sliding_window", window).u32(a + ".rope.scaling.original_context_length", 16);
      long_factors = rand(head_dim / 2, 0.5f);
      for (auto& f : long_factors) f = 1 + std::fabs(f) * 4;
      b.tensor_f32("rope_factors_long.weight", {uint64_t(head_dim / 2)}, long_factors);
      b.tensor_f32("rope_factors_short.weight", {uint64_t(head_dim / 2)}, std::vector<float>(head_dim / 2, 1.0f));
    }
    if (head_dim * heads != embd)
      b.u32(a + ".attention.key_length", head_dim).u32(a + ".attention.value_length", head_dim);
    auto add = [&](const std::string& name, std::vector<uint64_t> dims, float scale, float offset = 0) {
      size_t n = 1;
      for (auto d : dims) n *= d;
      auto v = rand(n, scale);
      for (auto& x : v) x += offset;
      t[name] = v;
      const bool fused = phi3 && (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight") ||
                                  name.ends_with("attn_v.weight") || name.ends_with("ffn_gate.weight") ||
                                  name.ends_with("ffn_up.weight"));
      if (!fused) b.tensor_f32(name, dims, v);
    };
    // Phi-3's fused tensors: the row blocks one after the other.
    auto fuse = [&](const std::string& name, std::initializer_list<std::string> parts, uint64_t rows) {
      std::vector<float> v;
      for (const auto& p : parts) v.insert(v.end(), t.at(p).begin(), t.at(p).end());
      b.tensor_f32(name, {uint64_t(embd), rows}, v);
    };
    const uint64_t q = heads * head_dim, kv = kv_heads * head_dim;
    add("token_embd.weight", {uint64_t(embd), uint64_t(vocab)}, 1.0f);
    if (!tied) add("output.weight", {uint64_t(embd), uint64_t(vocab)}, 0.3f);
    add("output_norm.weight", {uint64_t(embd)}, 0.1f, 1.0f);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", {uint64_t(embd)}, 0.1f, 1.0f);
      add(p + "attn_q.weight", {uint64_t(embd), q}, 0.4f);
      add(p + "attn_k.weight", {uint64_t(embd), kv}, 0.4f);
      add(p + "attn_v.weight", {uint64_t(embd), kv}, 0.4f);
      if (qwen3) {
        add(p + "attn_q_norm.weight", {uint64_t(head_dim)}, 0.3f, 1.0f);
        add(p + "attn_k_norm.weight", {uint64_t(head_dim)}, 0.3f, 1.0f);
      }
      if (qwen2) {
        add(p + "attn_q.bias", {q}, 0.5f);
        add(p + "attn_k.bias", {kv}, 0.5f);
        add(p + "attn_v.bias", {kv}, 0.5f);
      }
      add(p + "attn_output.weight", {q, uint64_t(embd)}, 0.3f);
      add(p + "ffn_norm.weight", {uint64_t(embd)}, 0.1f, 1.0f);
      add(p + "ffn_gate.weight", {uint64_t(embd), uint64_t(ff)}, 0.3f);
      add(p + "ffn_up.weight", {uint64_t(embd), uint64_t(ff)}, 0.3f);
      add(p + "ffn_down.weight", {uint64_t(ff), uint64_t(embd)}, 0.3f);
      if (phi3) {
        fuse(p + "attn_qkv.weight", {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}, q + 2 * kv);
        fuse(p + "ffn_up.weight", {p + "ffn_gate.weight", p + "ffn_up.weight"}, 2 * uint64_t(ff));
      }
    }
    return b;
  }

  // y = W x for a GGUF [cols, rows] matrix stored row-major by output row.
  std::vector<double> matvec(const std::string& name, const std::vector<double>& x, int rows) {
    const auto& w = t.at(name);
    const int cols = static_cast<int>(x.size());
    std::vector<double> y(rows, 0);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) y[r] += double(w[size_t(r) * cols + c]) * x[c];
    return y;
  }
  std::vector<double> rms(const std::vector<double>& x, const std::string& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1 / std::sqrt(ss / x.size() + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * t.at(w)[i];
    return y;
  }
  // Qwen3's QK-norm: every head of v RMS-normed with the same [head_dim] weights.
  void rms_heads(std::vector<double>& v, int n_heads, const std::string& w) {
    for (int h = 0; h < n_heads; ++h) {
      std::vector<double> head(v.begin() + h * head_dim, v.begin() + (h + 1) * head_dim);
      head = rms(head, w);
      std::copy(head.begin(), head.end(), v.begin() + h * head_dim);
    }
  }
  // YaRN from its paper (Peng et al. 2023, eq. 18-23) as transformers computes it: pair i keeps
  // its frequency when it turns more than beta_fast = 32 times over the original context, is
  // divided by the factor below beta_slow = 1 turn, linear in between.
  double inv_freq(int i) const {
    if (dynamic_ntk > 0) {
      const double f = dynamic_ntk, b = base * std::pow(f * f - f + 1, double(head_dim) / (head_dim - 2));
      return std::pow(b, -2.0 * i / head_dim);
    }
    if (phi3) return std::pow(double(base), -2.0 * i / head_dim) / long_factors[i];
    const double inv = std::pow(double(base), -2.0 * i / head_dim);
    if (yarn_factor <= 0) return inv;
    const double pi = std::acos(-1.0);
    auto dim_of = [&](double turns) {
      return head_dim * std::log(yarn_original_ctx / (turns * 2 * pi)) / (2 * std::log(double(base)));
    };
    const double lo = std::max(0.0, std::floor(dim_of(32))), hi = std::min(head_dim - 1.0, std::ceil(dim_of(1)));
    const double interp = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));
    return inv * (1 - interp) + inv / yarn_factor * interp;
  }
  // YaRN's magnitude on q and k (cos and sin scaled by it).
  // LongRoPE's: sqrt(1 + ln(64 / 16) / ln(16)).
  double mscale() const {
    if (phi3) return std::sqrt(1 + std::log(4.0) / std::log(16.0));
    return yarn_factor > 0 ? 0.1 * std::log(double(yarn_factor)) + 1 : 1.0;
  }
  // Adjacent pairs (GGUF llama) or halves (qwen2, Hugging Face).
  void rope(std::vector<double>& v, int n_heads, int pos) {
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < head_dim / 2; ++i) {
        const double th = pos * inv_freq(i);
        const bool halves = qwen2 || qwen3 || phi3;
        double& a = v[h * head_dim + (halves ? i : 2 * i)];
        double& b = v[h * head_dim + (halves ? i + head_dim / 2 : 2 * i + 1)];
        const double a0 = a, b0 = b;
        a = (a0 * std::cos(th) - b0 * std::sin(th)) * mscale();
        b = (a0 * std::sin(th) + b0 * std::cos(th)) * mscale();
      }
  }
  // Logits of every position for the token sequence, float64 throughout (KV kept exact).
  std::vector<std::vector<double>> forward(const std::vector<int32_t>& toks, bool tied) {
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim, group = heads / kv_heads;
    std::vector<std::vector<std::vector<double>>> K(layers), V(layers);
    std::vector<std::vector<double>> out;
    for (size_t p = 0; p < toks.size(); ++p) {
      std::vector<double> x(embd);
      for (int i = 0; i < embd; ++i) x[i] = t.at("token_embd.weight")[size_t(toks[p]) * embd + i];
      for (int l = 0; l < layers; ++l) {
        const std::string pre = "blk." + std::to_string(l) + ".";
        auto xn = rms(x, pre + "attn_norm.weight");
        auto q = matvec(pre + "attn_q.weight", xn, q_dim);
        auto k = matvec(pre + "attn_k.weight", xn, kv_dim);
        auto v = matvec(pre + "attn_v.weight", xn, kv_dim);
        if (qwen2) {
          for (int i = 0; i < q_dim; ++i) q[i] += t.at(pre + "attn_q.bias")[i];
          for (int i = 0; i < kv_dim; ++i) k[i] += t.at(pre + "attn_k.bias")[i];
          for (int i = 0; i < kv_dim; ++i) v[i] += t.at(pre + "attn_v.bias")[i];
        }
        if (qwen3) {
          rms_heads(q, heads, pre + "attn_q_norm.weight");
          rms_heads(k, kv_heads, pre + "attn_k_norm.weight");
        }
        rope(q, heads, int(p));
        rope(k, kv_heads, int(p));
        K[l].push_back(k);
        V[l].push_back(v);
        std::vector<double> att(q_dim, 0);
        for (int h = 0; h < heads; ++h) {
          const int kh = h / group;
          std::vector<double> s(p + 1);
          double mx = -1e300;
          const size_t first = window > 0 && p + 1 > size_t(window) ? p + 1 - window : 0;
          for (size_t j = first; j <= p; ++j) {
            double d = 0;
            for (int i = 0; i < head_dim; ++i) d += q[h * head_dim + i] * K[l][j][kh * head_dim + i];
            s[j] = d / std::sqrt(double(head_dim));
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (size_t j = first; j <= p; ++j) sum += (s[j] = std::exp(s[j] - mx));
          for (size_t j = first; j <= p; ++j)
            for (int i = 0; i < head_dim; ++i) att[h * head_dim + i] += s[j] / sum * V[l][j][kh * head_dim + i];
        }
        auto o = matvec(pre + "attn_output.weight", att, embd);
        for (int i = 0; i < embd; ++i) x[i] += o[i];
        xn = rms(x, pre + "ffn_norm.weight");
        auto g = matvec(pre + "ffn_gate.weight", xn, ff);
        auto u = matvec(pre + "ffn_up.weight", xn, ff);
        for (int i = 0; i < ff; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        auto d = matvec(pre + "ffn_down.weight", g, embd);
        for (int i = 0; i < embd; ++i) x[i] += d[i];
      }
      out.push_back(matvec(tied ? "token_embd.weight" : "output.weight", rms(x, "output_norm.weight"), vocab));
    }
    return out;
  }
};

std::shared_ptr<ModelWeights> load(const std::vector<uint8_t>& bytes) {
  auto f = std::shared_ptr<GGUFFile>(GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf"));
  return load_gguf_weights(f);
}

}  // namespace

TEST(TinyLlama, ForwardMatchesFloat64ReferenceAcrossBatchShapes) {
  for (int variant = 0; variant < 6; ++variant) {
    const bool tied = variant == 1 || variant == 3;
    Tiny tiny;
    tiny.qwen2 = variant == 2;
    tiny.qwen3 = variant == 3 || variant == 4;
    if (tiny.qwen3) tiny.head_dim = 8;  // wider than embd / heads, as Qwen3's 128 over 1024 / 16
    // YaRN x4 over 4096: with head_dim 8 the ramp keeps pair 0 and 1, interpolates pair 3 and
    // mixes pair 2.
    if (variant == 4) tiny.yarn_factor = 4;
    // Phi-3 with a 4-key window, which the 11-token sequence crosses.
    tiny.phi3 = variant == 5;
    if (tiny.phi3) tiny.window = 4;
    const auto bytes = tiny.build(tied).build();
    auto weights = load(bytes);
    EXPECT_EQ(weights->config.tied_embeddings, tied);
    CpuBackend be(2);
    auto model = create_model(weights, be, 16, 16);
    const std::vector<int32_t> toks = {3, 17, 0, 36, 5, 5, 9, 21, 30, 1, 2};
    const auto ref = tiny.forward(toks, tied);
    // Run the sequence as a chunk of 6 then decodes of one token, through F32 KV in blocks of 4.
    KvCache kv(be, KvCacheSpec::plain(tiny.layers, tiny.kv_heads, tiny.head_dim, 4, 8, DType::F32));
    BlockPool pool(8);
    SequenceBlocks seq;
    std::vector<float> logits(16 * tiny.vocab);
    size_t done = 0;
    double num = 0, den = 0;
    while (done < toks.size()) {
      const int n = done == 0 ? 6 : 1;
      ASSERT_TRUE(seq.reserve(pool, 4, n));
      ForwardBatch fb;
      fb.add_sequence(seq, 4, toks.data() + done, n, ForwardBatch::Logits::All);
      std::fill(logits.begin(), logits.end(), NAN);
      ModelRunner(*model, kv, be).forward(fb, logits.data());
      for (int r = 0; r < n; ++r)
        for (int v = 0; v < tiny.vocab; ++v) {
          const double d = logits[r * tiny.vocab + v] - ref[done + r][v];
          num += d * d;
          den += ref[done + r][v] * ref[done + r][v];
        }
      seq.n_tokens += n;
      done += n;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "variant " << variant;
    EXPECT_EQ(weights->config.rope_neox, tiny.qwen2 || tiny.qwen3 || tiny.phi3);
    EXPECT_EQ(weights->config.sliding_window, tiny.window);
    EXPECT_EQ(weights->config.head_dim, tiny.head_dim);
    seq.release_all(pool);
    EXPECT_EQ(pool.n_free(), 8);
  }
}

TEST(TinyLlama, BadModelFilesAreRejectedWithTheirName) {
  auto expect_error = [](GGUFBuilder b, const std::string& needle) {
    const auto bytes = b.build();
    try {
      load(bytes);
      ADD_FAILURE() << "accepted a model that should fail with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    Tiny t;
    auto b = t.build();
    b.u32("llama.block_count", 5000);  // duplicate key is caught by the reader first
    expect_error(b, "llama.block_count");
  }
  {
    Tiny t;
    t.layers = 3;  // metadata says 3 layers, tensors exist for 3; drop one by renaming arch keys
    GGUFBuilder b = t.build();
    b.u32("llama.attention.key_length", 7);  // odd head dim
    expect_error(b, "head dimension");
  }
  {
    Tiny t;
    t.heads = 5;  // 5 query heads over 2 KV heads
    t.head_dim = 4;
    t.embd = 20;
    expect_error(t.build(), "KV head count");
  }
  {
    Tiny t;
    GGUFBuilder b;
    b.string("general.architecture", "gpt-j");
    expect_error(b, "architecture 'gpt-j' is not supported");
  }
  {
    // A tensor with the wrong shape names the tensor and both shapes.
    Tiny t;
    t.ff = 40;
    GGUFBuilder b = t.build();
    GGUFBuilder c;
    c.string("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.embedding_length", 8)
        .u32("llama.feed_forward_length", 16)
        .u32("llama.attention.head_count", 2)
        .u32("llama.context_length", 32)
        .u32("llama.vocab_size", 4);
    c.tensor_f32("token_embd.weight", {8, 5}, std::vector<float>(40, 0.f));
    expect_error(c, "tensor 'token_embd.weight' has shape [8, 5], expected [8, 4]");
  }
  {
    GGUFBuilder c;
    c.string("general.architecture", "llama")
        .u32("llama.block_count", 2000)
        .u32("llama.embedding_length", 8)
        .u32("llama.feed_forward_length", 16)
        .u32("llama.attention.head_count", 2)
        .u32("llama.context_length", 32)
        .u32("llama.vocab_size", 4);
    expect_error(c, "layer count 2000");
  }
  {
    GGUFBuilder c;
    c.string("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.embedding_length", 8)
        .u32("llama.feed_forward_length", 16)
        .u32("llama.attention.head_count", 2)
        .u32("llama.context_length", 32)
        .u32("llama.vocab_size", 4);
    c.tensor_f32("token_embd.weight", {8, 4}, std::vector<float>(32, 0.f));
    expect_error(c, "missing tensor 'output_norm.weight'");
  }
}

TEST(TinyLlama, OutOfVocabularyTokenIsAnErrorNotARead) {
  Tiny tiny;
  auto weights = load(tiny.build().build());
  CpuBackend be(1);
  auto model = create_model(weights, be, 4, 1);
  KvCache kv(be, KvCacheSpec::plain(tiny.layers, tiny.kv_heads, tiny.head_dim, 4, 2, DType::F16));
  BlockPool pool(2);
  SequenceBlocks seq;
  ASSERT_TRUE(seq.reserve(pool, 4, 1));
  for (int32_t bad : {-1, 37, 1 << 30}) {
    ForwardBatch fb;
    fb.add_sequence(seq, 4, &bad, 1, ForwardBatch::Logits::Last);
    std::vector<float> logits(tiny.vocab);
    EXPECT_THROW(ModelRunner(*model, kv, be).forward(fb, logits.data()), Error);
  }
}

namespace {

// Writes the tiny model as a Hugging Face checkpoint: config.json + model.safetensors, with
// Q/K rows in HF order (halves rotated), i.e. undoing the permutation GGUF's converter applies
// to Llama (Qwen's GGUF rows are already in HF order). A window makes it a Mistral.
// kv_scales: per layer (k_scale, v_scale) scalars as fp8 checkpoints carry them (or none).
void write_hf_checkpoint(Tiny& t, const std::string& dir, bool tied,
                         const std::vector<std::pair<float, float>>& kv_scales = {}) {
  std::filesystem::create_directories(dir);
  const char* arch = t.qwen3        ? "Qwen3ForCausalLM"
                     : t.phi3       ? "Phi3ForCausalLM"
                     : t.window > 0 ? "MistralForCausalLM"
                                    : "LlamaForCausalLM";
  nlohmann::json cfg = {{"architectures", {arch}},
                        {"model_type", t.qwen3        ? "qwen3"
                                       : t.phi3       ? "phi3"
                                       : t.window > 0 ? "mistral"
                                                      : "llama"},
                        {"head_dim", t.head_dim},
                        {"hidden_size", t.embd},
                        {"intermediate_size", t.ff},
                        {"num_hidden_layers", t.layers},
                        {"num_attention_heads", t.heads},
                        {"num_key_value_heads", t.kv_heads},
                        {"rms_norm_eps", t.eps},
                        {"rope_theta", t.base},
                        {"max_position_embeddings", 64},
                        {"vocab_size", t.vocab},
                        {"tie_word_embeddings", tied},
                        {"torch_dtype", "float32"}};
  if (t.window > 0) cfg["sliding_window"] = t.window;
  if (t.qwen3) cfg["use_sliding_window"] = false;
  if (t.yarn_factor > 0)  // as Qwen3's model card says to enable it
    cfg["rope_scaling"] = {
        {"rope_type", "yarn"}, {"factor", t.yarn_factor}, {"original_max_position_embeddings", t.yarn_original_ctx}};
  if (t.dynamic_ntk > 0) cfg["rope_scaling"] = {{"type", "dynamic"}, {"factor", t.dynamic_ntk}};
  if (t.phi3) {  // Phi-3-mini-128k's layout: longrope with both lists, the original context beside
    cfg["original_max_position_embeddings"] = 16;
    cfg["rope_scaling"] = {{"type", "longrope"},
                           {"long_factor", t.long_factors},
                           {"short_factor", std::vector<float>(t.head_dim / 2, 1.0f)}};
  }
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> tensors;
  auto unpermute = [&](const std::vector<float>& w, int n_heads, int cols) {
    if (t.qwen3 || t.phi3) return w;
    std::vector<float> out(w.size());
    const int hd = t.head_dim;
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < hd / 2; ++i)
        for (int c = 0; c < 2; ++c)
          std::copy_n(w.begin() + size_t(h * hd + 2 * i + c) * cols, cols,
                      out.begin() + size_t(h * hd + c * hd / 2 + i) * cols);
    return out;
  };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    tensors.push_back({name, {shape, std::move(v)}});
  };
  const int q = t.heads * t.head_dim, kv = t.kv_heads * t.head_dim;
  add("model.embed_tokens.weight", {t.vocab, t.embd}, t.t.at("token_embd.weight"));
  if (!tied) add("lm_head.weight", {t.vocab, t.embd}, t.t.at("output.weight"));
  add("model.norm.weight", {t.embd}, t.t.at("output_norm.weight"));
  for (int l = 0; l < t.layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    add(h + "input_layernorm.weight", {t.embd}, t.t.at(g + "attn_norm.weight"));
    auto concat = [&](std::initializer_list<std::string> parts) {
      std::vector<float> v;
      for (const auto& p : parts) v.insert(v.end(), t.t.at(g + p).begin(), t.t.at(g + p).end());
      return v;
    };
    if (t.phi3) {
      add(h + "self_attn.qkv_proj.weight", {q + 2 * kv, t.embd},
          concat({"attn_q.weight", "attn_k.weight", "attn_v.weight"}));
      add(h + "mlp.gate_up_proj.weight", {2 * t.ff, t.embd}, concat({"ffn_gate.weight", "ffn_up.weight"}));
    } else {
      add(h + "self_attn.q_proj.weight", {q, t.embd}, unpermute(t.t.at(g + "attn_q.weight"), t.heads, t.embd));
      add(h + "self_attn.k_proj.weight", {kv, t.embd}, unpermute(t.t.at(g + "attn_k.weight"), t.kv_heads, t.embd));
      add(h + "self_attn.v_proj.weight", {kv, t.embd}, t.t.at(g + "attn_v.weight"));
      add(h + "mlp.gate_proj.weight", {t.ff, t.embd}, t.t.at(g + "ffn_gate.weight"));
      add(h + "mlp.up_proj.weight", {t.ff, t.embd}, t.t.at(g + "ffn_up.weight"));
    }
    add(h + "self_attn.o_proj.weight", {t.embd, q}, t.t.at(g + "attn_output.weight"));
    if (t.qwen3) {
      add(h + "self_attn.q_norm.weight", {t.head_dim}, t.t.at(g + "attn_q_norm.weight"));
      add(h + "self_attn.k_norm.weight", {t.head_dim}, t.t.at(g + "attn_k_norm.weight"));
    }
    add(h + "post_attention_layernorm.weight", {t.embd}, t.t.at(g + "ffn_norm.weight"));
    add(h + "mlp.down_proj.weight", {t.embd, t.ff}, t.t.at(g + "ffn_down.weight"));
    if (!kv_scales.empty()) {
      add(h + "self_attn.k_scale", {}, {kv_scales[l].first});
      add(h + "self_attn.v_scale", {1}, {kv_scales[l].second});
    }
  }
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (auto& [name, st] : tensors) {
    const size_t bytes = st.second.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", st.first}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string h = header.dump();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h;
  for (auto& [name, st] : tensors) out.write(reinterpret_cast<const char*>(st.second.data()), st.second.size() * 4);
}

}  // namespace

// Llama (untied, tied), Qwen3 (QK-norm, head_dim 8 over a width of 24 / 6 heads), Mistral
// (a 3-key sliding window, which the 7-token sequence crosses), Qwen3 with YaRN and Phi-3 (fused
// projections, LongRoPE, a 4-key window).
TEST(TinyLlama, HuggingFaceCheckpointGivesTheSameLogits) {
  for (int variant = 0; variant < 7; ++variant) {
    const bool tied = variant == 1;
    Tiny tiny;
    tiny.qwen3 = variant == 2 || variant == 4;
    if (tiny.qwen3) tiny.head_dim = 8;
    if (variant == 3) tiny.window = 3;
    if (variant == 4) tiny.yarn_factor = 4;
    tiny.phi3 = variant == 5;
    if (tiny.phi3) tiny.window = 4;
    if (variant == 6) tiny.dynamic_ntk = 2;
    tiny.build(tied);  // draws the weights
    const std::string dir = ::testing::TempDir() + "/tessera_tiny_hf_" + std::to_string(variant);
    write_hf_checkpoint(tiny, dir, tied);
    auto weights = load_safetensors_weights(dir);
    EXPECT_TRUE(weights->config.rope_neox);
    EXPECT_EQ(weights->config.arch, tiny.qwen3 ? "qwen3" : tiny.phi3 ? "phi3" : "llama");
    EXPECT_EQ(weights->config.sliding_window, tiny.window);
    // YaRN: the context runs to the original one times the factor.
    EXPECT_EQ(weights->config.n_ctx_train, variant == 4 ? 4 * tiny.yarn_original_ctx : variant == 6 ? 128 : 64);
    CpuBackend be(2);
    auto model = create_model(weights, be, 16, 16);
    const std::vector<int32_t> toks = {4, 8, 15, 16, 23, 36, 0};
    const auto ref = tiny.forward(toks, tied);
    KvCache kv(be, KvCacheSpec::plain(tiny.layers, tiny.kv_heads, tiny.head_dim, 4, 4, DType::F32));
    BlockPool pool(4);
    SequenceBlocks seq;
    ASSERT_TRUE(seq.reserve(pool, 4, int(toks.size())));
    ForwardBatch fb;
    fb.add_sequence(seq, 4, toks.data(), int(toks.size()), ForwardBatch::Logits::All);
    std::vector<float> logits(toks.size() * tiny.vocab, NAN);
    ModelRunner(*model, kv, be).forward(fb, logits.data());
    double num = 0, den = 0;
    for (size_t p = 0; p < toks.size(); ++p)
      for (int v = 0; v < tiny.vocab; ++v) {
        const double d = logits[p * tiny.vocab + v] - ref[p][v];
        num += d * d;
        den += ref[p][v] * ref[p][v];
      }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "variant " << variant;
    std::filesystem::remove_all(dir);
  }
}

TEST(TinyLlama, Fp8CheckpointKvScalesAreRead) {
  Tiny tiny;
  tiny.build(false);
  const std::string dir = ::testing::TempDir() + "/tessera_tiny_hf_kv_scales";
  std::vector<std::pair<float, float>> scales;
  for (int l = 0; l < tiny.layers; ++l) scales.push_back({0.5f + l, 0.25f + l});
  write_hf_checkpoint(tiny, dir, false, scales);
  auto weights = load_safetensors_weights(dir);
  ASSERT_EQ(weights->k_scale.size(), static_cast<size_t>(tiny.layers));
  EXPECT_EQ(weights->k_scale[1], 1.5f);
  EXPECT_EQ(weights->v_scale[0], 0.25f);
  // Used by fp8 :tensor unless scales were given; other formats ignore them.
  KvCacheSpec spec = KvCacheSpec::plain(tiny.layers, tiny.kv_heads, tiny.head_dim, 4, 4, DType::F16);
  spec.k_format = spec.v_format = parse_kv_format("fp8_e4m3", true);
  apply_checkpoint_kv_scales(*weights, spec);
  ASSERT_EQ(spec.k_scales.size(), static_cast<size_t>(tiny.layers));
  EXPECT_EQ(spec.v_scales[1], std::vector<float>{1.25f});
  CpuBackend be(1);
  KvCache kv(be, spec);
  EXPECT_EQ(kv.layer(1).k_consts[0], 1.5f);
  KvCacheSpec head = spec;
  head.k_scales.clear();
  head.v_scales.clear();
  head.k_format = head.v_format = parse_kv_format("fp8_e4m3:head", true);
  apply_checkpoint_kv_scales(*weights, head);
  EXPECT_TRUE(head.k_scales.empty());
  std::filesystem::remove_all(dir);
}

// Weights made resident once are not made resident again: an early-exit drafter's view of
// the target's resident weights (first_layers) reuses them instead of uploading its layers a
// second time on a device. Weights resident on another backend are refused.
TEST(TinyLlama, ResidentWeightsAndTheirViewsAreNotUploadedTwice) {
  const auto host = make_dummy_weights("llama3-tiny:f32", 1);
  CpuBackend be(1), other(1);
  const auto resident = make_resident(host, be);
  EXPECT_EQ(resident->resident_on, &be);
  EXPECT_EQ(make_resident(resident, be), resident);
  const auto view = first_layers(resident, 2);
  EXPECT_EQ(view->resident_on, &be);
  EXPECT_EQ(make_resident(view, be), view);
  EXPECT_EQ(view->layers[1].wq.data, resident->layers[1].wq.data);
  EXPECT_THROW(make_resident(resident, other), Error);
}
