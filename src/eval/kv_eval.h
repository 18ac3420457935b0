#pragma once
// Quality of KV-cache formats against a reference cache (tessera eval kv). The same token
// stream is cut into the windows of eval/perplexity.h (llama.cpp's rule: consecutive chunks
// of `window` tokens, each a fresh sequence); the reference session (f16 cache) runs first and
// its log-probabilities at every position are kept, then each format's session runs the
// same windows and is compared position by position:
//   - ppl over llama.cpp's scored positions [window/2, window-1), so it matches `eval ppl`;
//   - mean KL(reference || format) and top-1 agreement over the same scored positions;
//   - KL and top-1 by position bucket over the whole window [0, window-1) (n_buckets equal
//     ranges), to see whether the error grows with the number of cached tokens.
// Per-layer error is not measured: the model's forward has no hook for intermediate outputs.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera {

struct SessionOptions;  // engine/session.h (a private dependency of eval)

struct KvEvalCase {
  std::string label;                              // as given on the command line (e.g. "int4:g32")
  std::shared_ptr<const SessionOptions> options;  // the base options with this case's K/V formats
};

struct KvEvalConfig {
  int window = 512;
  int max_chunks = 0;  // 0 = every whole window of the text
  int n_buckets = 4;
};

struct KvEvalRow {
  std::string label, format;  // format: the cache's canonical name (KvCacheSpec::format_name)
  // Storage bits per element, page meta included (from the cache's page layout).
  double k_bits = 0, v_bits = 0, bits_per_element = 0;
  double ppl = 0;
  double mean_kl = 0;                          // nats, over the scored positions
  double max_kl = 0;                           // the worst single scored position
  double top1 = 0;                             // fraction of scored positions whose argmax equals the reference's
  double mean_nll = 0;                         // nats per scored token
  std::vector<double> bucket_kl, bucket_top1;  // by position bucket, whole window
};

struct KvEvalReport {
  std::string reference;
  int window = 0, n_chunks = 0, n_buckets = 0;
  int64_t n_tokens = 0;         // tokens of the text
  int64_t n_scored = 0;         // scored positions (ppl, mean KL, top-1)
  int64_t n_positions = 0;      // positions compared by bucket
  std::vector<KvEvalRow> rows;  // rows[0] is the reference against itself
};

// Runs `reference`, then every case, over `tokens`. progress(label, chunk, n_chunks) after
// each window. Throws (TESSERA_CHECK) on a window larger than a session's context or a text
// shorter than one window.
KvEvalReport evaluate_kv_formats(const KvEvalCase& reference, const std::vector<KvEvalCase>& cases,
                                 std::span<const int32_t> tokens, const KvEvalConfig& config,
                                 const std::function<void(const std::string&, int, int)>& progress = {});

// Markdown table, one row per format (reference first), and the bucket table.
std::string kv_eval_markdown(const KvEvalReport& report);
// The same as JSON text.
std::string kv_eval_json(const KvEvalReport& report);

// KL(p || q) with p, q given as log-probabilities, in double.
double kl_divergence(std::span<const float> logp, std::span<const float> logq);
// logits -> log-softmax in place (double accumulation).
void log_softmax_inplace(std::span<float> row);

}  // namespace tessera
