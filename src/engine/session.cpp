#include "engine/session.h"

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "engine/kv_scales.h"
#include "model/dummy.h"
#include "model/quantize_weights.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

namespace {
struct Alias {
  const char* name;
  const char* file;
};
constexpr Alias kAliases[] = {
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
};

std::string model_cache_dir() {
  if (const char* c = std::getenv("TESSERA_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tessera/models";
}
}  // namespace

std::string resolve_model_path(const std::string& model) {
  if (std::filesystem::exists(model)) return model;
  for (const Alias& a : kAliases) {
    if (model == a.name) {
      const std::string path = model_cache_dir() + "/" + a.file;
      if (!std::filesystem::exists(path))
        fail("model '", model, "' is not in the cache (", path, "); run `make model` or scripts/fetch-model.sh ",
             model);
      return path;
    }
  }
  fail("model '", model, "' is neither a file nor a known alias (smollm2-135m, gemma3-270m, dummy:<preset>)");
}

LoadedModel load_model(const std::string& model_spec, int cpu_threads, uint64_t dummy_seed) {
  LoadedModel m;
  // "MODEL@w4g128": the model's linear layers quantized at load (round-to-nearest).
  std::string model = model_spec;
  WeightQuantSpec quantize_at_load;
  bool quantize = false;
  if (const auto at = model.rfind('@'); at != std::string::npos && at > 0) {
    quantize = parse_weight_quant_spec(model.substr(at + 1), &quantize_at_load);
    TESSERA_CHECK(quantize, "model '", model, "': '", model.substr(at + 1),
                  "' after '@' is not a weight quantization (w4g128, w8g64, w4c, w4g128a, ...)");
    model = model.substr(0, at);
  }
  if (model.rfind("dummy:", 0) == 0) {
    m.weights = make_dummy_weights(model.substr(6), dummy_seed);
  } else if (const std::string path = resolve_model_path(model); std::filesystem::is_directory(path)) {
    // A Hugging Face checkpoint: config.json, safetensors, tokenizer.json.
    m.weights = load_safetensors_weights(path);
    if (std::filesystem::exists(path + "/tokenizer.json"))
      m.tokenizer = Tokenizer::from_hf_json(path + "/tokenizer.json");
  } else {
    m.gguf = GGUFFile::open(path);
    m.weights = load_gguf_weights(m.gguf);
    m.tokenizer = Tokenizer::from_gguf(*m.gguf);
  }
  if (quantize && quantize_at_load.method != "rtn") {
    // GPTQ/AWQ: calibration text through the model's tokenizer, on the CPU backend.
    TESSERA_CHECK(m.tokenizer != nullptr, "model '", model_spec, "': calibration needs the model's tokenizer");
    BackendOptions cpu_options;
    cpu_options.threads = cpu_threads;
    const auto cpu = make_backend(cpu_options);
    quantize_linear_weights_calibrated(
        *m.weights, quantize_at_load,
        [&](const std::string& text) {
          return m.tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/false);
        },
        *cpu,
        [](const CalibratedLayerReport& r) { std::fprintf(stderr, "%s\n", describe_calibrated_layer(r).c_str()); });
    m.weights->source += model_spec.substr(model_spec.rfind('@'));
  } else if (quantize) {
    quantize_linear_weights(*m.weights, quantize_at_load);
    m.weights->source += model_spec.substr(model_spec.rfind('@'));
  }
  if (m.tokenizer)
    TESSERA_CHECK(m.tokenizer->vocab_size() <= m.weights->config.n_vocab, m.weights->source, ": tokenizer has ",
                  m.tokenizer->vocab_size(), " tokens but the model's vocabulary is ", m.weights->config.n_vocab);
  return m;
}

Session::Session(const SessionOptions& options) : options_(options) {
  LoadedModel loaded = load_model(options.model, options.backend.threads, options.dummy_seed);
  gguf_ = std::move(loaded.gguf);
  weights_ = std::move(loaded.weights);
  tokenizer_ = std::move(loaded.tokenizer);
  const ModelConfig& c = weights_->config;
  ctx_ = options.ctx > 0 ? options.ctx : c.n_ctx_train;
  if (options.weights_only) return;
  TESSERA_CHECK(options.max_batch_tokens >= 1 && options.max_batch_tokens <= 65536, "max batch tokens ",
                options.max_batch_tokens, " is outside [1, 65536]");
  const int max_logits = std::min(options.max_logits, options.max_batch_tokens);
  TESSERA_CHECK(options.tensor_parallel_size >= 1, "--tensor-parallel-size ", options.tensor_parallel_size,
                " must be at least 1");
  const ParallelLayout layout{.tensor = options.tensor_parallel_size, .pipeline = options.pipeline_parallel_size};
  if (layout.size() > 1) {
    ranks_ = std::make_unique<ParallelRanks>(weights_, options.backend, layout, options.max_batch_tokens, max_logits);
  } else {
    backend_ = make_backend(options.backend);
    resident_ = make_resident(weights_, *backend_);
    model_ = create_model(resident_, *backend_, options.max_batch_tokens, max_logits);
  }
  TESSERA_CHECK(ctx_ >= 1 && ctx_ <= (1 << 22), "context ", ctx_, " is out of range");
  make_kv(options.kv_tokens > 0 ? std::min(options.kv_tokens, ctx_) : ctx_);
}

void Session::make_kv(int tokens) {
  const ModelConfig& c = weights_->config;
  KvCacheSpec spec;
  spec.n_layers = c.n_layer;
  spec.n_kv_heads = c.n_head_kv;
  spec.head_dim = c.head_dim;
  spec.block_size = options_.block_size;
  spec.n_blocks = (tokens + options_.block_size - 1) / options_.block_size;
  spec.k_format = options_.k_format;
  spec.v_format = options_.v_format;
  spec.k_scales = options_.k_scales;
  spec.v_scales = options_.v_scales;
  spec.k_mean = options_.k_mean;
  spec.k_equal = options_.k_equal;
  spec.k_rope_dim = options_.k_rope_dim;
  spec.k_rope_neox = options_.k_rope_neox;
  spec.k_rope_freq = options_.k_rope_freq;
  spec.k_first = options_.k_first;
  apply_checkpoint_kv_scales(*weights_, spec);
  pool_ = std::make_unique<BlockPool>(spec.n_blocks);
  if (ranks_) {  // each rank its KV heads, on its own thread
    ranks_->run([&](ParallelRanks::Rank& r) {
      r.runner.reset();
      r.kv.reset();
      r.kv = std::make_unique<KvCache>(*r.backend, ranks_->rank_kv_spec(spec, r.index));
      r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.backend);
    });
    return;
  }
  runner_.reset();
  kv_.reset();  // free the old cache before allocating the new one
  kv_ = std::make_unique<KvCache>(*backend_, spec);
  runner_ = std::make_unique<ModelRunner>(*model_, *kv_, *backend_);
}

