// tessera tokenize: text in, a JSON array of token ids out.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

void add_tokenize(CLI::App& app) {
  struct Args {
    std::string model = "smollm2-135m", text, file;
    bool no_add_special = false, parse_special = false, pieces = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  cmd->add_option("-m,--model", a->model, "GGUF path or alias")->capture_default_str();
  auto* t = cmd->add_option("--text", a->text, "text to tokenize");
  auto* f = cmd->add_option("--file", a->file, "file to tokenize");
  t->excludes(f);
  cmd->add_flag("--no-add-special", a->no_add_special, "do not add BOS/EOS even where the model asks for them");
  cmd->add_flag("--special", a->parse_special, "let the text spell special tokens");
  cmd->add_flag("--pieces", a->pieces, "print [id, piece] pairs instead of ids");
  cmd->callback([a, t, f] {
    TESSERA_CHECK(t->count() + f->count() > 0, "tokenize needs --text or --file");
    auto gguf = GGUFFile::open(resolve_model_path(a->model));
    auto tok = Tokenizer::from_gguf(*gguf);
    const std::string text = a->file.empty() ? a->text : read_file(a->file);
    const auto ids = tok->encode(text, !a->no_add_special, a->parse_special);
    nlohmann::json out = nlohmann::json::array();
    for (int32_t id : ids) {
      if (a->pieces) {
        const std::string_view piece = tok->token_piece(id);
        out.push_back({id, std::string(piece)});
      } else {
        out.push_back(id);
      }
    }
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  });
}

}  // namespace tessera::apps
