#include "model/quant_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "format/safetensors.h"

namespace tessera {

namespace {

using json = nlohmann::json;

// Field access on one object; errors name the file and the field path.
struct QFields {
  const json& obj;
  std::string_view file;
  std::string where;  // "quantization_config." or deeper

  const json* get(std::string_view key) const {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(std::string_view key, const json& v, std::string_view why) const {
    fail(file, ": field '", where, key, "' = ", v.dump(), ": ", why);
  }
  int64_t integer(std::string_view key, int64_t dflt) const {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_number_integer()) bad(key, *v, "expected an integer");
    return v->get<int64_t>();
  }
  bool boolean(std::string_view key, bool dflt) const {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_boolean()) bad(key, *v, "expected true or false");
    return v->get<bool>();
  }
  std::string string(std::string_view key, std::string dflt) const {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_string()) bad(key, *v, "expected a string");
    return v->get<std::string>();
  }
};

void check_bits(const QFields& f, std::string_view key, int64_t bits) {
  if (bits != 4 && bits != 8) f.bad(key, json(bits), "only 4- and 8-bit integer weights are supported");
}

int64_t check_group(const QFields& f, std::string_view key, int64_t g) {
  if (g == -1 || g == 0) return -1;  // one group per output row
  if (g < 32 || g % 32 != 0)
    f.bad(key, json(g), "group sizes must be -1 (per channel) or a multiple of 32 (32, 64, 128, ...)");
  return g;
}

WeightQuantConfig parse_gptq(const QFields& f) {
  WeightQuantConfig c;
  c.method = WeightQuantMethod::Gptq;
  c.bits = static_cast<int>(f.integer("bits", 4));
  check_bits(f, "bits", c.bits);
  c.group_size = check_group(f, "group_size", f.integer("group_size", 128));
  c.symmetric = f.boolean("sym", true);
  c.act_order = f.boolean("desc_act", false);
  const std::string fmt = f.string("checkpoint_format", "gptq");
  if (fmt == "gptq_v2")
    c.gptq_v2 = true;
  else if (fmt != "gptq")
    f.bad("checkpoint_format", json(fmt), "supported: \"gptq\" (qzeros stored minus one) and \"gptq_v2\"");
  if (f.boolean("is_marlin_format", false))
    f.bad("is_marlin_format", json(true), "Marlin-packed GPTQ checkpoints are not supported");
  if (const json* d = f.get("dynamic"); d && !(d->is_object() && d->empty()))
    f.bad("dynamic", *d, "per-module overrides are not supported");
  return c;
}

WeightQuantConfig parse_awq(const QFields& f) {
  WeightQuantConfig c;
  c.method = WeightQuantMethod::Awq;
  c.bits = static_cast<int>(f.integer("bits", f.integer("w_bit", 4)));
  if (c.bits != 4) f.bad("bits", json(c.bits), "AWQ checkpoints are loaded with 4-bit weights only");
  c.group_size = check_group(f, "group_size", f.integer("group_size", f.integer("q_group_size", 128)));
  c.symmetric = !f.boolean("zero_point", true);
  std::string version = f.string("version", "gemm");
  for (char& ch : version) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (version != "gemm")
    f.bad("version", json(version), "only the GEMM packing is supported (not GEMV, GEMV_fast, Marlin or ExLlama)");
  return c;
}

// FP8 checkpoints as vLLM's Fp8Config reads them (AutoFP8, transformers' FP8 configs).
WeightQuantConfig parse_fp8(const QFields& f) {
  WeightQuantConfig c;
  c.method = WeightQuantMethod::Fp8;
  c.bits = 8;
  c.group_size = -1;
  c.fp8 = true;
  const std::string scheme = f.string("activation_scheme", "dynamic");
  if (scheme == "static")
    c.static_input_scale = true;
  else if (scheme != "dynamic")
    f.bad("activation_scheme", json(scheme), "supported: \"static\" and \"dynamic\"");
  if (const json* b = f.get("weight_block_size"))
    f.bad("weight_block_size", *b,
          "block-wise FP8 scales (one per tile, DeepSeek-V3 / Qwen3-FP8 style) are not supported: tessera's "
          "FP8 weights keep one scale per output row, which cannot hold them without re-quantizing the weights");
  const std::string fmt = f.string("fmt", "e4m3");
  if (fmt != "e4m3") f.bad("fmt", json(fmt), "only E4M3 weights are supported");
  for (const char* key : {"ignored_layers", "modules_to_not_convert"}) {
    const json* l = f.get(key);
    if (!l) continue;
    bool ok = l->is_array();
    for (const json& e : ok ? *l : json::array()) ok = ok && e.is_string();
    if (!ok) f.bad(key, *l, "expected a list of layer names");
  }
  return c;
}

