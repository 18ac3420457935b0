#include "model/dummy.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/group_quant.h"
#include "model/quantize_weights.h"
#include "quant/fp8_weight.h"
#include "quant/quant.h"

namespace tessera {

const char* dummy_presets() {
  return "smollm2-135m, llama-3.2-1b, llama-3.1-8b, llama3-tiny, qwen2.5-0.5b, qwen3-0.6b, qwen3-tiny, phi3-mini, "
         "phi3-tiny, gemma3-270m, gemma3-tiny, qwen3-30b-a3b, qwen3moe-tiny, mixtral-8x7b";
}

ModelConfig dummy_preset(const std::string& name) {
  ModelConfig c;
  c.arch = "llama";
  c.name = "dummy " + name;
  if (name == "smollm2-135m") {
    c.n_vocab = 49152;
    c.n_embd = 576;
    c.n_layer = 30;
    c.n_head = 9;
    c.n_head_kv = 3;
    c.head_dim = 64;
    c.n_ff = 1536;
    c.n_ctx_train = 8192;
    c.rope_freq_base = 100000;
    c.tied_embeddings = true;
  } else if (name == "llama-3.2-1b") {
    c.n_vocab = 128256;
    c.n_embd = 2048;
    c.n_layer = 16;
    c.n_head = 32;
    c.n_head_kv = 8;
    c.head_dim = 64;
    c.n_ff = 8192;
    c.n_ctx_train = 131072;
    c.rope_freq_base = 500000;
    c.tied_embeddings = true;
    c.rope_scaling = "llama3";
    c.rope_scaling_factor = 32;
    c.rope_original_ctx = 8192;
  } else if (name == "llama-3.1-8b") {
    c.n_vocab = 128256;
    c.n_embd = 4096;
    c.n_layer = 32;
    c.n_head = 32;
    c.n_head_kv = 8;
    c.head_dim = 128;
    c.n_ff = 14336;
    c.n_ctx_train = 131072;
    c.rope_freq_base = 500000;
    c.rope_scaling = "llama3";
    c.rope_scaling_factor = 8;
    c.rope_original_ctx = 8192;
  } else if (name == "llama3-tiny") {
    // Llama 3's block shape (head_dim 128, 4 query heads per KV head, llama3 RoPE) at a
    // size tests can afford: the CUDA kernels' head_dim-128 paths without 16 GB of weights.
    c.n_vocab = 4096;
    c.n_embd = 1024;
    c.n_layer = 3;
    c.n_head = 8;
    c.n_head_kv = 2;
    c.head_dim = 128;
    c.n_ff = 2816;
    c.n_ctx_train = 131072;
    c.rope_freq_base = 500000;
    c.rope_scaling = "llama3";
    c.rope_scaling_factor = 8;
    c.rope_original_ctx = 8192;
  } else if (name == "qwen2.5-0.5b") {
    c.arch = "qwen2";
    c.n_vocab = 151936;
    c.n_embd = 896;
    c.n_layer = 24;
    c.n_head = 14;
    c.n_head_kv = 2;
    c.head_dim = 64;
    c.n_ff = 4864;
    c.n_ctx_train = 32768;
    c.rope_freq_base = 1000000;
    c.rms_eps = 1e-6f;
    c.rope_neox = true;
    c.qkv_bias = true;
    c.tied_embeddings = true;
  } else if (name == "qwen3-0.6b" || name == "qwen3-tiny") {
    // Qwen3-0.6B's shape: QK-norm, no QKV bias, head_dim 128 wider than n_embd / n_head; the
    // tiny one keeps the head shape with a small vocabulary and width.
    const bool tiny = name == "qwen3-tiny";
    c.arch = "qwen3";
    c.n_vocab = tiny ? 4096 : 151936;
    c.n_embd = tiny ? 256 : 1024;
    c.n_layer = tiny ? 4 : 28;
    c.n_head = tiny ? 4 : 16;
    c.n_head_kv = tiny ? 2 : 8;
    c.head_dim = 128;
    c.n_ff = tiny ? 768 : 3072;
    c.n_ctx_train = 40960;
    c.rope_freq_base = 1000000;
    c.rms_eps = 1e-6f;
    c.rope_neox = true;
    c.qk_norm = true;
    c.tied_embeddings = true;
  } else if (name == "phi3-mini" || name == "phi3-tiny") {
    // Phi-3-mini-4k's shape: 32 heads of 96 without GQA, a 2047-key window on every layer; the
    // tiny one keeps the heads with a 16-key window that short tests cross.
    const bool tiny = name == "phi3-tiny";
    c.arch = "phi3";
    c.n_vocab = tiny ? 4096 : 32064;
    c.n_embd = tiny ? 384 : 3072;
    c.n_layer = tiny ? 4 : 32;
    c.n_head = tiny ? 4 : 32;
    c.n_head_kv = c.n_head;
    c.head_dim = 96;
    c.n_ff = tiny ? 1024 : 8192;
    c.n_ctx_train = 4096;
    c.rope_freq_base = 10000;
    c.rope_neox = true;
    c.sliding_window = tiny ? 16 : 2047;
    c.sliding_window_pattern = 0;
  } else if (name == "gemma3-270m" || name == "gemma3-tiny") {
    // Gemma 3 270M's shape (head_dim 256, one KV head, window 512, five local layers per
    // global one); the tiny one keeps the block shape with a small vocabulary and a window
    // of 16, so tests cross it with short sequences.
    const bool tiny = name == "gemma3-tiny";
    c.arch = "gemma3";
    c.n_vocab = tiny ? 4096 : 262144;
    c.n_embd = 640;
    c.n_layer = tiny ? 6 : 18;
    c.n_head = 4;
    c.n_head_kv = 1;
    c.head_dim = 256;
    c.n_ff = 2048;
    c.n_ctx_train = 32768;
    c.rope_freq_base = 1000000;
    c.rms_eps = 1e-6f;
    c.rope_neox = true;
    c.qk_norm = true;
    c.tied_embeddings = true;
    c.sliding_window = tiny ? 16 : 512;
    c.sliding_window_pattern = 6;
    c.rope_freq_base_local = 10000;
    c.attn_scale = 1.0f / 16.0f;  // 1/sqrt(head_dim)
  } else if (name == "qwen3-30b-a3b" || name == "qwen3moe-tiny") {
    // Qwen3-30B-A3B's shape: 128 experts of width 768, 8 per token, QK-norm, head_dim 128 (3.3B
    // of the 30.5B parameters active per token); the tiny one keeps the routing (16 experts, 4
    // per token) at a size tests afford.
    const bool tiny = name == "qwen3moe-tiny";
    c.arch = "qwen3moe";
    c.n_vocab = tiny ? 4096 : 151936;
    c.n_embd = tiny ? 256 : 2048;
    c.n_layer = tiny ? 4 : 48;
    c.n_head = tiny ? 4 : 32;
    c.n_head_kv = tiny ? 2 : 4;
    c.head_dim = 128;
    c.n_ff = tiny ? 128 : 768;
    c.n_expert = tiny ? 16 : 128;
    c.n_expert_used = tiny ? 4 : 8;
    c.n_ctx_train = 40960;
    c.rope_freq_base = 1000000;
    c.rms_eps = 1e-6f;
    c.rope_neox = true;
    c.qk_norm = true;
  } else if (name == "mixtral-8x7b") {
    // Mixtral-8x7B's shape: Mistral 7B's attention, 8 experts of width 14336, 2 per token.
    c.n_vocab = 32000;
    c.n_embd = 4096;
    c.n_layer = 32;
    c.n_head = 32;
    c.n_head_kv = 8;
    c.head_dim = 128;
    c.n_ff = 14336;
    c.n_expert = 8;
    c.n_expert_used = 2;
    c.n_ctx_train = 32768;
    c.rope_freq_base = 1000000;
  } else {
    fail("unknown dummy preset '", name, "' (known: ", dummy_presets(), ")");
  }
  if (c.arch == "llama") c.rms_eps = 1e-5f;
  c.rope_dim = c.head_dim;
  return c;
}

namespace {

WeightQuantSpec not_grouped() {
  WeightQuantSpec s;
  s.bits = 0;
  s.group = 0;
  return s;
}

DType parse_dtype(const std::string& s) {
  static const std::pair<const char*, DType> kNames[] = {
      {"f32", DType::F32},   {"f16", DType::F16},   {"bf16", DType::BF16}, {"q8_0", DType::Q8_0},
      {"q4_0", DType::Q4_0}, {"q4_1", DType::Q4_1}, {"q5_0", DType::Q5_0}, {"q5_1", DType::Q5_1},
      {"q4_k", DType::Q4_K}, {"q5_k", DType::Q5_K}, {"q6_k", DType::Q6_K}};
  for (auto& [name, t] : kNames)
    if (s == name) return t;
  fail("unknown dummy weight type '", s,
       "' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, w4g<N>, w8g<N>, w4c, w8c, fp8)");
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform values in [-amp, amp) from a per-(tensor, row) stream, so the result does not depend
// on how rows are split over threads.
void fill_row(float* row, int64_t n, uint64_t seed, uint64_t tensor, int64_t r, float amp) {
  uint64_t state = seed ^ (tensor * 0x100000001b3ull) ^ (static_cast<uint64_t>(r) << 20);
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    row[i] = static_cast<float>((2 * u - 1) * amp);
  }
}

// Fills the rows of a matrix from fill_row's values on every core: f(row_values, r) stores
// row r in its format.
template <typename F>
void for_each_random_row(int64_t rows, int64_t cols, uint64_t seed, uint64_t id, F f) {
  const float amp = 1.0f / std::sqrt(static_cast<float>(cols));  // keeps activations O(1)
  const int n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int th = 0; th < n_threads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<float> row(cols);
      for (int64_t r = th; r < rows; r += n_threads) {
        fill_row(row.data(), cols, seed, id, r, amp);
        f(row.data(), r);
      }
    });
  }
  for (auto& th : threads) th.join();
}

