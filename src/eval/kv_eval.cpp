#include "eval/kv_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

void log_softmax_inplace(std::span<float> row) {
  float mx = -INFINITY;
  for (float v : row) mx = std::max(mx, v);
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  for (float& v : row) v = static_cast<float>(v - lse);
}

double kl_divergence(std::span<const float> logp, std::span<const float> logq) {
  double kl = 0;
  for (size_t i = 0; i < logp.size(); ++i) {
    const double lp = logp[i];
    if (lp < -80) continue;  // exp underflows: the term is 0 to double precision
    kl += std::exp(lp) * (lp - static_cast<double>(logq[i]));
  }
  return std::max(kl, 0.0);  // float rounding of the log-probs can give -1e-9
}

namespace {

int argmax(std::span<const float> row) {
  return static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Runs every window of `tokens` through a fresh sequence of `session` and calls
// row(chunk, pos, logits) for positions 0 .. window-2 of each (the logits predicting pos+1).
// The same windows, BOS rule and batch split as eval/perplexity.cpp.
void for_each_window_row(Session& session, std::span<const int32_t> tokens, int window, int n_chunks,
                         const std::function<void(int, int, std::span<float>)>& row,
                         const std::function<void(int)>& chunk_done) {
  const bool add_bos = session.has_tokenizer() && session.tokenizer().add_bos();
  const int n_vocab = session.config().n_vocab;
  const int batch_max = std::min(session.model().max_batch_tokens(), session.options().max_logits);
  std::vector<int32_t> chunk(window);
  std::vector<float> logits;
  ForwardBatch batch;
  for (int c = 0; c < n_chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<int64_t>(c) * window, window, chunk.begin());
    if (add_bos) chunk[0] = session.tokenizer().bos_id();
    SequenceBlocks seq;
    for (int done = 0; done < window;) {
      const int n = std::min(batch_max, window - done);
      TESSERA_CHECK(seq.reserve(session.pool(), session.block_size(), n), "KV cache full during eval kv");
      batch.clear();
      batch.add_sequence(seq, session.block_size(), chunk.data() + done, n, ForwardBatch::Logits::None);
      for (int i = 0; i < n; ++i)
        if (done + i < window - 1) batch.logits_rows.push_back(i);
      logits.resize(batch.logits_rows.size() * static_cast<size_t>(n_vocab));
      session.runner().forward(batch, logits.data());
      for (size_t k = 0; k < batch.logits_rows.size(); ++k)
        row(c, done + batch.logits_rows[k], std::span<float>(logits.data() + k * n_vocab, n_vocab));
      seq.n_tokens += n;
      done += n;
    }
    seq.release_all(session.pool());
    if (chunk_done) chunk_done(c);
  }
}

std::unique_ptr<Session> open_session(const KvEvalCase& c, int window) {
  SessionOptions so = *c.options;
  so.ctx = std::max(so.ctx, window);
  so.kv_tokens = std::max(so.kv_tokens, window);
  so.max_logits = std::min(window, so.max_batch_tokens);
  auto s = std::make_unique<Session>(so);
  TESSERA_CHECK(window <= s->ctx(), "eval kv: window ", window, " exceeds the context ", s->ctx());
  return s;
}

void describe(Session& s, KvEvalRow& r) {
  const KvCacheSpec& spec = s.kv().spec();
  r.format = spec.format_name();
  const double per_page = static_cast<double>(spec.block_size) * spec.head_dim;
  r.k_bits = 8.0 * static_cast<double>(spec.k_page_bytes()) / per_page;
  r.v_bits = 8.0 * static_cast<double>(spec.v_page_bytes()) / per_page;
  r.bits_per_element = (r.k_bits + r.v_bits) / 2;
}

}  // namespace

