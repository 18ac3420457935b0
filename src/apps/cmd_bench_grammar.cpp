// `tessera bench grammar`: what structured output costs. Part 1 times the grammar work of one
// token (mask fill, applying it to a row of logits, accepting the token) on the model's
// vocabulary, and the masks of the largest batch applied on the engine's backend; part 2 runs the serving engine's steps at each batch size with every request
// free, every request constrained, and half of each, and reports the step time and the
// overhead per constrained token (docs/benchmarks/structured-output.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "format/gguf.h"
#include "backend/backend.h"
#include "core/token_bitmask.h"
#include "grammar/grammar.h"
#include "server/api/tool_request.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

struct GrammarBenchArgs {
  ModelArgs model;
  EngineArgs engine;
  std::string batches = "1,32";
  int n_gen = 64;
  int walks = 20;
  std::string tokenizer;  // a GGUF (a vocabulary-only one will do) whose tokenizer replaces the model's
};

constexpr const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "favorite_color": {"enum": ["red", "green", "blue"]},
  "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "maxItems": 4},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
              "required": ["street", "city"]},
  "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
  "required": ["name", "age", "favorite_color", "tags", "address", "nickname"]})";
// Written with XGrammar's fixed separators (", " and ": "), in the schema's property order.
constexpr const char* kDocument = R"({"name": "Ann Smith", "age": 41, "favorite_color": "blue", "tags": ["red", "x"], )"
                                  R"("address": {"street": "12 Main Street", "city": "Paris"}, "nickname": null})";
// The engine part's grammar: JSON objects one after another, never closed, so every request
// runs exactly n_gen masked steps (the end-of-generation token is biased away).
constexpr const char* kEndless = R"(root ::= "[" item ("," " " item)*
item ::= "{\"name\": \"" [a-zA-Z ]{1,16} "\", \"age\": " [0-9]{1,3} ", \"tags\": [" (tag ("," " " tag)*)? "]}"
tag ::= "\"" [a-z]{1,8} "\"")";
// The engine part's JSON-schema grammar, the case users send most: an array of the 6-field
// objects above that cannot close before 10,000 items, so it never ends within n_gen tokens.
std::string endless_schema() {
  return std::string(R"({"type": "array", "minItems": 10000, "items": )") + kSchema + "}";
}

void time_masks(const Tokenizer& tok, const GrammarCompiler& compiler, const char* name, const GrammarSpec& spec,
                const std::string& text, int walks) {
  const auto t0 = Clock::now();
  const auto grammar = compiler.compile(spec);
  const double compile_ms = us_since(t0) / 1000;
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  TokenBitmask mask(static_cast<size_t>(token_bitmask_words(compiler.vocab_size())));
  std::vector<float> logits(static_cast<size_t>(compiler.vocab_size()), 0.5f);
  std::vector<double> fill, apply, accept;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(grammar);
    for (const int32_t id : ids) {
      auto t = Clock::now();
      m.fill_next_token_bitmask(mask);
      fill.push_back(us_since(t));
      t = Clock::now();
      apply_token_bitmask(logits, mask);
      apply.push_back(us_since(t));
      TESSERA_CHECK(token_bitmask_allows(mask, id), "bench grammar: the ", name,
                    " text is outside its grammar at token ", id);
      t = Clock::now();
      TESSERA_CHECK(m.accept(id), "bench grammar: token ", id, " refused");
      accept.push_back(us_since(t));
    }
  }
  const auto mean = [](std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  const auto p99 = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(0.99 * static_cast<double>(v.size() - 1))];
  };
  std::printf("| %s | %.1f | %zu | %.1f | %.1f | %.1f | %.1f | %.1f |\n", name, compile_ms, ids.size(), mean(fill),
              p99(fill), mean(apply), mean(accept), mean(fill) + mean(apply) + mean(accept));
}

