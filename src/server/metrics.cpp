// Prometheus exposition of the server's metrics under vLLM's names, types, help texts and
// buckets (vllm/v1/metrics/loggers.py), so Grafana dashboards built for vLLM work as they are.
// Contract: docs/design/metrics.md.
#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "core/error.h"
#include "server/exposition.h"

namespace tessera {

std::vector<double> buckets_1_2_5(int64_t max_value) {
  std::vector<double> buckets;
  // Same walk as vLLM's build_1_2_5_buckets: mantissas 1, 2, 5 times rising powers of ten,
  // stopping at the first value above max_value.
  for (int64_t scale = 1;; scale *= 10) {
    for (int64_t mantissa : {1, 2, 5}) {
      const int64_t value = mantissa * scale;
      if (value > max_value) return buckets;
      buckets.push_back(static_cast<double>(value));
    }
    if (scale > INT64_MAX / 50) return buckets;  // the next decade would overflow
  }
}

namespace {

// Bucket boundaries straight from vLLM.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenGapBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                              0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kNParamBuckets = {1, 2, 5, 10, 20};

// Finish reasons with a request_success series from the start (vLLM pre-creates its three;
// "error" is tessera's own, for requests a failed step ended).
constexpr FinishReason kSuccessReasons[] = {FinishReason::Stop, FinishReason::Length, FinishReason::Abort,
                                            FinishReason::Error};

struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

  void observe(double value) {
    if (std::isnan(value)) return;  // would poison _sum for good
    // Buckets are "less than or equal": the first bound >= value takes it; past the last
    // bound it lands in the +Inf slot.
    const size_t slot = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
    ++counts[slot];
    sum += value;
    ++count;
  }

  std::vector<double> bounds;    // finite upper bounds, ascending
  std::vector<uint64_t> counts;  // [bounds.size() + 1] per bucket, not cumulative; last = +Inf
  double sum = 0;
  uint64_t count = 0;
};

// A histogram family: cumulative buckets, count and sum.
void write_histogram(ExpositionWriter& w, std::string_view name, std::string_view help, const Histogram& h) {
  w.family(name, "histogram", help);
  const std::string base(name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    w.sample(base + "_bucket", "le=\"" + format_prometheus_value(h.bounds[i]) + "\"", static_cast<double>(cumulative));
  }
  cumulative += h.counts.back();
  w.sample(base + "_bucket", "le=\"+Inf\"", static_cast<double>(cumulative));
  w.sample(base + "_count", "", static_cast<double>(h.count));
  w.sample(base + "_sum", "", h.sum);
}

}  // namespace

struct ServerMetrics::Impl {
  Impl(std::string model, int64_t max_model_len)
      : model_name(std::move(model)),
        request_prompt_tokens(buckets_1_2_5(max_model_len)),
        request_generation_tokens(buckets_1_2_5(max_model_len)),
        request_params_max_tokens(buckets_1_2_5(max_model_len)),
        request_params_n(kNParamBuckets),
        time_to_first_token(kTtftBuckets),
        inter_token_latency(kTokenGapBuckets),
        e2e_latency(kRequestLatencyBuckets),
        queue_time(kRequestLatencyBuckets),
        inference_time(kRequestLatencyBuckets),
        prefill_time(kRequestLatencyBuckets),
        decode_time(kRequestLatencyBuckets) {}

  const std::string model_name;

  mutable std::mutex mutex;                                  // guards everything below
  std::map<FinishReason, uint64_t> success;                  // per finish reason
  std::map<std::pair<int, std::string>, uint64_t> rejected;  // (status, reason) -> count
  Histogram request_prompt_tokens;
  Histogram request_generation_tokens;
  Histogram request_params_max_tokens;
  Histogram request_params_n;
  Histogram time_to_first_token;
  Histogram inter_token_latency;  // also exposed as the deprecated time_per_output_token
  Histogram e2e_latency;
  Histogram queue_time;
  Histogram inference_time;  // prefill + decode
  Histogram prefill_time;
  Histogram decode_time;
  std::optional<ServerMetrics::CacheConfig> cache_config;
  const disagg::KvTransferCounters* kv_transfer = nullptr;
};

