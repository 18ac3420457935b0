// Integer-quantized linear layers of Hugging Face checkpoints, unpacked as their owners write
// them and rebuilt in tessera's group-quantized format (docs/design/weight-quant.md):
//  - GPTQ (AutoGPTQ / GPTQModel): qweight int32 [K/pack, N] packed along the input, LSB first;
//    qzeros int32 [G, N/pack] packed along the output; scales f16 [G, N]; g_idx int32 [K].
//    checkpoint_format "gptq" stores each zero point minus one, "gptq_v2" as is.
//  - AWQ GEMM (AutoAWQ): qweight int32 [K, N/8] packed along the output, nibble i of a word
//    holding column 8c + [0,2,4,6,1,3,5,7][i]; qzeros int32 [G, N/8] likewise; scales [G, N].
//  - compressed-tensors pack-quantized: weight_packed int32 [N, ceil(K/pack)] along the input,
//    LSB first, codes stored as signed value + 2^(bits-1); weight_scale [N, G]; asymmetric
//    weight_zero_point int32 [ceil(N/pack), G] packed along the output (older files: int8
//    [N, G], signed); weight_shape [2] = [N, K]; weight_g_idx [K] with group act-order.
// FP8 checkpoints (quant_method "fp8" as vLLM / AutoFP8 write them, compressed-tensors
// float-quantized) are rebuilt as DType::FP8W: weight F8_E4M3 [N, K] as is, weight_scale one
// value ([] or [1]) or one per output row ([N] or [N, 1]), input_scale checked only.
#include "model/loader_quantized.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/fp8_weight.h"
#include "quant/group_quant.h"

namespace tessera {

namespace {

std::string shape_of(const SafetensorsTensor& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

struct Reader {
  const SafetensorsModel& st;
  std::string prefix;

  std::string what() const { return st.name() + ": '" + prefix + "'"; }

  const SafetensorsTensor* find(const std::string& suffix) const { return st.find_tensor(prefix + "." + suffix); }

  // The tensor prefix.suffix with one of the given element types and exactly this shape.
  const SafetensorsTensor& need(const std::string& suffix, std::initializer_list<SafetensorsDType> types,
                                std::vector<int64_t> shape) const {
    const SafetensorsTensor* t = find(suffix);
    if (!t) fail(st.name(), ": missing tensor '", prefix, ".", suffix, "'");
    bool type_ok = false;
    std::string names;
    for (SafetensorsDType d : types) {
      type_ok = type_ok || t->stored == d;
      names += (names.empty() ? "" : " or ") + std::string(safetensors_dtype_name(d));
    }
    if (!type_ok)
      fail(st.name(), ": tensor '", t->name, "' has type ", safetensors_dtype_name(t->stored), ", expected ", names);
    if (t->shape != shape) {
      std::string want = "[";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
      fail(st.name(), ": tensor '", t->name, "' has shape ", shape_of(*t), ", expected ", want, "]");
    }
    return *t;
  }
};

uint32_t u32_at(const SafetensorsTensor& t, int64_t i) {
  uint32_t v;
  std::memcpy(&v, t.data + 4 * i, 4);
  return v;
}

// Scales as f16 bits, from F16 (as is), BF16 or F32 (rounded to nearest; a scale that does not
// survive as a finite nonzero half is an error). `at(i)` picks the source element of output i.
template <typename At>
std::vector<uint16_t> scales_f16(const SafetensorsTensor& t, int64_t n, At at, const std::string& what) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = at(i);
    float v;
    if (t.stored == SafetensorsDType::F16) {
      std::memcpy(&out[i], t.data + 2 * s, 2);
      continue;
    }
    if (t.stored == SafetensorsDType::BF16) {
      uint16_t b;
      std::memcpy(&b, t.data + 2 * s, 2);
      v = f32_from_bits(static_cast<uint32_t>(b) << 16);
    } else {
      std::memcpy(&v, t.data + 4 * s, 4);
    }
    out[i] = f32_to_fp16(v);
    const float back = fp16_to_f32(out[i]);
    if (!std::isfinite(back) || (v != 0 && back == 0))
      fail(what, ": scale ", v, " in '", t.name, "' does not fit an f16 scale");
  }
  return out;
}

std::vector<int32_t> read_g_idx(const SafetensorsTensor& t) {
  std::vector<int32_t> g(static_cast<size_t>(t.n_elements()));
  std::memcpy(g.data(), t.data, g.size() * 4);
  return g;
}

GroupQuantMatrix load_gptq(const Reader& rd, const WeightQuantConfig& cfg, int64_t n, int64_t k) {
  const int bits = cfg.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const int64_t gs = cfg.group_size < 0 ? k : cfg.group_size;
  const int64_t groups = (k + gs - 1) / gs;
  if (k % pack != 0) fail(rd.what(), ": input width ", k, " is not a multiple of ", pack, " (GPTQ packs whole words)");
  const auto& qw = rd.need("qweight", {SafetensorsDType::I32}, {k / pack, n});
  const auto& sc =
      rd.need("scales", {SafetensorsDType::F16, SafetensorsDType::BF16, SafetensorsDType::F32}, {groups, n});
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t r = 0; r < n; ++r)
      codes[r * k + kk] = static_cast<uint8_t>((u32_at(qw, (kk / pack) * n + r) >> (bits * (kk % pack))) & mask);
  std::vector<uint8_t> zeros;
  if (rd.find("qzeros")) {
    const auto& qz = rd.need("qzeros", {SafetensorsDType::I32}, {groups, (n + pack - 1) / pack});
    zeros.resize(static_cast<size_t>(groups * n));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < n; ++r) {
        uint32_t z = (u32_at(qz, g * qz.shape[1] + r / pack) >> (bits * (r % pack))) & mask;
        if (!cfg.gptq_v2) {
          // checkpoint_format "gptq": stored minus one, so zero point 0 cannot be represented.
          if (z == mask)
            fail(rd.what(), ": qzeros holds ", z, " at [", g, ", ", r, "]: a GPTQ v1 checkpoint cannot store zero ",
                 "point 0 (its stored value wraps); re-save as checkpoint_format \"gptq_v2\"");
          z += 1;
        }
        zeros[g * n + r] = static_cast<uint8_t>(z);
      }
  }
  const std::vector<uint16_t> scales = scales_f16(
      sc, groups * n, [](int64_t i) { return i; }, rd.what());
  std::vector<int32_t> g_idx;
  // vLLM reads g_idx only with desc_act; without it groups are contiguous by definition.
  if (cfg.act_order) g_idx = read_g_idx(rd.need("g_idx", {SafetensorsDType::I32}, {k}));
  GroupQuantSource src{bits, n, k, gs, codes, scales, zeros, g_idx};
  return build_group_quant(src, rd.what());
}