// What the engine does with a batch's masks after the forward: n_rows masks (the schema's
// first, mostly empty) applied to n_rows rows of logits on the engine's backend (one upload
// and one kernel on a device; synchronized, so the time includes the upload), against the
// same masks applied on the host, row after row.
void time_backend_masks(Backend& be, const GrammarCompiler& compiler, int n_rows, int reps) {
  const int n_vocab = compiler.vocab_size(), words = token_bitmask_words(n_vocab);
  GrammarMatcher m(compiler.compile({GrammarSpec::Kind::JsonSchema, kSchema, {}}));
  const size_t mask_bytes = static_cast<size_t>(n_rows) * words * sizeof(int32_t);
  const std::shared_ptr<void> masks = be.alloc_host(mask_bytes);
  auto* bits = static_cast<int32_t*>(masks.get());
  m.fill_next_token_bitmask({bits, static_cast<size_t>(words)});
  for (int r = 1; r < n_rows; ++r) std::copy(bits, bits + words, bits + static_cast<size_t>(r) * words);
  std::vector<int32_t> rows(static_cast<size_t>(n_rows));
  for (int r = 0; r < n_rows; ++r) rows[r] = r;
  const std::vector<float> host_rows(static_cast<size_t>(n_rows) * n_vocab, 0.5f);
  float* dev = static_cast<float*>(be.alloc(host_rows.size() * sizeof(float)));
  be.copy_to_device(dev, host_rows.data(), host_rows.size() * sizeof(float));
  be.apply_token_bitmask(dev, n_vocab, rows, bits, words);  // warm-up (buffers sized)
  be.synchronize();
  auto t = Clock::now();
  for (int i = 0; i < reps; ++i) {
    be.apply_token_bitmask(dev, n_vocab, rows, bits, words);
    be.synchronize();
  }
  const double on_backend = us_since(t) / reps;
  be.free(dev);
  std::vector<float> logits = host_rows;
  t = Clock::now();
  for (int i = 0; i < reps; ++i)
    for (int r = 0; r < n_rows; ++r)
      apply_token_bitmask(std::span<float>(logits.data() + static_cast<size_t>(r) * n_vocab, n_vocab),
                          std::span<const int32_t>(bits + static_cast<size_t>(r) * words, static_cast<size_t>(words)));
  std::printf(
      "\n%d masks applied to %d rows of %d logits: %.1f us on the backend (%s, synchronized: on a "
      "device the upload included), %.1f us on the host\n",
      n_rows, n_rows, n_vocab, on_backend, std::string(be.name()).c_str(), us_since(t) / reps);
}

struct ArmResult {
  double step_ms_median = 0;
  int64_t tokens = 0;
  int64_t constrained_tokens = 0;
  double seconds = 0;
};

ArmResult run_arm(ModelEngine& engine, const Tokenizer& tok, const std::shared_ptr<const CompiledGrammar>& grammar,
                  int batch, int n_constrained, int n_gen) {
  EngineConfig c = engine.config();
  EngineCore core(c, engine.executor());
  const std::vector<int32_t> prompt = tok.encode("A list of people as JSON:", true, false);
  for (int i = 0; i < batch; ++i) {
    Request r;
    r.prompt = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = static_cast<uint64_t>(i);
    r.sampling.max_tokens = n_gen;
    r.sampling.ignore_eos = true;
    r.sampling.logit_bias[tok.eos_id()] = -100.0f;  // the same processors in every arm
    if (i < n_constrained) r.sampling.grammar = grammar;
    core.add(static_cast<RequestId>(i + 1), r);
  }
  ArmResult a;
  std::vector<double> steps;
  const auto t0 = Clock::now();
  while (core.has_work()) {
    const auto t = Clock::now();
    const StepResult s = core.step();
    TESSERA_CHECK(s.error.empty(), "bench grammar: ", s.error);
    steps.push_back(us_since(t) / 1000);
    for (const SeqEvent& e : s.events)
      if (e.token >= 0) {
        ++a.tokens;
        if (static_cast<int>(e.request) <= n_constrained) ++a.constrained_tokens;
      }
  }
  a.seconds = us_since(t0) / 1e6;
  std::sort(steps.begin(), steps.end());
  a.step_ms_median = steps[steps.size() / 2];
  return a;
}