ServerMetrics::ServerMetrics(std::string model_name) : ServerMetrics(std::move(model_name), kDefaultMaxModelLen) {}

ServerMetrics::ServerMetrics(std::string model_name, int64_t max_model_len) {
  TESSERA_CHECK(max_model_len >= 1, "metrics: max_model_len must be at least 1, got ", max_model_len);
  impl_ = std::make_unique<Impl>(std::move(model_name), max_model_len);
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::set_cache_config(const CacheConfig& config) {
  std::lock_guard lock(impl_->mutex);
  impl_->cache_config = config;
}

void ServerMetrics::set_kv_transfer_counters(const disagg::KvTransferCounters* counters) {
  std::lock_guard lock(impl_->mutex);
  impl_->kv_transfer = counters;
}

void ServerMetrics::record(const RequestRecord& r) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  if (r.finish != FinishReason::None) ++m.success[r.finish];
  m.request_prompt_tokens.observe(static_cast<double>(r.prompt_tokens));
  m.request_generation_tokens.observe(static_cast<double>(r.generation_tokens));
  // vLLM observes max_tokens only when the request set it (its field is then non-zero).
  if (r.max_tokens_param > 0) m.request_params_max_tokens.observe(r.max_tokens_param);
  m.request_params_n.observe(r.n_param);
  if (r.ttft_s) m.time_to_first_token.observe(*r.ttft_s);
  for (double gap : r.inter_token_s) m.inter_token_latency.observe(gap);
  m.e2e_latency.observe(r.e2e_s);
  m.queue_time.observe(r.queue_s);
  m.inference_time.observe(r.prefill_s + r.decode_s);
  m.prefill_time.observe(r.prefill_s);
  m.decode_time.observe(r.decode_s);
}

void ServerMetrics::record_rejection(int http_status, std::string_view reason) {
  std::lock_guard lock(impl_->mutex);
  ++impl_->rejected[{http_status, std::string(reason)}];
}

