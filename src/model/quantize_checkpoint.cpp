// `tessera quantize`: group quantization of a Hugging Face checkpoint (round-to-nearest here,
// or GPTQ/AWQ's matrices handed in) into compressed-tensors pack-quantized safetensors
// (docs/design/weight-quant.md). The codes come
// from quant/'s quantizer in tessera's native layout and are repacked as compressed-tensors
// writes them: weight_packed int32 [N, ceil(K/pf)] along the input (value + 2^(bits-1)),
// weight_scale f16 [N, G], weight_zero_point int32 [ceil(N/pf), G] along the output,
// weight_shape int64 [2], and with act-order weight_g_idx int32 [K].
#include "model/quantize_checkpoint.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "quant/group_quant.h"
#include "quant/quant.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLinearSuffixes[] = {
    ".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight", ".self_attn.o_proj.weight",
    ".mlp.gate_proj.weight",    ".mlp.up_proj.weight",      ".mlp.down_proj.weight"};

// The decoder layer of a linear weight to quantize ("model.layers.<i>.<linear>.weight"), or -1;
// *which: its index in kLinearSuffixes.
int linear_layer(const std::string& name, int* which = nullptr) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  int found = -1;
  for (int i = 0; i < 7; ++i)
    if (name.ends_with(kLinearSuffixes[i])) found = i;
  if (found < 0) return -1;
  if (which) *which = found;
  size_t pos = kPrefix.size();
  int layer = 0;
  while (pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos])))
    layer = layer * 10 + (name[pos++] - '0');
  return pos > kPrefix.size() && name[pos] == '.' ? layer : -1;
}

// The output tensors of one quantized matrix, owning their bytes.
struct PackedLinear {
  std::vector<int32_t> packed, zero_point, g_idx;
  std::vector<uint16_t> scale;
  int64_t shape[2] = {0, 0};
  int64_t words = 0, groups = 0;
};

PackedLinear pack_compressed_tensors(const GroupQuantMatrix& m) {
  const GroupQuantLayout& l = m.layout;
  const uint8_t* buf = m.data.get();
  const int pf = 32 / l.bits;
  PackedLinear p;
  p.shape[0] = l.rows;
  p.shape[1] = l.cols;
  p.words = (l.cols + pf - 1) / pf;
  p.groups = l.n_groups;
  p.packed.assign(static_cast<size_t>(l.rows * p.words), 0);
  // Stored column j holds input column perm[j]; the checkpoint is in input order with g_idx.
  const int32_t* perm = gq_perm(l, buf);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t j = 0; j < l.cols; ++j) {
      const int64_t k = perm ? perm[j] : j;
      p.packed[r * p.words + k / pf] |=
          static_cast<int32_t>(static_cast<uint32_t>(gq_code(l, buf, r, j)) << (l.bits * (k % pf)));
    }
  if (perm) {
    p.g_idx.resize(static_cast<size_t>(l.cols));
    for (int64_t j = 0; j < l.cols; ++j) p.g_idx[perm[j]] = static_cast<int32_t>(j / l.group_size);
  }
  p.scale.resize(static_cast<size_t>(l.rows * l.n_groups));
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t g = 0; g < l.n_groups; ++g) p.scale[r * l.n_groups + g] = gq_scale_f16(l, buf, r, g);
  if (l.has_zeros) {
    const int64_t zr = (l.rows + pf - 1) / pf;
    p.zero_point.assign(static_cast<size_t>(zr * l.n_groups), 0);
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t g = 0; g < l.n_groups; ++g)
        p.zero_point[(r / pf) * l.n_groups + g] |=
            static_cast<int32_t>(static_cast<uint32_t>(gq_zero(l, buf, r, g)) << (l.bits * (r % pf)));
  }
  return p;
}

// The calibrated model's norm or v_proj bias of a tensor name, or nullptr for other tensors.
const float* calibrated_vector(const ModelWeights& w, const std::string& name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return nullptr;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return nullptr;
  const int layer = std::atoi(name.substr(kPrefix.size(), dot - kPrefix.size()).c_str());
  if (layer < 0 || layer >= static_cast<int>(w.layers.size())) return nullptr;
  const std::string rest = name.substr(dot + 1);
  const LayerWeights& l = w.layers[layer];
  if (rest == "input_layernorm.weight") return l.attn_norm;
  if (rest == "post_attention_layernorm.weight") return l.ffn_norm;
  if (rest == "self_attn.v_proj.bias") return l.bv;
  return nullptr;
}