GroupQuantMatrix load_awq(const Reader& rd, const WeightQuantConfig& cfg, int64_t n, int64_t k) {
  static constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i holds column 8c + kOrder[i]
  const int64_t gs = cfg.group_size < 0 ? k : cfg.group_size;
  const int64_t groups = (k + gs - 1) / gs;
  if (n % 8 != 0) fail(rd.what(), ": output width ", n, " is not a multiple of 8 (AWQ packs whole words)");
  const auto& qw = rd.need("qweight", {SafetensorsDType::I32}, {k, n / 8});
  const auto& sc =
      rd.need("scales", {SafetensorsDType::F16, SafetensorsDType::BF16, SafetensorsDType::F32}, {groups, n});
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t c = 0; c < n / 8; ++c) {
      const uint32_t word = u32_at(qw, kk * (n / 8) + c);
      for (int i = 0; i < 8; ++i) codes[(8 * c + kOrder[i]) * k + kk] = static_cast<uint8_t>((word >> (4 * i)) & 15);
    }
  std::vector<uint8_t> zeros;
  if (!cfg.symmetric) {
    const auto& qz = rd.need("qzeros", {SafetensorsDType::I32}, {groups, n / 8});
    zeros.resize(static_cast<size_t>(groups * n));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < n / 8; ++c) {
        const uint32_t word = u32_at(qz, g * (n / 8) + c);
        for (int i = 0; i < 8; ++i) zeros[g * n + 8 * c + kOrder[i]] = static_cast<uint8_t>((word >> (4 * i)) & 15);
      }
  }
  const std::vector<uint16_t> scales = scales_f16(
      sc, groups * n, [](int64_t i) { return i; }, rd.what());
  GroupQuantSource src{4, n, k, gs, codes, scales, zeros, {}};
  return build_group_quant(src, rd.what());
}

