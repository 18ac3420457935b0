// Tokenizer core: llama.cpp's vocabulary loading rules, special-token partition, BPE and SPM
// merges, pieces and decoding. The Hugging Face front end is in hf_json.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <queue>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tessera {

// ------------------------------------------------------------------------------------------
// Loading (llama.cpp's llama_vocab::impl::load, for the "gpt2" and "llama" models)

namespace {

uint32_t attr_from_gguf_type(int32_t type) {
  switch (type) {
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

std::string lowercase_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains_any(std::string_view s, std::initializer_list<std::string_view> parts) {
  for (auto p : parts)
    if (s.find(p) != std::string_view::npos) return true;
  return false;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // ▁

}  // namespace

std::string Tokenizer::Impl::merge_key(std::string_view left, std::string_view right) {
  std::string key;
  key.reserve(left.size() + right.size() + 1);
  key.append(left);
  key.push_back('\0');
  key.append(right);
  return key;
}

void Tokenizer::Impl::index_merges_by_id() {
  pair_merge.clear();
  pair_merge.reserve(merge_rank.size());
  for (const auto& [key, rank] : merge_rank) {
    const size_t cut = key.find('\0');
    const int32_t l = find(std::string_view(key).substr(0, cut)), r = find(std::string_view(key).substr(cut + 1));
    if (l < 0 || r < 0) continue;
    const int32_t merged = find(key.substr(0, cut) + key.substr(cut + 1));
    pair_merge[(static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r)] = {rank, merged};
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_spec(const VocabSpec& spec) {
  auto impl = std::make_unique<Impl>();
  Impl& v = *impl;
  const size_t n = spec.tokens.size();
  TESSERA_CHECK(n > 0, "tokenizer: the vocabulary has no tokens");
  TESSERA_CHECK(n < static_cast<size_t>(INT32_MAX), "tokenizer: ", n, " tokens is too many");
  TESSERA_CHECK(spec.scores.empty() || spec.scores.size() >= n, "tokenizer: ", spec.scores.size(), " scores for ", n,
                " tokens");
  TESSERA_CHECK(spec.token_types.empty() || spec.token_types.size() >= n, "tokenizer: ", spec.token_types.size(),
                " token types for ", n, " tokens");

  if (spec.model == "llama") {
    v.kind = Impl::Kind::LlamaSpm;
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_space_prefix = true, v.clean_spaces = false, v.add_bos = true, v.add_eos = false;
  } else if (spec.model == "gpt2") {
    v.kind = Impl::Kind::LlamaBpe;
    v.bos = 11, v.eos = 11, v.unk = -1;
    for (size_t i = 0; i < spec.merges.size(); ++i) {
      const std::string& m = spec.merges[i];
      const size_t cut = m.find(' ', 1);
      std::string_view left, right;  // a merge without a space pairs "" with "" (llama.cpp)
      if (cut != std::string::npos)
        left = std::string_view(m).substr(0, cut), right = std::string_view(m).substr(cut + 1);
      v.merge_rank.emplace(Impl::merge_key(left, right), static_cast<int32_t>(i));  // first one wins
    }
    const LlamaPreTokenizerInfo pre = llama_pre_tokenizer(spec.pre.empty() ? "default" : spec.pre);
    v.add_space_prefix = false;
    v.clean_spaces = pre.clean_spaces;
    v.ignore_merges = pre.ignore_merges;
    v.add_bos = pre.add_bos;
    v.splitter = std::make_unique<LlamaSplitter>(pre.regexes);
  } else {
    fail("tokenizer: unsupported tokenizer model '", spec.model,
         "' (tokenizer.ggml.model; tessera reads \"gpt2\" and \"llama\")");
  }
  if (spec.add_space_prefix) v.add_space_prefix = *spec.add_space_prefix;

  v.text.resize(n);
  v.score.assign(n, 0.0f);
  v.attr.assign(n, kAttrNormal);
  v.to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string word = spec.tokens[i];
    if (word.empty()) word = "[EMPTY_" + std::to_string(i) + "]";
    v.to_id[word] = static_cast<int32_t>(i);  // a repeated text maps to its last id
    v.max_token_len = std::max(v.max_token_len, word.size());
    v.text[i] = std::move(word);
    if (!spec.scores.empty()) v.score[i] = spec.scores[i];
    if (!spec.token_types.empty()) v.attr[i] = attr_from_gguf_type(spec.token_types[i]);
  }
  v.index_merges_by_id();

  // Special ids: a default outside the vocabulary is dropped. A file value outside it is an
  // error for the ids that steer prompts and stopping (bos, eos, eot, eom); for the optional
  // ones it is ignored with a warning, keeping the default (llama.cpp's behaviour).
  const std::pair<const char*, int32_t*> keyed[] = {
      {"bos", &v.bos},         {"eos", &v.eos},         {"eot", &v.eot},         {"eom", &v.eom},
      {"unknown", &v.unk},     {"seperator", &v.sep},   {"padding", &v.pad},     {"mask", &v.mask},
      {"fim_pre", &v.fim_pre}, {"fim_suf", &v.fim_suf}, {"fim_mid", &v.fim_mid}, {"fim_pad", &v.fim_pad},
      {"fim_rep", &v.fim_rep}, {"fim_sep", &v.fim_sep}, {"prefix", &v.fim_pre},  {"suffix", &v.fim_suf},
      {"middle", &v.fim_mid},
  };
  for (const auto& [key, id] : keyed) {
    if (*id >= 0 && static_cast<size_t>(*id) >= n) *id = -1;
    auto it = spec.special_ids.find(key);
    if (it == spec.special_ids.end()) continue;
    if (it->second >= 0 && static_cast<uint64_t>(it->second) < n) {
      *id = static_cast<int32_t>(it->second);
      continue;
    }
    const std::string_view k = key;
    const bool required = k == "bos" || k == "eos" || k == "eot" || k == "eom";
    TESSERA_CHECK(!required, "tokenizer: key 'tokenizer.ggml.", key, "_token_id' is ", it->second,
                  ", outside the vocabulary [0, ", n, ")");
    std::fprintf(stderr,
                 "tessera: warning: key 'tokenizer.ggml.%s_token_id' is %lld, outside the vocabulary [0, %zu); "
                 "using %d\n",
                 key, static_cast<long long>(it->second), n, *id);
  }
  if (spec.add_bos) v.add_bos = *spec.add_bos;
  if (spec.add_eos) v.add_eos = *spec.add_eos;
  v.chat_template = spec.chat_template;

  // Tokens recognised by their text. llama.cpp walks a hash map, so when several candidates
  // exist the one it picks is unspecified; tessera walks ids in increasing order.
  std::vector<int32_t> ids_by_text;  // ids that own their text (the last of repeated texts)
  for (size_t i = 0; i < n; ++i)
    if (v.to_id[v.text[i]] == static_cast<int32_t>(i)) ids_by_text.push_back(static_cast<int32_t>(i));
  const auto mark_control = [&](int32_t id) { v.attr[id] |= kAttrControl; };
  const auto detect = [&](int32_t& slot, std::initializer_list<std::string_view> names) {
    for (int32_t id : ids_by_text) {
      if (slot >= 0) return;
      if (std::find(names.begin(), names.end(), v.text[id]) != names.end()) {
        slot = id;
        mark_control(id);
      }
    }
  };
  detect(v.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
                 "_<EOT>", "[EOT]",
                 "<\xEF\xBD\x9C"
                 "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                 "<end_of_utterance>"});
  detect(v.eom, {"<|eom_id|>"});
  detect(v.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                     "<\xEF\xBD\x9C"
                     "fim\xE2\x96\x81"
                     "begin\xEF\xBD\x9C>",
                     "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(v.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                     "<\xEF\xBD\x9C"
                     "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
                     "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(v.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                     "<\xEF\xBD\x9C"
                     "fim\xE2\x96\x81"
                     "end\xEF\xBD\x9C>",
                     "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  detect(v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(v.fim_sep, {"<|file_sep|>"});

  for (int32_t id : ids_by_text)  // control tokens named "unused..." are unused
    if ((v.attr[id] & kAttrControl) && v.text[id].find("unused") != std::string::npos) v.attr[id] |= kAttrUnused;

  for (int32_t id : {v.fim_pad, v.fim_rep, v.fim_sep})
    if (id >= 0) v.eog.insert(id);
  static const std::string_view kEogTexts[] = {"<|eot_id|>",
                                               "<|im_end|>",
                                               "<|end|>",
                                               "<|return|>",
                                               "<|call|>",
                                               "<|flush|>",
                                               "<|calls|>",
                                               "<end_of_turn>",
                                               "<|endoftext|>",
                                               "</s>",
                                               "<|eom_id|>",
                                               "<EOT>",
                                               "_<EOT>",
                                               "[EOT]",
                                               "[EOS]",
                                               "<|end_of_text|>",
                                               "<end_of_utterance>",
                                               "<eos>",
                                               "<turn|>",
                                               "<|tool_response>",
                                               "<\xEF\xBD\x9C"
                                               "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                               "[e~["};
  for (int32_t id : ids_by_text) {
    if (std::find(std::begin(kEogTexts), std::end(kEogTexts), v.text[id]) != std::end(kEogTexts)) {
      v.eog.insert(id);
      mark_control(id);
    }
  }
  for (int32_t id : ids_by_text) {  // gpt-oss: always rendered
    const auto& t = v.text[id];
    if (t == "<|channel|>" || t == "<|message|>" || t == "<|start|>" || t == "<|constrain|>")
      v.attr[id] = kAttrUserDefined;
  }
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id >= 0) v.eog.insert(id);
  {  // o200k_harmony / solar-open: "<|end|>" is not an end of generation there
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = -1;
    for (int32_t id : v.eog) {
      const auto& t = v.text[id];
      if (t == "<|return|>")
        has_return = true;
      else if (t == "<|call|>" || t == "<|calls|>")
        has_call = true;
      else if (t == "<|flush|>")
        has_flush = true;
      else if (t == "<|end|>")
        end_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
      v.eog.erase(end_id);
      v.attr[end_id] = kAttrUserDefined;
    }
  }
  {  // gemma4 / plamo: "</s>" is a normal token there
    bool has_marker = false;
    int32_t s_id = -1;
    for (int32_t id : v.eog) {
      const auto& t = v.text[id];
      if (t == "<|tool_response>" || t == "<|plamo:eos|>")
        has_marker = true;
      else if (t == "</s>")
        s_id = id;
    }
    if (has_marker && s_id >= 0) {
      v.eog.erase(s_id);
      v.attr[s_id] = kAttrNormal;
    }
  }

  v.finish_special_tokens();

  // Attributes llama.cpp sets by model name, after its caches are built.
  const std::string name = lowercase_ascii(spec.model_name);
  const auto set_attr = [&](std::string_view t, uint32_t bit, bool on) {
    const int32_t id = v.find(t);
    if (id >= 0) v.attr[id] = on ? (v.attr[id] | bit) : (v.attr[id] & ~bit);
  };
  if (contains_any(spec.pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains_any(spec.architecture, {"nomic-bert-moe", "jina-bert-v3"})) {
    set_attr("<mask>", kAttrLstrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (int32_t id : v.special_order) v.attr[id] |= kAttrRstrip;
    set_attr("</s>", kAttrRstrip, true);
    for (auto t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(t, kAttrRstrip, false);
  } else if (contains_any(name, {"modern-bert"})) {
    set_attr("[MASK]", kAttrLstrip, true);
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

void Tokenizer::Impl::finish_special_tokens() {
  special_order.clear();
  for (size_t id = 0; id < text.size(); ++id)
    if (attr[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) special_order.push_back(static_cast<int32_t>(id));
  // Same algorithm, comparator and input order as llama.cpp, so ties come out the same.
  std::sort(special_order.begin(), special_order.end(),
            [&](int32_t a, int32_t b) { return text[a].size() > text[b].size(); });
  std::vector<std::string_view> needles;
  for (int32_t id : special_order) needles.push_back(text[id]);
  special_finder.build(needles);
  piece.resize(text.size());
  for (size_t id = 0; id < text.size(); ++id) piece[id] = piece_of(static_cast<int32_t>(id), true);
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GGUFFile& file) {
  validate_tokenizer_metadata(file);  // array lengths and special ids, naming the key
  VocabSpec spec;
  const auto str = [&](const char* key) { return std::string(file.get_string(key).value_or("")); };
  auto model = file.get_string("tokenizer.ggml.model");
  TESSERA_CHECK(model.has_value(), file.name(), ": missing key 'tokenizer.ggml.model'");
  spec.model = std::string(*model);
  spec.pre = str("tokenizer.ggml.pre");
  for (auto t : file.get_string_array("tokenizer.ggml.tokens")) spec.tokens.emplace_back(t);
  if (const GGUFValue* s = file.find("tokenizer.ggml.scores")) {
    TESSERA_CHECK(s->type == GGUFType::ARRAY && (s->elem_type == GGUFType::F32 || s->elem_type == GGUFType::I32),
                  file.name(), ": key 'tokenizer.ggml.scores' must be an array of f32 or i32");
    if (s->elem_type == GGUFType::F32)
      for (double d : s->floats) spec.scores.push_back(static_cast<float>(d));
    else
      for (int64_t i : s->ints) spec.scores.push_back(static_cast<float>(i));
    TESSERA_CHECK(spec.scores.size() >= spec.tokens.size(), file.name(), ": 'tokenizer.ggml.scores' has ",
                  spec.scores.size(), " entries for ", spec.tokens.size(), " tokens");
  }
  if (const GGUFValue* t = file.find("tokenizer.ggml.token_type")) {
    TESSERA_CHECK(t->type == GGUFType::ARRAY && t->elem_type == GGUFType::I32, file.name(),
                  ": key 'tokenizer.ggml.token_type' must be an array of i32");
    for (int64_t i : t->ints) spec.token_types.push_back(static_cast<int32_t>(i));
    TESSERA_CHECK(spec.token_types.size() >= spec.tokens.size(), file.name(), ": 'tokenizer.ggml.token_type' has ",
                  spec.token_types.size(), " entries for ", spec.tokens.size(), " tokens");
  }
  if (spec.model == "gpt2") {
    TESSERA_CHECK(file.has("tokenizer.ggml.merges"), file.name(), ": missing key 'tokenizer.ggml.merges'");
    for (auto m : file.get_string_array("tokenizer.ggml.merges")) spec.merges.emplace_back(m);
  }
  for (const char* key : {"bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "fim_pre", "fim_suf",
                          "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle"}) {
    const std::string full = std::string("tokenizer.ggml.") + key + "_token_id";
    if (auto id = file.get_int(full)) spec.special_ids[key] = *id;
  }
  spec.add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
  spec.add_eos = file.get_bool("tokenizer.ggml.add_eos_token");
  spec.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
  spec.chat_template = str("tokenizer.chat_template");
  spec.model_name = str("general.name");
  spec.architecture = str("general.architecture");
  return from_spec(spec);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

// ------------------------------------------------------------------------------------------
// Pieces

std::string Tokenizer::Impl::piece_of(int32_t id, bool special) const {
  const uint32_t a = attr[id];
  if (!special && (a & (kAttrUnknown | kAttrControl))) return {};
  const std::string& t = text[id];
  if (kind != Kind::HfBpe && (a & (kAttrUnknown | kAttrControl | kAttrUserDefined))) return t;
  if ((a & kAttrNormal) || kind == Kind::HfBpe) {
    if (kind == Kind::LlamaSpm) {
      std::string out = t;
      replace_all(out, kSpmSpace, " ");
      return out;
    }
    std::string out;
    const std::vector<uint32_t> cps = decode_utf8_lenient(t);
    if (kind == Kind::HfBpe) {  // HF ByteLevel decoder: all chars map to bytes, or the text stays
      for (uint32_t cp : cps) {
        const int b = unicode_to_byte(cp);
        if (b < 0) return t;
        out.push_back(static_cast<char>(b));
      }
      return out;
    }
    for (uint32_t cp : cps) {
      const int b = unicode_to_byte(cp);
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
        continue;
      }
      std::string utf8;
      append_utf8(utf8, cp);
      out += "[UNK_BYTE_0x";
      static const char* hex = "0123456789abcdef";
      for (unsigned char c : utf8) out += hex[c >> 4], out += hex[c & 15];
      out += t + "]";
    }
    return out;
  }
  if (a & kAttrByte) {  // <0xXX>
    TESSERA_CHECK(t.size() >= 5, "tokenizer: byte token ", id, " has text '", t, "'");
    return std::string(1, static_cast<char>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16)));
  }
  return {};
}

// ------------------------------------------------------------------------------------------
// Special-token partition (llama.cpp's tokenizer_st_partition)

std::vector<Fragment> Tokenizer::Impl::partition_llama(std::string_view input, const SpecialPolicy& policy) const {
  std::vector<Fragment> frags;
  if (input.empty()) return frags;
  frags.push_back({-1, 0, input.size()});
  // Only tokens that occur at all need a pass; the passes keep llama.cpp's order (longest
  // first), where a longer token claims its text before any shorter one is looked for.
  const std::vector<bool> present = special_finder.present(input);
  for (size_t k = 0; k < special_order.size(); ++k) {
    if (!present[k]) continue;
    const int32_t id = special_order[k];
    const uint32_t a = attr[id];
    const bool gated = (a & (kAttrControl | kAttrUnknown)) != 0;  // only where the policy allows
    if (gated && !policy.parse_special) continue;
    const std::string& tok = text[id];
    std::vector<Fragment> next;
    next.reserve(frags.size() + 2);
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t off = f.offset, len = f.length;
      size_t from = off;  // where to look next; past spellings the policy refuses
      while (true) {
        const size_t m = input.substr(0, off + len).find(tok, from);
        if (m != std::string_view::npos && gated && !policy.allows(m, m + tok.size())) {
          from = m + 1;
          continue;
        }
        if (m == std::string_view::npos) {
          if (len > 0) next.push_back({-1, off, len});
          break;
        }
        if (m > off) {
          size_t left = m - off;
          if (a & kAttrLstrip)
            while (left > 0 && std::isspace(static_cast<unsigned char>(input[off + left - 1]))) --left;
          if (left > 0) next.push_back({-1, off, left});
        }
        next.push_back({id, 0, 0});
        if (m + tok.size() >= off + len) break;
        size_t r_off = m + tok.size(), r_len = len - ((m - off) + tok.size());
        if (a & kAttrRstrip)
          while (r_len > 0 && std::isspace(static_cast<unsigned char>(input[r_off]))) ++r_off, --r_len;
        off = r_off, len = r_len, from = r_off;
      }
    }
    frags = std::move(next);
  }
  return frags;
}

// ------------------------------------------------------------------------------------------
// BPE merges (one pre-tokenized, byte-encoded word)

namespace {
struct Symbol {
  int32_t prev, next;
  uint32_t start, n;  // bytes of the word
  int32_t id;         // token whose text the symbol spells, or -1
};

uint64_t pair_key(int32_t l, int32_t r) { return (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r); }

// The merge loop BPE and SentencePiece share: queue every adjacent pair (try_add decides
// whether it can merge and pushes it), then repeatedly merge the best pair, skipping stale
// entries (one side merged away or grown since it was queued) and queueing the new neighbours.
template <typename Queue, typename TryAdd>
void merge_symbols(std::vector<Symbol>& sym, Queue& queue, const TryAdd& try_add) {
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const auto b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    l.id = b.merged;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
}
}  // namespace

void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    const int32_t id = find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t off = 0; off < word.size();) {
    const size_t len = std::min(word.size() - off, utf8_len_from_lead(static_cast<uint8_t>(word[off])));
    const int32_t idx = static_cast<int32_t>(sym.size());
    sym.push_back({idx - 1, off + len == word.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                   static_cast<uint32_t>(len), find(word.substr(off, len))});
    off += len;
  }
  struct Bigram {  // 20 bytes: the queue of a megabyte word is memory-bound
    int32_t rank, left, right;
    uint32_t size;
    int32_t merged;  // id of the merged text, -1 if it is none
  };
  // Lowest rank first; among equal ranks the leftmost (llama.cpp's comparator).
  const auto later = [](const Bigram& l, const Bigram& r) {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(later)> queue(later);
  std::string key;
  const auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    if (sym[l].id >= 0 && sym[r].id >= 0) {  // both sides are tokens: the id-keyed table decides
      auto it = pair_merge.find(pair_key(sym[l].id, sym[r].id));
      if (it != pair_merge.end())
        queue.push({it->second.rank, l, r, static_cast<uint32_t>(sym[l].n + sym[r].n), it->second.merged});
      return;
    }
    key.assign(word.substr(sym[l].start, sym[l].n));
    key.push_back('\0');
    key.append(word.substr(sym[r].start, sym[r].n));
    auto it = merge_rank.find(key);
    if (it == merge_rank.end()) return;
    queue.push({it->second, l, r, static_cast<uint32_t>(sym[l].n + sym[r].n),
                find(word.substr(sym[l].start, sym[l].n + sym[r].n))});
  };
  merge_symbols(sym, queue, try_add);
  for (int32_t i = 0; i != -1; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out.push_back(sym[i].id);
      continue;
    }
    const std::string_view s = word.substr(sym[i].start, sym[i].n);
    if (kind == Kind::HfBpe && hf_byte_fallback) {
      // Not reached for byte-level vocabularies, which hold every byte character.
      for (unsigned char c : s) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", c);
        const int32_t b = find(buf);
        if (b >= 0) out.push_back(b);
      }
      continue;
    }
    for (char c : s) {  // llama.cpp looks the single bytes of the encoded text up
      const int32_t b = find(std::string_view(&c, 1));
      if (b >= 0)
        out.push_back(b);
      else if (kind == Kind::HfBpe && unk >= 0)
        out.push_back(unk);
    }
  }
}

// ------------------------------------------------------------------------------------------
// SentencePiece merges (llama.cpp's llm_tokenizer_spm_session; `text` has ▁ for spaces)

void Tokenizer::Impl::spm_fragment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(text.size() - off, utf8_len_from_lead(static_cast<uint8_t>(text[off])));
    const int32_t idx = static_cast<int32_t>(sym.size());
    sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                   static_cast<uint32_t>(len), find(text.substr(off, len))});
    off += len;
  }
  // Long texts repeat the same pairs: remember what each pair of tokens merges into.
  std::unordered_map<uint64_t, int32_t> pair_memo;
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;
    int32_t merged;
  };
  // Highest score first; among equal scores the leftmost.
  const auto lower = [](const Bigram& l, const Bigram& r) {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
  const auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const size_t size = sym[l].n + sym[r].n;
    if (size > max_token_len) return;  // no token is that long
    int32_t id;
    if (sym[l].id >= 0 && sym[r].id >= 0) {
      auto [it, fresh] = pair_memo.try_emplace(pair_key(sym[l].id, sym[r].id), -1);
      if (fresh) it->second = find(text.substr(sym[l].start, size));  // the pair is contiguous
      id = it->second;
    } else {
      id = find(text.substr(sym[l].start, size));
    }
    if (id < 0) return;
    queue.push({score[id], l, r, static_cast<uint32_t>(size), id});
  };
  merge_symbols(sym, queue, try_add);
  for (int32_t i = 0; i != -1; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out.push_back(sym[i].id);
      continue;
    }
    const std::string_view s = text.substr(sym[i].start, sym[i].n);
    // Every merged symbol is a token, so only single characters get here: byte fallback.
    for (unsigned char c : s) {
      static const char* hex = "0123456789ABCDEF";
      const char buf[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
      int32_t b = find(std::string_view(buf, 6));
      if (b < 0) b = find(std::string_view(reinterpret_cast<const char*>(&c), 1));
      TESSERA_CHECK(b >= 0, "tokenizer: the vocabulary has no token for byte 0x", hex[c >> 4], hex[c & 15]);
      out.push_back(b);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Public API

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special, bool parse_special) const {
  SpecialPolicy policy;
  policy.parse_special = parse_special;
  return impl_->encode_impl(input, add_special, policy);
}

std::vector<int32_t> Tokenizer::encode_with_special_spans(
    std::string_view input, bool add_special, std::span<const std::pair<size_t, size_t>> special_spans) const {
  for (size_t i = 0; i < special_spans.size(); ++i) {
    const auto& [b, e] = special_spans[i];
    TESSERA_CHECK(b <= e && e <= input.size() && (i == 0 || special_spans[i - 1].second <= b),
                  "tokenizer: special span ", i, " [", b, ", ", e, ") is out of order or past the text's ",
                  input.size(), " bytes");
  }
  SpecialPolicy policy;
  policy.parse_special = true;
  policy.gated = true;
  policy.spans = special_spans;
  return impl_->encode_impl(input, add_special, policy);
}

std::vector<int32_t> Tokenizer::Impl::encode_impl(std::string_view input, bool add_special,
                                                  const SpecialPolicy& policy) const {
  const Impl& v = *this;
  // Symbol offsets are 32-bit; a prompt of 4 GiB is a caller bug, not a tokenizer input.
  TESSERA_CHECK(input.size() < (size_t{1} << 32) - 8, "tokenizer: input of ", input.size(), " bytes is too long");
  if (v.kind == Impl::Kind::HfBpe) return v.encode_hf(input, add_special, policy);
  std::vector<int32_t> out;
  const std::vector<Fragment> frags = v.partition_llama(input, policy);
  if (add_special && v.add_bos) {
    TESSERA_CHECK(v.bos >= 0, "tokenizer: add_bos_token is set but the vocabulary has no BOS token");
    out.push_back(v.bos);
  }
  if (v.kind == Impl::Kind::LlamaSpm) {
    bool prev_special = true;  // the text start counts as "after a special token"
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      std::string t = (v.add_space_prefix && prev_special) ? " " : "";
      t.append(input.substr(f.offset, f.length));
      replace_all(t, " ", kSpmSpace);
      v.spm_fragment(t, out);
      prev_special = false;
    }
  } else {
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      for (const std::string& word : v.splitter->split(input.substr(f.offset, f.length), true)) v.bpe_word(word, out);
    }
  }
  if (add_special && v.add_eos) {
    TESSERA_CHECK(v.eos >= 0, "tokenizer: add_eos_token is set but the vocabulary has no EOS token");
    out.push_back(v.eos);
  }
  return out;
}

// llama.cpp's clean_up_tokenization_spaces, three passes over the bytes.
void clean_up_spaces(std::string& s) {
  size_t total = s.size();
  char* text = s.data();
  const size_t total1 = total;  // " ?", " !", " .", " ," lose the space
  total = total ? 1 : 0;
  for (size_t i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    text[total++] = x;
  }
  const size_t total2 = total;  // " ' " loses both spaces
  total = total ? 1 : 0;
  for (size_t i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --total;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  const size_t total3 = total;  // " 's", " 'm", " 're", " 've" lose the space
  total = total ? 1 : 0;
  for (size_t i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[total++] = x;
  }
  s.resize(total);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& v = *impl_;
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    TESSERA_CHECK(v.valid(id), "tokenizer: token id ", id, " is outside the vocabulary [0, ", v.text.size(), ")");
    std::string_view p = v.piece[id];
    const uint32_t a = v.attr[id];
    if (skip_special && (a & (kAttrUnknown | kAttrControl))) p = {};
    if (first && v.add_space_prefix && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    first = false;
    out.append(p);
  }
  if (v.clean_spaces) clean_up_spaces(out);
  return out;
}

std::string_view Tokenizer::token_piece(int32_t id) const {
  TESSERA_CHECK(impl_->valid(id), "tokenizer: token id ", id, " is outside the vocabulary [0, ", impl_->text.size(),
                ")");
  return impl_->piece[id];
}

std::string_view Tokenizer::token_text(int32_t id) const {
  TESSERA_CHECK(impl_->valid(id), "tokenizer: token id ", id, " is outside the vocabulary [0, ", impl_->text.size(),
                ")");
  return impl_->text[id];
}

uint32_t Tokenizer::token_attr(int32_t id) const {
  TESSERA_CHECK(impl_->valid(id), "tokenizer: token id ", id, " is outside the vocabulary [0, ", impl_->text.size(),
                ")");
  return impl_->attr[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->text.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
bool Tokenizer::add_space_prefix() const { return impl_->add_space_prefix; }
bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && impl_->eog.count(id) > 0; }
bool Tokenizer::is_special(int32_t id) const {
  return impl_->valid(id) && (impl_->attr[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown));
}
bool Tokenizer::is_control(int32_t id) const { return impl_->valid(id) && (impl_->attr[id] & kAttrControl); }
std::optional<int32_t> Tokenizer::token_id(std::string_view piece) const {
  const int32_t id = impl_->find(piece);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}
std::string_view Tokenizer::chat_template() const { return impl_->chat_template; }
bool Tokenizer::is_spm() const { return impl_->kind == Impl::Kind::LlamaSpm; }
bool Tokenizer::clean_spaces() const { return impl_->clean_spaces; }

}  // namespace tessera
