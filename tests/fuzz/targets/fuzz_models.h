#pragma once
// Model files the tokenizer and request targets read their vocabularies from: the ones the
// unit and e2e tests use (make test-models), in TESSERA_CACHE or ~/.cache/tessera/models.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tessera::fuzz {

inline std::string model_file(const char* file) {
  const char* cache = std::getenv("TESSERA_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache ? cache : std::string(home ? home : "") + "/.cache/tessera/models";
  return dir + "/" + file;
}

// Loads a GGUF model's tokenizer, or exits naming the file (a fuzz run without its
// vocabulary would test nothing).
struct LoadedTokenizer {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

inline LoadedTokenizer load_tokenizer(const char* file) {
  const std::string path = model_file(file);
  try {
    LoadedTokenizer t;
    t.file = GGUFFile::open(path);
    t.tokenizer = Tokenizer::from_gguf(*t.file);
    return t;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: cannot load the tokenizer of %s: %s (make test-models)\n", path.c_str(), e.what());
    std::exit(2);
  }
}

inline constexpr const char* kBpeModel = "SmolLM2-135M-Instruct.Q4_1.gguf";  // byte-level BPE
inline constexpr const char* kSpmModel = "gemma-3-270m-q4_k_m.gguf";         // SentencePiece

}  // namespace tessera::fuzz