struct DummyBuilder {
  ModelWeights& w;
  uint64_t seed;
  DType dtype;
  WeightQuantSpec group = not_grouped();  // bits 0: not group-quantized
  uint64_t next_tensor = 1;

  // Random codes (uniform over the levels, zero 2^(bits-1)) and one scale that spans the same
  // range as the float matrices; widths that are not a multiple of 32 stay F16.
  WeightMatrix group_matrix(int64_t rows, int64_t cols) {
    const int64_t gs = group.group == 0 ? cols : group.group;
    const GroupQuantLayout l = GroupQuantLayout::make(group.bits, rows, cols, gs, group.asymmetric, false);
    auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(l.total_bytes)]());
    const uint64_t id = next_tensor++;
    const int n_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> threads;
    for (int th = 0; th < n_threads; ++th) {
      threads.emplace_back([&, th] {
        for (int64_t r = th; r < rows; r += n_threads) {
          uint64_t state = seed ^ (id * 0x100000001b3ull) ^ (static_cast<uint64_t>(r) << 20);
          uint8_t* row = buf.get() + r * l.code_row_bytes;
          for (int64_t i = 0; i < l.code_row_bytes; i += 8) {
            const uint64_t v = splitmix64(state);
            std::memcpy(row + i, &v, static_cast<size_t>(std::min<int64_t>(8, l.code_row_bytes - i)));
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    const float amp = 1.0f / std::sqrt(static_cast<float>(cols));
    const uint16_t scale = f32_to_fp16(amp / static_cast<float>(1 << (group.bits - 1)));
    auto* scales = reinterpret_cast<uint16_t*>(buf.get() + l.off_scales);
    std::fill(scales, scales + l.n_groups * rows, scale);
    if (l.has_zeros) std::fill(buf.get() + l.off_zeros, buf.get() + l.off_zeros + l.n_groups * rows, l.zero_default());
    w.owners.push_back(std::shared_ptr<const void>(buf, buf.get()));
    w.weight_bytes += l.total_bytes;
    WeightMatrix m{buf.get(), group.bits == 8 ? DType::W8G : DType::W4G, rows, cols};
    m.group_size = gs;
    m.gq_zeros = l.has_zeros;
    return m;
  }

  // Uniform random values as the float matrices hold, quantized to E4M3 per row (RTN).
  WeightMatrix fp8_matrix(int64_t rows, int64_t cols) {
    Fp8Matrix m = make_fp8_matrix(rows, cols);
    const Fp8WeightLayout& l = m.layout;
    auto* scales = reinterpret_cast<float*>(m.data.get() + l.off_scales);
    for_each_random_row(rows, cols, seed, next_tensor++, [&](const float* row, int64_t r) {
      scales[r] = quantize_fp8_row(row, cols, m.data.get() + r * l.row_bytes, r);
    });
    w.owners.push_back(m.data);
    w.weight_bytes += l.total_bytes;
    return WeightMatrix{m.data.get(), DType::FP8W, rows, cols};
  }

  WeightMatrix matrix(int64_t rows, int64_t cols) {
    if (group.fp8) return fp8_matrix(rows, cols);
    if (group.bits != 0 && cols % 32 == 0 && (group.group == 0 || cols % group.group == 0))
      return group_matrix(rows, cols);
    const DType t = cols % dtype_traits(dtype).block_elems == 0 ? dtype : DType::F16;
    const int64_t row_bytes = dtype_row_bytes(t, cols);
    auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(rows * row_bytes)]);
    for_each_random_row(rows, cols, seed, next_tensor++,
                        [&](const float* row, int64_t r) { quantize_row(t, row, buf.get() + r * row_bytes, cols); });
    w.owners.push_back(std::shared_ptr<const void>(buf, buf.get()));
    w.weight_bytes += rows * row_bytes;
    return WeightMatrix{buf.get(), t, rows, cols};
  }

  const float* vector(int64_t n, float base, float amp) {
    float* v = w.make_f32(n);
    fill_row(v, n, seed, next_tensor++, 0, amp);
    for (int64_t i = 0; i < n; ++i) v[i] += base;
    w.weight_bytes += n * 4;
    return v;
  }
};

}  // namespace

