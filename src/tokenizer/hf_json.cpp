// Hugging Face tokenizer.json front end: byte-level BPE with the rules of the `tokenizers`
// library (added tokens matched leftmost-longest, Split/ByteLevel/Digits/Sequence
// pre-tokenizers, TemplateProcessing for BOS/EOS).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tessera {

namespace {

using json = nlohmann::json;

const char* const kByteLevelRegex = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good(), "tokenizer: cannot open '", path.string(), "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("tokenizer: '", path.string(), "' is not valid JSON: ", e.what());
  }
}

std::string where(const std::string& path, std::string_view field) { return path + ": " + std::string(field); }

// Appends the pre-tokenizer steps described by `node` (recursively for Sequence).
void parse_pre_tokenizer(const json& node, const std::string& path, std::vector<HfPreStep>& steps) {
  if (node.is_null()) return;
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const auto& sub : node.at("pretokenizers")) parse_pre_tokenizer(sub, path, steps);
    return;
  }
  HfPreStep step;
  if (type == "ByteLevel") {
    step.kind = HfPreStep::Kind::ByteLevel;
    step.add_prefix_space = node.value("add_prefix_space", false);
    step.use_regex = node.value("use_regex", true);
    if (step.use_regex) step.regex = std::make_unique<PcreRegex>(kByteLevelRegex, PcreRegex::Mode::Unicode);
  } else if (type == "Split") {
    step.kind = HfPreStep::Kind::Split;
    const json& pattern = node.at("pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern.at("Regex").get<std::string>();
    } else if (pattern.contains("String")) {  // a literal: quote it for PCRE2
      regex = "\\Q" + pattern.at("String").get<std::string>() + "\\E";
    } else {
      fail("tokenizer: ", where(path, "pre_tokenizer Split"), " has no Regex or String pattern");
    }
    step.regex = std::make_unique<PcreRegex>(regex, PcreRegex::Mode::Unicode);
    const std::string behavior = node.value("behavior", "Isolated");
    using B = HfPreStep::Behavior;
    if (behavior == "Isolated")
      step.behavior = B::Isolated;
    else if (behavior == "Removed")
      step.behavior = B::Removed;
    else if (behavior == "MergedWithPrevious")
      step.behavior = B::MergedWithPrevious;
    else if (behavior == "MergedWithNext")
      step.behavior = B::MergedWithNext;
    else if (behavior == "Contiguous")
      step.behavior = B::Contiguous;
    else
      fail("tokenizer: ", where(path, "Split behavior"), " '", behavior, "' is not supported");
    step.invert = node.value("invert", false);
  } else if (type == "Digits") {
    step.kind = HfPreStep::Kind::Digits;
    step.regex = std::make_unique<PcreRegex>("\\p{N}", PcreRegex::Mode::Unicode);
    step.behavior =
        node.value("individual_digits", false) ? HfPreStep::Behavior::Isolated : HfPreStep::Behavior::Contiguous;
  } else {
    fail("tokenizer: ", where(path, "pre_tokenizer"), " type '", type,
         "' is not supported (Sequence, Split, ByteLevel, Digits are)");
  }
  steps.push_back(std::move(step));
}

// Splits `piece` by the matches of `re` as tokenizers' SplitDelimiterBehavior says.
void split_piece(const std::string& piece, const HfPreStep& step, std::vector<std::string>& out) {
  const auto matches = step.regex->find_all(piece, 0, piece.size());
  // (begin, end, is_match) spans covering the piece
  std::vector<std::tuple<size_t, size_t, bool>> spans;
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (s > prev) spans.emplace_back(prev, s, false);
    spans.emplace_back(s, e, true);
    prev = e;
  }
  if (prev < piece.size()) spans.emplace_back(prev, piece.size(), false);
  if (step.invert)
    for (auto& sp : spans) std::get<2>(sp) = !std::get<2>(sp);
  using B = HfPreStep::Behavior;
  std::vector<std::pair<size_t, size_t>> parts;
  switch (step.behavior) {
    case B::Isolated:
      for (const auto& [s, e, m] : spans) parts.emplace_back(s, e);
      break;
    case B::Removed:
      for (const auto& [s, e, m] : spans)
        if (!m) parts.emplace_back(s, e);
      break;
    case B::MergedWithPrevious:  // a match joins the part before it
      for (const auto& [s, e, m] : spans) {
        if (m && !parts.empty() && parts.back().second == s)
          parts.back().second = e;
        else
          parts.emplace_back(s, e);
      }
      break;
    case B::MergedWithNext: {  // a match starts the part after it
      bool open = false;
      for (const auto& [s, e, m] : spans) {
        if (open)
          parts.back().second = e;
        else
          parts.emplace_back(s, e);
        open = m;
      }
      break;
    }
    case B::Contiguous: {  // consecutive matches form one part
      bool prev_match = false;
      for (const auto& [s, e, m] : spans) {
        if (m && prev_match && !parts.empty())
          parts.back().second = e;
        else
          parts.emplace_back(s, e);
        prev_match = m;
      }
      break;
    }
  }
  for (const auto& [s, e] : parts)
    if (e > s) out.push_back(piece.substr(s, e - s));
}

