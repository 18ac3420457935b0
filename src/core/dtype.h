#pragma once
// Element and block types. The numeric values of the GGUF-backed ones are GGML's type ids,
// so a tensor's type read from a GGUF file maps directly.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  BF16 = 30,
  // Group-quantized integer weights (tessera's own, never in a GGUF file): 4- or 8-bit codes
  // with f16 scales per group of columns, optional zero points and act-order permutation.
  // A matrix's layout (core/group_quant.h, docs/design/weight-quant.md) needs its group size
  // and flags, which WeightMatrix carries.
  W4G = 0x100,
  W8G = 0x101,
  // FP8 E4M3 weights with one f32 scale per output row (tessera's own, core/fp8_weight.h):
  // value = decode_e4m3(code) * scale[row]. What vLLM's --quantization fp8 and
  // compressed-tensors float-quantized (channel strategy) checkpoints hold.
  FP8W = 0x102,
  Unknown = 0xffffffffu,
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool supported;       // tessera can compute with it
};

// Traits of a type; a type id tessera does not know returns {"unknown", 0, 0, false}.
const DTypeTraits& dtype_traits(DType t);
// Parses a GGML type id; Unknown when the id is not one of the types above.
DType dtype_from_ggml_id(uint32_t id);
inline std::string_view dtype_name(DType t) { return dtype_traits(t).name; }
inline bool is_group_quant(DType t) { return t == DType::W4G || t == DType::W8G; }
inline bool is_fp8_weight(DType t) { return t == DType::FP8W; }
// Bytes of one row of n elements; n must be a multiple of the block size (checked by loaders).
// For W4G/W8G: the codes of one row only (the scales follow all rows' codes). For FP8W the
// stored stride is padded (WeightMatrix::row_bytes, core/fp8_weight.h).
inline int64_t dtype_row_bytes(DType t, int64_t n) {
  const auto& tr = dtype_traits(t);
  return n / tr.block_elems * tr.block_bytes;
}

}  // namespace tessera
