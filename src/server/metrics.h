#pragma once
// Prometheus metrics under vLLM's names, so existing dashboards work unchanged. The API
// layer reports each finished request once (histograms, success counts); engine gauges and
// counters, the token totals among them, are read from EngineStats when /metrics is
// scraped, so they move while a request runs. Contract: docs/design/metrics.md.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "disagg/kv_transport.h"  // KvTransferCounters
#include "engine/engine_core.h"   // EngineStats
#include "engine/request.h"       // FinishReason, through the engine's API
#include "server/exposition.h"    // format_prometheus_value

namespace tessera {

// Everything the server measured about one finished request (seconds, monotonic clock).
struct RequestRecord {
  FinishReason finish = FinishReason::Stop;  // for the choice that finished last
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;      // all choices
  double e2e_s = 0;                   // arrival → last token
  double queue_s = 0;                 // arrival → first scheduled (RequestProgress::scheduled_at)
  double prefill_s = 0;               // first scheduled → first token
  double decode_s = 0;                // first token → last token
  std::optional<double> ttft_s;       // arrival → first token (none if no token)
  std::vector<double> inter_token_s;  // gaps between consecutive tokens of a choice
  int32_t max_tokens_param = 0;       // the request's max_tokens (histogram)
  int32_t n_param = 1;
};

// vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to and including max_value.
std::vector<double> buckets_1_2_5(int64_t max_value);

class ServerMetrics {
 public:
  // Token-count histograms use buckets up to this context length unless told otherwise.
  static constexpr int64_t kDefaultMaxModelLen = 8192;

  explicit ServerMetrics(std::string model_name);
  // max_model_len: the top of the 1-2-5 buckets of the token-count histograms (as vLLM).
  ServerMetrics(std::string model_name, int64_t max_model_len);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Thread-safe; called once per finished request (any finish reason).
  void record(const RequestRecord& record);
  // A request refused before it entered the engine (HTTP status and reason name).
  void record_rejection(int http_status, std::string_view reason);

  // The KV cache's configuration, shown as vLLM's vllm:cache_config_info (value 1, labels)
  // and tessera's capacity gauges. Set once after start-up; absent until then.
  struct CacheConfig {
    int block_size = 0;
    std::string cache_dtype;  // as --kv-cache-dtype names it
    int num_gpu_blocks = 0;   // the device (or host-memory) pool
    int num_cpu_blocks = 0;   // the swap tier
    double bits_per_element = 0;
  };
  void set_cache_config(const CacheConfig& config);
  // A prefill or decode worker's transfer counters (tessera:kv_transfer_*), read at each
  // scrape; not owned, must outlive this. Absent (no series) until set.
  void set_kv_transfer_counters(const disagg::KvTransferCounters* counters);

  // The Prometheus text exposition (format 0.0.4): the recorded histograms and counters,
  // plus the engine's gauges and counters from `engine`.
  std::string render(const EngineStats& engine) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
