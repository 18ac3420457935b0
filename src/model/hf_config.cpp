#include "model/hf_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "format/safetensors.h"

namespace tessera {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxConfigBytes = 16u << 20;
// Sizes and counts above this are corrupt; it keeps products of two of them inside int64.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();

// Reads fields of one JSON object; `where` is the field path prefix ("" or "rope_scaling.").
class Fields {
 public:
  Fields(const json& obj, std::string_view file, std::string where)
      : obj_(obj), file_(file), where_(std::move(where)) {}

  // nullptr when absent or null.
  const json* get(std::string_view key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void wrong(std::string_view key, const json& v, std::string_view expected) const {
    fail(file_, ": field '", where_, key, "' is ", v.type_name(), " (", v.dump(), "), expected ", expected);
  }
  [[noreturn]] void missing(std::string_view key) const { fail(file_, ": missing required field '", where_, key, "'"); }

  std::optional<int64_t> integer(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) wrong(key, *v, "an int64");
      return static_cast<int64_t>(v->get<uint64_t>());
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    wrong(key, *v, "an integer");
  }
  // A count or size: an integer in 1..kMaxDimension.
  std::optional<int64_t> positive(std::string_view key) const {
    const auto n = integer(key);
    if (n && (*n < 1 || *n > kMaxDimension))
      fail(file_, ": field '", where_, key, "' is ", *n, ", expected 1..", kMaxDimension);
    return n;
  }
  int64_t required_positive(std::string_view key) const {
    const auto n = positive(key);
    if (!n) missing(key);
    return *n;
  }
  std::optional<double> number(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong(key, *v, "a number");
    return v->get<double>();
  }
  // A finite number > 0.
  std::optional<double> positive_number(std::string_view key) const {
    const auto x = number(key);
    if (x && !(std::isfinite(*x) && *x > 0))
      fail(file_, ": field '", where_, key, "' is ", *x, ", expected a finite number > 0");
    return x;
  }
  std::optional<bool> boolean(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong(key, *v, "true or false");
    return v->get<bool>();
  }
  std::optional<std::string> string(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong(key, *v, "a string");
    return v->get<std::string>();
  }
  // An int or a list of ints, each a non-negative token id.
  std::vector<int64_t> token_ids(std::string_view key) const {
    const json* v = get(key);
    if (!v) return {};
    const auto check = [&](const json& x) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > static_cast<uint64_t>(kMaxDimension))
        wrong(key, *v, "a non-negative token id or a list of them");
      return static_cast<int64_t>(x.get<uint64_t>());
    };
    if (!v->is_array()) return {check(*v)};
    std::vector<int64_t> ids;
    for (const json& x : *v) ids.push_back(check(x));
    return ids;
  }

 private:
  const json& obj_;
  std::string_view file_;
  std::string where_;
};

HFRopeScaling parse_rope_scaling(const json& obj, std::string_view file, const std::string& where) {
  const Fields f(obj, file, where);
  HFRopeScaling s;
  if (auto t = f.string("rope_type"))
    s.type = *t;
  else if (auto t2 = f.string("type"))
    s.type = *t2;
  else
    f.missing("rope_type");
  s.factor = f.positive_number("factor").value_or(1.0);
  s.low_freq_factor = f.positive_number("low_freq_factor").value_or(s.low_freq_factor);
  s.high_freq_factor = f.positive_number("high_freq_factor").value_or(s.high_freq_factor);
  s.original_max_position_embeddings = f.positive("original_max_position_embeddings").value_or(0);
  s.attention_factor = f.positive_number("attention_factor").value_or(0);
  s.beta_fast = f.positive_number("beta_fast").value_or(s.beta_fast);
  s.beta_slow = f.positive_number("beta_slow").value_or(s.beta_slow);
  if (s.type == "longrope") {
    for (auto [key, out] : {std::pair{"short_factor", &s.short_factor}, std::pair{"long_factor", &s.long_factor}}) {
      const json* v = f.get(key);
      if (!v) f.missing(key);
      if (!v->is_array() || v->empty() || v->size() > 4096) f.wrong(key, *v, "a non-empty list of numbers");
      for (const json& x : *v) {
        if (!x.is_number() || !(x.get<double>() > 0)) f.wrong(key, *v, "a list of positive numbers");
        out->push_back(x.get<double>());
      }
    }
  }
  if (s.type == "yarn")
    for (std::string_view k : {"mscale", "mscale_all_dim"})  // DeepSeek's variant of the magnitude
      if (f.get(k)) fail(file, ": field '", where, k, "': YaRN with mscale is not supported");
  if (s.type == "llama3") {
    // transformers refuses llama3 scaling without these; so do we.
    for (std::string_view k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!f.get(k)) f.missing(k);
    if (!(s.high_freq_factor > s.low_freq_factor))
      fail(file, ": field '", where, "high_freq_factor' (", s.high_freq_factor,
           ") must be greater than 'low_freq_factor' (", s.low_freq_factor, ")");
  }
  return s;
}

}  // namespace