// The calibrated model's matrix `which` (kLinearSuffixes order) of a layer, as a view.
GroupQuantMatrix calibrated_matrix(const ModelWeights& w, int layer, int which, int64_t rows, int64_t cols,
                                   const std::string& name) {
  const LayerWeights& l = w.layers[layer];
  const WeightMatrix* ms[7] = {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down};
  const WeightMatrix& m = *ms[which];
  TESSERA_CHECK(is_group_quant(m.dtype) && m.rows == rows && m.cols == cols, "quantize: the calibrated model's '", name,
                "' is not a group-quantized ", rows, " x ", cols, " matrix");
  GroupQuantMatrix g;
  g.layout = m.gq_layout();
  g.data = std::shared_ptr<uint8_t>(std::shared_ptr<void>(), static_cast<uint8_t*>(const_cast<void*>(m.data)));
  return g;
}

nlohmann::ordered_json quantization_config(const QuantizeOptions& o) {
  nlohmann::ordered_json weights = {{"num_bits", o.bits},
                                    {"type", "int"},
                                    {"symmetric", !o.asymmetric},
                                    {"dynamic", false},
                                    {"strategy", o.group_size < 0 ? "channel" : "group"},
                                    {"observer", "minmax"},
                                    {"actorder", o.act_order ? nlohmann::ordered_json("group") : nullptr}};
  if (o.group_size > 0) weights["group_size"] = o.group_size;
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", nullptr},
              {"output_activations", nullptr}}}}}};
}

}  // namespace