GroupQuantMatrix load_compressed_tensors(const Reader& rd, const WeightQuantConfig& cfg, int64_t n, int64_t k) {
  const int bits = cfg.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const int64_t gs = cfg.group_size < 0 ? k : cfg.group_size;
  const int64_t groups = (k + gs - 1) / gs;
  const auto& shape = rd.need("weight_shape", {SafetensorsDType::I32, SafetensorsDType::I64}, {2});
  int64_t dims[2];
  for (int i = 0; i < 2; ++i) {
    if (shape.stored == SafetensorsDType::I64) {
      std::memcpy(&dims[i], shape.data + 8 * i, 8);
    } else {
      int32_t d;
      std::memcpy(&d, shape.data + 4 * i, 4);
      dims[i] = d;
    }
  }
  if (dims[0] != n || dims[1] != k)
    fail(rd.what(), ": weight_shape is [", dims[0], ", ", dims[1], "], expected [", n, ", ", k, "]");
  const int64_t words = (k + pack - 1) / pack;
  const auto& wp = rd.need("weight_packed", {SafetensorsDType::I32}, {n, words});
  const auto& sc =
      rd.need("weight_scale", {SafetensorsDType::F16, SafetensorsDType::BF16, SafetensorsDType::F32}, {n, groups});
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t kk = 0; kk < k; ++kk)
      codes[r * k + kk] = static_cast<uint8_t>((u32_at(wp, r * words + kk / pack) >> (bits * (kk % pack))) & mask);
  std::vector<uint8_t> zeros;
  if (const SafetensorsTensor* zp = rd.find("weight_zero_point"); zp && !cfg.symmetric) {
    zeros.resize(static_cast<size_t>(groups * n));
    if (zp->stored == SafetensorsDType::I32) {  // packed along the output, codes + 2^(bits-1)
      const auto& z = rd.need("weight_zero_point", {SafetensorsDType::I32}, {(n + pack - 1) / pack, groups});
      for (int64_t r = 0; r < n; ++r)
        for (int64_t g = 0; g < groups; ++g)
          zeros[g * n + r] = static_cast<uint8_t>((u32_at(z, (r / pack) * groups + g) >> (bits * (r % pack))) & mask);
    } else {  // older files: signed int8 [N, G]
      const auto& z = rd.need("weight_zero_point", {SafetensorsDType::I8}, {n, groups});
      for (int64_t r = 0; r < n; ++r)
        for (int64_t g = 0; g < groups; ++g) {
          const int v = static_cast<int8_t>(z.data[r * groups + g]) + (1 << (bits - 1));
          if (v < 0 || v > static_cast<int>(mask))
            fail(rd.what(), ": weight_zero_point ", v - (1 << (bits - 1)), " is out of range for ", bits, " bits");
          zeros[g * n + r] = static_cast<uint8_t>(v);
        }
    }
  } else if (!cfg.symmetric) {
    fail(rd.st.name(), ": missing tensor '", rd.prefix, ".weight_zero_point' (the config says asymmetric)");
  }
  // weight_scale is [N, G]: transpose to the group-major order of the native format.
  const std::vector<uint16_t> scales = scales_f16(
      sc, groups * n, [&](int64_t i) { return (i % n) * groups + i / n; }, rd.what());
  std::vector<int32_t> g_idx;
  if (rd.find("weight_g_idx")) g_idx = read_g_idx(rd.need("weight_g_idx", {SafetensorsDType::I32}, {k}));
  GroupQuantSource src{bits, n, k, gs, codes, scales, zeros, g_idx};
  return build_group_quant(src, rd.what());
}

bool is_fp8_stored(const SafetensorsTensor* t) {
  return t && (t->stored == SafetensorsDType::F8_E4M3 || t->stored == SafetensorsDType::F8_E5M2);
}

