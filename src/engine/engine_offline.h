#pragma once
// Offline use of the serving engine: a JSONL batch of requests in, one JSON line per
// request out, in input order (`tessera generate --batch`), and the offline throughput
// benchmark (`tessera bench offline`). Both run an EngineCore on the calling thread.
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "engine/engine_model.h"

namespace tessera {

// Input line: {"prompt": "text"} or {"prompt_tokens": [ids]}, and optionally
// "max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
// "presence_penalty", "frequency_penalty", "seed", "n", "stop_token_ids", "ignore_eos",
// "priority". Output line:
//   {"index": i, "choices": [{"index": c, "text": "...", "token_ids": [...],
//    "finish_reason": "stop"|"length"}], "usage": {"prompt_tokens": p, "completion_tokens": g}}
// or, for a line that cannot be served, {"index": i, "error": {"message": "...", "type":
// "invalid_request"}} — the other lines still run.
struct OfflineBatchOptions {
  SamplingParams defaults;     // for fields a line leaves out
  bool parse_special = false;  // prompts may spell special tokens
};

struct OfflineBatchSummary {
  int n_requests = 0;
  int n_errors = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double seconds = 0;
  EngineStats stats;
};

OfflineBatchSummary run_offline_batch(ModelEngine& engine, std::istream& in, std::ostream& out,
                                      const OfflineBatchOptions& options);

struct OfflineBenchOptions {
  int n_requests = 64;
  int prompt_tokens = 128;                    // per request, shared prefix included
  int gen_tokens = 64;                        // per request (end-of-generation ignored)
  std::vector<int> concurrency = {1, 8, 32};  // max_num_seqs of each run
  int shared_prefix_tokens = 0;               // > 0: every prompt starts with the same tokens
  bool compare_prefix_cache = false;          // run each concurrency with the prefix cache off, then on
  uint64_t seed = 1;
};

struct OfflineBenchRow {
  int concurrency = 0;
  bool prefix_cache = false;
  int n_requests = 0;
  double seconds = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;  // prompt + output tokens computed per second
  // Raw per-request figures (seconds) for reports: TTFT and end-to-end from t = 0, TPOT =
  // (last token - first token) / (tokens - 1), and every inter-token gap of every request.
  std::vector<double> ttft_s, e2e_s, tpot_s, itl_s;
  int64_t prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;     // engine steps (forwards) of the run
  SpecDecodeStats spec;  // speculative decoding: drafts, draft and accepted tokens
};

// `engine` must have been built with max_num_seqs >= every concurrency level.
std::vector<OfflineBenchRow> bench_offline(ModelEngine& engine, const OfflineBenchOptions& options,
                                           const std::function<void(const OfflineBenchRow&)>& on_row = {});

}  // namespace tessera
