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

// What `--type` names: one block type for every matrix (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k,
// q6_k), or llama.cpp's "_M" mixes (q4_k_m, q5_k_m): the base K type, Q6_K for the output matrix
// and for attn_v / ffn_down in the first and last eighth of the layers and every third between
// (llama-quantize's use_more_bits).
struct GgufQuantTarget {
  std::string name;
  DType base = DType::Unknown;
  bool mix = false;          // the _M rule
  uint32_t llama_ftype = 0;  // general.file_type
};
// Throws naming the accepted names.
GgufQuantTarget gguf_quant_target(const std::string& name);

// The type one tensor gets (its stored type when it is kept). K types fall back as llama.cpp's do
// when a row is not a whole number of 256-blocks: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0.
DType gguf_tensor_target(const GgufQuantTarget& t, const std::string& name, const std::vector<int64_t>& shape,
                         DType stored, int n_layer, bool has_output);

// Requantizes `in` into `out`: matrices (two or more dimensions) whose name ends in ".weight",
// except routers (ffn_gate_inp) and norms, which keep their stored type, as llama-quantize does;
// the rest is copied. Source blocks are decoded to f32 first (a quantized file is requantized,
// said per tensor in the report). general.file_type is set to llama.cpp's id. `progress` runs
// after each tensor.
GgufQuantizeReport quantize_gguf(const std::string& in, const std::string& out, const GgufQuantTarget& to,
                                 const std::function<void(const GgufTensorReport&, size_t, size_t)>& progress);

}  // namespace tessera