// compressed-tensors float-quantized: FP8 E4M3 weights with a scale per tensor or per output
// row; activations dynamic (any strategy: FP8W quantizes per token) or static per tensor.
void parse_ct_fp8(const QFields& w, const json* inputs, const std::string& inputs_where, WeightQuantConfig& c) {
  c.bits = 8;
  c.group_size = -1;
  c.fp8 = true;
  const std::string type = w.string("type", "float");
  if (type != "float") w.bad("type", json(type), "float-quantized holds float weights");
  if (const int64_t bits = w.integer("num_bits", 8); bits != 8)
    w.bad("num_bits", json(bits), "only 8-bit (E4M3) float weights are supported (FP4 is not)");
  if (!w.boolean("symmetric", true)) w.bad("symmetric", json(false), "FP8 weights are symmetric");
  if (w.boolean("dynamic", false)) w.bad("dynamic", json(true), "dynamic weight quantization is not supported");
  const std::string strategy = w.string("strategy", "");
  if (strategy == "tensor")
    c.fp8_scales = Fp8ScaleStrategy::Tensor;
  else if (strategy == "channel")
    c.fp8_scales = Fp8ScaleStrategy::Channel;
  else
    w.bad("strategy", json(strategy),
          "supported for FP8: \"tensor\" and \"channel\" (block and group scales cannot be held by one scale "
          "per output row)");
  if (const json* b = w.get("block_structure")) w.bad("block_structure", *b, "block-wise scales are not supported");
  if (!inputs) return;  // weight-only FP8
  if (!inputs->is_object())
    fail(w.file, ": field '", inputs_where.substr(0, inputs_where.size() - 1), "' is not an object");
  const QFields a{*inputs, w.file, inputs_where};
  const std::string atype = a.string("type", "float");
  if (atype != "float") a.bad("type", json(atype), "FP8 weights are loaded with float activations only");
  if (const int64_t bits = a.integer("num_bits", 8); bits != 8) a.bad("num_bits", json(bits), "expected 8");
  const std::string astrategy = a.string("strategy", "");
  if (a.boolean("dynamic", false)) {
    if (astrategy != "token" && astrategy != "tensor")
      a.bad("strategy", json(astrategy), "supported for dynamic FP8 activations: \"token\" and \"tensor\"");
  } else {
    if (astrategy != "tensor")
      a.bad("strategy", json(astrategy), "supported for static FP8 activations: \"tensor\" (one input_scale)");
    c.static_input_scale = true;
  }
}

// The KV-cache scheme compressed-tensors records beside the weights: the per-layer scalar
// k_scale / v_scale that load_safetensors_weights reads (used by an fp8 :tensor KV cache).
void check_kv_cache_scheme(const QFields& k) {
  if (!k.obj.is_object()) fail(k.file, ": field '", k.where.substr(0, k.where.size() - 1), "' is not an object");
  const std::string type = k.string("type", "float");
  if (type != "float") k.bad("type", json(type), "only an FP8 KV cache scheme is supported");
  if (const int64_t bits = k.integer("num_bits", 8); bits != 8) k.bad("num_bits", json(bits), "expected 8");
  const std::string strategy = k.string("strategy", "tensor");
  if (strategy != "tensor")
    k.bad("strategy", json(strategy), "only \"tensor\" (one k_scale / v_scale per layer) is supported");
  if (k.boolean("dynamic", false)) k.bad("dynamic", json(true), "only static KV scales are supported");
}

