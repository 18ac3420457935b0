// tessera bench model: prefill and decode speed of one sequence, like llama-bench's pp/tg
// tests, with the machine's floor beside it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>

#include "apps/commands.h"
#include "apps/common.h"
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_factory.h"
#include "bench/membw.h"
#include "format/gguf.h"
#include "core/error.h"
#include "benchharness/offline_report.h"
#include "engine/engine_offline.h"

namespace tessera::apps {

namespace {

struct Stat {
  double mean = 0, sd = 0;
};

struct BenchArgs {
  ModelArgs model;
  int n_prompt = 512;
  int n_gen = 128;
  int depth = 0;  // tokens in the KV cache before the pp and tg tests (llama-bench's -d)
  int reps = 3;
  int tensor_parallel_size = 1;    // ranks of this process (docs/design/parallel.md)
  int pipeline_parallel_size = 1;  // stages of this process
  std::string peer_python;         // a Python with llama-cpp-python: measure llama.cpp in the same run
  std::string peer_script = "tools/bench/llama_cpp_bench.py";
};

struct PeerResult {
  bool ok = false;
  std::string version;
  Stat pp, tg;
};

// Runs llama.cpp (through llama-cpp-python) on the same file, threads and lengths, for
// `reps` repetitions (after its own warm-up), so a figure shares the machine's state with
// the tessera repetition run right before it.
PeerResult run_peer(const BenchArgs& a, const std::string& model_path, int threads, int reps) {
  PeerResult r;
  const std::string json_path = "/tmp/tessera-peer-" + std::to_string(::getpid()) + ".json";
  const std::string cmd = "'" + a.peer_python + "' '" + a.peer_script + "' --model '" + model_path + "' --threads " +
                          std::to_string(threads) + " --pp " + std::to_string(std::max(1, a.n_prompt)) + " --tg " +
                          std::to_string(std::max(1, a.n_gen)) + " --reps " + std::to_string(reps) +
                          " --batched --json '" + json_path + "' > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "[bench] peer run failed: %s\n", cmd.c_str());
    return r;
  }
  std::ifstream in(json_path);
  const auto j = nlohmann::json::parse(in, nullptr, false);
  std::remove(json_path.c_str());
  if (j.is_discarded()) return r;
  const auto& single = j.at("single");
  auto get = [&](const std::string& key) {
    Stat s;
    s.mean = single.at(key).at("mean").get<double>();
    s.sd = single.at(key).at("sd").get<double>();
    return s;
  };
  r.pp = get("pp" + std::to_string(std::max(1, a.n_prompt)));
  r.tg = get("tg" + std::to_string(std::max(1, a.n_gen)) + "@d0");
  r.version = "llama.cpp " + j.value("libllama", std::string("?")) + " (llama-cpp-python " +
              j.value("llama_cpp_python", std::string("?")) + ")";
  r.ok = true;
  return r;
}

Stat stat_of(const std::vector<double>& v) {
  Stat s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / (v.size() - 1)) : 0;
  return s;
}