HFConfig parse_hf_config(std::string_view json_text, std::string_view name) {
  const json root = parse_model_json(json_text, name);
  if (!root.is_object()) fail(name, ": not a JSON object");
  const Fields f(root, name, "");
  HFConfig c;

  const json* archs = f.get("architectures");
  if (!archs) f.missing("architectures");
  if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    f.wrong("architectures", *archs, "a non-empty list of strings");
  c.architecture = (*archs)[0].get<std::string>();
  c.model_type = f.string("model_type").value_or("");

  c.hidden_size = f.required_positive("hidden_size");
  c.intermediate_size = f.required_positive("intermediate_size");
  c.num_hidden_layers = f.required_positive("num_hidden_layers");
  c.num_attention_heads = f.required_positive("num_attention_heads");
  c.vocab_size = f.required_positive("vocab_size");

  c.num_key_value_heads = f.positive("num_key_value_heads").value_or(c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(name, ": field 'num_key_value_heads' (", c.num_key_value_heads, ") does not divide 'num_attention_heads' (",
         c.num_attention_heads, ")");
  if (auto hd = f.positive("head_dim")) {
    c.head_dim = *hd;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail(name, ": no 'head_dim', and 'hidden_size' (", c.hidden_size,
           ") is not a multiple of 'num_attention_heads' (", c.num_attention_heads, ")");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  c.rms_norm_eps = f.positive_number("rms_norm_eps").value_or(c.rms_norm_eps);
  c.max_position_embeddings = f.positive("max_position_embeddings").value_or(c.max_position_embeddings);
  c.original_max_position_embeddings = f.positive("original_max_position_embeddings").value_or(0);
  c.partial_rotary_factor = f.positive_number("partial_rotary_factor").value_or(1.0);
  if (c.partial_rotary_factor > 1)
    fail(name, ": field 'partial_rotary_factor' (", c.partial_rotary_factor, ") is above 1");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings").value_or(false);
  c.bos_token_ids = f.token_ids("bos_token_id");
  c.eos_token_ids = f.token_ids("eos_token_id");
  c.sliding_window = f.positive("sliding_window").value_or(0);
  c.use_sliding_window = f.boolean("use_sliding_window").value_or(true);
  c.attention_bias = f.boolean("attention_bias").value_or(false);
  // Qwen2 has q/k/v biases by construction; its config has no flag for them.
  c.qkv_bias = c.attention_bias || c.model_type == "qwen2" || c.architecture == "Qwen2ForCausalLM";
  if (auto d = f.string("torch_dtype"))
    c.torch_dtype = *d;
  else
    c.torch_dtype = f.string("dtype").value_or("");

  c.num_experts = f.positive("num_local_experts").value_or(f.positive("num_experts").value_or(0));
  c.num_experts_per_tok = f.positive("num_experts_per_tok").value_or(0);
  c.moe_intermediate_size = f.positive("moe_intermediate_size").value_or(0);
  c.norm_topk_prob = f.boolean("norm_topk_prob").value_or(true);
  c.decoder_sparse_step = f.positive("decoder_sparse_step").value_or(1);
  if (const json* dense = f.get("mlp_only_layers"); dense && !dense->is_null()) {
    if (!dense->is_array()) f.wrong("mlp_only_layers", *dense, "a list of layer indices");
    c.has_mlp_only_layers = !dense->empty();
  }
  c.shared_expert_intermediate_size = f.positive("shared_expert_intermediate_size").value_or(0);
  if (c.num_experts > 0 && (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts))
    fail(name, ": field 'num_experts_per_tok' (", c.num_experts_per_tok, ") must be in [1, ", c.num_experts, "]");

  // Newer transformers nest rope_theta and the scaling in "rope_parameters".
  const json* rope_params = f.get("rope_parameters");
  if (rope_params && !rope_params->is_object()) f.wrong("rope_parameters", *rope_params, "an object");
  if (auto theta = f.positive_number("rope_theta")) {
    c.rope_theta = *theta;
  } else if (rope_params) {
    c.rope_theta = Fields(*rope_params, name, "rope_parameters.").positive_number("rope_theta").value_or(c.rope_theta);
  }
  if (const json* rs = f.get("rope_scaling")) {
    if (!rs->is_object()) f.wrong("rope_scaling", *rs, "an object or null");
    c.rope_scaling = parse_rope_scaling(*rs, name, "rope_scaling.");
  } else if (rope_params && rope_params->contains("rope_type") && (*rope_params)["rope_type"] != "default") {
    c.rope_scaling = parse_rope_scaling(*rope_params, name, "rope_parameters.");
  }
  return c;
}

HFConfig load_hf_config(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json").string();
  const MappedFile mapped(file);
  if (mapped.size() > kMaxConfigBytes)
    fail(file, ": ", mapped.size(), " bytes, over the limit of ", kMaxConfigBytes, " for a config");
  return parse_hf_config(std::string_view(reinterpret_cast<const char*>(mapped.data()), mapped.size()), file);
}

}  // namespace tessera
