// tessera quantize for GGUF (model/quantize_gguf.h).
#include "model/quantize_gguf.h"

#include <cmath>
#include <memory>

#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "quant/quant.h"

namespace tessera {

namespace {

// llama.cpp's llama_ftype for a file whose matrices are mostly of this type (the _S variant
// of the K-quants: one type throughout).
uint32_t llama_ftype(DType t) {
  switch (t) {
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::Q5_0:
      return 8;
    case DType::Q5_1:
      return 9;
    case DType::Q4_K:
      return 14;
    case DType::Q5_K:
      return 16;
    case DType::Q6_K:
      return 18;
    default:
      fail("quantize: ", dtype_name(t), " is not a GGUF target type");
  }
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

DType gguf_quant_type(const std::string& name) {
  static const std::pair<const char*, DType> kTypes[] = {
      {"q4_0", DType::Q4_0}, {"q4_1", DType::Q4_1}, {"q5_0", DType::Q5_0}, {"q5_1", DType::Q5_1},
      {"q8_0", DType::Q8_0}, {"q4_k", DType::Q4_K}, {"q5_k", DType::Q5_K}, {"q6_k", DType::Q6_K}};
  for (const auto& [n, t] : kTypes)
    if (name == n) return t;
  return DType::Unknown;
}

GgufQuantizeReport quantize_gguf(const std::string& in, const std::string& out, DType to,
                                 const std::function<void(const GgufTensorReport&, size_t, size_t)>& progress) {
  const auto file = GGUFFile::open(in);
  const uint32_t ftype = llama_ftype(to);
  const int64_t block = dtype_traits(to).block_elems;
  GGUFWriter w;
  for (const auto& [key, value] : file->metadata()) w.set(key, value);
  w.set_u32("general.file_type", ftype);
  w.set_string("general.quantized_by", "tessera quantize");

  GgufQuantizeReport report;
  std::vector<std::vector<uint8_t>> owned;  // the requantized tensors, alive until written
  owned.reserve(file->tensors().size());
  const size_t n_tensors = file->tensors().size();
  for (size_t ti = 0; ti < n_tensors; ++ti) {
    const GGUFTensorInfo& t = file->tensors()[ti];
    GgufTensorReport r{t.name, t.dtype, t.dtype, t.n_elements(), 0};
    report.bytes_in += t.n_bytes;
    const bool matrix = t.shape.size() >= 2 && ends_with(t.name, ".weight") && t.shape[0] % block == 0 &&
                        t.name.find("ffn_gate_inp") == std::string::npos && t.name.find("_norm") == std::string::npos &&
                        t.dtype != to;
    if (!matrix) {
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