std::shared_ptr<ModelWeights> make_dummy_weights(const std::string& spec, uint64_t seed) {
  const auto colon = spec.find(':');
  const std::string preset = spec.substr(0, colon);
  const std::string type = colon == std::string::npos ? "f16" : spec.substr(colon + 1);
  WeightQuantSpec group = not_grouped();
  // Group-quantized dummies keep the embedding and output head in F16, as GPTQ/AWQ checkpoints
  // do; FP8 ones in BF16, as vLLM's --quantization fp8 leaves them.
  const bool grouped = parse_weight_quant_spec(type, &group);
  TESSERA_CHECK(!grouped || group.method == "rtn", "dummy weights '", spec, "': random codes have no ", group.method);
  const DType dtype = grouped ? (group.fp8 ? DType::BF16 : DType::F16) : parse_dtype(type);
  auto w = std::make_shared<ModelWeights>();
  w->config = dummy_preset(preset);
  w->config.validate();
  w->source = "dummy:" + spec;
  const ModelConfig& c = w->config;
  DummyBuilder b{*w, seed, dtype, not_grouped()};
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim,
                kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  w->tok_embd = b.matrix(c.n_vocab, c.n_embd);
  w->output = c.tied_embeddings ? w->tok_embd : b.matrix(c.n_vocab, c.n_embd);
  b.group = group;  // the decoder's linear layers
  w->output_norm = b.vector(c.n_embd, 1.0f, 0.1f);
  w->layers.resize(c.n_layer);
  for (auto& l : w->layers) {
    l.attn_norm = b.vector(c.n_embd, 1.0f, 0.1f);
    l.wq = b.matrix(q_dim, c.n_embd);
    l.wk = b.matrix(kv_dim, c.n_embd);
    l.wv = b.matrix(kv_dim, c.n_embd);
    l.wo = b.matrix(c.n_embd, q_dim);
    if (c.qkv_bias) {
      l.bq = b.vector(q_dim, 0.0f, 0.1f);
      l.bk = b.vector(kv_dim, 0.0f, 0.1f);
      l.bv = b.vector(kv_dim, 0.0f, 0.1f);
    }
    l.ffn_norm = b.vector(c.n_embd, 1.0f, 0.1f);
    if (c.n_expert > 0) {  // the router in the dummy's type too (llama-quantize keeps it as stored)
      l.router = b.matrix(c.n_expert, c.n_embd);
      for (int e = 0; e < c.n_expert; ++e) {
        l.gate_exps.push_back(b.matrix(c.n_ff, c.n_embd));
        l.up_exps.push_back(b.matrix(c.n_ff, c.n_embd));
        l.down_exps.push_back(b.matrix(c.n_embd, c.n_ff));
      }
    } else {
      l.w_gate = b.matrix(c.n_ff, c.n_embd);
      l.w_up = b.matrix(c.n_ff, c.n_embd);
      l.w_down = b.matrix(c.n_embd, c.n_ff);
    }
    if (c.qk_norm) {
      l.q_norm = b.vector(c.head_dim, 1.0f, 0.1f);
      l.k_norm = b.vector(c.head_dim, 1.0f, 0.1f);
    }
    if (c.arch == "gemma3") {
      l.post_attn_norm = b.vector(c.n_embd, 1.0f, 0.1f);
      l.post_ffn_norm = b.vector(c.n_embd, 1.0f, 0.1f);
    }
  }
  return w;
}

}  // namespace tessera