void Session::provision_kv(int tokens) {
  TESSERA_CHECK(tokens >= 1 && tokens <= ctx_, "KV for ", tokens, " tokens is outside [1, the context of ", ctx_,
                "]; raise --max-model-len");
  if (!pool_) weights_only_error();
  if (tokens <= kv_tokens()) return;
  TESSERA_CHECK(pool_->n_free() == pool_->n_blocks(), "KV cache resized while sequences hold blocks");
  make_kv(tokens);
}

Session::~Session() = default;

void Session::weights_only_error() const {
  if (ranks_)
    fail("session of '", options_.model, "' runs on ", ranks_->size(), " parallel ranks (", ranks_->layout().flag(),
         "): it has no single runner (feed() runs every rank)");
  fail("session of '", options_.model, "' holds its weights only (parallel ranks run them)");
}

Tokenizer& Session::tokenizer() {
  TESSERA_CHECK(tokenizer_ != nullptr, "model '", options_.model, "' has no tokenizer (dummy weights)");
  return *tokenizer_;
}

void Session::feed(SequenceBlocks& seq, std::span<const int32_t> tokens, ForwardBatch::Logits mode,
                   std::vector<float>& logits) {
  if (!runner_ && !ranks_) weights_only_error();
  const int n_vocab = config().n_vocab;
  const int chunk_max = mode == ForwardBatch::Logits::All
                            ? std::min(model().max_batch_tokens(), std::max(1, options_.max_logits))
                            : model().max_batch_tokens();
  size_t done = 0;
  while (done < tokens.size()) {
    const int n = static_cast<int>(std::min<size_t>(chunk_max, tokens.size() - done));
    TESSERA_CHECK(seq.n_tokens + n <= ctx_, "context full: ", seq.n_tokens, " + ", n, " tokens exceed the context of ",
                  ctx_);
    TESSERA_CHECK(seq.reserve(*pool_, options_.block_size, n), "KV cache full: no free blocks for ", n, " tokens");
    const bool last_chunk = done + n == tokens.size();
    const auto chunk_mode = mode == ForwardBatch::Logits::All ? mode : (last_chunk ? mode : ForwardBatch::Logits::None);
    batch_.clear();
    batch_.add_sequence(seq, options_.block_size, tokens.data() + done, n, chunk_mode);
    const size_t rows = batch_.logits_rows.size();
    const size_t old = logits.size();
    logits.resize(old + rows * n_vocab);
    forward(logits.data() + old, {});
    seq.n_tokens += n;
    done += n;
  }
}