QuantizeReport quantize_checkpoint(
    const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& o,
    const std::function<void(int, int, const std::vector<QuantizedTensorReport>&)>& on_layer,
    const ModelWeights* calibrated) {
  TESSERA_CHECK(o.method == "rtn" || o.method == "gptq" || o.method == "awq", "quantize: method '", o.method,
                "' (rtn, gptq or awq)");
  TESSERA_CHECK((o.method == "rtn") == (calibrated == nullptr), "quantize: ", o.method,
                o.method == "rtn" ? " takes no calibrated weights" : " needs the calibrated model");
  TESSERA_CHECK(!o.act_order || o.method == "gptq", "quantize: --act-order is a GPTQ option");
  TESSERA_CHECK(o.bits == 4 || o.bits == 8, "quantize: --bits ", o.bits, " (4 or 8)");
  TESSERA_CHECK(o.group_size == -1 || (o.group_size >= 32 && o.group_size % 32 == 0), "quantize: --group-size ",
                o.group_size, " (-1, or a multiple of 32)");
  TESSERA_CHECK(fs::is_directory(in_dir), "quantize: '", in_dir,
                "' is not a Hugging Face directory (GGUF input is not implemented)");
  TESSERA_CHECK(fs::absolute(in_dir) != fs::absolute(out_dir), "quantize: the output directory is the input");

  const std::string cfg_path = (fs::path(in_dir) / "config.json").string();
  const MappedFile cfg_file(cfg_path);
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(
      std::string_view(reinterpret_cast<const char*>(cfg_file.data()), cfg_file.size()), nullptr, false);
  TESSERA_CHECK(cfg.is_object(), cfg_path, ": not a JSON object");
  TESSERA_CHECK(!cfg.contains("quantization_config") || cfg["quantization_config"].is_null(), cfg_path,
                ": the model is quantized already (quantization_config)");
  const auto st = SafetensorsModel::open(in_dir);

  int n_layers = 0;
  for (const auto& [name, t] : st->tensors()) n_layers = std::max(n_layers, linear_layer(name) + 1);
  if (calibrated)
    TESSERA_CHECK(static_cast<int>(calibrated->layers.size()) == n_layers, "quantize: the calibrated model has ",
                  calibrated->layers.size(), " layers, the checkpoint ", n_layers);
  // Tensor outputs in name order; the packed ones own their bytes here.
  std::vector<SafetensorsOutTensor> out;
  std::vector<std::unique_ptr<PackedLinear>> packed;
  std::vector<std::vector<QuantizedTensorReport>> per_layer(n_layers);
  std::vector<int> left(n_layers, 0);
  for (const auto& [name, t] : st->tensors())
    if (linear_layer(name) >= 0) ++left[linear_layer(name)];
  QuantizeReport report;
  std::vector<float> w;
  for (const auto& [name, t] : st->tensors()) {
    report.bytes_in += static_cast<int64_t>(t->n_bytes);
    int which = 0;
    const int layer = linear_layer(name, &which);
    if (layer < 0) {
      if (const float* v = calibrated ? calibrated_vector(*calibrated, name) : nullptr) {
        // AWQ folds its scales into these: the calibrated model's values, as F32.
        out.push_back({name, SafetensorsDType::F32, t->shape, v, static_cast<size_t>(t->shape[0]) * 4});
        continue;
      }
      out.push_back({name, t->stored, t->shape, t->data, t->n_bytes});
      continue;
    }
    TESSERA_CHECK(t->shape.size() == 2, st->name(), ": '", name, "' is not a matrix");
    TESSERA_CHECK(t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16, st->name(), ": '", name,
                  "' has type ", safetensors_dtype_name(t->stored), "; quantize takes F32, F16 or BF16");
    const int64_t rows = t->shape[0], cols = t->shape[1];
    w.resize(static_cast<size_t>(rows * cols));
    dequantize_row(t->dtype, t->data, w.data(), rows * cols);
    const int64_t group = o.group_size < 0 ? cols : o.group_size;
    const GroupQuantMatrix m = calibrated ? calibrated_matrix(*calibrated, layer, which, rows, cols, name)
                                          : quantize_group_rtn(w.data(), rows, cols, o.bits, group, o.asymmetric);
    double err = 0, ref = 0;
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      gq_dequantize_row(m.layout, m.data.get(), r, row.data());
      for (int64_t k = 0; k < cols; ++k) {
        const double d = double(row[k]) - w[r * cols + k];
        err += d * d;
        ref += double(w[r * cols + k]) * w[r * cols + k];
      }
    }
    const double rel = o.method == "awq" ? NAN : ref > 0 ? std::sqrt(err / ref) : 0.0;
    const QuantizedTensorReport tr{name, rows, cols, rel};
    report.tensors.push_back(tr);
    per_layer[layer].push_back(tr);
    packed.push_back(std::make_unique<PackedLinear>(pack_compressed_tensors(m)));
    const PackedLinear& p = *packed.back();
    const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
    out.push_back(
        {base + ".weight_packed", SafetensorsDType::I32, {rows, p.words}, p.packed.data(), p.packed.size() * 4});
    out.push_back(
        {base + ".weight_scale", SafetensorsDType::F16, {rows, p.groups}, p.scale.data(), p.scale.size() * 2});
    out.push_back({base + ".weight_shape", SafetensorsDType::I64, {2}, p.shape, 16});
    if (!p.zero_point.empty())
      out.push_back({base + ".weight_zero_point",
                     SafetensorsDType::I32,
                     {(rows + 32 / o.bits - 1) / (32 / o.bits), p.groups},
                     p.zero_point.data(),
                     p.zero_point.size() * 4});
    if (!p.g_idx.empty())
      out.push_back({base + ".weight_g_idx", SafetensorsDType::I32, {cols}, p.g_idx.data(), p.g_idx.size() * 4});
    if (--left[layer] == 0 && on_layer) on_layer(layer, n_layers, per_layer[layer]);
  }

  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), out);
  for (const SafetensorsOutTensor& t : out) report.bytes_out += static_cast<int64_t>(t.n_bytes);
  cfg["quantization_config"] = quantization_config(o);
  std::ofstream((fs::path(out_dir) / "config.json").string()) << cfg.dump(2) << "\n";
  for (const auto& entry : fs::directory_iterator(in_dir)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file == "config.json" || file.ends_with(".safetensors") ||
        file == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), fs::path(out_dir) / file, fs::copy_options::overwrite_existing);
  }
  return report;
}

}  // namespace tessera
