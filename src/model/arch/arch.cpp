// The architecture registry (create_model) and the pieces architectures share.
#include "model/arch/arch.h"

#include <utility>

#include "core/error.h"

namespace tessera {

DecoderActivations::DecoderActivations(Backend& be, const ModelConfig& c, int max_tokens, int max_logits) : bufs(be) {
  TESSERA_CHECK(max_tokens >= 1 && max_logits >= 1 && max_logits <= max_tokens, c.arch, ": bad batch limits ",
                max_tokens, "/", max_logits);
  q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
  kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  qkv_ld = q_dim + 2 * kv_dim;
  const int64_t t = max_tokens;
  x = bufs.floats(t * c.n_embd);
  x2 = bufs.floats(t * c.n_embd);
  xn = bufs.floats(t * c.n_embd);
  tmp = bufs.floats(t * c.n_embd);
  q = bufs.floats(t * qkv_ld);
  k = q + q_dim;
  v = k + kv_dim;
  att = bufs.floats(t * q_dim);
  gate = bufs.floats(t * 2 * c.n_ff);
  up = gate + c.n_ff;
  h = bufs.floats(t * c.n_ff);
  rows = bufs.floats(static_cast<int64_t>(max_logits) * c.n_embd);
  logits = bufs.floats(static_cast<int64_t>(max_logits) * c.n_vocab);
}

void decoder_final_norm(Backend& be, const ModelWeights& w, DecoderActivations& a, float* x, const ForwardInputs& in) {
  const ModelConfig& c = w.config;
  const int n = in.batch.n_tokens, n_out = in.n_logits, e = c.n_embd;
  be.add(x, a.tmp, static_cast<int64_t>(n) * e);
  // Only the wanted rows go through the final norm and the (large) output matrix.
  be.gather_rows(x, e, in.logits_rows, n_out, e, a.rows);
  be.rms_norm(a.rows, w.output_norm, a.rows, n_out, e, c.rms_eps);
}

float* decoder_head(Backend& be, const ModelWeights& w, DecoderActivations& a, float* x, const ForwardInputs& in) {
  const ModelConfig& c = w.config;
  const int n_out = in.n_logits, e = c.n_embd;
  if (n_out == 0) return a.logits;
  decoder_final_norm(be, w, a, x, in);
  const MatmulTarget out[] = {{w.output, a.logits, c.n_vocab}};
  be.matmul(a.rows, n_out, e, out);  // logits: [n_out, n_vocab]
  return a.logits;
}

RopeConfig rope_config_for(const ModelConfig& c, float freq_base, const float* freq_factors, bool with_scaling) {
  RopeConfig r;
  r.head_dim = c.head_dim;
  r.rot_dim = c.rope_dim;
  r.freq_base = freq_base;
  r.neox = c.rope_neox;
  r.freq_factors = freq_factors;
  if (!with_scaling) return r;
  if (c.rope_scaling == "linear") r.linear_factor = c.rope_scaling_factor;
  if (c.rope_scaling == "llama3") {
    r.llama3_factor = c.rope_scaling_factor;
    r.llama3_low_freq_factor = c.rope_low_freq_factor;
    r.llama3_high_freq_factor = c.rope_high_freq_factor;
    r.llama3_original_ctx = c.rope_original_ctx;
  }
  if (c.rope_scaling == "yarn") {
    r.yarn_factor = c.rope_scaling_factor;
    r.yarn_original_ctx = c.rope_original_ctx;
    r.yarn_beta_fast = c.rope_yarn_beta_fast;
    r.yarn_beta_slow = c.rope_yarn_beta_slow;
  }
  return r;
}

RopeConfig layer_rope_config(const ModelWeights& w, int il) {
  const ModelConfig& c = w.config;
  if (c.arch == "gemma3" && c.is_local_layer(il))
    return rope_config_for(c, c.rope_freq_base_local, nullptr, /*with_scaling=*/false);
  return rope_config_for(c, c.rope_freq_base, w.rope_freq_factors, /*with_scaling=*/true);
}

std::unique_ptr<Model> create_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_batch_tokens,
                                    int max_logits, ModelComms comms) {
  const std::string& arch = weights->config.arch;
  if (arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" ||
      arch == "phi3")
    return make_llama_model(std::move(weights), backend, max_batch_tokens, max_logits, comms);
  TESSERA_CHECK(weights->shard.size == 1, arch, ": tensor parallelism is built for the Llama family only");
  TESSERA_CHECK(weights->stage.size == 1, arch, ": pipeline parallelism is built for the Llama family only");
  if (arch == "gemma3") return make_gemma3_model(std::move(weights), backend, max_batch_tokens, max_logits);
  fail("no model runner for architecture '", arch, "'");
}

}  // namespace tessera