std::string ServerMetrics::render(const EngineStats& engine) const {
  const Impl& m = *impl_;
  ExpositionWriter w("model_name=\"" + escape_label_value(m.model_name) + "\",engine=\"0\"");

  // Engine state, read from the snapshot the caller took.
  w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          static_cast<double>(engine.running));
  w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          static_cast<double>(engine.waiting));
  // Cached blocks nobody references count as free, as in vLLM: an idle server reads 0.
  const auto usage = [](int free, int total) {
    return total > 0 ? std::clamp(1.0 - static_cast<double>(free) / total, 0.0, 1.0) : 0.0;
  };
  w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          usage(engine.kv_free_blocks, engine.kv_total_blocks));
  if (engine.kv_window_total_blocks > 0) {
    // The sliding-window layers' pool (docs/design/kv-manager.md): admission needs room in both.
    w.gauge("tessera:kv_window_cache_usage_perc",
            "Usage of the sliding-window layers' KV pool (blocks behind the window are freed). 1 means 100 percent.",
            usage(engine.kv_window_free_blocks, engine.kv_window_total_blocks));
    w.gauge("tessera:kv_window_cache_blocks", "Blocks of the sliding-window layers' KV pool.",
            static_cast<double>(engine.kv_window_total_blocks));
  }
  w.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            static_cast<double>(engine.prefix.queried_tokens));
  w.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            static_cast<double>(engine.prefix.hit_tokens));
  w.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
            static_cast<double>(engine.preemptions));

  // tessera's own engine counters (vLLM has no name for these). Preemptions have one cause
  // today, a step short of KV blocks; the mode says whether the KV was dropped (recompute,
  // including swap-mode fallbacks when the host tier is full) or swapped to the host tier.
  w.family("tessera:preemptions_total", "counter", "Preemptions, by cause and mode.");
  const int64_t swap_preemptions = std::min(engine.swaps_out, engine.preemptions);
  w.sample("tessera:preemptions_total", "cause=\"kv_cache_full\",mode=\"recompute\"",
           static_cast<double>(engine.preemptions - swap_preemptions));
  w.sample("tessera:preemptions_total", "cause=\"kv_cache_full\",mode=\"swap\"", static_cast<double>(swap_preemptions));
  w.counter("tessera:swap_fallbacks_total", "Swap-mode preemptions recomputed because the host tier was full.",
            static_cast<double>(engine.swap_fallbacks));
  w.family("tessera:kv_swaps_total", "counter", "Sequences whose KV blocks moved between device and host tier.");
  w.sample("tessera:kv_swaps_total", "direction=\"out\"", static_cast<double>(engine.swaps_out));
  w.sample("tessera:kv_swaps_total", "direction=\"in\"", static_cast<double>(engine.swaps_in));
  w.family("tessera:kv_swap_bytes_total", "counter", "Bytes of KV cache copied between device and host tier.");
  w.sample("tessera:kv_swap_bytes_total", "direction=\"out\"", static_cast<double>(engine.swap_out_bytes));
  w.sample("tessera:kv_swap_bytes_total", "direction=\"in\"", static_cast<double>(engine.swap_in_bytes));
  w.counter("tessera:kv_block_copies_total", "KV blocks copied on write (a shared block written by one sequence).",
            static_cast<double>(engine.block_copies));
  w.counter("tessera:prefix_cache_evictions_total", "Cached prefix blocks evicted to hold other data.",
            static_cast<double>(engine.prefix.evictions));

  // Prefill/decode disaggregation (docs/design/disaggregation.md): leases held on the prefill
  // side, import reservations on the decode side.
  const KvTransferEngineStats& kt = engine.transfer;
  w.gauge("tessera:kv_leased_blocks", "KV blocks pinned under leases for a decode worker to pull.",
          static_cast<double>(kt.leased_blocks));
  w.family("tessera:kv_leases_total", "counter", "KV leases, by what happened to them.");
  w.sample("tessera:kv_leases_total", "outcome=\"created\"", static_cast<double>(kt.leases_created));
  w.sample("tessera:kv_leases_total", "outcome=\"released\"", static_cast<double>(kt.leases_released));
  w.sample("tessera:kv_leases_total", "outcome=\"expired\"", static_cast<double>(kt.leases_expired));
  w.counter("tessera:kv_exported_blocks_total", "KV blocks staged for a pull.",
            static_cast<double>(kt.exported_blocks));
  w.gauge("tessera:kv_import_reserved_blocks", "KV blocks reserved or imported for requests not yet scheduled.",
          static_cast<double>(kt.reserved_blocks));
  w.family("tessera:kv_imports_total", "counter", "KV import reservations, by outcome.");
  w.sample("tessera:kv_imports_total", "outcome=\"imported\"", static_cast<double>(kt.imports));
  w.sample("tessera:kv_imports_total", "outcome=\"cancelled\"", static_cast<double>(kt.imports_cancelled));
  w.counter("tessera:kv_imported_blocks_total", "KV blocks imported from a prefill worker.",
            static_cast<double>(kt.imported_blocks));

  // Speculative decoding, under vLLM's names (present when the engine speculates), with
  // the _total that prometheus_client appends to counters, like the rest.
  if (!engine.spec.accepted_per_pos.empty()) {
    w.counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
              static_cast<double>(engine.spec.drafts));
    w.counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.",
              static_cast<double>(engine.spec.draft_tokens));
    w.counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
              static_cast<double>(engine.spec.accepted_tokens));
    w.family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
             "Number of accepted tokens per position.");
    for (size_t j = 0; j < engine.spec.accepted_per_pos.size(); ++j)
      w.sample("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position=\"" + std::to_string(j) + "\"",
               static_cast<double>(engine.spec.accepted_per_pos[j]));
  }

  // Token counters as they happen (vLLM counts them per engine step): prompt tokens when a
  // request's prefill completes, generation tokens as they are sampled.
  w.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
            static_cast<double>(engine.prompt_tokens));
  w.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
            static_cast<double>(engine.generated_tokens));

  std::lock_guard lock(m.mutex);

  if (m.cache_config) {
    const CacheConfig& c = *m.cache_config;
    w.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    w.sample("vllm:cache_config_info",
             "block_size=\"" + std::to_string(c.block_size) + "\",cache_dtype=\"" + escape_label_value(c.cache_dtype) +
                 "\",num_gpu_blocks=\"" + std::to_string(c.num_gpu_blocks) + "\",num_cpu_blocks=\"" +
                 std::to_string(c.num_cpu_blocks) + "\"",
             1.0);
    w.gauge("tessera:kv_cache_capacity_tokens", "Tokens the KV-cache pool holds (blocks x block size).",
            static_cast<double>(c.num_gpu_blocks) * c.block_size);
    w.gauge("tessera:kv_cache_bits_per_element", "KV-cache storage per K/V element, scales included.",
            c.bits_per_element);
  }

  // The KV transport of a prefill or decode worker (both sides' counters on either).
  if (const disagg::KvTransferCounters* t = m.kv_transfer) {
    const auto value = [](const std::atomic<int64_t>& c) { return static_cast<double>(c.load()); };
    w.counter("tessera:kv_transfer_served_total", "KV pulls served completely and acknowledged (prefill side).",
              value(t->served));
    w.counter("tessera:kv_transfer_serve_failures_total",
              "KV pulls refused or broken off (prefill side: unknown lease, other KV format, peer gone).",
              value(t->serve_failures));
    w.counter("tessera:kv_transfer_unauthenticated_total",
              "KV pulls refused because their authentication code did not verify (prefill side; "
              "--kv-transfer-secret-file).",
              value(t->unauthenticated));
    w.counter("tessera:kv_transfer_pulls_total", "KV pulls completed (decode side).", value(t->pulled));
    w.counter("tessera:kv_transfer_pull_failures_total", "KV pulls that failed, timeouts included (decode side).",
              value(t->pull_failures));
    w.counter("tessera:kv_transfer_pull_timeouts_total", "KV pulls that ran out of time (decode side).",
              value(t->pull_timeouts));
    w.counter("tessera:kv_transfer_fallbacks_total",
              "Requests that came with a KV handle and prefilled locally instead (decode side).", value(t->fallbacks));
    w.family("tessera:kv_transfer_bytes_total", "counter", "Bytes of KV transfer messages, by direction.");
    w.sample("tessera:kv_transfer_bytes_total", "direction=\"sent\"", value(t->bytes_sent));
    w.sample("tessera:kv_transfer_bytes_total", "direction=\"received\"", value(t->bytes_received));
    w.counter("tessera:kv_transfer_pull_seconds_total", "Time spent in completed KV pulls (decode side).",
              value(t->pull_micros) / 1e6);
  }

  w.family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (FinishReason reason : kSuccessReasons) {
    const auto it = m.success.find(reason);
    w.sample("vllm:request_success_total", "finished_reason=\"" + std::string(finish_reason_name(reason)) + "\"",
             it == m.success.end() ? 0.0 : static_cast<double>(it->second));
  }

  // vLLM's histograms, in its order. The deprecated time_per_output_token shares the
  // inter-token observations.
  struct HistogramFamily {
    const char* name;
    const char* help;
    Histogram Impl::*values;
  };
  static constexpr HistogramFamily kHistograms[] = {
      {"vllm:request_prompt_tokens", "Number of prefill tokens processed.", &Impl::request_prompt_tokens},
      {"vllm:request_generation_tokens", "Number of generation tokens processed.", &Impl::request_generation_tokens},
      {"vllm:request_params_n", "Histogram of the n request parameter.", &Impl::request_params_n},
      {"vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
       &Impl::request_params_max_tokens},
      {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &Impl::time_to_first_token},
      {"vllm:time_per_output_token_seconds",
       "Histogram of time per output token in seconds. DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
       &Impl::inter_token_latency},
      {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &Impl::inter_token_latency},
      {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &Impl::e2e_latency},
      {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", &Impl::queue_time},
      {"vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
       &Impl::inference_time},
      {"vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
       &Impl::prefill_time},
      {"vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", &Impl::decode_time},
  };
  for (const HistogramFamily& h : kHistograms) write_histogram(w, h.name, h.help, m.*h.values);

  // tessera's own: refusals before the engine (400/429/503...), by status and reason.
  w.family("tessera:requests_rejected_total", "counter",
           "Requests refused before they entered the engine, by HTTP status and reason.");
  for (const auto& [key, count] : m.rejected) {
    w.sample("tessera:requests_rejected_total",
             "status=\"" + std::to_string(key.first) + "\",reason=\"" + escape_label_value(key.second) + "\"",
             static_cast<double>(count));
  }
  return w.take();
}

}  // namespace tessera
