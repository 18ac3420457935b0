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
#include "grammar/grammar.h"
#include "engine/engine.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"
#include "engine/stats_logger.h"
#include "server/api/access_log.h"
#include "server/api/api_server.h"
#include "server/api/startup_gate.h"
#include "server/http/server.h"
#include "server/metrics.h"
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
};

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
  // Signals are taken by sigwait below: block them before any thread exists, so every thread
  // inherits the mask and none is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
  served.chat = [chat_template](const nlohmann::json& messages, bool add_generation_prompt,
                                const nlohmann::json& extra) {
    return chat_template->apply_marked(messages, add_generation_prompt, extra);
  };

  ServerMetrics metrics(served.name, served.max_model_len);
  {
    const EngineSummary s = describe_engine(model_engine, a.model.model);
    metrics.set_cache_config({s.block_size, s.kv_dtype, s.n_blocks, s.n_host_blocks, s.kv_bits_per_element});
  }
  api::ApiServerOptions options;
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
  print_engine_summary(model_engine, a.model);  // after the address: clients read that line first

  int sig = 0;
  sigwait(&signals, &sig);
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
  cmd->callback([args] { serve(*args); });
}

}  // namespace tessera::apps
