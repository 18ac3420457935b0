#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

double negative_log_likelihood(std::span<const float> logits, int32_t target) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return std::log(sum) - (static_cast<double>(logits[target]) - mx);
}

PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int window, int max_chunks,
                            const std::function<void(int, int, double)>& progress) {
  TESSERA_CHECK(window >= 4, "perplexity window ", window, " is too small (at least 4)");
  TESSERA_CHECK(window <= session.ctx(), "perplexity window ", window, " exceeds the context ", session.ctx());
  int n_chunks = static_cast<int>(tokens.size() / window);
  TESSERA_CHECK(n_chunks >= 1, "perplexity needs at least ", window, " tokens, the text has ", tokens.size());
  if (max_chunks > 0) n_chunks = std::min(n_chunks, max_chunks);
  const bool add_bos = session.has_tokenizer() && session.tokenizer().add_bos();
  const int n_vocab = session.config().n_vocab;
  const int first = window / 2;
  const int batch_max = std::min(session.model().max_batch_tokens(), session.options().max_logits);

  PerplexityResult r;
  double nll_total = 0;
  std::vector<int32_t> chunk(window);
  std::vector<float> logits;
  ForwardBatch batch;
  for (int c = 0; c < n_chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<int64_t>(c) * window, window, chunk.begin());
    if (add_bos) chunk[0] = session.tokenizer().bos_id();
    SequenceBlocks seq;
    double nll = 0;
    for (int done = 0; done < window;) {
      const int n = std::min(batch_max, window - done);
      TESSERA_CHECK(seq.reserve(session.pool(), session.block_size(), n), "KV cache full during perplexity");
      batch.clear();
      batch.add_sequence(seq, session.block_size(), chunk.data() + done, n, ForwardBatch::Logits::None);
      for (int i = 0; i < n; ++i)
        if (done + i >= first && done + i < window - 1) batch.logits_rows.push_back(i);
      logits.resize(batch.logits_rows.size() * static_cast<size_t>(n_vocab));
      session.runner().forward(batch, logits.data());
      for (size_t k = 0; k < batch.logits_rows.size(); ++k) {
        const int pos = done + batch.logits_rows[k];
        nll += negative_log_likelihood(std::span<const float>(logits.data() + k * n_vocab, n_vocab), chunk[pos + 1]);
      }
      seq.n_tokens += n;
      done += n;
    }
    seq.release_all(session.pool());
    r.chunk_nll.push_back(nll);
    nll_total += nll;
    r.n_scored += window - 1 - first;
    if (progress) progress(c + 1, n_chunks, std::exp(nll_total / r.n_scored));
  }
  r.n_chunks = n_chunks;
  r.ppl = std::exp(nll_total / r.n_scored);
  return r;
}

}  // namespace tessera
