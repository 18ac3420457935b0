// tessera generate: one prompt in, streamed text out.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <cstdio>
#include <map>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_offline.h"
#include "sample/sampler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

namespace {

struct GenerateArgs {
  ModelArgs model;
  std::string prompt;
  std::string prompt_file;
  bool parse_special = false;
  int max_tokens = 128;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::string> logit_bias;
  int64_t seed = -1;
  bool ignore_eos = false;
  // Offline batch through the serving engine.
  std::string batch_file;
  std::string out_file;
  EngineArgs engine;
  bool through_engine = false;  // one prompt through the serving engine (implied by --speculative-config)
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

SamplingParams sampling_params_of(const GenerateArgs& a) {
  SamplingParams sp;
  sp.temperature = a.temperature;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.min_p = a.min_p;
  sp.repetition_penalty = a.repetition_penalty;
  sp.presence_penalty = a.presence_penalty;
  sp.frequency_penalty = a.frequency_penalty;
  sp.max_tokens = a.max_tokens;
  sp.ignore_eos = a.ignore_eos;
  if (a.seed >= 0) sp.seed = static_cast<uint64_t>(a.seed);
  for (const std::string& lb : a.logit_bias) {
    const auto eq = lb.find('=');
    TESSERA_CHECK(eq != std::string::npos, "--logit-bias '", lb, "' is not ID=BIAS");
    try {
      sp.logit_bias[std::stoi(lb.substr(0, eq))] = std::stof(lb.substr(eq + 1));
    } catch (const std::exception&) {
      fail("--logit-bias '", lb, "' is not ID=BIAS");
    }
  }
  return sp;
}

void run_batch(const GenerateArgs& a) {
  ModelEngine engine(a.engine.engine_options(a.model));
  print_engine_summary(engine, a.model);
  OfflineBatchOptions bo;
  bo.defaults = sampling_params_of(a);
  bo.parse_special = a.parse_special;
  std::ifstream in(a.batch_file);
  TESSERA_CHECK(in.good(), "cannot read --batch file '", a.batch_file, "'");
  std::ofstream out_file;
  if (!a.out_file.empty()) {
    out_file.open(a.out_file);
    TESSERA_CHECK(out_file.good(), "cannot write --out file '", a.out_file, "'");
  }
  const OfflineBatchSummary s = run_offline_batch(engine, in, a.out_file.empty() ? std::cout : out_file, bo);
  std::fprintf(
      stderr, "[tessera] %d requests (%d errors), %lld prompt + %lld completion tokens in %.2f s (%.1f tok/s out)\n",
      s.n_requests, s.n_errors, static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.completion_tokens),
      s.seconds, s.seconds > 0 ? s.completion_tokens / s.seconds : 0.0);
}

void run_generate(const GenerateArgs& a) {
  SessionOptions so = a.model.session_options();
  so.kv_tokens = so.block_size;  // provisioned below, once the prompt's length is known
  Session session(so);
  Tokenizer& tok = session.tokenizer();
  const std::string prompt = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
  std::vector<int32_t> ids = tok.encode(prompt, /*add_special=*/true, a.parse_special);
  TESSERA_CHECK(!ids.empty(), "the prompt is empty after tokenization");
  SamplingParams sp = sampling_params_of(a);
  const int n_vocab = session.config().n_vocab;
  sp.validate(n_vocab);
  TESSERA_CHECK(static_cast<int>(ids.size()) + a.max_tokens <= session.ctx(), "prompt (", ids.size(),
                " tokens) + max tokens (", a.max_tokens, ") exceed the context of ", session.ctx(),
                " tokens; raise --max-model-len");
  session.provision_kv(static_cast<int>(ids.size()) + a.max_tokens);
  Sampler sampler(sp, n_vocab, ids);
  IncrementalDetokenizer detok(tok);

  SequenceBlocks seq;
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  session.feed(seq, ids, ForwardBatch::Logits::Last, logits);
  const double t_prefill = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  int n_gen = 0;
  for (; n_gen < a.max_tokens; ++n_gen) {
    const int32_t next = sampler.sample(std::span<float>(logits.data() + logits.size() - n_vocab, n_vocab));
    sampler.accept(next);
    if (!a.ignore_eos && tok.is_eog(next)) break;
    const std::string text = detok.push(next);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (n_gen + 1 == a.max_tokens) {
      ++n_gen;
      break;
    }
    logits.clear();
    session.feed(seq, std::span<const int32_t>(&next, 1), ForwardBatch::Logits::Last, logits);
  }
  const std::string rest = detok.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  const double t_decode = seconds_since(t1);
  std::fprintf(stderr,
               "\n[tessera] prompt %zu tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s); %s\n",
               ids.size(), t_prefill, ids.size() / t_prefill, n_gen, t_decode, n_gen > 0 ? n_gen / t_decode : 0.0,
               session.backend().describe().c_str());
  seq.release_all(session.pool());
}

// One prompt through the serving engine (a batch of one): what --speculative-config needs,
// and the fair baseline for it (--engine without it). Prints decode speed and acceptance.
void run_generate_engine(const GenerateArgs& a) {
  EngineArgs ea = a.engine;
  ea.max_num_seqs = 1;
  ModelEngine engine(ea.engine_options(a.model));
  print_engine_summary(engine, a.model);
  Tokenizer& tok = engine.session().tokenizer();
  const std::string prompt = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
  Request r;
  r.prompt = tok.encode(prompt, /*add_special=*/true, a.parse_special);
  TESSERA_CHECK(!r.prompt.empty(), "the prompt is empty after tokenization");
  r.sampling = sampling_params_of(a);
  EngineCore core(engine.config(), engine.executor());
  if (const auto rejection = core.validate(r)) fail("generate: ", rejection->message);
  core.add(1, r);
  IncrementalDetokenizer detok(tok);
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t_first;
  int n_gen = 0;
  while (core.has_work()) {
    const StepResult step = core.step();
    TESSERA_CHECK(step.error.empty(), "generate: ", step.error);
    for (const SeqEvent& e : step.events) {
      if (e.token < 0) continue;
      if (n_gen++ == 0) t_first = std::chrono::steady_clock::now();
      if (!a.ignore_eos && tok.is_eog(e.token)) continue;
      const std::string text = detok.push(e.token);
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    std::fflush(stdout);
  }
  const std::string rest = detok.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  const double t_prefill = n_gen > 0 ? std::chrono::duration<double>(t_first - t0).count() : seconds_since(t0);
  const double t_decode = n_gen > 1 ? seconds_since(t_first) : 0.0;
  const EngineStats st = core.stats();
  std::fprintf(stderr,
               "\n[tessera] prompt %zu tokens, first token after %.3f s; then %d tokens in %.3f s (%.1f tok/s) in %lld "
               "steps; speculative: %s, %lld drafts, %lld of %lld draft tokens accepted (%.1f%%); %s\n",
               r.prompt.size(), t_prefill, std::max(0, n_gen - 1), t_decode,
               t_decode > 0 ? (n_gen - 1) / t_decode : 0.0, static_cast<long long>(st.steps),
               describe_speculative_config(engine.config().speculative).c_str(), static_cast<long long>(st.spec.drafts),
               static_cast<long long>(st.spec.accepted_tokens), static_cast<long long>(st.spec.draft_tokens),
               100.0 * st.spec.acceptance_rate(), engine.describe_device().c_str());
}

}  // namespace

void add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt");
  args->model.add_to(*cmd);
  auto* p = cmd->add_option("-p,--prompt", args->prompt, "prompt text");
  auto* pf = cmd->add_option("-f,--prompt-file", args->prompt_file, "read the prompt from a file");
  p->excludes(pf);
  cmd->add_flag("--special", args->parse_special, "let the prompt spell special tokens (e.g. <|im_start|>)");
  cmd->add_option("-n,--max-tokens", args->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature,--temp", args->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "1 = off")->capture_default_str();
  cmd->add_option("--min-p", args->min_p, "0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty,--repetition-penalty", args->repetition_penalty)->capture_default_str();
  cmd->add_option("--presence-penalty", args->presence_penalty)->capture_default_str();
  cmd->add_option("--frequency-penalty", args->frequency_penalty)->capture_default_str();
  cmd->add_option("--logit-bias", args->logit_bias, "ID=BIAS, repeatable");
  cmd->add_option("-s,--seed", args->seed, "sampling seed (-1 = random)")->capture_default_str();
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past end-of-generation tokens");
  auto* batch = cmd->add_option("--batch", args->batch_file,
                                "JSONL requests ({\"prompt\": ...} per line) run together through the serving engine; "
                                "one JSON line out per request, in order");
  batch->excludes(p)->excludes(pf);
  cmd->add_option("--out", args->out_file, "with --batch: write results here instead of stdout");
  args->engine.add_to(*cmd);
  cmd->add_flag("--engine", args->through_engine,
                "run the prompt through the serving engine, as --speculative-config and --tensor-parallel-size do (a "
                "like-for-like baseline)");
  cmd->callback([args] {
    if (!args->batch_file.empty()) return run_batch(*args);
    TESSERA_CHECK(!args->prompt.empty() || !args->prompt_file.empty(),
                  "generate needs --prompt, --prompt-file or --batch");
    // Speculation and tensor or pipeline parallelism run through the engine (its executor drives them).
    if (args->through_engine || !args->engine.speculative_config.empty() || args->engine.tensor_parallel_size > 1 ||
        args->engine.pipeline_parallel_size > 1)
      return run_generate_engine(*args);
    run_generate(*args);
  });
}

}  // namespace tessera::apps
