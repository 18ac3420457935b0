// tessera bench model: prefill and decode speed of one sequence, like llama-bench's pp/tg
// tests, with the machine's floor beside it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "apps/commands.h"
#include "apps/common.h"
#include "bench/membw.h"
#include "core/error.h"

namespace tessera::apps {

namespace {

struct BenchArgs {
  ModelArgs model;
  int n_prompt = 512;
  int n_gen = 128;
  int reps = 3;
};

struct Stat {
  double mean = 0, sd = 0;
};

Stat stat_of(const std::vector<double>& v) {
  Stat s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / (v.size() - 1)) : 0;
  return s;
}

void run_bench(const BenchArgs& a) {
  SessionOptions so = a.model.session_options();
  so.ctx = std::max(so.ctx, a.n_prompt + a.n_gen + 1);
  so.max_batch_tokens = std::max(1, std::min(so.max_batch_tokens, std::max(a.n_prompt, 1)));
  Session session(so);
  const ModelConfig& c = session.config();
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, c.n_vocab - 1);
  std::vector<int32_t> prompt(a.n_prompt);
  for (auto& t : prompt) t = tok(rng);
  std::vector<float> logits;

  auto time_it = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Warm-up: touch every weight page and the KV once.
  {
    SequenceBlocks seq;
    session.feed(seq, std::span<const int32_t>(prompt.data(), std::min<size_t>(prompt.size(), 16)),
                 ForwardBatch::Logits::Last, logits);
    seq.release_all(session.pool());
  }
  std::vector<double> pp, tg;
  for (int r = 0; r < a.reps; ++r) {
    if (a.n_prompt > 0) {
      SequenceBlocks seq;
      logits.clear();
      const double t = time_it([&] { session.feed(seq, prompt, ForwardBatch::Logits::Last, logits); });
      pp.push_back(a.n_prompt / t);
      seq.release_all(session.pool());
    }
    if (a.n_gen > 0) {
      SequenceBlocks seq;
      int32_t next = prompt.empty() ? 1 : prompt[0];
      const double t = time_it([&] {
        for (int i = 0; i < a.n_gen; ++i) {
          logits.clear();
          session.feed(seq, std::span<const int32_t>(&next, 1), ForwardBatch::Logits::Last, logits);
          next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
      });
      tg.push_back(a.n_gen / t);
      seq.release_all(session.pool());
    }
  }
  const double bw = measure_read_bandwidth(session.backend());
  const double gib = session.weights().weight_bytes / 1073741824.0;
  std::printf("\n| model | size | params | backend | test | t/s |\n|---|---|---|---|---|---|\n");
  const std::string name = c.name.empty() ? session.weights().source : c.name;
  auto row = [&](const char* test, int n, const Stat& s) {
    std::printf("| %s | %.2f GiB | %.1f M | %s | %s%d | %.2f ± %.2f |\n", name.c_str(), gib, c.n_params() / 1e6,
                session.backend().describe().c_str(), test, n, s.mean, s.sd);
  };
  if (!pp.empty()) row("pp", a.n_prompt, stat_of(pp));
  if (!tg.empty()) row("tg", a.n_gen, stat_of(tg));
  // Floors: decode reads every weight once per token; prefill does 2 FLOPs per weight per token.
  std::printf("\nfloor: memory read bandwidth %.1f GB/s (measured) -> decode <= %.1f tok/s reading %.1f MB per token\n",
              bw / 1e9, bw / session.weights().weight_bytes, session.weights().weight_bytes / 1e6);
  if (!pp.empty())
    std::printf("prefill: %.2f GFLOP per token -> %.1f GFLOP/s achieved\n", 2.0 * c.n_params() / 1e9,
                stat_of(pp).mean * 2.0 * c.n_params() / 1e9);
}

}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks that print tables");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  CLI::App* model = bench->add_subcommand("model", "prefill and decode speed of one sequence (llama-bench style)");
  a->model.add_to(*model);
  model->add_option("-p,--n-prompt", a->n_prompt, "prompt tokens (pp test)")->capture_default_str();
  model->add_option("-n,--n-gen", a->n_gen, "generated tokens (tg test)")->capture_default_str();
  model->add_option("-r,--reps", a->reps, "repetitions")->capture_default_str();
  model->add_option("--seed", a->model.seed, "dummy weight seed")->capture_default_str();
  model->callback([a] {
    TESSERA_CHECK(a->reps >= 1 && a->n_prompt >= 0 && a->n_gen >= 0, "bench: bad counts");
    run_bench(*a);
  });
}

}  // namespace tessera::apps
