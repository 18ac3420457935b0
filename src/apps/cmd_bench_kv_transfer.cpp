// tessera bench kv-transfer: what moving a prefilled prompt's KV between two engines costs
// over the TCP transport (docs/design/disaggregation.md), at a few block counts, beside the
// floor of copying the same bytes once in memory.
//
// Two engines on the same model in one process: the prefill engine runs a prompt of
// n x block_size + 1 tokens under a lease (the first repetition computes it; the later ones
// hit the prefix cache, so only the last token is computed again), its TcpKvServer serves the
// lease on loopback, and the decode engine reserves n blocks and pulls them into host staging
// (TcpKvPuller). The timed part is the pull alone: the lease staged in host memory on the
// prefill side (Executor::export_blocks), the wire (one checksummed message per block) and
// the reads into the staging. The reservation is then given back (no import). The floor is
// one memcpy of the pull's bytes between two host buffers (best of the repetitions).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "disagg/kv_auth.h"
#include "disagg/tcp_transport.h"
#include "engine/engine.h"
#include "engine/engine_model.h"

namespace tessera::apps {

namespace {

struct KvTransferArgs {
  ModelArgs model;
  EngineArgs engine;
  std::string blocks = "8,64,256";
  int reps = 5;
  double timeout_s = 60;
  bool authenticated = false;  // both sides with a (random) shared secret: every frame MACed
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The prefill engine's part: the prompt under a lease; returns the handle.
disagg::KvHandle lease_prompt(Engine& prefill, const std::vector<int32_t>& prompt, const disagg::TcpKvServer& server) {
  Request r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 1;
  r.sampling.ignore_eos = true;
  r.kv_lease_seconds = 600;
  SubmitResult s = prefill.submit(std::move(r));
  TESSERA_CHECK(s.ok(), "bench kv-transfer: the prefill engine refused the prompt: ", s.rejection->message);
  const RequestOutput out = s.stream->collect();
  TESSERA_CHECK(out.error.empty(), "bench kv-transfer: prefill failed: ", out.error);
  const auto& lease = s.stream->progress()->kv_lease;
  TESSERA_CHECK(lease.has_value(), "bench kv-transfer: the prefill request left no lease");
  disagg::KvHandle h;
  h.host = server.host();
  h.port = server.port();
  h.lease = lease->id;
  h.n_blocks = lease->n_blocks;
  return h;
}

void run_kv_transfer_bench(const KvTransferArgs& a) {
  const std::vector<int> block_counts = parse_int_list(a.blocks, "--blocks", 1);
  TESSERA_CHECK(a.reps >= 1, "bench kv-transfer: --reps must be at least 1");
  const int max_blocks = *std::max_element(block_counts.begin(), block_counts.end());
  EngineArgs ea = a.engine;
  ea.max_num_seqs = std::max(ea.max_num_seqs, 1);
  ModelEngineOptions mo = ea.engine_options(a.model);
  mo.warmup = false;
  ModelEngine prefill_model(mo), decode_model(mo);
  print_engine_summary(prefill_model, a.model);
  const int block_size = prefill_model.config().block_size;
  TESSERA_CHECK(max_blocks * block_size + 1 < prefill_model.config().scheduler.max_model_len,
                "bench kv-transfer: ", max_blocks, " blocks of ", block_size, " tokens do not fit --max-model-len ",
                prefill_model.config().scheduler.max_model_len);
  Engine prefill(prefill_model.config(), prefill_model.executor());
  Engine decode(decode_model.config(), decode_model.executor());
  disagg::KvTransferCounters counters;
  disagg::EngineLeaseSource source(prefill);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  std::string secret;
  if (a.authenticated)
    for (const uint8_t b : disagg::random_nonce()) secret += "0123456789abcdef"[b % 16];
  disagg::TcpKvServer server(source, disagg::TcpKvServerOptions{"127.0.0.1", 0, timeout, secret}, &counters);
  server.start();
  disagg::TcpKvPuller puller(&counters, secret);
  const KvIdentity identity = decode.kv_identity();

  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, prefill_model.config().vocab_size - 1);
  std::printf(
      "\nKV format %s, block %d tokens, %.1f KiB per block; pulls over loopback TCP%s, best and median of %d\n\n",
      identity.kv_format.c_str(), block_size, identity.block_bytes() / 1024.0,
      a.authenticated ? " (authenticated: HMAC-SHA256 on every message)" : "", a.reps);
  std::printf(
      "| blocks | MiB | pull ms (best) | pull ms (median) | blocks/s (best) | GB/s (best) | memcpy GB/s | x memcpy "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const int n : block_counts) {
    std::vector<int32_t> prompt(static_cast<size_t>(n) * block_size + 1);
    for (int32_t& t : prompt) t = token(rng);
    std::vector<double> times;
    int64_t bytes = 0;
    for (int rep = 0; rep < a.reps; ++rep) {
      const disagg::KvHandle h = lease_prompt(prefill, prompt, server);
      TESSERA_CHECK(h.n_blocks == n, "bench kv-transfer: the lease holds ", h.n_blocks, " blocks, not ", n);
      const KvImportReservation res = decode.reserve_kv_import(n);
      const int64_t before = counters.bytes_received.load();
      const Clock::time_point start = Clock::now();
      try {
        puller.pull(h, identity, res.staging, timeout);
      } catch (...) {
        decode.cancel_kv_import(res.id);
        throw;
      }
      times.push_back(seconds_since(start));
      bytes = counters.bytes_received.load() - before;
      decode.cancel_kv_import(res.id);
    }
    // The floor: the same bytes copied once between two host buffers.
    std::vector<char> from(static_cast<size_t>(bytes), 1), to(static_cast<size_t>(bytes), 0);
    double copy_best = 1e30;
    for (int rep = 0; rep < a.reps; ++rep) {
      const Clock::time_point start = Clock::now();
      std::memcpy(to.data(), from.data(), from.size());
      copy_best = std::min(copy_best, seconds_since(start));
    }
    TESSERA_CHECK(to[to.size() / 2] == 1, "bench kv-transfer: memcpy floor copied nothing");
    std::sort(times.begin(), times.end());
    const double best = times.front(), median = times[times.size() / 2];
    std::printf("| %d | %.1f | %.2f | %.2f | %.0f | %.2f | %.2f | %.1f |\n", n, bytes / 1048576.0, best * 1e3,
                median * 1e3, n / best, bytes / best / 1e9, bytes / copy_best / 1e9, best / copy_best);
    std::fflush(stdout);
  }
  server.stop();
  prefill.stop();
  decode.stop();
}

}  // namespace

void add_bench_kv_transfer(CLI::App& bench) {
  auto a = std::make_shared<KvTransferArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "kv-transfer", "KV pulls between two engines in one process over the TCP transport, beside a memcpy floor");
  a->model.add_to(*cmd);
  a->engine.add_to(*cmd);
  cmd->add_option("--blocks", a->blocks, "comma-separated block counts per pull")->capture_default_str();
  cmd->add_option("-r,--reps", a->reps, "pulls per block count")->capture_default_str();
  cmd->add_option("--timeout", a->timeout_s, "seconds one pull may take")->capture_default_str();
  cmd->add_flag("--authenticated", a->authenticated,
                "both sides with a shared secret, as --kv-transfer-secret-file gives serve: every message MACed");
  cmd->callback([a] { run_kv_transfer_bench(*a); });
}

}  // namespace tessera::apps
