#pragma once
// Shared pieces of the API tests: the SmolLM2 tokenizer (loaded once) and a ServedModel
// around it with a ChatML renderer written out by hand (the model's own template, which the
// server renders through src/template/, reduced to the messages these tests send).
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "format/gguf.h"
#include "server/api/api_error.h"
#include "server/api/served_model.h"
#include "template/jinja_ast.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

namespace api_test {

inline const tessera::Tokenizer& smollm2_tokenizer() {
  static std::unique_ptr<tessera::GGUFFile> file =
      tessera::GGUFFile::open(test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"));
  static std::unique_ptr<tessera::Tokenizer> tok = tessera::Tokenizer::from_gguf(*file);
  return *tok;
}

// SmolLM2's template: a default system turn, then <|im_start|>role\ncontent<|im_end|>\n.
inline std::string chatml(const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json&) {
  std::string out;
  if (messages.empty() || messages[0]["role"] != "system")
    out += "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
  for (const auto& m : messages) {
    if (m["role"] == "raise")  // a template's raise_exception: a verdict on the messages
      throw tessera::jinja::RaisedException(tessera::jinja::SourcePos{1, 1}, "roles must alternate");
    if (m["role"] == "template_bug")  // the template failing on its own (a runtime error)
      throw tessera::Error("chat template: line 3, column 7: 'dict object' has no attribute 'x'");
    out += "<|im_start|>" + m["role"].get<std::string>() + "\n" +
           (m["content"].is_string() ? m["content"].get<std::string>() : std::string()) + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

inline tessera::api::ServedModel served_model(int32_t max_model_len = 512) {
  tessera::api::ServedModel m;
  m.name = "SmolLM2-135M-Instruct";
  m.tokenizer = &smollm2_tokenizer();
  m.vocab_size = m.tokenizer->vocab_size();
  m.max_model_len = max_model_len;
  m.max_n = 8;
  m.chat = chatml;
  m.created = 1700000000;
  return m;
}

// Runs fn, which must throw an ApiError; returns it.
template <typename Fn>
tessera::api::ApiError expect_api_error(Fn&& fn) {
  try {
    fn();
  } catch (const tessera::api::ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return tessera::api::ApiError(0, "", "", std::nullopt, std::nullopt);
}

}  // namespace api_test