KvEvalReport evaluate_kv_formats(const KvEvalCase& reference, const std::vector<KvEvalCase>& cases,
                                 std::span<const int32_t> tokens, const KvEvalConfig& config,
                                 const std::function<void(const std::string&, int, int)>& progress) {
  const int window = config.window;
  TESSERA_CHECK(window >= 8, "eval kv: window ", window, " is too small (at least 8)");
  TESSERA_CHECK(config.n_buckets >= 1 && config.n_buckets <= window - 1, "eval kv: ", config.n_buckets,
                " buckets for a window of ", window);
  int n_chunks = static_cast<int>(tokens.size() / window);
  TESSERA_CHECK(n_chunks >= 1, "eval kv needs at least ", window, " tokens, the text has ", tokens.size());
  if (config.max_chunks > 0) n_chunks = std::min(n_chunks, config.max_chunks);

  KvEvalReport rep;
  rep.reference = reference.label;
  rep.window = window;
  rep.n_chunks = n_chunks;
  rep.n_buckets = config.n_buckets;
  rep.n_tokens = static_cast<int64_t>(tokens.size());
  const int first = window / 2;  // llama.cpp's scored half
  const int rows_per_chunk = window - 1;
  rep.n_scored = static_cast<int64_t>(n_chunks) * (window - 1 - first);
  rep.n_positions = static_cast<int64_t>(n_chunks) * rows_per_chunk;
  auto bucket_of = [&](int pos) {
    return static_cast<int>(static_cast<int64_t>(pos) * config.n_buckets / rows_per_chunk);
  };
  std::vector<int64_t> bucket_n(config.n_buckets, 0);
  for (int p = 0; p < rows_per_chunk; ++p) bucket_n[bucket_of(p)] += n_chunks;

  // The reference's log-probabilities at every compared position, kept for all formats
  // (n_chunks * (window-1) * n_vocab floats: 0.8 GB at window 2048 over 4k tokens).
  std::vector<float> ref_logp;
  std::vector<int32_t> ref_top;
  int n_vocab = 0;
  {
    std::unique_ptr<Session> s = open_session(reference, window);
    n_vocab = s->config().n_vocab;
    ref_logp.resize(static_cast<size_t>(rep.n_positions) * n_vocab);
    ref_top.resize(rep.n_positions);
    KvEvalRow r;
    r.label = reference.label;
    describe(*s, r);
    double nll = 0;
    for_each_window_row(
        *s, tokens, window, n_chunks,
        [&](int c, int pos, std::span<float> row) {
          log_softmax_inplace(row);
          const int64_t idx = static_cast<int64_t>(c) * rows_per_chunk + pos;
          std::copy(row.begin(), row.end(), ref_logp.begin() + idx * n_vocab);
          ref_top[idx] = argmax(row);
          if (pos >= first) nll -= row[tokens[static_cast<int64_t>(c) * window + pos + 1]];
        },
        [&](int c) {
          if (progress) progress(reference.label, c + 1, n_chunks);
        });
    r.mean_nll = nll / rep.n_scored;
    r.ppl = std::exp(r.mean_nll);
    r.top1 = 1;
    r.bucket_kl.assign(config.n_buckets, 0.0);
    r.bucket_top1.assign(config.n_buckets, 1.0);
    rep.rows.push_back(r);
  }

  for (const KvEvalCase& kc : cases) {
    std::unique_ptr<Session> s = open_session(kc, window);
    TESSERA_CHECK(s->config().n_vocab == n_vocab, "eval kv: ", kc.label, " has a vocabulary of ", s->config().n_vocab,
                  ", the reference ", n_vocab);
    KvEvalRow r;
    r.label = kc.label;
    describe(*s, r);
    double nll = 0, kl_sum = 0;
    int64_t agree = 0;
    std::vector<double> bkl(config.n_buckets, 0.0), btop(config.n_buckets, 0.0);
    for_each_window_row(
        *s, tokens, window, n_chunks,
        [&](int c, int pos, std::span<float> row) {
          log_softmax_inplace(row);
          const int64_t idx = static_cast<int64_t>(c) * rows_per_chunk + pos;
          const double kl = kl_divergence(std::span<const float>(ref_logp.data() + idx * n_vocab, n_vocab), row);
          const bool same = argmax(row) == ref_top[idx];
          const int b = bucket_of(pos);
          bkl[b] += kl;
          btop[b] += same;
          if (pos >= first) {
            nll -= row[tokens[static_cast<int64_t>(c) * window + pos + 1]];
            kl_sum += kl;
            r.max_kl = std::max(r.max_kl, kl);
            agree += same;
          }
        },
        [&](int c) {
          if (progress) progress(kc.label, c + 1, n_chunks);
        });
    r.mean_nll = nll / rep.n_scored;
    r.ppl = std::exp(r.mean_nll);
    r.mean_kl = kl_sum / rep.n_scored;
    r.top1 = static_cast<double>(agree) / rep.n_scored;
    for (int b = 0; b < config.n_buckets; ++b) {
      r.bucket_kl.push_back(bkl[b] / bucket_n[b]);
      r.bucket_top1.push_back(btop[b] / bucket_n[b]);
    }
    rep.rows.push_back(std::move(r));
  }
  return rep;
}

namespace {

// printf into a string (also keeps GCC 12's -Wrestrict false positive on "literal" + string away).
template <typename... T>
void appendf(std::string& o, const char* f, T... v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, v...);
  o += buf;
}

