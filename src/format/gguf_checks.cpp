// Consistency checks on a GGUF file's metadata that go beyond the file format: the
// tokenizer arrays must agree with each other and the special token ids must name tokens.
#include <string>

#include "core/error.h"
#include "format/gguf.h"

namespace tessera {

namespace {
constexpr std::string_view kTokenizerPrefix = "tokenizer.ggml.";
constexpr std::string_view kTokenIdSuffix = "_token_id";

bool is_special_token_key(std::string_view key) {
  return key.size() > kTokenizerPrefix.size() + kTokenIdSuffix.size() &&
         key.substr(0, kTokenizerPrefix.size()) == kTokenizerPrefix &&
         key.substr(key.size() - kTokenIdSuffix.size()) == kTokenIdSuffix;
}
// The ids that steer prompts and stopping; a bad one is an error. The others (unknown,
// padding, mask, FIM, ...) are optional: the tokenizer warns and keeps its default, as llama.cpp.
bool is_required_special_token_key(std::string_view key) {
  return key == "tokenizer.ggml.bos_token_id" || key == "tokenizer.ggml.eos_token_id" ||
         key == "tokenizer.ggml.eot_token_id" || key == "tokenizer.ggml.eom_token_id";
}
}  // namespace

void validate_tokenizer_metadata(const GGUFFile& file) {
  const std::string& name = file.name();
  if (!file.has("tokenizer.ggml.tokens")) fail(name, ": missing key 'tokenizer.ggml.tokens' (no vocabulary)");
  const size_t n_vocab = file.get_string_array("tokenizer.ggml.tokens").size();
  if (n_vocab == 0) fail(name, ": key 'tokenizer.ggml.tokens': the vocabulary is empty");

  if (const GGUFValue* scores = file.find("tokenizer.ggml.scores")) {
    // f32, or i32 as some converters write them (the tokenizer reads both).
    const bool ints = scores->type == GGUFType::ARRAY && scores->elem_type == GGUFType::I32;
    const size_t n = ints ? scores->ints.size() : file.get_float_array("tokenizer.ggml.scores").size();
    if (n != n_vocab)
      fail(name, ": key 'tokenizer.ggml.scores' has ", n, " entries but 'tokenizer.ggml.tokens' has ", n_vocab);
  }
  if (file.has("tokenizer.ggml.token_type")) {
    const size_t n = file.get_int_array("tokenizer.ggml.token_type").size();
    if (n != n_vocab)
      fail(name, ": key 'tokenizer.ggml.token_type' has ", n, " entries but 'tokenizer.ggml.tokens' has ", n_vocab);
  }
  if (file.has("tokenizer.ggml.merges")) file.get_string_array("tokenizer.ggml.merges");  // type check

  for (const auto& [key, value] : file.metadata()) {
    if (!is_special_token_key(key)) continue;
    const int64_t id = *file.get_int(key);  // throws, naming the key, if not an integer
    if (value.type == GGUFType::BOOL) fail(name, ": key '", key, "' has type bool, expected an integer token id");
    if ((id < 0 || static_cast<uint64_t>(id) >= n_vocab) && is_required_special_token_key(key))
      fail(name, ": key '", key, "': token id ", id, " is outside the vocabulary [0, ", n_vocab, ")");
  }
}

}  // namespace tessera
