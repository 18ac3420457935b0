// tessera eval ppl: perplexity over a text file, with llama.cpp's window rule so the numbers
// compare: chunks of ctx tokens, each scored on its second half.
// tessera eval kv: the same windows through the f16 cache and each KV format, compared
// (eval/kv_eval.h): perplexity, KL against f16, top-1 agreement, error by position.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "backend/kv_format.h"
#include "engine/kv_scales.h"
#include "eval/kv_eval.h"
#include "eval/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

namespace {

// The formats of the quality table in docs/benchmarks/kv-quant.md.
constexpr const char* kDefaultKvFormats =
    "fp8_e4m3,fp8_e4m3:token,fp8_e5m2:token,int8,int8:g32,int4,int4:g32,turbo4,turbo3.5,turbo3.5:qjl,turbo3,"
    "turbo2.5";

// "NAME" (K and V) or "KNAME/VNAME" (one each) over the base options; the --kv-scales file's
// static scales and key means go to the formats that take them.
KvEvalCase kv_case(const SessionOptions& base, const KvScales& file, const std::string& label) {
  auto o = std::make_shared<SessionOptions>(base);
  const size_t slash = label.find('/');
  const std::string k = label.substr(0, slash), v = slash == std::string::npos ? k : label.substr(slash + 1);
  o->k_format = parse_kv_format(k, true);
  o->v_format = parse_kv_format(v, false);
  if (o->k_format.static_scale()) o->k_scales = file.k;
  if (o->v_format.static_scale()) o->v_scales = file.v;
  if (o->k_format.centers_keys()) apply_key_centering(file, *o);
  return KvEvalCase{label, std::move(o)};
}

void add_eval_kv(CLI::App& eval) {
  struct Args {
    ModelArgs model;
    std::string file, formats = kDefaultKvFormats, reference = "f16", json, markdown;
    int ctx = 512;
    int max_chunks = 0;
    int buckets = 4;
  };
  auto a = std::make_shared<Args>();
  CLI::App* kv = eval.add_subcommand("kv", "quality of KV-cache formats against the f16 cache (ppl, KL, top-1)");
  a->model.add_to(*kv);
  kv->add_option("-f,--file", a->file, "text file")->required();
  kv->add_option("--window", a->ctx, "tokens per window (llama.cpp's -c)")->capture_default_str();
  kv->add_option("--chunks", a->max_chunks, "evaluate at most this many windows (0 = all)")->capture_default_str();
  kv->add_option("--formats", a->formats, "comma-separated KV formats; K/V for different K and V formats")
      ->capture_default_str();
  kv->add_option("--reference", a->reference, "the reference format")->capture_default_str();
  kv->add_option("--buckets", a->buckets, "position buckets of the window for the error by position")
      ->capture_default_str();
  kv->add_option("--json", a->json, "also write the report as JSON to this file");
  kv->add_option("--markdown", a->markdown, "also write the markdown tables to this file");
  kv->callback([a] {
    // --kv-cache-dtype is ignored here: every format comes from --formats.
    ModelArgs model = a->model;
    model.kv_scales.clear();  // applied per format below
    const SessionOptions base = model.session_options();
    const KvScales file = a->model.kv_scales.empty() ? KvScales() : read_kv_scales(a->model.kv_scales);
    const KvEvalCase ref = kv_case(base, file, a->reference);
    std::vector<KvEvalCase> cases;
    std::stringstream list(a->formats);
    for (std::string name; std::getline(list, name, ',');)
      if (!name.empty()) cases.push_back(kv_case(base, file, name));  // parse errors before any run
    std::vector<int32_t> tokens;
    {
      Session tok_session(*ref.options);  // only its tokenizer
      std::string text = read_file(a->file);
      if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp reads -f files
      tokens = tok_session.tokenizer().encode(text, /*add_special=*/false, /*parse_special=*/false);
    }
    KvEvalConfig cfg;
    cfg.window = a->ctx;
    cfg.max_chunks = a->max_chunks;
    cfg.n_buckets = a->buckets;
    const auto t0 = std::chrono::steady_clock::now();
    const KvEvalReport rep = evaluate_kv_formats(ref, cases, tokens, cfg, [&](const std::string& label, int c, int n) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "[%s %d/%d] %.0f s\n", label.c_str(), c, n, s);
    });
    const std::string md = kv_eval_markdown(rep);
    std::printf("%s", md.c_str());
    auto write = [](const std::string& path, const std::string& text) {
      std::ofstream out(path, std::ios::binary);
      TESSERA_CHECK(out.good(), "cannot write ", path);
      out << text;
    };
    if (!a->json.empty()) write(a->json, kv_eval_json(rep));
    if (!a->markdown.empty()) write(a->markdown, md);
  });
}

}  // namespace

void add_eval(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "evaluate a model");
  eval->require_subcommand(1);
  struct Args {
    ModelArgs model;
    std::string file;
    int ctx = 512;
    int max_chunks = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* ppl = eval->add_subcommand("ppl", "perplexity over a text file (llama.cpp's window rule)");
  a->model.add_to(*ppl);
  ppl->add_option("-f,--file", a->file, "text file")->required();
  ppl->add_option("--window", a->ctx, "tokens per chunk (llama.cpp's -c)")->capture_default_str();
  ppl->add_option("--chunks", a->max_chunks, "score at most this many chunks (0 = all)")->capture_default_str();
  ppl->callback([a] {
    SessionOptions so = a->model.session_options();
    so.ctx = std::max(so.ctx, a->ctx);
    so.max_logits = std::min(a->ctx, so.max_batch_tokens);
    Session session(so);
    std::string text = read_file(a->file);
    if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama.cpp reads -f files
    // add_special as llama-perplexity tokenizes: a model that adds BOS (Gemma) starts the
    // stream with it, so the chunks fall on the same tokens as llama.cpp's.
    const auto tokens = session.tokenizer().encode(text, /*add_special=*/true, /*parse_special=*/false);
    const auto t0 = std::chrono::steady_clock::now();
    const PerplexityResult r = perplexity(session, tokens, a->ctx, a->max_chunks, [](int i, int n, double ppl) {
      std::fprintf(stderr, "[%d/%d] ppl %.4f\n", i, n, ppl);
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("tokens = %zu, chunks = %d, window = %d, scored = %lld, %.1f tok/s\n", tokens.size(), r.n_chunks,
                a->ctx, static_cast<long long>(r.n_scored), r.n_chunks * a->ctx / secs);
    std::printf("ppl = %.4f\n", r.ppl);
  });
  add_eval_kv(*eval);
}

}  // namespace tessera::apps
