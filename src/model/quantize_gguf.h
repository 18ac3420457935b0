#pragma once
// `tessera quantize` for GGUF files (llama-quantize's job): every weight matrix requantized to
// one GGML block type, the metadata copied, written as a GGUF that tessera and llama.cpp load.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera {

struct GgufTensorReport {
  std::string name;
  DType from = DType::Unknown, to = DType::Unknown;  // to == from: kept as stored
  int64_t elements = 0;
  double rel_error = 0;  // ||W - Q(W)||_F / ||W||_F against the stored values (0 when kept)
};

struct GgufQuantizeReport {
  std::vector<GgufTensorReport> tensors;
  uint64_t bytes_in = 0, bytes_out = 0;
};

// The block type a name stands for: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k (Unknown otherwise).
DType gguf_quant_type(const std::string& name);

// Requantizes `in` to `to` into `out`: matrices (two or more dimensions, rows a multiple of the
// block size) whose name ends in ".weight", except routers (ffn_gate_inp) and norms, which keep
// their stored type, as llama-quantize does; the rest is copied. Source blocks are decoded to
// f32 first (a quantized file is requantized, said per tensor in the report).
// general.file_type is set to llama.cpp's id for the type. `progress` runs after each tensor.
GgufQuantizeReport quantize_gguf(const std::string& in, const std::string& out, DType to,
                                 const std::function<void(const GgufTensorReport&, size_t, size_t)>& progress);

}  // namespace tessera