void run_grammar_bench(const GrammarBenchArgs& a, const std::vector<int>& batches) {
  EngineArgs ea = a.engine;
  ea.max_num_seqs = std::max(ea.max_num_seqs, *std::max_element(batches.begin(), batches.end()));
  ModelEngine engine(ea.engine_options(a.model));
  print_engine_summary(engine, a.model);
  // A dummy model (the GPU machine's only large models) has no tokenizer: one comes from a file.
  std::unique_ptr<Tokenizer> own_tok;
  if (!a.tokenizer.empty()) {
    own_tok = Tokenizer::from_gguf(*GGUFFile::open(a.tokenizer));
    TESSERA_CHECK(own_tok->vocab_size() <= engine.config().vocab_size, "--tokenizer ", a.tokenizer, " has ",
                  own_tok->vocab_size(), " tokens, more than the model's ", engine.config().vocab_size);
  }
  const Tokenizer& tok = own_tok ? *own_tok : engine.session().tokenizer();
  auto t0 = Clock::now();
  const GrammarCompiler compiler(tok, engine.config().vocab_size);
  std::printf("vocabulary: %d tokens; grammar index built in %.0f ms\n\n", engine.config().vocab_size,
              us_since(t0) / 1000);
  std::printf("| grammar | compile ms | tokens | fill us/token | fill p99 us | apply us | accept us | total us |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  time_masks(tok, compiler, "JSON schema (object, 6 fields)", {GrammarSpec::Kind::JsonSchema, kSchema, {}}, kDocument,
             a.walks);
  time_masks(tok, compiler, "json_object (any object)", {GrammarSpec::Kind::JsonObject, "", {}}, kDocument, a.walks);
  time_masks(tok, compiler, "regex (date)", {GrammarSpec::Kind::Regex, R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2})", {}},
             "2026-12-03T21:45", a.walks);
  time_masks(tok, compiler, "EBNF (endless JSON list)", {GrammarSpec::Kind::Ebnf, kEndless, {}},
             R"([{"name": "Ann", "age": 41, "tags": ["x", "yz"]}, {"name": "Bo", "age": 7, "tags": []})", a.walks);
  {  // tool_choice "auto", Hermes: free text, then a call held to the 6-field schema
    api::ToolRequest tools;
    tools.tools = api::json::array(
        {{{"type", "function"}, {"function", {{"name", "add_person"}, {"parameters", api::json::parse(kSchema)}}}}});
    tools.choice = api::ToolChoice::Auto;
    time_masks(tok, compiler, "tool call under auto (Hermes triggered tag)",
               *api::auto_tool_call_grammar(tools, api::ToolFormat::Hermes),
               std::string("Let me add that person. <tool_call>\n{\"name\": \"add_person\", \"arguments\": ") +
                   kDocument + "}\n</tool_call>",
               a.walks);
  }

  time_backend_masks(engine.backend(), compiler, *std::max_element(batches.begin(), batches.end()), 50);

  struct EngineGrammar {
    const char* name;
    GrammarSpec spec;
  };
  const EngineGrammar engine_grammars[] = {
      {"JSON schema (array of 6-field objects)", {GrammarSpec::Kind::JsonSchema, endless_schema(), {}}},
      {"EBNF (endless JSON list)", {GrammarSpec::Kind::Ebnf, kEndless, {}}}};
  std::printf(
      "\n| grammar | batch | requests constrained | step ms (median) | output tok/s | overhead vs free, ms/step |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const int b : batches) {
    (void)run_arm(engine, tok, nullptr, b, 0, 4);  // warm the caches at this batch size
    const ArmResult free = run_arm(engine, tok, nullptr, b, 0, a.n_gen);
    std::printf("| none | %d | 0 | %.2f | %.1f | — |\n", b, free.step_ms_median,
                static_cast<double>(free.tokens) / free.seconds);
    for (const EngineGrammar& g : engine_grammars) {
      const auto grammar = compiler.compile(g.spec);
      for (const int n_constrained : {b / 2, b}) {
        if (n_constrained == 0 || (n_constrained == b / 2 && b / 2 == b)) continue;
        const ArmResult r = run_arm(engine, tok, grammar, b, n_constrained, a.n_gen);
        std::printf("| %s | %d | %d | %.2f | %.1f | %+.2f (%+.1f%%) |\n", g.name, b, n_constrained, r.step_ms_median,
                    static_cast<double>(r.tokens) / r.seconds, r.step_ms_median - free.step_ms_median,
                    100 * (r.step_ms_median / free.step_ms_median - 1));
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

void add_bench_grammar(CLI::App& bench) {
  auto a = std::make_shared<GrammarBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "grammar", "structured output: mask time per token, and engine steps with free and constrained requests");
  a->model.add_to(*cmd);
  a->engine.add_to(*cmd);
  cmd->add_option("-C,--batches", a->batches, "comma-separated batch sizes")->capture_default_str();
  cmd->add_option("-n,--n-gen", a->n_gen, "tokens per request")->capture_default_str();
  cmd->add_option("--walks", a->walks, "walks through each mask test's text")->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "GGUF file whose tokenizer to use (e.g. llama.cpp's vocabulary-only ggml-vocab-llama-bpe.gguf "
                  "beside -m dummy:llama-3.1-8b)");
  cmd->callback([a] {
    const std::vector<int> batches = parse_int_list(a->batches, "--batches", 1);
    TESSERA_CHECK(a->n_gen >= 1 && a->walks >= 1, "bench grammar: bad counts");
    run_grammar_bench(*a, batches);
  });
}

}  // namespace tessera::apps
