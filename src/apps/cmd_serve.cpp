// tessera serve: the OpenAI-compatible HTTP server over the serving engine.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>
#include <thread>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "disagg/kv_auth.h"
#include "disagg/tcp_transport.h"
#include "grammar/grammar.h"
#include "engine/engine.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"
#include "engine/stats_logger.h"
#include "server/api/access_log.h"
#include "server/api/api_server.h"
#include "server/api/kv_roles.h"
#include "server/api/startup_gate.h"
#include "server/http/server.h"
#include "server/metrics.h"
#include "server/router/router.h"
#include "server/web/chat_page.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

namespace {

struct ServeArgs {
  ModelArgs model;
  EngineArgs engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string chat_template_file;
  std::string tool_call_parser = "auto";  // hermes | llama3_json | mistral | auto (from the template)
  size_t max_request_body = 8u << 20;
  int drain_timeout_s = 30;
  int max_waiting_requests = 4096;
  int io_threads = 2;
  int prompt_threads = 2;
  double log_stats_interval_s = 10;  // 0 = no stats line
  bool metrics_require_key = false;
  bool disable_log_requests = false;
  // Prefill/decode disaggregation (docs/design/disaggregation.md).
  std::string role = "colocated";  // colocated | prefill | decode | router
  std::string kv_transfer_host = "127.0.0.1";
  std::string kv_transfer_advertise_host;  // "": kv_transfer_host
  int kv_transfer_port = 0;
  double kv_lease_seconds = 30;
  double kv_transfer_timeout_s = 5;
  int kv_transfer_threads = 4;
  std::string kv_transfer_secret_file;                 // "": KV transfers unauthenticated
  std::vector<std::string> prefill_urls, decode_urls;  // router
  double router_timeout_s = 600;
  std::string router_policy;  // "": not given (load)
};

// Blocks SIGINT and SIGTERM before any thread exists, so every thread inherits the mask and
// none is interrupted; wait_for_signal takes them.
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int wait_for_signal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
}

// --role router: no model, only the HTTP front over the workers.
void serve_router(const ServeArgs& a, const sigset_t& signals) {
  TESSERA_CHECK(a.router_timeout_s > 0, "--router-timeout must be positive");
  router::RouterOptions ro;
  ro.prefill_urls = a.prefill_urls;
  ro.decode_urls = a.decode_urls;
  ro.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.router_timeout_s * 1000));
  ro.policy = a.router_policy.empty() ? router::RouterPolicy::Load : router::router_policy_from_name(a.router_policy);
  router::Router router(ro);
  http::ServerOptions so;
  so.host = a.host;
  so.port = static_cast<uint16_t>(a.port);
  so.io_threads = a.io_threads;
  so.max_body_bytes = a.max_request_body;
  http::HttpServer server(so, router.handler());
  server.start();
  std::printf("tessera: router listening on http://%s:%u (prefill workers: %zu, decode workers: %zu, policy: %s)\n",
              a.host.c_str(), static_cast<unsigned>(server.port()), a.prefill_urls.size(), a.decode_urls.size(),
              std::string(router::router_policy_name(ro.policy)).c_str());
  std::fflush(stdout);
  const int sig = wait_for_signal(signals);
  std::fprintf(stderr, "tessera: %s: stopping the router\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop_accepting();
  server.stop();
  std::fprintf(stderr, "tessera: stopped\n");
}

// "SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct": the file name without its
// extension and quantization tag.
std::string default_model_name(const std::string& path) {
  std::string stem = std::filesystem::path(path).filename().string();
  if (stem.size() > 5 && stem.ends_with(".gguf")) stem.resize(stem.size() - 5);
  static const std::regex kQuantTag(R"([.-](I?Q\d\w*|BF16|F16|F32)$)", std::regex::icase);
  stem = std::regex_replace(stem, kQuantTag, "");
  return stem.empty() ? path : stem;
}

std::string chat_template_source(const ServeArgs& a, const Tokenizer& tok) {
  std::string source;
  if (!a.chat_template_file.empty())
    source = read_file(a.chat_template_file);
  else
    source = std::string(tok.chat_template());
  if (source.empty()) {
    std::fprintf(stderr, "tessera: the model has no chat template; using ChatML\n");
    source = ChatTemplate::chatml_source();
  }
  return source;
}

std::unique_ptr<ChatTemplate> load_chat_template(const std::string& source, const Tokenizer& tok) {
  ChatTemplateOptions o;
  if (tok.bos_id() >= 0) o.bos_token = std::string(tok.token_text(tok.bos_id()));
  if (tok.eos_id() >= 0) o.eos_token = std::string(tok.token_text(tok.eos_id()));
  return std::make_unique<ChatTemplate>(source, o);
}

