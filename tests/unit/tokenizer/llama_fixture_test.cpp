// Token ids, decoded text, pieces and token classes against llama.cpp (llama-cpp-python,
// vocab_only) on the real SmolLM2 and Gemma 3 files. Fixtures: tools/fixtures/make_tokenizer_fixtures.py.
#include <set>

#include "core/error.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace tessera {
namespace {

using test::fixture_text;
using test::unhex;

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

void check_against_llama(const std::string& fixture_name, const std::string& alias) {
  const nlohmann::json fx = test::load_fixture(fixture_name);
  const auto model = test::open_cached(fx["model_file"].get<std::string>(), alias);
  if (!model.tok) return;
  const Tokenizer& tok = *model.tok;

  ASSERT_EQ(tok.vocab_size(), fx["vocab_size"].get<int32_t>());
  EXPECT_EQ(tok.bos_id(), fx["bos"].get<int32_t>());
  EXPECT_EQ(tok.eos_id(), fx["eos"].get<int32_t>());
  EXPECT_EQ(tok.add_bos(), fx["add_bos"].get<bool>());
  EXPECT_EQ(tok.add_eos(), fx["add_eos"].get<bool>());
  const auto as_set = [](const nlohmann::json& a) { return a.get<std::set<int32_t>>(); };
  std::set<int32_t> eog, special, control;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_eog(id)) eog.insert(id);
    if (tok.is_special(id)) special.insert(id);
    if (tok.is_control(id)) control.insert(id);
  }
  EXPECT_EQ(eog, as_set(fx["eog"]));
  EXPECT_EQ(special, as_set(fx["special"]));
  EXPECT_EQ(control, as_set(fx["control"]));

  const auto& texts = fx["texts"];
  int round_trips = 0;
  for (const auto& c : fx["cases"]) {
    const std::string text = fixture_text(texts[c["text"].get<size_t>()]);
    const std::string label = "text #" + std::to_string(c["text"].get<int>()) + " '" + text.substr(0, 60) + "'";
    for (const char* mode : {"nn", "np", "an", "ap"}) {
      const bool add = mode[0] == 'a', parse = mode[1] == 'p';
      const auto expected = c[mode].get<std::vector<int32_t>>();
      const auto got = tok.encode(text, add, parse);
      EXPECT_EQ(got, expected) << label << " add_special=" << add << " parse_special=" << parse
                               << "\n  got:      " << show(got) << "\n  expected: " << show(expected);
    }
    const auto user_ids = c["nn"].get<std::vector<int32_t>>();
    const std::string decoded = tok.decode(user_ids, true);
    EXPECT_EQ(decoded, unhex(c["decode_nn"].get<std::string>())) << label;
    EXPECT_EQ(tok.decode(c["ap"].get<std::vector<int32_t>>(), false), unhex(c["decode_ap_special"].get<std::string>()))
        << label;
    if (unhex(c["decode_nn"].get<std::string>()) == text) {  // llama.cpp round-trips this text
      EXPECT_EQ(tok.decode(tok.encode(text, false, false), true), text) << label;
      ++round_trips;
    }
  }
  EXPECT_GT(round_trips, 60) << "most of the text set should round-trip";

  const auto& pieces = fx["pieces"];
  for (size_t i = 0; i < pieces["ids"].size(); ++i) {
    const int32_t id = pieces["ids"][i].get<int32_t>();
    EXPECT_EQ(std::string(tok.token_piece(id)), unhex(pieces["hex"][i].get<std::string>())) << "piece of " << id;
  }
}

TEST(TokenizerLlama, SmolLM2MatchesLlamaCpp) { check_against_llama("smollm2_llama.json", "smollm2-135m"); }

TEST(TokenizerLlama, Gemma3MatchesLlamaCpp) { check_against_llama("gemma3_llama.json", "gemma3-270m"); }

TEST(TokenizerLlama, SmolLM2Basics) {
  const auto model = test::open_cached("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m");
  if (!model.tok) return;
  const Tokenizer& tok = *model.tok;
  EXPECT_EQ(tok.token_id("<|im_start|>"), 1);
  EXPECT_FALSE(tok.token_id("no such token").has_value());
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string_view::npos);
  // User text that spells a control token stays text; with parse_special it is the token.
  EXPECT_EQ(tok.encode("<|im_start|>", false, true), std::vector<int32_t>{1});
  EXPECT_GT(tok.encode("<|im_start|>", false, false).size(), 1u);
  const std::vector<int32_t> bad{5, tok.vocab_size()};
  try {
    (void)tok.decode(bad, true);
    ADD_FAILURE() << "decode accepted an id outside the vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(tok.vocab_size())), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)tok.decode(std::vector<int32_t>{-1}, false), Error);
  EXPECT_THROW((void)tok.token_piece(-3), Error);
}

TEST(TokenizerLlama, PreTokenizerSplitsMatchLlamaCpp) {
  const nlohmann::json fx = test::load_fixture("pre_tokenizer_splits.json");
  std::vector<std::vector<uint32_t>> texts;
  for (const auto& t : fx["texts"]) texts.push_back(decode_utf8_lenient(fixture_text(t)));
  for (const auto& [name, fam] : fx["families"].items()) {
    const auto regexes = fam["regexes"].get<std::vector<std::string>>();
    EXPECT_EQ(llama_pre_tokenizer(name).regexes, regexes) << name;
    const LlamaSplitter splitter(regexes);
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto expected = fam["lengths"][i].get<std::vector<size_t>>();
      EXPECT_EQ(splitter.split_lengths(texts[i]), expected) << name << " text #" << i;
    }
  }
}

}  // namespace
}  // namespace tessera
