#include "backend/kv_format.h"

#include <charconv>
#include <sstream>

#include "backend/op_types.h"
#include "core/error.h"

namespace tessera {

namespace {

constexpr const char* kAccepted =
    "f16, f32, auto, fp8, fp8_e4m3, fp8_e5m2 (optionally :tensor, :head or :token), int8 (:token or :gN), "
    "int4 (:kivi or :gN), turbo2.5, turbo3, turbo3.5, turbo4 (optionally :qjl: keys with the QJL sketch, or :mse: "
    "without it, the default)";

int parse_group(std::string_view g, std::string_view name) {
  int n = 0;
  const auto* end = g.data() + g.size();
  const auto r = std::from_chars(g.data() + 1, end, n);
  TESSERA_CHECK(g.size() > 1 && g[0] == 'g' && r.ec == std::errc() && r.ptr == end && n > 0, "KV cache format '", name,
                "': group '", g, "' is not gN with N > 0");
  return n;
}

KvFormat turbo(double bits, bool qjl) {
  // Total bits per channel; keys with QJL spend one of them on the sketch. Fractional widths
  // give half the channels one bit more (bits_hi) than the other half.
  const int twice = static_cast<int>(bits * 2 + 0.5) - (qjl ? 2 : 0);
  KvFormat f;
  f.codec = KvCodec::Turbo;
  f.bits_hi = static_cast<int8_t>((twice + 1) / 2);
  f.bits_lo = static_cast<int8_t>(twice / 2);
  f.qjl = qjl;
  return f;
}

}  // namespace

DType KvFormat::plain_dtype() const {
  if (codec == KvCodec::F32) return DType::F32;
  if (codec == KvCodec::F16) return DType::F16;
  return DType::Unknown;
}

KvFormat kv_format_of(DType plain) {
  TESSERA_CHECK(plain == DType::F16 || plain == DType::F32, "KV cache: ", dtype_name(plain), " is not f16 or f32");
  KvFormat f;
  f.codec = plain == DType::F32 ? KvCodec::F32 : KvCodec::F16;
  return f;
}

KvFormat parse_kv_format(std::string_view name, bool for_keys) {
  const size_t colon = name.find(':');
  const std::string_view base = name.substr(0, colon);
  const std::string_view opt = colon == std::string_view::npos ? std::string_view() : name.substr(colon + 1);
  KvFormat f;
  if (base == "f16" || base == "auto" || base == "fp16" || base == "f32") {
    TESSERA_CHECK(opt.empty(), "KV cache format '", name, "': ", base, " takes no option");
    f.codec = base == "f32" ? KvCodec::F32 : KvCodec::F16;
    return f;
  }
  if (base == "fp8" || base == "fp8_e4m3" || base == "fp8_e5m2") {
    f.codec = base == "fp8_e5m2" ? KvCodec::Fp8E5M2 : KvCodec::Fp8E4M3;
    if (opt.empty() || opt == "tensor")
      f.scale = KvScale::Tensor;
    else if (opt == "head")
      f.scale = KvScale::Head;
    else if (opt == "token")
      f.scale = KvScale::Token;
    else
      fail("KV cache format '", name, "': fp8 scales are :tensor, :head or :token");
    return f;
  }
  if (base == "int8") {
    f.codec = KvCodec::Int8;
    if (opt.empty() || opt == "token") {
      f.scale = KvScale::Token;
    } else {
      f.scale = KvScale::Group;
      f.group = static_cast<int16_t>(parse_group(opt, name));
    }
    return f;
  }
  if (base == "int4") {
    f.codec = KvCodec::Int4;
    if (opt.empty() || opt == "kivi") {
      f.scale = for_keys ? KvScale::Channel : KvScale::Group;
      f.group = for_keys ? 0 : 32;
    } else if (opt == "channel") {
      f.scale = KvScale::Channel;
    } else {
      f.scale = KvScale::Group;
      f.group = static_cast<int16_t>(parse_group(opt, name));
    }
    return f;
  }
  if (base == "turbo2.5" || base == "turbo3" || base == "turbo3.5" || base == "turbo4") {
    // Keys default to all bits in the codes (:mse): the QJL sketch's variance costs more than
    // its bias removal gains (docs/benchmarks/kv-quant.md); :qjl asks for it.
    TESSERA_CHECK(opt.empty() || opt == "mse" || opt == "qjl", "KV cache format '", name,
                  "': turbo's options are :mse (the default) and :qjl");
    return turbo(std::stod(std::string(base.substr(5))), for_keys && opt == "qjl");
  }
  fail("KV cache format '", name, "' is not one of: ", kAccepted);
}

std::string kv_format_name(const KvFormat& f, bool for_keys) {
  switch (f.codec) {
    case KvCodec::F32:
      return "f32";
    case KvCodec::F16:
      return "f16";
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2: {
      const char* base = f.codec == KvCodec::Fp8E4M3 ? "fp8_e4m3" : "fp8_e5m2";
      const char* s = f.scale == KvScale::Head ? ":head" : f.scale == KvScale::Token ? ":token" : "";
      return std::string(base) + s;
    }
    case KvCodec::Int8:
      return f.scale == KvScale::Group ? "int8:g" + std::to_string(f.group) : std::string("int8");
    case KvCodec::Int4:
      return f.scale == KvScale::Channel ? std::string("int4:channel") : "int4:g" + std::to_string(f.group);
    case KvCodec::Turbo: {
      const int twice = f.bits_hi + f.bits_lo + (f.qjl ? 2 : 0);
      std::ostringstream s;
      s << "turbo" << twice / 2 << (twice % 2 ? ".5" : "");
      if (for_keys && f.qjl) s << ":qjl";
      return s.str();
    }
  }
  return "?";
}

void check_kv_format(const KvFormat& f, int head_dim, int block_size) {
  const std::string name = kv_format_name(f);
  TESSERA_CHECK(head_dim > 0 && block_size > 0, "KV cache format ", name, ": head_dim ", head_dim, ", block size ",
                block_size);
  if (f.scale == KvScale::Group)
    TESSERA_CHECK(f.group > 0 && head_dim % f.group == 0 && (f.codec != KvCodec::Int4 || f.group % 2 == 0),
                  "KV cache format ", name, ": group of ", f.group, " channels does not divide head_dim ", head_dim,
                  " (int4 groups are even)");
  if (f.codec == KvCodec::Int4)
    TESSERA_CHECK(head_dim % 2 == 0, "KV cache format ", name, ": head_dim ", head_dim, " is odd");
  if (f.codec == KvCodec::Turbo) {
    TESSERA_CHECK(head_dim >= 16 && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0, "KV cache format ", name,
                  ": the Walsh-Hadamard rotation needs a power-of-two head_dim in [16, 256], not ", head_dim);
    TESSERA_CHECK(f.bits_lo >= 1 && f.bits_hi <= 4 && f.bits_hi >= f.bits_lo, "KV cache format ", name,
                  ": codebook bits ", int(f.bits_hi), "/", int(f.bits_lo), " outside 1..4");
  }
}

KvPageLayout kv_page_layout(const KvFormat& f, int block_size, int head_dim) {
  KvPageLayout l;
  const int64_t bs = block_size, hd = head_dim;
  switch (f.codec) {
    case KvCodec::F32:
      l.row_bytes = 4 * hd;
      break;
    case KvCodec::F16:
      l.row_bytes = 2 * hd;
      break;
    case KvCodec::Fp8E4M3:
    case KvCodec::Fp8E5M2:
      l.row_bytes = hd;
      if (f.scale == KvScale::Token) l.meta_bytes = 2 * bs;
      break;
    case KvCodec::Int8:
      l.row_bytes = hd;
      l.meta_bytes = f.scale == KvScale::Group ? 2 * bs * (hd / f.group) : 2 * bs;
      break;
    case KvCodec::Int4:
      l.row_bytes = hd / 2;
      l.meta_bytes = f.scale == KvScale::Channel ? 4 * hd : 4 * bs * (hd / f.group);
      break;
    case KvCodec::Turbo:
      l.plane_bytes = hd / 16;  // hd/2 bits
      l.qjl_offset = l.plane_bytes * (f.bits_hi + f.bits_lo);
      l.row_bytes = l.qjl_offset + (f.qjl ? hd / 8 : 0);
      l.meta_bytes = (f.qjl ? 4 : 2) * bs;
      break;
  }
  l.meta_offset = bs * l.row_bytes;
  // Plain pages stay exactly [bs, hd] (the f16/f32 kernels index elements across pages);
  // quantized ones start 16-byte aligned for vector loads.
  l.page_bytes = f.is_plain() ? l.meta_offset : (l.meta_offset + l.meta_bytes + 15) / 16 * 16;
  return l;
}

double kv_bits_per_element(const KvFormat& f, int block_size, int head_dim) {
  const KvPageLayout l = kv_page_layout(f, block_size, head_dim);
  return 8.0 * static_cast<double>(l.page_bytes) / (static_cast<double>(block_size) * head_dim);
}

float fp8_max(KvCodec codec) { return codec == KvCodec::Fp8E5M2 ? 57344.0f : 448.0f; }

KvLayerView plain_kv_view(void* k, void* v, DType dtype, int n_blocks, int block_size, int n_kv_heads, int head_dim) {
  KvLayerView view;
  view.k = k;
  view.v = v;
  view.k_fmt = view.v_fmt = kv_format_of(dtype);
  view.n_blocks = n_blocks;
  view.block_size = block_size;
  view.n_kv_heads = n_kv_heads;
  view.head_dim = head_dim;
  view.k_page_bytes = view.v_page_bytes = kv_page_layout(view.k_fmt, block_size, head_dim).page_bytes;
  return view;
}

}  // namespace tessera
