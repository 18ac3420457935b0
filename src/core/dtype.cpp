#include "core/dtype.h"

namespace tessera {

namespace {
constexpr DTypeTraits kUnknown{"unknown", 0, 0, false};
}

const DTypeTraits& dtype_traits(DType t) {
  static constexpr DTypeTraits f32{"F32", 1, 4, true}, f16{"F16", 1, 2, true}, bf16{"BF16", 1, 2, true},
      q4_0{"Q4_0", 32, 18, true}, q4_1{"Q4_1", 32, 20, true}, q5_0{"Q5_0", 32, 22, true}, q5_1{"Q5_1", 32, 24, true},
      q8_0{"Q8_0", 32, 34, true}, q8_1{"Q8_1", 32, 36, false}, q4_k{"Q4_K", 256, 144, true},
      q5_k{"Q5_K", 256, 176, true}, q6_k{"Q6_K", 256, 210, true}, q8_k{"Q8_K", 256, 292, false}, i8{"I8", 1, 1, false},
      i16{"I16", 1, 2, false}, i32{"I32", 1, 4, false}, w4g{"W4G", 32, 16, true}, w8g{"W8G", 32, 32, true},
      fp8w{"FP8W", 1, 1, true};
  switch (t) {
    case DType::F32:
      return f32;
    case DType::F16:
      return f16;
    case DType::BF16:
      return bf16;
    case DType::Q4_0:
      return q4_0;
    case DType::Q4_1:
      return q4_1;
    case DType::Q5_0:
      return q5_0;
    case DType::Q5_1:
      return q5_1;
    case DType::Q8_0:
      return q8_0;
    case DType::Q8_1:
      return q8_1;
    case DType::Q4_K:
      return q4_k;
    case DType::Q5_K:
      return q5_k;
    case DType::Q6_K:
      return q6_k;
    case DType::Q8_K:
      return q8_k;
    case DType::I8:
      return i8;
    case DType::I16:
      return i16;
    case DType::I32:
      return i32;
    case DType::W4G:
      return w4g;
    case DType::W8G:
      return w8g;
    case DType::FP8W:
      return fp8w;
    default:
      return kUnknown;
  }
}

DType dtype_from_ggml_id(uint32_t id) {
  const DType t = static_cast<DType>(id);
  // The group-quantized and FP8W types are tessera's own: no GGML id maps to them.
  return dtype_traits(t).block_elems == 0 || is_group_quant(t) || is_fp8_weight(t) ? DType::Unknown : t;
}

}  // namespace tessera