std::string byte_level_encode(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char b : s) append_utf8(out, byte_to_unicode(b));
  return out;
}

bool is_hf_whitespace(uint32_t cp) { return unicode_is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

}  // namespace

std::vector<std::string> Tokenizer::Impl::hf_pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces{std::string(text)};
  bool byte_encoded = false;
  for (const HfPreStep& step : hf_steps) {
    std::vector<std::string> next;
    for (std::string& p : pieces) {
      if (step.kind == HfPreStep::Kind::ByteLevel) {
        if (step.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
        std::vector<std::string> words;
        if (step.use_regex)
          split_piece(p, step, words);
        else
          words.push_back(p);
        for (auto& w : words) next.push_back(byte_level_encode(w));
      } else {
        split_piece(p, step, next);
      }
    }
    if (step.kind == HfPreStep::Kind::ByteLevel) byte_encoded = true;
    pieces = std::move(next);
  }
  TESSERA_CHECK(byte_encoded, "tokenizer: tokenizer.json without a ByteLevel pre-tokenizer is not supported");
  return pieces;
}

std::vector<int32_t> Tokenizer::Impl::encode_hf(std::string_view input, bool add_special, SpecialPolicy policy) const {
  std::vector<int32_t> out;
  if (add_special) out.insert(out.end(), hf_prefix.begin(), hf_prefix.end());
  // Rust strings are UTF-8: ill-formed input is replaced first (U+FFFD per maximal subpart).
  const bool valid = is_valid_utf8(input);
  const std::string s = valid ? std::string(input) : sanitize_utf8(input);
  // Replacement moves bytes, so spans no longer fit: then no control token is read at all.
  if (!valid && policy.gated) policy.parse_special = false;
  // Added tokens: first the ones matched on raw text, then the "normalized" ones in what is
  // left; each stage takes the leftmost match, the longest there. With parse_special false,
  // special added tokens are not matched (tokenizers' encode_special_tokens).
  std::vector<Fragment> frags{{-1, 0, s.size()}};
  for (int stage = 0; stage < 2; ++stage) {
    const auto& ids = stage == 0 ? hf_added_plain : hf_added_normalized;
    const auto& finder = stage == 0 ? hf_plain_finder : hf_normalized_finder;
    if (ids.empty()) continue;
    std::vector<Fragment> next;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view window(s.data(), f.offset + f.length);
      size_t start = f.offset;  // start of the pending plain text
      for (size_t pos = f.offset; pos < f.offset + f.length;) {
        const int k = finder.longest_at(window, pos);
        if (k < 0 || ((attr[ids[k]] & kAttrControl) && !policy.allows(pos, pos + text[ids[k]].size()))) {
          ++pos;
          continue;
        }
        const int32_t id = ids[k];
        size_t m_begin = pos, m_end = pos + text[id].size();
        if (attr[id] & kAttrLstrip) {  // the token swallows whitespace before it
          while (m_begin > start) {
            size_t back = m_begin - 1;
            while (back > start && (static_cast<uint8_t>(s[back]) & 0xC0) == 0x80) --back;
            size_t p = back;
            if (!is_hf_whitespace(decode_utf8_lenient(s, p))) break;
            m_begin = back;
          }
        }
        if (attr[id] & kAttrRstrip) {  // ... and after it
          while (m_end < f.offset + f.length) {
            size_t p = m_end;
            if (!is_hf_whitespace(decode_utf8_lenient(window, p))) break;
            m_end = p;
          }
        }
        if (m_begin > start) next.push_back({-1, start, m_begin - start});
        next.push_back({id, 0, 0});
        pos = start = m_end;
      }
      if (f.offset + f.length > start) next.push_back({-1, start, f.offset + f.length - start});
    }
    frags = std::move(next);
  }
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    for (const std::string& word : hf_pre_tokenize(std::string_view(s).substr(f.offset, f.length))) bpe_word(word, out);
  }
  if (add_special) out.insert(out.end(), hf_suffix.begin(), hf_suffix.end());
  return out;
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& tokenizer_json_path) {
  namespace fs = std::filesystem;
  const std::string& path = tokenizer_json_path;
  const json root = read_json(path);
  auto impl = std::make_unique<Impl>();
  Impl& v = *impl;
  v.kind = Impl::Kind::HfBpe;
  try {
    if (root.contains("normalizer") && !root["normalizer"].is_null())
      fail("tokenizer: ", where(path, "normalizer"), " is not supported (only null)");
    const json& model = root.at("model");
    TESSERA_CHECK(model.value("type", "BPE") == "BPE", "tokenizer: ", where(path, "model.type"), " '",
                  model.value("type", ""), "' is not supported (only BPE)");
    for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(unsupported) && !model[unsupported].is_null() && model[unsupported] != "")
        fail("tokenizer: ", where(path, std::string("model.") + unsupported), " is not supported");
    if (model.contains("dropout") && !model["dropout"].is_null())
      fail("tokenizer: ", where(path, "model.dropout"), " is not supported");
    v.ignore_merges = model.value("ignore_merges", false);
    v.hf_byte_fallback = model.value("byte_fallback", false);

    // Vocabulary: model.vocab plus added_tokens; ids must cover [0, n) without gaps.
    std::map<int64_t, std::string> by_id;
    for (const auto& [tok, id] : model.at("vocab").items()) by_id[id.get<int64_t>()] = tok;
    struct Added {
      int32_t id;
      bool special, normalized, lstrip, rstrip;
    };
    std::vector<Added> added;
    if (root.contains("added_tokens")) {
      for (const json& a : root["added_tokens"]) {
        const int64_t id = a.at("id").get<int64_t>();
        by_id[id] = a.at("content").get<std::string>();
        if (a.value("single_word", false))
          fail("tokenizer: ", where(path, "added_tokens"), ": single_word tokens are not supported (id ", id, ")");
        added.push_back({static_cast<int32_t>(id), a.value("special", false), a.value("normalized", true),
                         a.value("lstrip", false), a.value("rstrip", false)});
      }
    }
    TESSERA_CHECK(!by_id.empty(), "tokenizer: ", where(path, "model.vocab"), " is empty");
    const int64_t n = by_id.rbegin()->first + 1;
    TESSERA_CHECK(by_id.begin()->first == 0 && static_cast<int64_t>(by_id.size()) == n,
                  "tokenizer: ", where(path, "vocab"), " ids do not cover 0..", n - 1, " without gaps");
    v.text.resize(n);
    v.score.assign(n, 0.0f);
    v.attr.assign(n, kAttrNormal);
    for (auto& [id, tok] : by_id) {
      v.max_token_len = std::max(v.max_token_len, tok.size());
      v.to_id[tok] = static_cast<int32_t>(id);
      v.text[id] = std::move(tok);
    }
    for (const Added& a : added) {
      uint32_t at = a.special ? kAttrControl : kAttrUserDefined;
      if (a.lstrip) at |= kAttrLstrip;
      if (a.rstrip) at |= kAttrRstrip;
      if (a.normalized) at |= kAttrNormalized;
      v.attr[a.id] = at;
      (a.normalized ? v.hf_added_normalized : v.hf_added_plain).push_back(a.id);
    }
    for (int stage = 0; stage < 2; ++stage) {
      std::vector<std::string_view> needles;
      for (int32_t id : stage == 0 ? v.hf_added_plain : v.hf_added_normalized) needles.push_back(v.text[id]);
      (stage == 0 ? v.hf_plain_finder : v.hf_normalized_finder).build(needles);
    }

    const json& merges = model.at("merges");
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      std::string left, right;
      if (m.is_string()) {  // "left right"
        const std::string s = m.get<std::string>();
        const size_t cut = s.find(' ', 1);
        TESSERA_CHECK(cut != std::string::npos, "tokenizer: ", where(path, "model.merges"), "[", i, "] '", s,
                      "' is not a pair");
        left = s.substr(0, cut), right = s.substr(cut + 1);
      } else {
        TESSERA_CHECK(m.is_array() && m.size() == 2, "tokenizer: ", where(path, "model.merges"), "[", i,
                      "] is neither \"a b\" nor [a, b]");
        left = m[0].get<std::string>(), right = m[1].get<std::string>();
      }
      TESSERA_CHECK(v.to_id.count(left + right), "tokenizer: ", where(path, "model.merges"), "[", i, "] makes '",
                    left + right, "', which is not in the vocabulary");
      v.merge_rank.emplace(Impl::merge_key(left, right), static_cast<int32_t>(i));
    }
    v.index_merges_by_id();
    if (model.contains("unk_token") && model["unk_token"].is_string())
      v.unk = v.find(model["unk_token"].get<std::string>());

    parse_pre_tokenizer(root.value("pre_tokenizer", json()), path, v.hf_steps);
    if (const json& dec = root.value("decoder", json()); !dec.is_null())
      TESSERA_CHECK(dec.value("type", "") == "ByteLevel", "tokenizer: ", where(path, "decoder"), " type '",
                    dec.value("type", ""), "' is not supported (ByteLevel is)");

    // BOS/EOS: TemplateProcessing's single-sequence template, then tokenizer_config.json.
    if (const json& post = root.value("post_processor", json()); !post.is_null()) {
      const std::string type = post.value("type", "");
      std::vector<const json*> templates;
      if (type == "TemplateProcessing") templates.push_back(&post);
      if (type == "Sequence") {
        for (const json& p : post.at("processors")) {
          if (p.value("type", "") == "TemplateProcessing") {
            templates.push_back(&p);
          } else if (p.value("type", "") != "ByteLevel") {
            fail("tokenizer: ", where(path, "post_processor"), " type '", p.value("type", ""), "' is not supported");
          }
        }
      }
      if (type != "TemplateProcessing" && type != "Sequence" && type != "ByteLevel")
        fail("tokenizer: ", where(path, "post_processor"), " type '", type, "' is not supported");
      for (const json* t : templates) {
        bool after = false;
        for (const json& item : t->at("single")) {
          if (item.contains("Sequence")) {
            after = true;
            continue;
          }
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          const json& ids = t->at("special_tokens").at(name).at("ids");
          for (const json& id : ids) (after ? v.hf_suffix : v.hf_prefix).push_back(id.get<int32_t>());
        }
      }
    }
    const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
    json config = fs::exists(config_path) ? read_json(config_path) : json::object();
    const auto token_of = [&](const char* key) -> int32_t {
      if (!config.contains(key) || config[key].is_null()) return -1;
      const json& t = config[key];
      const std::string s = t.is_string() ? t.get<std::string>() : t.at("content").get<std::string>();
      const int32_t id = v.find(s);
      TESSERA_CHECK(id >= 0, "tokenizer: ", config_path.string(), ": ", key, " '", s, "' is not in the vocabulary");
      return id;
    };
    v.bos = token_of("bos_token");
    v.eos = token_of("eos_token");
    v.add_bos = !v.hf_prefix.empty() && v.hf_prefix.front() == v.bos;
    v.add_eos = !v.hf_suffix.empty() && v.hf_suffix.back() == v.eos;
    if (config.value("add_bos_token", false) && !v.add_bos) {
      TESSERA_CHECK(v.bos >= 0, "tokenizer: ", config_path.string(), ": add_bos_token without bos_token");
      v.hf_prefix.insert(v.hf_prefix.begin(), v.bos);
      v.add_bos = true;
    }
    if (config.value("add_eos_token", false) && !v.add_eos) {
      TESSERA_CHECK(v.eos >= 0, "tokenizer: ", config_path.string(), ": add_eos_token without eos_token");
      v.hf_suffix.push_back(v.eos);
      v.add_eos = true;
    }
    if (config.contains("chat_template")) {
      const json& ct = config["chat_template"];
      if (ct.is_string()) {
        v.chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const json& t : ct)
          if (t.value("name", "") == "default") v.chat_template = t.at("template").get<std::string>();
      }
    }
  } catch (const json::exception& e) {
    fail("tokenizer: ", path, ": unexpected structure: ", e.what());
  }
  if (v.eos >= 0) v.eog.insert(v.eos);
  for (size_t id = 0; id < v.text.size(); ++id)  // the same end-of-turn names llama.cpp knows
    for (std::string_view t : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>", "<|end|>", "<|eom_id|>"})
      if (v.text[id] == t && (v.attr[id] & kAttrControl)) v.eog.insert(static_cast<int32_t>(id));
  v.piece.resize(v.text.size());
  for (size_t id = 0; id < v.text.size(); ++id) v.piece[id] = v.piece_of(static_cast<int32_t>(id), true);
  for (size_t id = 0; id < v.text.size(); ++id)
    if (v.attr[id] & (kAttrControl | kAttrUserDefined)) v.special_order.push_back(static_cast<int32_t>(id));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace tessera