// Bucket b covers positions [lo, hi) of the window (0-based, the position whose logits predict
// the next token): the smallest pos with pos * n_buckets / (window-1) >= b.
std::pair<int, int> bucket_range(const KvEvalReport& rep, int b) {
  const int rows = rep.window - 1;
  auto lo_of = [&](int k) {
    return static_cast<int>((static_cast<int64_t>(k) * rows + rep.n_buckets - 1) / rep.n_buckets);
  };
  return {lo_of(b), lo_of(b + 1)};
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    o += ch;
  }
  return o;
}

}  // namespace

std::string kv_eval_markdown(const KvEvalReport& rep) {
  const KvEvalRow& ref = rep.rows.front();
  std::string o;
  appendf(o, "window %d, %d windows, %lld scored tokens (of %lld), reference %s\n\n", rep.window, rep.n_chunks,
          static_cast<long long>(rep.n_scored), static_cast<long long>(rep.n_tokens), rep.reference.c_str());
  o += "| format | K bits | V bits | bits/elem | ppl | Δppl | mean KL | max KL | top-1 |\n";
  o += "|---|---|---|---|---|---|---|---|---|\n";
  for (const KvEvalRow& r : rep.rows)
    appendf(o, "| %s | %.2f | %.2f | %.2f | %.4f | %+.2f%% | %.5f | %.3f | %.2f%% |\n", r.label.c_str(), r.k_bits,
            r.v_bits, r.bits_per_element, r.ppl, 100.0 * (r.ppl / ref.ppl - 1), r.mean_kl, r.max_kl, 100.0 * r.top1);
  o += "\nmean KL (top-1 agreement) by position in the window, all positions:\n\n| format |";
  std::string sep = "|---|";
  for (int b = 0; b < rep.n_buckets; ++b) {
    const auto [lo, hi] = bucket_range(rep, b);
    appendf(o, " %d–%d |", lo, hi - 1);
    sep += "---|";
  }
  o += "\n";
  o += sep;
  o += "\n";
  for (size_t i = 1; i < rep.rows.size(); ++i) {
    const KvEvalRow& r = rep.rows[i];
    appendf(o, "| %s |", r.label.c_str());
    for (int b = 0; b < rep.n_buckets; ++b) appendf(o, " %.5f (%.1f%%) |", r.bucket_kl[b], 100.0 * r.bucket_top1[b]);
    o += "\n";
  }
  return o;
}

std::string kv_eval_json(const KvEvalReport& rep) {
  std::string o;
  appendf(o, "{\n  \"reference\": \"%s\", \"window\": %d, \"n_chunks\": %d, \"n_tokens\": %lld, \"n_scored\": %lld, ",
          json_escape(rep.reference).c_str(), rep.window, rep.n_chunks, static_cast<long long>(rep.n_tokens),
          static_cast<long long>(rep.n_scored));
  appendf(o, "\"n_positions\": %lld,\n  \"buckets\": [", static_cast<long long>(rep.n_positions));
  for (int b = 0; b < rep.n_buckets; ++b) {
    const auto [lo, hi] = bucket_range(rep, b);
    appendf(o, "%s[%d, %d]", b ? ", " : "", lo, hi);
  }
  o += "],\n  \"rows\": [\n";
  for (size_t i = 0; i < rep.rows.size(); ++i) {
    const KvEvalRow& r = rep.rows[i];
    appendf(o, "    {\"label\": \"%s\", \"format\": \"%s\", ", json_escape(r.label).c_str(),
            json_escape(r.format).c_str());
    appendf(o, "\"k_bits\": %.4f, \"v_bits\": %.4f, \"bits_per_element\": %.4f, ", r.k_bits, r.v_bits,
            r.bits_per_element);
    appendf(o,
            "\"ppl\": %.6f, \"mean_nll\": %.8f, \"mean_kl\": %.8g, \"max_kl\": %.6g, \"top1\": %.6f, \"bucket_kl\": [",
            r.ppl, r.mean_nll, r.mean_kl, r.max_kl, r.top1);
    for (int b = 0; b < rep.n_buckets; ++b) appendf(o, "%s%.8g", b ? ", " : "", r.bucket_kl[b]);
    o += "], \"bucket_top1\": [";
    for (int b = 0; b < rep.n_buckets; ++b) appendf(o, "%s%.6f", b ? ", " : "", r.bucket_top1[b]);
    o += i + 1 < rep.rows.size() ? "]},\n" : "]}\n";
  }
  o += "  ]\n}\n";
  return o;
}

}  // namespace tessera
