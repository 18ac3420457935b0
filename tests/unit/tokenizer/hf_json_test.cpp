// tokenizer.json loading against the Hugging Face `tokenizers` library. The tokenizer.json is
// built here from the SmolLM2 GGUF (vocabulary and merges) and the fixture's skeleton, the same
// way the fixture generator built the one it gave to `tokenizers`.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    path =
        fs::temp_directory_path() / ("tessera_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
    return (path / name).string();
  }
};

TEST(TokenizerHfJson, SmolLM2MatchesHuggingFaceTokenizers) {
  const json fx = test::load_fixture("smollm2_hf.json");
  const std::string path = test::model_path(fx["model_file"].get<std::string>());
  ASSERT_TRUE(fs::exists(path)) << path << " is missing: run scripts/fetch-model.sh smollm2-135m";
  const auto gguf = GGUFFile::open(path);
  const auto& tokens = gguf->get_string_array("tokenizer.ggml.tokens");
  const auto& merges = gguf->get_string_array("tokenizer.ggml.merges");
  const auto texts = fx["texts"].get<std::vector<std::string>>();
  for (const auto& [variant, data] : fx["variants"].items()) {
    json doc = data["skeleton"];
    json vocab = json::object();
    for (size_t i = 0; i < tokens.size(); ++i) vocab[std::string(tokens[i])] = i;
    json merge_list = json::array();
    for (auto m : merges) {
      if (variant == "pairs") {
        const size_t cut = m.find(' ', 1);
        merge_list.push_back(json::array({std::string(m.substr(0, cut)), std::string(m.substr(cut + 1))}));
      } else {
        merge_list.push_back(std::string(m));
      }
    }
    doc["model"]["vocab"] = std::move(vocab);
    doc["model"]["merges"] = std::move(merge_list);
    TempDir dir;
    const auto tok = Tokenizer::from_hf_json(dir.write("tokenizer.json", doc.dump()));
    const auto& cases = data["cases"];
    ASSERT_EQ(cases.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      for (const char* mode : {"nn", "np", "an", "ap"}) {
        const bool add = mode[0] == 'a', parse = mode[1] == 'p';
        EXPECT_EQ(tok->encode(texts[i], add, parse), cases[i][mode].get<std::vector<int32_t>>())
            << variant << " text #" << i << " add_special=" << add << " parse_special=" << parse;
      }
      const auto ids = cases[i]["ap"].get<std::vector<int32_t>>();
      EXPECT_EQ(sanitize_utf8(tok->decode(ids, true)), cases[i]["decode_ap_skip"].get<std::string>())
          << variant << " #" << i;
      EXPECT_EQ(sanitize_utf8(tok->decode(ids, false)), cases[i]["decode_ap_keep"].get<std::string>())
          << variant << " #" << i;
    }
    if (variant == "strings") {  // TemplateProcessing wraps the ids in <|im_start|> ... <|im_end|>
      EXPECT_TRUE(tok->add_bos() || tok->encode("x", true, false).front() == 1);
      EXPECT_EQ(tok->encode("x", true, false).front(), 1);
      EXPECT_EQ(tok->encode("x", true, false).back(), 2);
    }
    EXPECT_TRUE(tok->is_eog(2)) << "<|im_end|> ends generation";
  }
}

// A tiny hand-made tokenizer.json exercising the config file and error paths.
json tiny_tokenizer_json() {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(static_cast<uint8_t>(b)));
    vocab[s] = id++;
  }
  vocab["he"] = id++;     // 256
  vocab["ll"] = id++;     // 257
  vocab["hell"] = id++;   // 258
  vocab["hello"] = id++;  // 259
  vocab["<s>"] = id++;    // 260
  vocab["</s>"] = id++;   // 261
  return json{
      {"added_tokens", json::array({json{{"id", 260}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                                    json{{"id", 261}, {"content", "</s>"}, {"special", true}, {"normalized", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", json{{"type", "ByteLevel"}}},
      {"post_processor", nullptr},
      {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"h e", "l l", "he ll", "hell o"})}}}};
}

TEST(TokenizerHfJson, ReadsTokenizerConfig) {
  TempDir dir;
  const std::string path = dir.write("tokenizer.json", tiny_tokenizer_json().dump());
  dir.write("tokenizer_config.json", json{{"bos_token", "<s>"},
                                          {"eos_token", json{{"content", "</s>"}}},
                                          {"add_bos_token", true},
                                          {"add_eos_token", true},
                                          {"chat_template", "{{ messages }}"}}
                                         .dump());
  const auto tok = Tokenizer::from_hf_json(path);
  EXPECT_EQ(tok->bos_id(), 260);
  EXPECT_EQ(tok->eos_id(), 261);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->is_eog(261));
  EXPECT_EQ(tok->chat_template(), "{{ messages }}");
  EXPECT_EQ(tok->encode("hello", true, false), (std::vector<int32_t>{260, 259, 261}));
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{259}));
  EXPECT_EQ(tok->encode("<s>hello", false, true), (std::vector<int32_t>{260, 259}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{260, 259, 261}, true), "hello");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{260, 259, 261}, false), "<s>hello</s>");
}

// The tokenizer.json path honours special spans too (chat prompts from tokenizer.json models).
TEST(TokenizerHfJson, SpecialSpansGateControlTokens) {
  TempDir dir;
  const auto tok = Tokenizer::from_hf_json(dir.write("tokenizer.json", tiny_tokenizer_json().dump()));
  using Spans = std::vector<std::pair<size_t, size_t>>;
  const std::string text = "<s>hello<s>";
  std::vector<int32_t> expected{260};
  for (const int32_t id : tok->encode("hello<s>", false, false)) expected.push_back(id);
  EXPECT_EQ(tok->encode_with_special_spans(text, false, Spans{{0, 3}}), expected);
  EXPECT_EQ(std::count(expected.begin(), expected.end(), 260), 1);
  EXPECT_EQ(tok->encode_with_special_spans(text, false, Spans{{0, text.size()}}), tok->encode(text, false, true));
  // Ill-formed UTF-8 is replaced first, which moves bytes: then no control token is read.
  const std::string bad = "<s>\xff<s>";
  EXPECT_EQ(tok->encode_with_special_spans(bad, false, Spans{{0, 3}}), tok->encode(bad, false, false));
}

TEST(TokenizerHfJson, RejectsWhatItCannotHonour) {
  TempDir dir;
  json doc = tiny_tokenizer_json();
  doc["normalizer"] = json{{"type", "NFC"}};
  EXPECT_THROW(Tokenizer::from_hf_json(dir.write("a.json", doc.dump())), Error);
  doc = tiny_tokenizer_json();
  doc["model"]["merges"].push_back("x y");  // "xy" is not a token
  EXPECT_THROW(Tokenizer::from_hf_json(dir.write("b.json", doc.dump())), Error);
  doc = tiny_tokenizer_json();
  doc["pre_tokenizer"] = json{{"type", "Whitespace"}};
  EXPECT_THROW(Tokenizer::from_hf_json(dir.write("c.json", doc.dump())), Error);
  EXPECT_THROW(Tokenizer::from_hf_json(dir.write("d.json", "{not json")), Error);
  EXPECT_THROW(Tokenizer::from_hf_json((dir.path / "missing.json").string()), Error);
}

}  // namespace
}  // namespace tessera
