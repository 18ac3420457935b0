// tessera eval ppl: perplexity over a text file, with llama.cpp's window rule so the numbers
// compare: chunks of ctx tokens, each scored on its second half.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "eval/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

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
    const auto tokens = session.tokenizer().encode(text, /*add_special=*/false, /*parse_special=*/false);
    const auto t0 = std::chrono::steady_clock::now();
    const PerplexityResult r = perplexity(session, tokens, a->ctx, a->max_chunks, [](int i, int n, double ppl) {
      std::fprintf(stderr, "[%d/%d] ppl %.4f\n", i, n, ppl);
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("tokens = %zu, chunks = %d, window = %d, scored = %lld, %.1f tok/s\n", tokens.size(), r.n_chunks,
                a->ctx, static_cast<long long>(r.n_scored), r.n_chunks * a->ctx / secs);
    std::printf("ppl = %.4f\n", r.ppl);
  });
}

}  // namespace tessera::apps
