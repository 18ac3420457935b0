#pragma once
// Perplexity with llama.cpp's window rule: the token stream is cut into consecutive chunks of
// `window` tokens; in each chunk (a fresh sequence; its first token replaced by BOS when the
// model adds one), the logits at positions [window/2, window-1) are scored against the next
// token. ppl = exp(mean NLL over all scored tokens).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace tessera {

class Session;

struct PerplexityResult {
  double ppl = 0;
  int n_chunks = 0;
  int64_t n_scored = 0;
  std::vector<double> chunk_nll;  // sum of NLL per chunk
};

PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int window, int max_chunks,
                            const std::function<void(int chunk, int n_chunks, double ppl_so_far)>& progress = {});

// -log softmax(logits)[target], computed in double.
double negative_log_likelihood(std::span<const float> logits, int32_t target);

}  // namespace tessera
