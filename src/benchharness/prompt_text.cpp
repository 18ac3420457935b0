#include "benchharness/prompt_text.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/session.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera::bench {

namespace {

class TokenizerCounter : public TokenCounter {
 public:
  TokenizerCounter(const Tokenizer& tok, std::string name) : tok_(tok), name_(std::move(name)) {}
  int64_t count(std::string_view text) override {
    return static_cast<int64_t>(tok_.encode(text, /*add_special=*/false, /*parse_special=*/false).size());
  }
  std::string describe() const override { return "tokenizer of " + name_; }
  bool can_decode() const override { return true; }
  std::vector<int32_t> encode(std::string_view text) override { return tok_.encode(text, false, false); }
  std::string decode(const std::vector<int32_t>& ids) override { return tok_.decode(ids, /*skip_special=*/true); }

 private:
  const Tokenizer& tok_;
  std::string name_;
};

class OwningTokenizerCounter : public TokenizerCounter {
 public:
  OwningTokenizerCounter(std::unique_ptr<Tokenizer> tok, std::string name)
      : TokenizerCounter(*tok, std::move(name)), owned_(std::move(tok)) {}

 private:
  std::unique_ptr<Tokenizer> owned_;
};

class ServerCounter : public TokenCounter {
 public:
  ServerCounter(const Endpoint& ep, std::string model, std::string key)
      : ep_(ep), model_(std::move(model)), key_(std::move(key)) {
    baseline_ = raw_count("");
  }
  int64_t count(std::string_view text) override { return raw_count(text) - baseline_; }
  std::string describe() const override { return "POST " + ep_.url() + "/tokenize"; }

 private:
  int64_t raw_count(std::string_view text) {
    nlohmann::json body = {{"prompt", std::string(text)}, {"add_special_tokens", false}};
    if (!model_.empty()) body["model"] = model_;
    const HttpReply r = http_post_json(ep_, "/tokenize", body.dump(), key_);
    TESSERA_CHECK(r.status == 200, "POST ", ep_.url(), "/tokenize answered ", r.status, ": ", error_message_of(r.body),
                  " (use --tokenizer-model to count tokens locally)");
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    TESSERA_CHECK(!j.is_discarded() && j.is_object(), "POST /tokenize: reply is not a JSON object");
    if (j.contains("count") && j["count"].is_number_integer()) return j["count"].get<int64_t>();
    if (j.contains("tokens") && j["tokens"].is_array()) return static_cast<int64_t>(j["tokens"].size());
    fail("POST /tokenize: reply has neither \"count\" nor \"tokens\"");
  }
  Endpoint ep_;
  std::string model_, key_;
  int64_t baseline_ = 0;
};

class EstimatingCounter : public TokenCounter {
 public:
  int64_t count(std::string_view text) override { return static_cast<int64_t>((text.size() + 3) / 4); }
  bool exact() const override { return false; }
  std::string describe() const override { return "estimate (4 bytes per token; not exact)"; }
};

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Common English words for prompts when no corpus is given.
constexpr const char* kWords[] = {
    "the",    "of",      "and",      "to",       "in",         "is",          "that",      "for",    "it",
    "as",     "was",     "with",     "be",       "by",         "on",          "not",       "he",     "this",
    "are",    "or",      "his",      "from",     "at",         "which",       "but",       "have",   "an",
    "had",    "they",    "you",      "were",     "their",      "one",         "all",       "we",     "can",
    "her",    "has",     "there",    "been",     "if",         "more",        "when",      "will",   "would",
    "who",    "so",      "no",       "time",     "people",     "year",        "way",       "day",    "man",
    "thing",  "woman",   "life",     "child",    "world",      "school",      "state",     "family", "student",
    "group",  "country", "problem",  "hand",     "part",       "place",       "case",      "week",   "company",
    "system", "program", "question", "work",     "government", "number",      "night",     "point",  "home",
    "water",  "room",    "mother",   "area",     "money",      "story",       "fact",      "month",  "lot",
    "right",  "study",   "book",     "eye",      "job",        "word",        "business",  "issue",  "side",
    "kind",   "head",    "house",    "service",  "friend",     "father",      "power",     "hour",   "game",
    "line",   "end",     "member",   "law",      "car",        "city",        "community", "name",   "president",
    "team",   "minute",  "idea",     "kid",      "body",       "information", "back",      "parent", "face",
    "others", "level",   "office",   "door",     "health",     "person",      "art",       "war",    "history",
    "party",  "result",  "change",   "morning",  "reason",     "research",    "girl",      "guy",    "moment",
    "air",    "teacher", "force",    "education"};

}  // namespace

std::unique_ptr<TokenCounter> make_tokenizer_counter(const Tokenizer& tokenizer, std::string name) {
  return std::make_unique<TokenizerCounter>(tokenizer, std::move(name));
}

