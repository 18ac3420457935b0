// tessera quantize for GGUF (model/quantize_gguf.h).
#include "model/quantize_gguf.h"

#include <cmath>
#include <memory>
#include <optional>

#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "quant/quant.h"

namespace tessera {

namespace {

// llama-quantize's use_more_bits: the first and last eighth of the layers, and every third between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The layer index of "blk.N.…", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  try {
    return std::stoi(name.substr(4));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

GgufQuantTarget gguf_quant_target(const std::string& name) {
  // llama.cpp's llama_ftype ids (the _S variant where a K type is used throughout).
  static const GgufQuantTarget kTargets[] = {{"q4_0", DType::Q4_0, false, 2},   {"q4_1", DType::Q4_1, false, 3},
                                             {"q8_0", DType::Q8_0, false, 7},   {"q5_0", DType::Q5_0, false, 8},
                                             {"q5_1", DType::Q5_1, false, 9},   {"q4_k", DType::Q4_K, false, 14},
                                             {"q4_k_m", DType::Q4_K, true, 15}, {"q5_k", DType::Q5_K, false, 16},
                                             {"q5_k_m", DType::Q5_K, true, 17}, {"q6_k", DType::Q6_K, false, 18}};
  for (const GgufQuantTarget& t : kTargets)
    if (name == t.name) return t;
  fail("quantize: --type '", name, "' (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q4_k_m, q5_k, q5_k_m, q6_k)");
}

DType gguf_tensor_target(const GgufQuantTarget& t, const std::string& name, const std::vector<int64_t>& shape,
                         DType stored, int n_layer, bool has_output) {
  if (shape.size() < 2 || !name.ends_with(".weight") || name.find("ffn_gate_inp") != std::string::npos ||
      name.find("_norm") != std::string::npos)
    return stored;
  DType to = t.base;
  if (t.mix) {
    // The output matrix (the embeddings when the head is tied to them), and attn_v / ffn_down in
    // the layers use_more_bits picks, get Q6_K.
    const bool output = name == "output.weight" || (!has_output && name == "token_embd.weight");
    const int layer = layer_of(name);
    const bool more = layer >= 0 &&
                      (name.find(".attn_v.") != std::string::npos || name.find(".ffn_down") != std::string::npos) &&
                      use_more_bits(layer, n_layer);
    if (output || more) to = DType::Q6_K;
  }
  if (shape[0] % dtype_traits(to).block_elems != 0) {  // llama.cpp's fallbacks for partial 256-blocks
    to = to == DType::Q4_K ? DType::Q5_0 : to == DType::Q5_K ? DType::Q5_1 : to == DType::Q6_K ? DType::Q8_0 : to;
    if (shape[0] % dtype_traits(to).block_elems != 0) return stored;
  }
  return to;
}

GgufQuantizeReport quantize_gguf(const std::string& in, const std::string& out, const GgufQuantTarget& target,
                                 const std::function<void(const GgufTensorReport&, size_t, size_t)>& progress) {
  const auto file = GGUFFile::open(in);
  const auto arch = file->get_string("general.architecture");
  const auto n_layer = arch ? file->get_int(std::string(*arch) + ".block_count") : std::nullopt;
  TESSERA_CHECK(!target.mix || n_layer, "quantize: ", in, " has no <arch>.block_count, which ", target.name, " needs");
  const bool has_output = file->find_tensor("output.weight") != nullptr;
  GGUFWriter w;
  for (const auto& [key, value] : file->metadata()) w.set(key, value);
  w.set_u32("general.file_type", target.llama_ftype);
  w.set_string("general.quantized_by", "tessera quantize");

  GgufQuantizeReport report;
  std::vector<std::vector<uint8_t>> owned;  // the requantized tensors, alive until written
  owned.reserve(file->tensors().size());
  const size_t n_tensors = file->tensors().size();
  for (size_t ti = 0; ti < n_tensors; ++ti) {
    const GGUFTensorInfo& t = file->tensors()[ti];
    GgufTensorReport r{t.name, t.dtype, t.dtype, t.n_elements(), 0};
    report.bytes_in += t.n_bytes;
    const DType to =
        gguf_tensor_target(target, t.name, t.shape, t.dtype, n_layer ? static_cast<int>(*n_layer) : 0, has_output);
    if (to == t.dtype) {
      w.add_tensor(t.name, t.dtype, t.shape, t.data, t.n_bytes);
      report.bytes_out += t.n_bytes;
      report.tensors.push_back(r);
      if (progress) progress(r, ti, n_tensors);
      continue;
    }
    const int64_t cols = t.shape[0], rows = t.n_elements() / cols;
    const int64_t src_row = dtype_row_bytes(t.dtype, cols), dst_row = dtype_row_bytes(to, cols);
    auto& dst = owned.emplace_back(static_cast<size_t>(rows * dst_row));
    std::vector<float> row(cols), back(cols);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < rows; ++i) {
      dequantize_row(t.dtype, t.data + i * src_row, row.data(), cols);
      uint8_t* q = dst.data() + i * dst_row;
      quantize_row(to, row.data(), q, cols);
      dequantize_row(to, q, back.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const double d = double(back[c]) - row[c];
        err += d * d;
        norm += double(row[c]) * row[c];
      }
    }
    r.to = to;
    r.rel_error = norm > 0 ? std::sqrt(err / norm) : 0;
    w.add_tensor(t.name, to, t.shape, dst.data(), dst.size());
    report.bytes_out += dst.size();
    report.tensors.push_back(r);
    if (progress) progress(r, ti, n_tensors);
  }
  w.write(out);
  return report;
}

}  // namespace tessera