void run_bench(const BenchArgs& a) {
  SessionOptions so = a.model.session_options();
  so.tensor_parallel_size = a.tensor_parallel_size;
  so.pipeline_parallel_size = a.pipeline_parallel_size;
  so.ctx = std::max(so.ctx, a.depth + std::max(a.n_prompt, a.n_gen + 1) + 1);
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
  // With a peer, every tessera repetition is followed by one of llama.cpp's, so each pair
  // shares the machine's state (a shared VM's bandwidth drifts by tens of percent within a
  // minute); the ratio reported is the median of the per-pair ratios.
  const bool with_peer = !a.peer_python.empty() && session.gguf();
  const int peer_threads =
      session.backend().name() == "cpu" ? static_cast<CpuBackend&>(session.backend()).pool().size() : 1;
  std::vector<double> pp, tg, peer_pp, peer_tg;
  std::string peer_version;
  // The context a test runs on top of, not timed.
  auto fill_depth = [&](SequenceBlocks& seq) {
    if (a.depth == 0) return;
    std::vector<int32_t> ctx(a.depth);
    for (auto& t : ctx) t = tok(rng);
    logits.clear();
    session.feed(seq, ctx, ForwardBatch::Logits::Last, logits);
  };
  for (int r = 0; r < a.reps; ++r) {
    if (a.n_prompt > 0) {
      SequenceBlocks seq;
      fill_depth(seq);
      logits.clear();
      const double t = time_it([&] { session.feed(seq, prompt, ForwardBatch::Logits::Last, logits); });
      pp.push_back(a.n_prompt / t);
      seq.release_all(session.pool());
    }
    if (a.n_gen > 0) {
      SequenceBlocks seq;
      fill_depth(seq);
      int32_t next = prompt.empty() ? 1 : prompt[0];
      const double t = time_it([&] {
        // Greedy, read back as the engine reads a greedy request's logits (the argmax on the
        // device backend, only the id crosses the bus).
        for (int i = 0; i < a.n_gen; ++i) next = session.decode_greedy(seq, next);
      });
      tg.push_back(a.n_gen / t);
      seq.release_all(session.pool());
    }
    if (with_peer) {
      const PeerResult peer = run_peer(a, session.gguf()->name(), peer_threads, 1);
      if (peer.ok) {
        peer_pp.push_back(peer.pp.mean);
        peer_tg.push_back(peer.tg.mean);
        peer_version = peer.version;
      }
      std::fprintf(stderr, "[bench] rep %d: tessera pp %.1f tg %.1f | llama.cpp pp %.1f tg %.1f tok/s\n", r + 1,
                   pp.empty() ? 0.0 : pp.back(), tg.empty() ? 0.0 : tg.back(), peer.ok ? peer.pp.mean : 0.0,
                   peer.ok ? peer.tg.mean : 0.0);
    }
  }
  const double bw = measure_read_bandwidth(session.backend());
  const double gib = session.weights().weight_bytes / 1073741824.0;
  std::printf("\n| model | size | params | backend | test | t/s |\n|---|---|---|---|---|---|\n");
  const std::string name = c.name.empty() ? session.weights().source : c.name;
  auto row = [&](const char* test, int n, const Stat& s) {
    std::printf("| %s | %.2f GiB | %.1f M | %s | %s%d | %.2f ± %.2f |\n", name.c_str(), gib, c.n_params() / 1e6,
                session.describe_device().c_str(), test, n, s.mean, s.sd);
  };
  // At a depth: the KV format, and ms per token for decode.
  auto depth_row = [&](const char* test, int n, const Stat& s, bool per_token) {
    std::printf("| %s | %.2f GiB | %.1f M | %s | %s%d @ d%d (KV %s) | %.2f ± %.2f", name.c_str(), gib,
                c.n_params() / 1e6, session.describe_device().c_str(), test, n, a.depth,
                session.kv().spec().format_name().c_str(), s.mean, s.sd);
    if (per_token) std::printf(" (%.2f ms/token)", 1000.0 / s.mean);
    std::printf(" |\n");
  };
  if (!pp.empty()) a.depth > 0 ? depth_row("pp", a.n_prompt, stat_of(pp), false) : row("pp", a.n_prompt, stat_of(pp));
  if (!tg.empty()) a.depth > 0 ? depth_row("tg", a.n_gen, stat_of(tg), true) : row("tg", a.n_gen, stat_of(tg));
  if (with_peer && peer_pp.size() == static_cast<size_t>(a.reps)) {
    auto peer_row = [&](const char* test, int n, const std::vector<double>& theirs, const std::vector<double>& ours) {
      const Stat s = stat_of(theirs);
      std::vector<double> q(ours.size());
      for (size_t i = 0; i < q.size(); ++i) q[i] = ours[i] / theirs[i];
      std::sort(q.begin(), q.end());
      const size_t h = q.size() / 2;
      const double median = q.size() % 2 ? q[h] : 0.5 * (q[h - 1] + q[h]);
      std::printf("| %s | | | %s | %s%d | %.2f ± %.2f |\n", "peer", peer_version.c_str(), test, n, s.mean, s.sd);
      std::printf("| ratio tessera / peer (median of %zu pairs, range %.2f-%.2f) | | | | %s%d | %.2fx |\n", q.size(),
                  q.front(), q.back(), test, n, median);
    };
    if (!pp.empty()) peer_row("pp", a.n_prompt, peer_pp, pp);
    if (!tg.empty()) peer_row("tg", a.n_gen, peer_tg, tg);
  } else if (with_peer) {
    std::printf("| peer | | | llama.cpp | failed (see stderr) | |\n");
  }
  // Floors: decode reads every weight once per token (of a MoE layer's experts, the n_used a token
  // is routed to); prefill does 2 FLOPs per active weight per token.
  double token_bytes = static_cast<double>(session.weights().weight_bytes);
  if (c.n_expert > 0) {
    double experts = 0;
    for (const LayerWeights& l : session.weights().layers)
      for (const auto* group : {&l.gate_exps, &l.up_exps, &l.down_exps})
        for (const WeightMatrix& m : *group) experts += static_cast<double>(m.bytes());
    token_bytes -= experts * (1.0 - static_cast<double>(c.n_expert_used) / c.n_expert);
  }
  const double active = static_cast<double>(c.n_active_params());
  if (session.backend().name() == "cuda") {
    // The device's own ceilings (copy bandwidth, bf16 tensor-core rate), measured now.
    const DeviceCeilings dc = measure_cuda_ceilings(session.backend());
    std::printf(
        "\nfloor: device copy bandwidth %.0f GB/s, bf16 GEMM %.0f TFLOP/s (measured) -> decode <= %.1f tok/s "
        "reading %.1f MB per token, prefill <= %.0f tok/s (matrices only)\n",
        dc.copy_bytes_per_s / 1e9, dc.bf16_flops_per_s / 1e12, dc.copy_bytes_per_s / token_bytes, token_bytes / 1e6,
        dc.bf16_flops_per_s / (2.0 * active));
  } else {
    std::printf(
        "\nfloor: memory read bandwidth %.1f GB/s (measured) -> decode <= %.1f tok/s reading %.1f MB per token\n",
        bw / 1e9, bw / token_bytes, token_bytes / 1e6);
  }
  if (!pp.empty())
    std::printf("prefill: %.2f GFLOP per token -> %.1f GFLOP/s achieved\n", 2.0 * active / 1e9,
                stat_of(pp).mean * 2.0 * active / 1e9);
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
  model->add_option("-d,--depth", a->depth, "tokens already in the KV cache for the pp and tg tests (llama-bench's -d)")
      ->capture_default_str();
  model->add_option("-r,--reps", a->reps, "repetitions")->capture_default_str();
  model->add_option("--seed", a->model.seed, "dummy weight seed")->capture_default_str();
  model
      ->add_option("--tensor-parallel-size", a->tensor_parallel_size,
                   "(also -tp) split the model over N ranks, threads of this process (docs/design/parallel.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  model
      ->add_option("--pipeline-parallel-size", a->pipeline_parallel_size,
                   "(also -pp) split the model's layers into N stages, threads of this process (one sequence: "
                   "the stages run one after the other)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  model->add_option(
      "--peer", a->peer_python,
      "Python with llama-cpp-python: measure llama.cpp on the same file, one of its repetitions after each of "
      "tessera's, and report the median of the per-pair ratios");
  model->add_option("--peer-script", a->peer_script, "the peer's bench script")->capture_default_str();
  model->callback([a] {
    TESSERA_CHECK(a->reps >= 1 && a->n_prompt >= 0 && a->n_gen >= 0 && a->depth >= 0, "bench: bad counts");
    TESSERA_CHECK((a->tensor_parallel_size == 1 && a->pipeline_parallel_size == 1) || a->peer_python.empty(),
                  "bench model: --peer runs llama.cpp on one rank; it is not compared with --tensor-parallel-size ",
                  a->tensor_parallel_size, " or --pipeline-parallel-size ", a->pipeline_parallel_size);
    TESSERA_CHECK(a->depth == 0 || a->peer_python.empty(),
                  "bench model: --depth is not compared with --peer "
                  "(the peer's script decodes from an empty cache)");
    run_bench(*a);
  });

  struct OfflineArgs {
    ModelArgs model;
    EngineArgs engine;
    OfflineBenchOptions bench;
    std::string concurrency = "1,8,32";
    std::string out;
  };
  auto o = std::make_shared<OfflineArgs>();
  CLI::App* offline = bench->add_subcommand("offline",
                                            "many requests through the serving engine in-process: "
                                            "requests/s, tokens/s and TTFT per concurrency");
  o->model.add_to(*offline);
  o->engine.add_to(*offline);
  offline->add_option("--requests", o->bench.n_requests, "requests per run")->capture_default_str();
  offline->add_option("-p,--n-prompt", o->bench.prompt_tokens, "prompt tokens per request")->capture_default_str();
  offline->add_option("-n,--n-gen", o->bench.gen_tokens, "generated tokens per request")->capture_default_str();
  offline->add_option("-C,--concurrency", o->concurrency, "comma-separated max concurrent sequences")
      ->capture_default_str();
  offline->add_option("--shared-prefix", o->bench.shared_prefix_tokens, "tokens every prompt shares")
      ->capture_default_str();
  offline->add_flag("--compare-prefix-cache", o->bench.compare_prefix_cache,
                    "run each concurrency with the prefix cache off, then on");
  offline->add_option("--out", o->out,
                      "write the JSON report (bench serve's schema, so `bench compare` reads it beside a serve run)");
  offline->callback([o] {
    o->bench.concurrency = parse_int_list(o->concurrency, "--concurrency", 1);
    EngineArgs ea = o->engine;
    ea.max_num_seqs = *std::max_element(o->bench.concurrency.begin(), o->bench.concurrency.end());
    ModelEngine engine(ea.engine_options(o->model));
    print_engine_summary(engine, o->model);
    const auto rows = bench_offline(engine, o->bench, [](const OfflineBenchRow& r) {
      std::fprintf(stderr, "[bench] concurrency %d%s: %.2f req/s, %.1f output tok/s\n", r.concurrency,
                   r.prefix_cache ? " (prefix cache)" : "", r.requests_per_s, r.output_tokens_per_s);
    });
    std::printf("%s\n", bench::format_offline_table(rows).c_str());
    if (!o->out.empty()) {
      const nlohmann::json config = {{"model", o->model.model},
                                     {"device", o->model.device},
                                     {"threads", o->model.threads},
                                     {"requests", o->bench.n_requests},
                                     {"prompt_tokens", o->bench.prompt_tokens},
                                     {"gen_tokens", o->bench.gen_tokens},
                                     {"shared_prefix_tokens", o->bench.shared_prefix_tokens}};
      std::ofstream f(o->out);
      TESSERA_CHECK(f.good(), "bench offline: cannot write ", o->out);
      f << bench::offline_report_json(rows, config).dump(1) << "\n";
      std::fprintf(stderr, "[bench] wrote %s\n", o->out.c_str());
    }
  });
  add_bench_serve(*bench);
  add_bench_compare(*bench);
  add_bench_grammar(*bench);
  add_bench_verify(*bench);
  add_bench_kv_transfer(*bench);
}

}  // namespace tessera::apps
