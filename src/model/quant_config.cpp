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
  const json* first_weights = nullptr;
  for (const auto& [name, g] : groups->items()) {
    const std::string where = f.where + "config_groups." + name + ".";
    if (!g.is_object()) fail(f.file, ": field '", where, "' is not an object");
    const QFields gf{g, f.file, where};
    const std::string format = gf.string("format", global_format);
    if (format != "pack-quantized")
      gf.bad("format", json(format),
             "only \"pack-quantized\" is supported (float-quantized / FP8, naive-quantized, int-quantized, "
             "marlin-24 and others are not)");
    if (const json* a = gf.get("input_activations"))
      gf.bad("input_activations", *a, "activation quantization is not supported (weight-only schemes are)");
    if (const json* a = gf.get("output_activations"))
      gf.bad("output_activations", *a, "output quantization is not supported");
    const json* w = gf.get("weights");
    if (!w || !w->is_object()) fail(f.file, ": field '", where, "weights' is missing");
    if (first_weights && *w != *first_weights)
      fail(f.file, ": '", where,
           "weights' differs from the first config group; groups with different weight "
           "schemes are not supported");
    first_weights = w;
  }
  const QFields w{*first_weights, f.file, f.where + "config_groups.<group>.weights."};
  const std::string type = w.string("type", "int");
  if (type != "int") w.bad("type", json(type), "only integer weights are supported (FP8 is not implemented)");
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
  f.bad("quant_method", *m, "supported: \"gptq\", \"awq\", \"compressed-tensors\"");
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
