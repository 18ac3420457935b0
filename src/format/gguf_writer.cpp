// GGUF v3 writer (format/gguf_writer.h): header, key/values, tensor infos, then the data, each
// tensor at an offset that is a multiple of the alignment, as the reader (gguf.cpp) checks.
#include "format/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tessera {

namespace {

class Out {
 public:
  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = buf.size();
    buf.resize(at + n);
    std::memcpy(buf.data() + at, p, n);
  }
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  std::vector<uint8_t> buf;
};

void put_scalar(Out& o, GGUFType t, const GGUFValue& v, int64_t i, double f) {
  switch (t) {
    case GGUFType::U8:
      return o.put<uint8_t>(static_cast<uint8_t>(i));
    case GGUFType::I8:
      return o.put<int8_t>(static_cast<int8_t>(i));
    case GGUFType::U16:
      return o.put<uint16_t>(static_cast<uint16_t>(i));
    case GGUFType::I16:
      return o.put<int16_t>(static_cast<int16_t>(i));
    case GGUFType::U32:
      return o.put<uint32_t>(static_cast<uint32_t>(i));
    case GGUFType::I32:
      return o.put<int32_t>(static_cast<int32_t>(i));
    case GGUFType::U64:
      return o.put<uint64_t>(static_cast<uint64_t>(i));
    case GGUFType::I64:
      return o.put<int64_t>(i);
    case GGUFType::BOOL:
      return o.put<uint8_t>(i ? 1 : 0);
    case GGUFType::F32:
      return o.put<float>(static_cast<float>(f));
    case GGUFType::F64:
      return o.put<double>(f);
    default:
      (void)v;
      fail("gguf writer: ", gguf_type_name(t), " is not a scalar type");
  }
}

// A scalar's value as the reader stored it: unsigned types in u, signed and BOOL in i.
int64_t scalar_int(const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::U8:
    case GGUFType::U16:
    case GGUFType::U32:
    case GGUFType::U64:
      return static_cast<int64_t>(v.u);
    default:
      return v.i;
  }
}

void put_value(Out& o, const std::string& key, const GGUFValue& v) {
  o.put<uint32_t>(static_cast<uint32_t>(v.type));
  if (v.type == GGUFType::STRING) return o.str(v.str);
  if (v.type != GGUFType::ARRAY) return put_scalar(o, v.type, v, scalar_int(v), v.f);
  o.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
  if (v.elem_type == GGUFType::STRING) {
    o.put<uint64_t>(v.strs.size());
    for (std::string_view s : v.strs) o.str(s);
  } else if (v.elem_type == GGUFType::F32 || v.elem_type == GGUFType::F64) {
    o.put<uint64_t>(v.floats.size());
    for (double f : v.floats) put_scalar(o, v.elem_type, v, 0, f);
  } else if (v.elem_type == GGUFType::ARRAY) {
    fail("gguf writer: key '", key, "' is an array of arrays, which is not written");
  } else {
    o.put<uint64_t>(v.ints.size());
    for (int64_t i : v.ints) put_scalar(o, v.elem_type, v, i, 0);
  }
}

uint64_t alignment_of(const std::vector<std::pair<std::string, GGUFValue>>& kv) {
  for (const auto& [k, v] : kv)
    if (k == "general.alignment") {
      const uint64_t a = static_cast<uint64_t>(scalar_int(v));
      TESSERA_CHECK(a > 0 && (a & (a - 1)) == 0, "gguf writer: general.alignment ", a, " is not a power of two");
      return a;
    }
  return 32;
}

}  // namespace

void GGUFWriter::set(const std::string& key, const GGUFValue& value) {
  TESSERA_CHECK(!(value.type == GGUFType::ARRAY && value.elem_type == GGUFType::ARRAY), "gguf writer: key '", key,
                "' is an array of arrays, which is not written");
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = value;
      return;
    }
  kv_.emplace_back(key, value);
}

void GGUFWriter::set_string(const std::string& key, std::string_view value) {
  GGUFValue v;
  v.type = GGUFType::STRING;
  v.str = value;
  set(key, v);
}

void GGUFWriter::set_u32(const std::string& key, uint32_t value) {
  GGUFValue v;
  v.type = GGUFType::U32;
  v.u = value;
  set(key, v);
}

void GGUFWriter::add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
                            uint64_t n_bytes) {
  const DTypeTraits& tr = dtype_traits(dtype);
  TESSERA_CHECK(static_cast<uint32_t>(dtype) < 0x100 && tr.block_elems > 0, "gguf writer: tensor '", name, "': type ",
                dtype_name(dtype), " has no GGML id");
  TESSERA_CHECK(!shape.empty() && shape.size() <= 4 && shape[0] % tr.block_elems == 0, "gguf writer: tensor '", name,
                "': bad shape for ", dtype_name(dtype));
  uint64_t expect = static_cast<uint64_t>(shape[0] / tr.block_elems * tr.block_bytes);
  for (size_t d = 1; d < shape.size(); ++d) expect *= static_cast<uint64_t>(shape[d]);
  TESSERA_CHECK(expect == n_bytes, "gguf writer: tensor '", name, "': ", n_bytes, " bytes, its shape needs ", expect);
  tensors_.push_back({name, dtype, shape, data, n_bytes});
}

void GGUFWriter::write(const std::string& path) const {
  const uint64_t align = alignment_of(kv_);
  Out o;
  o.bytes("GGUF", 4);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    o.str(k);
    put_value(o, k, v);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    o.str(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) o.put<uint64_t>(static_cast<uint64_t>(d));
    o.put<uint32_t>(static_cast<uint32_t>(t.dtype));
    o.put<uint64_t>(offset);
    offset += (t.n_bytes + align - 1) / align * align;
  }
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TESSERA_CHECK(f, "gguf writer: cannot create ", tmp);
  bool ok = std::fwrite(o.buf.data(), 1, o.buf.size(), f) == o.buf.size();
  static const uint8_t zeros[4096] = {};
  auto pad_to = [&](uint64_t written) {
    for (uint64_t pad = (align - written % align) % align; ok && pad > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof zeros));
      ok = std::fwrite(zeros, 1, n, f) == n;
      pad -= n;
    }
  };
  pad_to(o.buf.size());
  for (const Tensor& t : tensors_) {
    ok = ok && std::fwrite(t.data, 1, t.n_bytes, f) == t.n_bytes;
    pad_to(t.n_bytes);
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail("gguf writer: writing ", tmp, " failed");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace tessera
