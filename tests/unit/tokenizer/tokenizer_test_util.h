#pragma once
// Helpers shared by the tokenizer tests: fixture and model paths, hex, fixture texts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tessera::test {

inline nlohmann::json load_fixture(const std::string& name) {
  const std::string path = std::string(TESSERA_FIXTURES_DIR) + "/tokenizer/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  return nlohmann::json::parse(in);
}

inline std::string model_path(const std::string& file) {
  if (const char* cache = std::getenv("TESSERA_CACHE")) return std::string(cache) + "/" + file;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/tessera/models/" + file;
}

inline std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// A GPT-2 byte-level vocabulary of the 256 bytes alone (ids 0..255, "gpt-2" pre-tokenizer):
// callers append their own tokens and merges.
inline VocabSpec byte_vocab_spec() {
  VocabSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(static_cast<uint8_t>(b)));
    spec.tokens.push_back(s);
  }
  return spec;
}

inline std::string fixture_text(const nlohmann::json& entry) {
  return entry.contains("s") ? entry["s"].get<std::string>() : unhex(entry["hex"].get<std::string>());
}

// Opens a cached model or fails the test with the command that fetches it.
struct CachedModel {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tok;
};

inline CachedModel open_cached(const std::string& file, const std::string& alias) {
  const std::string path = model_path(file);
  CachedModel m;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " is missing: run scripts/fetch-model.sh " << alias;
    return m;
  }
  m.file = GGUFFile::open(path);
  m.tok = Tokenizer::from_gguf(*m.file);
  return m;
}

}  // namespace tessera::test