void Session::forward(float* logits, const Backend::LogitsReadback& plan) {
  if (!ranks_) return runner_->forward(batch_, logits, plan);
  // Every rank runs the batch (their collectives or messages meet). The sampling rank's
  // logits are returned (tensor parallelism: rank 0's; pipeline stages: the last stage's);
  // the other ranks of the last stage compute theirs (their slices join in the all-gather),
  // the stages before compute none.
  const ParallelLayout& layout = ranks_->layout();
  const size_t n = batch_.logits_rows.size() * static_cast<size_t>(config().n_vocab);
  ForwardBatch no_logits;
  if (layout.pipelined()) {
    no_logits = batch_;
    no_logits.logits_rows.clear();
  }
  ranks_->run([&](ParallelRanks::Rank& r) {
    if (r.index == layout.sampling_rank()) return r.runner->forward(batch_, logits, plan);
    const bool computes = layout.computes_logits(r.index);
    std::vector<float> dropped(computes ? n : 1);
    r.runner->forward(computes ? batch_ : no_logits, dropped.data());
  });
}

int32_t Session::decode_greedy(SequenceBlocks& seq, int32_t token) {
  if (!runner_ && !ranks_) weights_only_error();
  TESSERA_CHECK(seq.n_tokens + 1 <= ctx_, "context full: ", seq.n_tokens, " + 1 tokens exceed the context of ", ctx_);
  TESSERA_CHECK(seq.reserve(*pool_, options_.block_size, 1), "KV cache full: no free blocks for 1 token");
  batch_.clear();
  batch_.add_sequence(seq, options_.block_size, &token, 1, ForwardBatch::Logits::Last);
  const uint8_t argmax_only = 1;
  int32_t next = -1;
  // The host row is written only when the device cannot reduce it (NaN, all -inf): then the
  // host picks, as the engine's sampler would.
  greedy_row_.resize(config().n_vocab);
  forward(greedy_row_.data(), Backend::LogitsReadback{&argmax_only, &next});
  if (next < 0)  // a row of NaN or +inf: the first largest as the host reads it
    next = static_cast<int32_t>(std::max_element(greedy_row_.begin(), greedy_row_.end()) - greedy_row_.begin());
  seq.n_tokens += 1;
  return next;
}

}  // namespace tessera
