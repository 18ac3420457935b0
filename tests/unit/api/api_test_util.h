#pragma once
// Shared pieces of the API tests: the SmolLM2 tokenizer (loaded once) and a ServedModel
// around it with a ChatML renderer written out by hand (the model's own template, which the
// server renders through src/template/, reduced to the messages these tests send).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/engine_model.h"
#include "fake_exchange.h"
#include "format/gguf.h"
#include "server/api/api_error.h"
#include "server/api/served_model.h"
#include "template/jinja_ast.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

namespace api_test {

// Polls `done` every 10 ms until it holds or `timeout` passes; says whether it held.
inline bool wait_until(const std::function<bool()>& done, std::chrono::seconds timeout = kTestWait) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

inline const tessera::Tokenizer& smollm2_tokenizer() {
  static std::unique_ptr<tessera::GGUFFile> file =
      tessera::GGUFFile::open(test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"));
  static std::unique_ptr<tessera::Tokenizer> tok = tessera::Tokenizer::from_gguf(*file);
  return *tok;
}

// SmolLM2's template: a default system turn, then <|im_start|>role\ncontent<|im_end|>\n. The
// template's own text is marked as such (RenderedChat::template_spans); roles and contents are
// data. Content "raise!" fails as a template's raise_exception would.
inline tessera::RenderedChat chatml(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                    const nlohmann::ordered_json&) {
  tessera::RenderedChat out;
  auto put = [&](const std::string& text, bool by_template) {
    if (by_template && !text.empty()) {
      if (!out.template_spans.empty() && out.template_spans.back().second == out.text.size())
        out.template_spans.back().second += text.size();
      else
        out.template_spans.emplace_back(out.text.size(), out.text.size() + text.size());
    }
    out.text += text;
  };
  if (messages.empty() || messages[0]["role"] != "system")
    put("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n", true);
  for (const auto& m : messages) {
    if (m["content"] == "raise!")  // a template's raise_exception: a verdict on the messages
      throw tessera::jinja::RaisedException(tessera::jinja::SourcePos{1, 1}, "roles must alternate");
    if (m["content"] == "template_bug!")  // the template failing on its own (a runtime error)
      throw tessera::Error("chat template: line 3, column 7: 'dict object' has no attribute 'x'");
    put("<|im_start|>", true);
    put(m["role"].get<std::string>(), false);
    put("\n", true);
    put(m["content"].is_string() ? m["content"].get<std::string>() : std::string(), false);
    put("<|im_end|>\n", true);
  }
  if (add_generation_prompt) put("<|im_start|>assistant\n", true);
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
  m.tool_format = tessera::api::ToolFormat::Hermes;
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

// A small engine on SmolLM2 for API tests: one thread (ctest runs suites side by side on 2
// cores), 8 sequences of up to 512 tokens, 128 KV blocks, no warm-up.
inline tessera::ModelEngineOptions small_engine_options(const std::string& model_path) {
  tessera::ModelEngineOptions o;
  o.session.model = model_path;
  o.session.backend.threads = 1;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 512;
  o.max_kv_blocks = 128;
  o.kv_cache_bytes = 64ll << 20;
  o.warmup = false;
  return o;
}

}  // namespace api_test