void serve(const ServeArgs& a) {
  TESSERA_CHECK(a.port >= 0 && a.port <= 65535, "--port ", a.port, " is outside [0, 65535]");
  TESSERA_CHECK(a.drain_timeout_s >= 0, "--drain-timeout must not be negative");
  const bool router_role = a.role == "router";
  TESSERA_CHECK(router_role || (a.prefill_urls.empty() && a.decode_urls.empty()),
                "--prefill and --decode name the workers of --role router, not of --role ", a.role);
  TESSERA_CHECK(router_role || a.router_policy.empty(), "--router-policy is for --role router, not --role ", a.role);
  const api::ServeRole role = router_role ? api::ServeRole::Colocated : api::serve_role_from_name(a.role);
  if (role != api::ServeRole::Colocated) {
    TESSERA_CHECK(!a.engine.no_prefix_cache, "--role ", a.role,
                  " needs prefix caching (the KV moves through the prefix index): drop --no-prefix-cache");
    TESSERA_CHECK(a.kv_transfer_port >= 0 && a.kv_transfer_port <= 65535, "--kv-transfer-port ", a.kv_transfer_port,
                  " is outside [0, 65535]");
    TESSERA_CHECK(a.kv_lease_seconds > 0 && a.kv_lease_seconds <= 3600, "--kv-lease-seconds ", a.kv_lease_seconds,
                  " is outside (0, 3600]");
    TESSERA_CHECK(a.kv_transfer_timeout_s > 0, "--kv-transfer-timeout must be positive");
    TESSERA_CHECK(a.kv_transfer_threads >= 1, "--kv-transfer-threads must be at least 1");
    const std::string& advertised =
        a.kv_transfer_advertise_host.empty() ? a.kv_transfer_host : a.kv_transfer_advertise_host;
    TESSERA_CHECK(role != api::ServeRole::Prefill || (advertised != "0.0.0.0" && advertised != "::"),
                  "--kv-transfer-host ", a.kv_transfer_host,
                  " listens on every interface but names none a decode worker can reach: give "
                  "--kv-transfer-advertise-host too");
  }
  TESSERA_CHECK(a.kv_transfer_secret_file.empty() || role != api::ServeRole::Colocated,
                "--kv-transfer-secret-file is for --role prefill and --role decode, not --role ", a.role);
  // Read before the model loads: a bad file fails at once.
  const std::string kv_secret =
      a.kv_transfer_secret_file.empty() ? std::string() : disagg::read_kv_secret_file(a.kv_transfer_secret_file);
  // Signals are taken by sigwait below.
  const sigset_t signals = block_stop_signals();
  if (router_role) return serve_router(a, signals);

  std::vector<std::string> keys = a.api_keys;
  if (!a.api_key_file.empty())
    for (std::string& k : api::ApiKeys::read_key_file(a.api_key_file)) keys.push_back(std::move(k));

  // The listener opens first: /health answers while the model loads, /ready says 503
  // model_loading until the gate opens.
  api::StartupGate gate;
  http::ServerOptions so;
  so.host = a.host;
  so.port = static_cast<uint16_t>(a.port);
  so.io_threads = a.io_threads;
  so.max_body_bytes = a.max_request_body;
  so.header_filter = gate.header_filter();  // 401 before reading a body
  http::HttpServer server(so, gate.handler());
  server.start();
  std::printf("tessera: listening on http://%s:%u, loading the model\n", a.host.c_str(),
              static_cast<unsigned>(server.port()));
  std::fflush(stdout);

  ModelEngineOptions mo = a.engine.engine_options(a.model);
  mo.admission.max_waiting_requests = a.max_waiting_requests;
  ModelEngine model_engine(mo);
  Engine engine(model_engine.config(), model_engine.executor());
  const Tokenizer& tok = model_engine.session().tokenizer();
  const std::string template_source = chat_template_source(a, tok);
  const std::shared_ptr<ChatTemplate> chat_template = load_chat_template(template_source, tok);

  api::ServedModel served;
  served.name =
      !a.served_model_name.empty() ? a.served_model_name : default_model_name(resolve_model_path(a.model.model));
  served.tokenizer = &tok;
  api::set_engine_limits(served, model_engine.config());
  // The vocabulary's grammar index is built once here; requests compile against it.
  const GrammarCompiler grammar(tok, model_engine.config().vocab_size);
  served.grammar = &grammar;
  served.tool_format = a.tool_call_parser == "auto"
                           ? api::detect_tool_format(template_source, chat_template->renders_tools())
                           : api::tool_format_from_name(a.tool_call_parser);
  served.chat = [chat_template](const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra) {
    return chat_template->apply_marked(messages, add_generation_prompt, extra);
  };

  ServerMetrics metrics(served.name, served.max_model_len);
  {
    const EngineSummary s = describe_engine(model_engine, a.model.model);
    metrics.set_cache_config({s.block_size, s.kv_dtype, s.n_blocks, s.n_host_blocks, s.kv_bits_per_element});
  }
  // Disaggregation: a prefill worker serves its leases on a KV port of its own; a decode
  // worker pulls. Declared after the engine: stopped and destroyed before it.
  disagg::KvTransferCounters kv_counters;
  std::unique_ptr<disagg::EngineLeaseSource> lease_source;
  std::unique_ptr<disagg::TcpKvServer> kv_server;
  std::unique_ptr<disagg::TcpKvPuller> kv_puller;
  api::KvRoleOptions kv_role;
  kv_role.role = role;
  const auto transfer_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.kv_transfer_timeout_s * 1000));
  if (role == api::ServeRole::Prefill) {
    lease_source = std::make_unique<disagg::EngineLeaseSource>(engine);
    kv_server = std::make_unique<disagg::TcpKvServer>(
        *lease_source,
        disagg::TcpKvServerOptions{a.kv_transfer_host, static_cast<uint16_t>(a.kv_transfer_port), transfer_timeout,
                                   kv_secret},
        &kv_counters);
    kv_server->start();
    kv_role.lease_seconds = a.kv_lease_seconds;
    kv_role.block_size = model_engine.config().block_size;
    kv_role.kv_host = a.kv_transfer_advertise_host.empty() ? a.kv_transfer_host : a.kv_transfer_advertise_host;
    kv_role.kv_port = kv_server->port();
  } else if (role == api::ServeRole::Decode) {
    kv_puller = std::make_unique<disagg::TcpKvPuller>(&kv_counters, kv_secret);
    kv_role.puller = kv_puller.get();
    kv_role.pull_timeout = transfer_timeout;
    kv_role.pull_threads = a.kv_transfer_threads;
  }
  if (role != api::ServeRole::Colocated) {
    kv_role.counters = &kv_counters;
    kv_role.log = [](const std::string& line) {
      std::fprintf(stderr, "tessera: %s\n", line.c_str());
      std::fflush(stderr);
    };
    metrics.set_kv_transfer_counters(&kv_counters);
  }
  api::ApiServerOptions options;
  options.kv = kv_role;
  options.keys = api::ApiKeys(keys);
  options.chat_page_html = std::string(web::chat_page_html());
  options.prompt_threads = a.prompt_threads;
  options.render_metrics = [&] { return metrics.render(engine.stats()); };
  options.hooks.record = [&](const RequestRecord& r) { metrics.record(r); };
  options.hooks.record_rejection = [&](int status, std::string_view reason) {
    metrics.record_rejection(status, reason);
  };
  options.metrics_require_key = a.metrics_require_key;
  if (!a.disable_log_requests)
    options.hooks.access_log = [](const api::AccessRecord& r) {
      std::fprintf(stderr, "%s\n", api::format_access_log(r).c_str());
    };
  api::ApiServer api(engine, served, std::move(options));
  // The I/O threads reach `api` through the gate: stop them before it is destroyed, on every path.
  struct StopServerFirst {
    http::HttpServer& server;
    ~StopServerFirst() { server.stop(); }
  } stop_server_first{server};
  gate.open(api);
  std::unique_ptr<PeriodicStatsLogger> stats_logger;
  if (a.log_stats_interval_s > 0)
    stats_logger = std::make_unique<PeriodicStatsLogger>(
        std::chrono::milliseconds(static_cast<int64_t>(a.log_stats_interval_s * 1000)), [&] { return engine.stats(); },
        [](const std::string& line) {
          std::fprintf(stderr, "tessera: %s\n", line.c_str());
          std::fflush(stderr);
        });
  std::printf("tessera: serving %s on http://%s:%u (OpenAI API at /v1)\n", served.name.c_str(), a.host.c_str(),
              static_cast<unsigned>(server.port()));
  std::fflush(stdout);
  if (kv_server)
    std::printf("tessera: prefill worker: KV transfer server on %s:%u (leases of %g s; %s)\n",
                kv_server->host().c_str(), static_cast<unsigned>(kv_server->port()), a.kv_lease_seconds,
                kv_secret.empty() ? "unauthenticated" : "pulls authenticated with the shared secret");
  if (role == api::ServeRole::Decode)
    std::printf("tessera: decode worker: pulls KV within %g s, else prefills locally\n", a.kv_transfer_timeout_s);
  std::fflush(stdout);
  print_engine_summary(model_engine, a.model);  // after the address: clients read that line first

  const int sig = wait_for_signal(signals);
  std::fprintf(stderr, "tessera: %s: draining (up to %d s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", a.drain_timeout_s);
  // The listener stays open: probes get 503 server_draining rather than a refused connection.
  api.set_draining(true);
  const auto drain_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.drain_timeout_s);
  engine.drain(std::chrono::seconds(a.drain_timeout_s));
  // The engine is idle; the connections still write their last chunks (stop() would drop
  // what is queued). Bounded by the drain timeout, and at least 2 s for the last chunks.
  const auto deadline = std::max(drain_deadline, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  while ((api.live_generations() > 0 || server.counters().answering > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server.stop();
  if (kv_server) kv_server->stop();  // its pulls read the engine's leases
  stats_logger.reset();
  engine.stop();
  std::fprintf(stderr, "tessera: stopped\n");
}

}  // namespace

void add_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a model over an OpenAI-compatible HTTP API");
  args->model.add_to(*cmd);
  args->engine.add_to(*cmd);
  cmd->add_option("--host", args->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "port to listen on (0: any free port, printed at start)")
      ->capture_default_str();
  cmd->add_option("--served-model-name", args->served_model_name,
                  "the model name clients must use (default: the model file's name)");
  cmd->add_option("--api-key", args->api_keys, "accept this API key (repeatable); none: no authentication");
  cmd->add_option("--api-key-file", args->api_key_file, "file of API keys, one per line");
  cmd->add_option("--chat-template", args->chat_template_file, "Jinja chat template file (default: the model's)");
  cmd->add_option("--tool-call-parser", args->tool_call_parser,
                  "how the model writes tool calls: hermes, llama3_json, mistral, or auto (from the chat template)")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral"}))
      ->capture_default_str();
  cmd->add_option("--max-request-body", args->max_request_body, "largest request body in bytes (413 beyond)")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", args->drain_timeout_s,
                  "seconds to let requests finish on SIGINT/SIGTERM before aborting them")
      ->capture_default_str();
  cmd->add_option("--max-waiting-requests", args->max_waiting_requests, "queued requests before 429")
      ->capture_default_str();
  cmd->add_option("--io-threads", args->io_threads, "HTTP I/O threads")->capture_default_str();
  cmd->add_option("--prompt-threads", args->prompt_threads,
                  "threads that render chat templates and tokenize prompts (0: on the I/O threads)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--log-stats-interval", args->log_stats_interval_s,
                  "seconds between stats lines (throughput, queues, KV usage) while busy; 0 = none")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_flag("--metrics-require-key", args->metrics_require_key,
                "with API keys, GET /metrics needs one too (default: /metrics is open)");
  cmd->add_flag("--disable-log-requests", args->disable_log_requests,
                "no access-log line on stderr per finished request");
  cmd->add_option("--role", args->role,
                  "prefill/decode disaggregation: colocated (prefill and decode here), prefill (run each request to "
                  "its first token and lease its KV), decode (pull the KV a request's kv_transfer_params name), or "
                  "router (no model: send each request to a --prefill then a --decode worker)")
      ->check(CLI::IsMember({"colocated", "prefill", "decode", "router"}))
      ->capture_default_str();
  cmd->add_option("--kv-transfer-host", args->kv_transfer_host, "prefill worker: the address its KV server listens on")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-advertise-host", args->kv_transfer_advertise_host,
                  "prefill worker: the host decode workers are told to reach its KV server at (default: "
                  "--kv-transfer-host)");
  cmd->add_option("--kv-transfer-port", args->kv_transfer_port,
                  "prefill worker: port of its KV server (0: any free port, printed at start)")
      ->capture_default_str();
  cmd->add_option("--kv-lease-seconds", args->kv_lease_seconds,
                  "prefill worker: how long a request's KV stays pinned for a decode worker to pull")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-timeout", args->kv_transfer_timeout_s,
                  "seconds a whole KV pull may take (decode), and each message of one (prefill); a decode worker "
                  "prefills locally past it")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-threads", args->kv_transfer_threads, "decode worker: threads that pull KV")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-secret-file", args->kv_transfer_secret_file,
                  "prefill and decode workers: a file holding a shared secret (at least 16 bytes, e.g. `openssl rand "
                  "-hex 32`); KV pulls then authenticate both ends and every message carries an HMAC-SHA256");
  cmd->add_option("--prefill", args->prefill_urls, "router: a prefill worker's URL (http://host:port; repeatable)");
  cmd->add_option("--decode", args->decode_urls, "router: a decode worker's URL (http://host:port; repeatable)");
  cmd->add_option("--router-timeout", args->router_timeout_s,
                  "router: seconds a worker may go without sending or taking a byte before the call fails")
      ->capture_default_str();
  cmd->add_option("--router-policy", args->router_policy,
                  "router: how workers are picked: load (decode: fewest calls in flight; prefill: the worker the "
                  "prompt's prefix hashes to, unless it is busier than the rest) or round-robin (default: load)")
      ->check(CLI::IsMember({"load", "round-robin"}));  // router::router_policy_from_name
  cmd->callback([args] { serve(*args); });
}

}  // namespace tessera::apps
