// The pre-tokenizers of llama.cpp's BPE vocabularies that tessera implements, chosen by the
// GGUF key `tokenizer.ggml.pre`. Each family lists the regexes llama.cpp applies in order and
// the flags it sets for that name (see docs/design/tokenizer.md).
#include <algorithm>

#include "core/error.h"
#include "tokenizer/regex_split.h"

namespace tessera {

namespace {

const char* const kGpt2 = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
const char* const kLlama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kQwen2 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kQwen35 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kGpt4o =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kTekken =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

struct Family {
  std::vector<std::string> names;
  LlamaPreTokenizerInfo info;
};

const std::vector<Family>& families() {
  static const std::vector<Family> all = [] {
    std::vector<Family> f;
    // {names}, {regexes, ignore_merges, clean_spaces, add_bos}
    f.push_back({{"default"},
                 {{R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}, false, true, false}});
    f.push_back(
        {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
         {{kLlama3}, true, true, true}});
    f.push_back({{"dbrx", "smaug-bpe"}, {{kLlama3}, false, true, false}});
    // "deepseek-llm" is left out on purpose: llama.cpp's regex list for it has out-of-order
    // ranges (e.g. U+1FD0-U+0390) that std::regex rejects, so llama.cpp cannot tokenize with it
    // and there is no behaviour to match.
    f.push_back(
        {{"deepseek-coder"},
         {{"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}, false, false, false}});
    f.push_back({{"falcon"}, {{R"re([\p{P}\$\+<=>\^~\|`]+)re", kGpt2, "[0-9][0-9][0-9]"}, false, true, false}});
    f.push_back({{"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"},
                 {{R"re(\p{N})re", kGpt2}, false, true, false}});
    f.push_back({{"smollm", "command-r"}, {{R"re(\p{N})re", kGpt2}, false, false, false}});
    f.push_back({{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                  "modern-bert", "mpt", "olmo", "jais", "exaone4"},
                 {{kGpt2}, false, true, false}});
    f.push_back({{"trillion", "granite-docling"}, {{kGpt2}, false, false, false}});
    f.push_back(
        {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"}, {{kQwen2}, false, false, false}});
    f.push_back({{"megrez", "stablelm2"}, {{kQwen2}, false, true, false}});
    f.push_back({{"qwen35"}, {{kQwen35}, false, false, false}});
    f.push_back({{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {{kGpt4o}, false, false, false}});
    f.push_back({{"tekken"}, {{kTekken}, true, false, true}});
    return f;
  }();
  return all;
}

}  // namespace

LlamaPreTokenizerInfo llama_pre_tokenizer(std::string_view pre) {
  for (const auto& fam : families())
    if (std::find(fam.names.begin(), fam.names.end(), pre) != fam.names.end()) return fam.info;
  fail("tokenizer: unsupported pre-tokenizer '", pre, "' (tokenizer.ggml.pre)");
}

std::vector<std::string> llama_pre_tokenizer_names() {
  std::vector<std::string> names;
  for (const auto& fam : families()) names.insert(names.end(), fam.names.begin(), fam.names.end());
  return names;
}

}  // namespace tessera