std::unique_ptr<TokenCounter> make_local_token_counter(const std::string& model) {
  const std::string path = resolve_model_path(model);
  std::unique_ptr<Tokenizer> tok;
  if (std::filesystem::is_directory(path)) {
    TESSERA_CHECK(std::filesystem::exists(path + "/tokenizer.json"), "--tokenizer-model '", model,
                  "': directory has no tokenizer.json");
    tok = Tokenizer::from_hf_json(path + "/tokenizer.json");
  } else if (path.size() > 15 && path.compare(path.size() - 15, 15, "/tokenizer.json") == 0) {
    tok = Tokenizer::from_hf_json(path);
  } else {
    const auto gguf = GGUFFile::open(path);
    tok = Tokenizer::from_gguf(*gguf);
  }
  return std::make_unique<OwningTokenizerCounter>(std::move(tok), path);
}

std::unique_ptr<TokenCounter> make_server_token_counter(const Endpoint& endpoint, std::string model,
                                                        std::string api_key) {
  return std::make_unique<ServerCounter>(endpoint, std::move(model), std::move(api_key));
}

std::unique_ptr<TokenCounter> make_estimating_token_counter() { return std::make_unique<EstimatingCounter>(); }

TextSource::TextSource(std::string text) {
  // Collapse whitespace runs: a cut never starts or ends inside a run of newlines and
  // paragraphs of a license read as one stream of prose.
  text_.reserve(text.size());
  bool space = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      space = !text_.empty();
      continue;
    }
    if (space) text_.push_back(' ');
    space = false;
    text_.push_back(c);
  }
  TESSERA_CHECK(text_.size() >= 64, "prompt corpus has only ", text_.size(), " bytes of text (need at least 64)");
  describe_ = "inline text";
}

TextSource TextSource::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read corpus '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  TextSource s(ss.str());
  s.describe_ = path;
  return s;
}

TextSource TextSource::builtin(uint64_t seed) {
  Rng rng(seed ^ 0x5eedf00dULL);
  std::string text;
  constexpr size_t n_words = sizeof(kWords) / sizeof(kWords[0]);
  for (int i = 0; i < 20000; ++i) {
    if (i) text += (i % 17 == 0) ? ". " : " ";
    text += kWords[rng.uniform_int(0, n_words - 1)];
  }
  TextSource s(text);
  s.describe_ = "built-in word list (no --corpus)";
  return s;
}

size_t TextSource::random_offset(Rng& rng) const {
  size_t off = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(text_.size()) - 1));
  // Move to the start of the next word.
  while (off < text_.size() && text_[off] != ' ') ++off;
  if (off >= text_.size()) return 0;
  return off + 1 < text_.size() ? off + 1 : 0;
}

std::string TextSource::slice(size_t offset, size_t length) const {
  std::string out;
  out.reserve(length);
  size_t pos = offset % text_.size();
  while (out.size() < length) {
    const size_t take = std::min(length - out.size(), text_.size() - pos);
    out.append(text_, pos, take);
    pos = 0;
    if (out.size() < length) out.push_back(' ');  // the corpus repeats, one space between copies
  }
  return out;
}

std::string make_text_with_tokens(const TextSource& source, TokenCounter& counter, int64_t tokens, Rng& rng) {
  TESSERA_CHECK(tokens >= 1, "prompt length ", tokens, " must be at least 1 token");
  for (int attempt = 0; attempt < 8; ++attempt) {
    const size_t offset = source.random_offset(rng);
    // Fast path with an in-process tokenizer: decode the first `tokens` ids of a window.
    if (counter.can_decode()) {
      size_t window = static_cast<size_t>(tokens) * 6 + 64;
      std::vector<int32_t> ids;
      for (int grow = 0; grow < 8; ++grow, window *= 2) {
        ids = counter.encode(source.slice(offset, window));
        if (static_cast<int64_t>(ids.size()) > tokens) break;
      }
      if (static_cast<int64_t>(ids.size()) > tokens) {
        ids.resize(static_cast<size_t>(tokens));
        std::string text = counter.decode(ids);
        if (counter.count(text) == tokens) return text;
      }
    }
    // General path: the longest prefix of the window with count <= tokens, by bisection on
    // its byte length (invariant: count(lo) <= tokens < count(hi)).
    auto text_of = [&](size_t len) { return source.slice(offset, len); };
    size_t lo = 0, hi = static_cast<size_t>(tokens) * 4 + 16;
    while (counter.count(text_of(hi)) <= tokens) hi *= 2;
    const std::string window = text_of(hi);
    while (hi - lo > 1) {
      // Cut only at character starts (the tokenizer would otherwise see broken UTF-8).
      size_t mid = lo + (hi - lo) / 2;
      while (mid > lo && is_continuation(static_cast<unsigned char>(window[mid]))) --mid;
      if (mid == lo) {
        mid = lo + (hi - lo) / 2;
        while (mid < hi && is_continuation(static_cast<unsigned char>(window[mid]))) ++mid;
        if (mid == hi) break;
      }
      if (counter.count(std::string_view(window).substr(0, mid)) <= tokens)
        lo = mid;
      else
        hi = mid;
    }
    std::string text = window.substr(0, lo);
    if (counter.count(text) == tokens) return text;
  }
  fail("could not cut text of exactly ", tokens, " tokens from ", source.describe(), " with ", counter.describe());
}

}  // namespace tessera::bench
