// tessera bench verify: what a speculative verification step costs. B sequences, each with
// `depth` tokens already in its KV, run one forward of k+1 rows each (the k draft tokens plus
// the bonus row, every row returning its argmax as greedy verification reads it), against the
// plain decode step of the same B sequences (k = 0, the path the engine runs, graphs included).
//
// The column that decides whether speculation pays at a batch size: a step with k drafts
// costs t(k)/t(0) decode steps and yields 1 + (accepted drafts) tokens, so it wins only when
// the mean accepted count per step exceeds t(k)/t(0) - 1 (the "break-even" column).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "engine/session.h"

namespace tessera::apps {

namespace {

struct VerifyArgs {
  ModelArgs model;
  std::string batches = "1,8,32,128";
  std::string ks = "0,1,2,4,8,16";
  int depth = 1024;
  int reps = 5;
};

void run_verify_bench(const VerifyArgs& a) {
  const std::vector<int> batches = parse_int_list(a.batches, "--batches", 1);
  std::vector<int> ks = parse_int_list(a.ks, "--ks", 0);
  if (std::find(ks.begin(), ks.end(), 0) == ks.end()) ks.insert(ks.begin(), 0);  // the baseline
  std::sort(ks.begin(), ks.end());
  const int max_b = *std::max_element(batches.begin(), batches.end());
  const int max_rows = ks.back() + 1;

  SessionOptions so = a.model.session_options();
  // One sequence's positions stay below depth + max_rows; the KV holds every sequence.
  const int per_seq = a.depth + max_rows;
  so.ctx = std::max(so.ctx, max_b * (per_seq + so.block_size));
  so.kv_tokens = so.ctx;
  so.max_batch_tokens = std::max({so.max_batch_tokens, max_b * max_rows, 1});
  so.max_logits = max_b * max_rows;
  Session session(so);
  const ModelConfig& c = session.config();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, c.n_vocab - 1);

  std::printf(
      "\n| batch | k | rows | ms/step | x decode step | break-even accepted/step |\n|---|---|---|---|---|---|\n");
  ForwardBatch batch;
  std::vector<float> logits;
  std::vector<uint8_t> argmax_only;
  std::vector<int32_t> argmax;
  for (const int b : batches) {
    std::vector<SequenceBlocks> seqs(b);
    std::vector<float> fill_logits;
    for (auto& s : seqs) {
      std::vector<int32_t> ctx(a.depth);
      for (auto& t : ctx) t = tok(rng);
      TESSERA_CHECK(s.reserve(session.pool(), so.block_size, per_seq - s.n_tokens),
                    "bench verify: the KV pool cannot hold ", b, " sequences of ", per_seq, " tokens");
      if (a.depth > 0) session.feed(s, ctx, ForwardBatch::Logits::Last, fill_logits);
      fill_logits.clear();
    }
    double base_ms = 0;
    for (const int k : ks) {
      const int rows = k + 1;
      std::vector<int32_t> draft(rows);
      batch.clear();
      for (auto& s : seqs) {
        for (auto& t : draft) t = tok(rng);
        // Every row's argmax, as greedy verification needs; the KV slots written are the same
        // every repetition (n_tokens does not advance), as a rejected draft's would be.
        batch.add_sequence(s, so.block_size, draft.data(), rows, ForwardBatch::Logits::All);
      }
      const int n_logits = static_cast<int>(batch.logits_rows.size());
      logits.resize(static_cast<size_t>(n_logits) * c.n_vocab);
      argmax_only.assign(n_logits, 1);
      argmax.assign(n_logits, 0);
      const Backend::LogitsReadback plan{argmax_only.data(), argmax.data()};
      session.runner().forward(batch, logits.data(), plan);  // warm-up (captures a graph at k = 0)
      std::vector<double> ms;
      for (int r = 0; r < a.reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        session.runner().forward(batch, logits.data(), plan);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      if (k == 0) base_ms = med;
      std::printf("| %d | %d | %d | %.3f | %.2f | %.2f |\n", b, k, b * rows, med, med / base_ms, med / base_ms - 1);
      std::fflush(stdout);
    }
    for (auto& s : seqs) s.release_all(session.pool());
  }
  std::printf("\nmodel %s, %s, depth %d, KV %s, median of %d steps\n", c.name.c_str(),
              session.backend().describe().c_str(), a.depth, session.kv().spec().format_name().c_str(), a.reps);
}

}  // namespace

void add_bench_verify(CLI::App& bench) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* cmd = bench.add_subcommand("verify",
                                       "speculative verification cost: a step of k+1 rows per sequence against a "
                                       "decode step, per batch size, and the acceptance it needs to pay");
  a->model.add_to(*cmd);
  cmd->add_option("--batches", a->batches, "comma-separated sequences per step")->capture_default_str();
  cmd->add_option("--ks", a->ks, "comma-separated draft lengths (0, the decode step, is always run)")
      ->capture_default_str();
  cmd->add_option("-d,--depth", a->depth, "tokens in each sequence's KV before the step")->capture_default_str();
  cmd->add_option("-r,--reps", a->reps, "timed steps per point (median reported)")->capture_default_str();
  cmd->add_option("--seed", a->model.seed, "dummy weight seed")->capture_default_str();
  cmd->callback([a] {
    TESSERA_CHECK(a->reps >= 1 && a->depth >= 0, "bench verify: bad counts");
    run_verify_bench(*a);
  });
}

}  // namespace tessera::apps