// One scale of an FP8 checkpoint as f32 (F32, F16 and BF16 are all exact in f32).
float scale_at(const SafetensorsTensor& t, int64_t i) {
  if (t.stored == SafetensorsDType::F32) {
    float v;
    std::memcpy(&v, t.data + 4 * i, 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, t.data + 2 * i, 2);
  return t.stored == SafetensorsDType::F16 ? fp16_to_f32(b) : f32_from_bits(static_cast<uint32_t>(b) << 16);
}

Fp8Matrix load_fp8(const Reader& rd, const WeightQuantConfig& cfg, int64_t n, int64_t k) {
  const SafetensorsTensor* raw = rd.find("weight");
  if (raw->stored == SafetensorsDType::F8_E5M2)
    fail(rd.st.name(), ": tensor '", raw->name,
         "' has type F8_E5M2: only E4M3 (F8_E4M3) weights are supported, as vLLM loads them");
  const auto& wt = rd.need("weight", {SafetensorsDType::F8_E4M3}, {n, k});
  const SafetensorsTensor* sc = rd.find("weight_scale");
  if (!sc && rd.find("weight_scale_inv"))
    fail(rd.what(), ": has weight_scale_inv (block-wise FP8 scales, DeepSeek-V3 style), which are not supported");
  if (!sc) fail(rd.st.name(), ": missing tensor '", rd.prefix, ".weight_scale'");
  const auto float_types = {SafetensorsDType::F32, SafetensorsDType::F16, SafetensorsDType::BF16};
  // Per tensor: [], [1] or [1, 1]; per output row: [N] or [N, 1].
  const bool per_tensor = sc->n_elements() == 1 && sc->shape.size() <= 2;
  const bool per_row = sc->shape == std::vector<int64_t>{n} || sc->shape == std::vector<int64_t>{n, 1};
  const bool shape_ok = cfg.fp8_scales == Fp8ScaleStrategy::Tensor    ? per_tensor
                        : cfg.fp8_scales == Fp8ScaleStrategy::Channel ? per_row
                                                                      : per_tensor || per_row;
  if (!shape_ok)
    fail(rd.st.name(), ": tensor '", sc->name, "' has shape ", shape_of(*sc), ", expected ",
         cfg.fp8_scales == Fp8ScaleStrategy::Channel ? "" : "one scale ([] or [1])",
         cfg.fp8_scales == Fp8ScaleStrategy::Any ? " or " : "",
         cfg.fp8_scales == Fp8ScaleStrategy::Tensor
             ? ""
             : "one per output row ([" + std::to_string(n) + "] or [" + std::to_string(n) + ", 1])");
  rd.need("weight_scale", float_types, sc->shape);  // the element type
  Fp8Matrix m = make_fp8_matrix(n, k);
  const Fp8WeightLayout& l = m.layout;
  auto* scales = reinterpret_cast<float*>(m.data.get() + l.off_scales);
  for (int64_t r = 0; r < n; ++r) {
    scales[r] = scale_at(*sc, per_tensor ? 0 : r);
    if (!std::isfinite(scales[r]) || scales[r] < 0)
      fail(rd.what(), ": weight_scale ", scales[r], " (row ", r, ") is not a finite, non-negative number");
    uint8_t* row = m.data.get() + r * l.row_bytes;
    std::memcpy(row, wt.data + r * k, static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j)
      if ((row[j] & 0x7F) == 0x7F)
        fail(rd.what(), ": weight holds an E4M3 NaN (code ", int(row[j]), ") at [", r, ", ", j, "]");
  }
  // A static activation scheme's input_scale: checked, not used (FP8W quantizes each token's
  // activations with its own scale at run time; docs/design/weight-quant.md says why).
  if (cfg.static_input_scale || rd.find("input_scale")) {
    if (!rd.find("input_scale"))
      fail(rd.st.name(), ": missing tensor '", rd.prefix, ".input_scale' (the activation scheme is static)");
    const SafetensorsTensor& in = *rd.find("input_scale");
    if (in.n_elements() != 1 || in.shape.size() > 1)
      fail(rd.st.name(), ": tensor '", in.name, "' has shape ", shape_of(in), ", expected one scale ([] or [1])");
    rd.need("input_scale", float_types, in.shape);
    const float v = scale_at(in, 0);
    if (!std::isfinite(v) || v <= 0) fail(rd.what(), ": input_scale ", v, " is not a finite, positive number");
  }
  return m;
}

}  // namespace

bool load_quantized_linear(const SafetensorsModel& st, const WeightQuantConfig& cfg, const std::string& prefix,
                           int64_t rows, int64_t cols, ModelWeights& w, WeightMatrix* out) {
  const Reader rd{st, prefix};
  if (cfg.fp8) {
    if (!is_fp8_stored(rd.find("weight"))) return false;  // kept in 16 bits (ignored_layers / ignore)
    const Fp8Matrix m = load_fp8(rd, cfg, rows, cols);
    w.owners.push_back(m.data);
    w.weight_bytes += m.layout.total_bytes;
    *out = WeightMatrix{m.data.get(), DType::FP8W, rows, cols};
    return true;
  }
  GroupQuantMatrix m;
  switch (cfg.method) {
    case WeightQuantMethod::Gptq:
      if (!rd.find("qweight")) return false;
      m = load_gptq(rd, cfg, rows, cols);
      break;
    case WeightQuantMethod::Awq:
      if (!rd.find("qweight")) return false;
      m = load_awq(rd, cfg, rows, cols);
      break;
    case WeightQuantMethod::CompressedTensors:
      if (!rd.find("weight_packed")) return false;
      m = load_compressed_tensors(rd, cfg, rows, cols);
      break;
    default:
      if (rd.find("qweight") || rd.find("weight_packed") || is_fp8_stored(rd.find("weight")))
        fail(st.name(), ": '", prefix, "' is stored quantized but config.json has no quantization_config");
      return false;
  }
  w.owners.push_back(m.data);
  w.weight_bytes += m.layout.total_bytes;
  *out = WeightMatrix{m.data.get(), cfg.bits == 8 ? DType::W8G : DType::W4G, rows, cols};
  out->group_size = m.layout.group_size;
  out->gq_zeros = m.layout.has_zeros;
  out->gq_perm = m.layout.has_perm;
  return true;
}

}  // namespace tessera