WeightQuantConfig parse_compressed_tensors(const QFields& f) {
  WeightQuantConfig c;
  c.method = WeightQuantMethod::CompressedTensors;
  const std::string global_format = f.string("format", "");
  if (const json* t = f.get("transform_config")) f.bad("transform_config", *t, "weight transforms are not supported");
  if (const json* sp = f.get("sparsity_config")) {
    const QFields s{*sp, f.file, f.where + "sparsity_config."};
    const std::string sf = sp->is_object() ? s.string("format", "dense") : "";
    if (sf != "dense") f.bad("sparsity_config", *sp, "sparse checkpoints are not supported");
  }
  const json* groups = f.get("config_groups");
  if (!groups || !groups->is_object() || groups->empty())
    fail(f.file, ": field '", f.where, "config_groups' is missing or empty");
  if (const json* kv = f.get("kv_cache_scheme"))
    check_kv_cache_scheme(QFields{*kv, f.file, f.where + "kv_cache_scheme."});
  const json* first_weights = nullptr;
  const json* first_inputs = nullptr;
  std::string format;  // the same in every group
  for (const auto& [name, g] : groups->items()) {
    const std::string where = f.where + "config_groups." + name + ".";
    if (!g.is_object()) fail(f.file, ": field '", where, "' is not an object");
    const QFields gf{g, f.file, where};
    const std::string group_format = gf.string("format", global_format);
    if (group_format != "pack-quantized" && group_format != "float-quantized")
      gf.bad("format", json(group_format),
             "supported: \"pack-quantized\" (integer) and \"float-quantized\" (FP8); naive-quantized, "
             "int-quantized, nvfp4-pack-quantized, marlin-24 and others are not");
    if (!format.empty() && group_format != format)
      gf.bad("format", json(group_format), "config groups with different formats are not supported");
    format = group_format;
    const json* inputs = gf.get("input_activations");
    if (inputs && format == "pack-quantized")
      gf.bad("input_activations", *inputs, "activation quantization is not supported with integer weights");
    if (const json* a = gf.get("output_activations"))
      gf.bad("output_activations", *a, "output quantization is not supported");
    const json* w = gf.get("weights");
    if (!w || !w->is_object()) fail(f.file, ": field '", where, "weights' is missing");
    if (first_weights &&
        (*w != *first_weights || (inputs ? *inputs : json()) != (first_inputs ? *first_inputs : json())))
      fail(f.file, ": '", where.substr(0, where.size() - 1),
           "' differs from the first config group; groups with different weight or activation "
           "schemes are not supported");
    first_weights = w;
    first_inputs = inputs;
  }
  const QFields w{*first_weights, f.file, f.where + "config_groups.<group>.weights."};
  if (format == "float-quantized") {
    parse_ct_fp8(w, first_inputs, f.where + "config_groups.<group>.input_activations.", c);
    return c;
  }
  const std::string type = w.string("type", "int");
  if (type != "int") w.bad("type", json(type), "pack-quantized holds integer weights (FP8 is format float-quantized)");
  c.bits = static_cast<int>(w.integer("num_bits", 4));
  check_bits(w, "num_bits", c.bits);
  c.symmetric = w.boolean("symmetric", true);
  if (w.boolean("dynamic", false)) w.bad("dynamic", json(true), "dynamic weight quantization is not supported");
  const std::string strategy = w.string("strategy", "");
  if (strategy == "group")
    c.group_size = check_group(w, "group_size", w.integer("group_size", 0));
  else if (strategy == "channel")
    c.group_size = -1;
  else
    w.bad("strategy", json(strategy), "supported: \"group\" and \"channel\"");
  if (const json* ao = w.get("actorder")) {
    if (ao->is_boolean())
      c.act_order = ao->get<bool>();
    else if (ao->is_string() && (*ao == "group" || *ao == "weight" || *ao == "static"))
      c.act_order = *ao == "group";  // "weight"/"static" reorder during quantization only: no g_idx
    else
      w.bad("actorder", *ao, "expected null, a boolean, \"group\", \"weight\" or \"static\"");
  }
  return c;
}

}  // namespace

const char* weight_quant_method_name(WeightQuantMethod m) {
  switch (m) {
    case WeightQuantMethod::Gptq:
      return "gptq";
    case WeightQuantMethod::Awq:
      return "awq";
    case WeightQuantMethod::CompressedTensors:
      return "compressed-tensors";
    case WeightQuantMethod::Fp8:
      return "fp8";
    default:
      return "none";
  }
}

WeightQuantConfig parse_weight_quant_config(std::string_view config_json, std::string_view file) {
  const json root = parse_model_json(config_json, file);
  if (!root.is_object()) fail(file, ": not a JSON object");
  const auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return {};
  if (!it->is_object()) fail(file, ": field 'quantization_config' is not an object");
  const QFields f{*it, file, "quantization_config."};
  const json* m = f.get("quant_method");
  if (!m || !m->is_string()) fail(file, ": field 'quantization_config.quant_method' is missing or not a string");
  const std::string method = m->get<std::string>();
  if (method == "gptq") return parse_gptq(f);
  if (method == "awq") return parse_awq(f);
  if (method == "compressed-tensors") return parse_compressed_tensors(f);
  if (method == "fp8") return parse_fp8(f);
  f.bad("quant_method", *m, "supported: \"gptq\", \"awq\", \"compressed-tensors\", \"fp8\"");
}

WeightQuantConfig load_weight_quant_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const bool is_dir = fs::is_directory(dir);
  const std::string file = is_dir ? (fs::path(dir) / "config.json").string() : dir;
  auto read = [](const std::string& path) {
    const MappedFile mapped(path);
    return std::string(reinterpret_cast<const char*>(mapped.data()), mapped.size());
  };
  WeightQuantConfig c = parse_weight_quant_config(read(file), file);
  if (c.method != WeightQuantMethod::None || !is_dir) return c;
  // Older checkpoints keep the settings beside config.json: AutoGPTQ's quantize_config.json,
  // AutoAWQ's quant_config.json (often without quant_method), as vLLM also reads them.
  for (const auto& [name, method] : {std::pair<const char*, const char*>{"quantize_config.json", "gptq"},
                                     std::pair<const char*, const char*>{"quant_config.json", "awq"}}) {
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path)) continue;
    json q = parse_model_json(read(path), path);
    if (!q.is_object()) fail(path, ": not a JSON object");
    if (!q.contains("quant_method")) q["quant_method"] = method;
    return parse_weight_quant_config(json{{"quantization_config", q}}.dump(), path);
  }
  return c;
}

}  // namespace tessera
