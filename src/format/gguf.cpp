#include "format/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace tessera {

namespace {

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF" read as a little-endian u32

// Limits. Real models are far below every one of them (the default model has 33 keys, 272
// tensors, a 49152-entry vocabulary); they exist so that a corrupt count cannot make us
// allocate or loop for long. Every count is also bounded by the bytes left in the file.
constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
constexpr uint64_t kMaxKeys = uint64_t{1} << 20;
constexpr uint64_t kMaxKeyLength = 65535;  // the GGUF spec's limit
constexpr uint64_t kMaxTensorNameLength = 256;
constexpr uint64_t kMaxStringLength = uint64_t{64} << 20;
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 24;
constexpr int kMaxArrayNesting = 4;
constexpr uint64_t kMaxAlignment = uint64_t{1} << 20;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

// Smallest possible encodings, used to bound counts by the bytes left before allocating.
constexpr uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;            // key length, key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name length, name, n_dims, dim, type, offset
constexpr uint64_t kMinArrayBytes = 4 + 8;                       // element type, length

// GGML's type names by id, so that a file using a type tessera lacks gets a readable message.
std::string ggml_type_label(uint32_t id) {
  static constexpr std::string_view names[] = {
      "F32",        "F16",        "Q4_0",       "Q4_1",  "Q4_2",     "Q4_3",     "Q5_0",     "Q5_1",    "Q8_0",
      "Q8_1",       "Q2_K",       "Q3_K",       "Q4_K",  "Q5_K",     "Q6_K",     "Q8_K",     "IQ2_XXS", "IQ2_XS",
      "IQ3_XXS",    "IQ1_S",      "IQ4_NL",     "IQ3_S", "IQ2_S",    "IQ4_XS",   "I8",       "I16",     "I32",
      "I64",        "F64",        "IQ1_M",      "BF16",  "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",   "TQ2_0",
      "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4", "NVFP4",    "Q1_0"};
  std::string label = "type id " + std::to_string(id);
  if (id < std::size(names)) label += " (" + std::string(names[id]) + ")";
  return label;
}

bool is_valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::F64); }

// Encoded size of a fixed-size value; 0 for STRING and ARRAY.
uint64_t fixed_size(GGUFType t) {
  switch (t) {
    case GGUFType::U8:
    case GGUFType::I8:
    case GGUFType::BOOL:
      return 1;
    case GGUFType::U16:
    case GGUFType::I16:
      return 2;
    case GGUFType::U32:
    case GGUFType::I32:
    case GGUFType::F32:
      return 4;
    case GGUFType::U64:
    case GGUFType::I64:
    case GGUFType::F64:
      return 8;
    case GGUFType::STRING:
    case GGUFType::ARRAY:
      return 0;
  }
  return 0;
}

bool is_integer(GGUFType t) {
  switch (t) {
    case GGUFType::U8:
    case GGUFType::I8:
    case GGUFType::U16:
    case GGUFType::I16:
    case GGUFType::U32:
    case GGUFType::I32:
    case GGUFType::U64:
    case GGUFType::I64:
    case GGUFType::BOOL:
      return true;
    default:
      return false;
  }
}
bool is_unsigned(GGUFType t) {
  return t == GGUFType::U8 || t == GGUFType::U16 || t == GGUFType::U32 || t == GGUFType::U64;
}
bool is_float(GGUFType t) { return t == GGUFType::F32 || t == GGUFType::F64; }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // GGUF is little-endian, as is every host tessera runs on
  return v;
}

// A bounds-checked cursor over the header. `ctx` in every call names what is being read
// ("header", "key 'general.name'", "tensor #3") for the error message.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }
  const std::string& file() const { return file_; }

  void need(uint64_t n, std::string_view ctx, std::string_view what) const {
    if (n > remaining())
      fail(file_, ": ", ctx, ": ", what, " at offset ", pos_, " needs ", n, " bytes but the file ends at ", size_,
           " (truncated)");
  }
  template <typename T>
  T read(std::string_view ctx, std::string_view what) {
    need(sizeof(T), ctx, what);
    const T v = load<T>(data_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  void skip(uint64_t n) { pos_ += n; }  // callers check with need() first

  std::string_view read_string(std::string_view ctx, std::string_view what, uint64_t max_length) {
    const uint64_t start = pos_;
    const uint64_t len = read<uint64_t>(ctx, what);
    if (len > max_length)
      fail(file_, ": ", ctx, ": ", what, " length ", len, " at offset ", start, " is over the limit of ", max_length);
    if (len > remaining())
      fail(file_, ": ", ctx, ": ", what, " length ", len, " at offset ", start, " runs past end of file (", remaining(),
           " bytes left, truncated)");
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

  GGUFType read_type(std::string_view ctx, std::string_view what) {
    const uint64_t at = pos_;
    const uint32_t t = read<uint32_t>(ctx, what);
    if (!is_valid_type(t)) fail(file_, ": ", ctx, ": unknown value type ", t, " at offset ", at);
    return static_cast<GGUFType>(t);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

int64_t read_integer(Reader& r, GGUFType t, std::string_view ctx) {
  const uint8_t* p = r.here();
  switch (t) {
    case GGUFType::I8:
      return load<int8_t>(p);
    case GGUFType::I16:
      return load<int16_t>(p);
    case GGUFType::I32:
      return load<int32_t>(p);
    case GGUFType::I64:
      return load<int64_t>(p);
    case GGUFType::U8:
      return load<uint8_t>(p);
    case GGUFType::U16:
      return load<uint16_t>(p);
    case GGUFType::U32:
      return load<uint32_t>(p);
    case GGUFType::U64: {
      const uint64_t u = load<uint64_t>(p);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(r.file(), ": ", ctx, ": u64 array element ", u, " does not fit in int64");
      return static_cast<int64_t>(u);
    }
    case GGUFType::BOOL: {
      const uint8_t b = *p;
      if (b > 1) fail(r.file(), ": ", ctx, ": bool value ", int{b}, " is neither 0 nor 1");
      return b;
    }
    default:
      return 0;
  }
}

double read_floating(const uint8_t* p, GGUFType t) {
  return t == GGUFType::F32 ? static_cast<double>(load<float>(p)) : load<double>(p);
}

// Walks over a nested array without storing it (GGUFValue has no place for nested contents);
// every length is still checked against the bytes left.
void skip_array(Reader& r, std::string_view ctx, int depth) {
  if (depth > kMaxArrayNesting) fail(r.file(), ": ", ctx, ": arrays nested deeper than ", kMaxArrayNesting, " levels");
  const GGUFType elem = r.read_type(ctx, "array element type");
  const uint64_t len = r.read<uint64_t>(ctx, "array length");
  if (len > kMaxArrayLength)
    fail(r.file(), ": ", ctx, ": array length ", len, " is over the limit of ", kMaxArrayLength);
  const uint64_t esize = fixed_size(elem);
  if (esize != 0) {
    r.need(len * esize, ctx, "array data");
    if (elem == GGUFType::BOOL) {
      for (uint64_t i = 0; i < len; ++i, r.skip(1)) read_integer(r, elem, ctx);  // checks 0 or 1
    } else {
      r.skip(len * esize);
    }
  } else if (elem == GGUFType::STRING) {
    r.need(len * 8, ctx, "array of string lengths");
    for (uint64_t i = 0; i < len; ++i) r.read_string(ctx, "array string", kMaxStringLength);
  } else {
    r.need(len * kMinArrayBytes, ctx, "nested arrays");
    for (uint64_t i = 0; i < len; ++i) skip_array(r, ctx, depth + 1);
  }
}

void read_array(Reader& r, GGUFValue& v, std::string_view ctx) {
  v.elem_type = r.read_type(ctx, "array element type");
  const uint64_t len = r.read<uint64_t>(ctx, "array length");
  if (len > kMaxArrayLength)
    fail(r.file(), ": ", ctx, ": array length ", len, " is over the limit of ", kMaxArrayLength);
  v.array_len = len;
  const GGUFType elem = v.elem_type;
  if (elem == GGUFType::STRING) {
    // Each string takes at least its 8-byte length: bound the count before reserving.
    if (len * 8 > r.remaining())
      fail(r.file(), ": ", ctx, ": array of ", len, " strings runs past end of file (", r.remaining(),
           " bytes left, truncated)");
    v.strs.reserve(len);
    for (uint64_t i = 0; i < len; ++i) v.strs.push_back(r.read_string(ctx, "array string", kMaxStringLength));
  } else if (elem == GGUFType::ARRAY) {
    r.need(len * kMinArrayBytes, ctx, "nested arrays");
    for (uint64_t i = 0; i < len; ++i) skip_array(r, ctx, 2);
  } else {
    const uint64_t esize = fixed_size(elem);
    if (len * esize > r.remaining())
      fail(r.file(), ": ", ctx, ": array of ", len, " ", gguf_type_name(elem), " runs past end of file (",
           r.remaining(), " bytes left, truncated)");
    if (is_float(elem)) {
      v.floats.resize(len);
      for (uint64_t i = 0; i < len; ++i, r.skip(esize)) v.floats[i] = read_floating(r.here(), elem);
    } else {
      v.ints.resize(len);
      for (uint64_t i = 0; i < len; ++i, r.skip(esize)) v.ints[i] = read_integer(r, elem, ctx);
    }
  }
}

GGUFValue read_value(Reader& r, GGUFType type, std::string_view ctx) {
  GGUFValue v;
  v.type = type;
  if (type == GGUFType::STRING) {
    v.str = r.read_string(ctx, "string value", kMaxStringLength);
  } else if (type == GGUFType::ARRAY) {
    read_array(r, v, ctx);
  } else {
    const uint64_t n = fixed_size(type);
    r.need(n, ctx, "value");
    if (is_float(type)) {
      v.f = read_floating(r.here(), type);
    } else if (type == GGUFType::U64) {
      v.u = load<uint64_t>(r.here());
    } else if (is_unsigned(type)) {
      v.u = static_cast<uint64_t>(read_integer(r, type, ctx));
    } else {
      v.i = read_integer(r, type, ctx);
    }
    r.skip(n);
  }
  return v;
}

std::string quoted(std::string_view kind, std::string_view name) {
  std::string s(kind);
  s += " '";
  s += name;
  s += "'";
  return s;
}

}  // namespace

std::string gguf_type_name(GGUFType type, GGUFType elem_type) {
  static constexpr std::string_view names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  const auto name = [](GGUFType t) -> std::string {
    const auto i = static_cast<uint32_t>(t);
    return i < std::size(names) ? std::string(names[i]) : "type " + std::to_string(i);
  };
  if (type == GGUFType::ARRAY) return "array of " + name(elem_type);
  return name(type);
}

int64_t GGUFTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded when the file was read
  return n;
}

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->file_ = std::make_unique<MappedFile>(path);
  f->name_ = path;
  f->parse_image(f->file_->data(), f->file_->size());
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::parse(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->name_ = std::move(name);
  f->parse_image(data, size);
  return f;
}

void GGUFFile::parse_image(const uint8_t* data, size_t size) {
  static const uint8_t kEmpty = 0;
  if (data == nullptr) data = &kEmpty;  // an empty map; size is 0 and nothing is read
  Reader r(data, size, name_);

  // Header: magic, version, counts.
  r.need(4, "header", "magic");
  if (load<uint32_t>(data) != kMagic) {
    fail(name_, ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
  }
  r.skip(4);
  version_ = r.read<uint32_t>("header", "version");
  if (version_ == 1) fail(name_, ": GGUF version 1 is not supported (only versions 2 and 3)");
  if (version_ != 2 && version_ != 3) {
    // A big-endian file's version reads byte-swapped; say so rather than "unknown version".
    if (version_ == 0x02000000u || version_ == 0x03000000u) fail(name_, ": big-endian GGUF files are not supported");
    fail(name_, ": unknown GGUF version ", version_, " (only versions 2 and 3)");
  }
  const uint64_t n_tensors = r.read<uint64_t>("header", "tensor count");
  const uint64_t n_keys = r.read<uint64_t>("header", "metadata key count");
  if (n_tensors > kMaxTensors) fail(name_, ": tensor count ", n_tensors, " is over the limit of ", kMaxTensors);
  if (n_keys > kMaxKeys) fail(name_, ": metadata key count ", n_keys, " is over the limit of ", kMaxKeys);
  if (n_keys * kMinKeyValueBytes + n_tensors * kMinTensorInfoBytes > r.remaining())
    fail(name_, ": ", n_keys, " metadata keys and ", n_tensors, " tensors cannot fit in the ", r.remaining(),
         " bytes left after the header (truncated or corrupt counts)");

  // Metadata.
  for (uint64_t k = 0; k < n_keys; ++k) {
    const std::string ctx_index = "metadata key #" + std::to_string(k);
    const std::string_view key = r.read_string(ctx_index, "key", kMaxKeyLength);
    if (key.empty()) fail(name_, ": ", ctx_index, ": empty key");
    const std::string ctx = quoted("key", key);
    if (kv_.find(key) != kv_.end()) fail(name_, ": ", ctx, ": duplicate key");
    const GGUFType type = r.read_type(ctx, "value type");
    kv_.emplace(std::string(key), read_value(r, type, ctx));
  }

  // Alignment of the data section and of every tensor in it.
  if (const GGUFValue* a = find("general.alignment")) {
    if (!is_integer(a->type) || a->type == GGUFType::BOOL)
      fail(name_, ": key 'general.alignment' has type ", gguf_type_name(a->type, a->elem_type),
           ", expected an unsigned integer");
    if (!is_unsigned(a->type) && a->i < 0) fail(name_, ": key 'general.alignment': value ", a->i, " is negative");
    const uint64_t align = is_unsigned(a->type) ? a->u : static_cast<uint64_t>(a->i);
    if (align == 0) fail(name_, ": key 'general.alignment': value is 0");
    if ((align & (align - 1)) != 0) fail(name_, ": key 'general.alignment': value ", align, " is not a power of two");
    if (align > kMaxAlignment)
      fail(name_, ": key 'general.alignment': value ", align, " is over the limit of ", kMaxAlignment);
    alignment_ = align;
  } else {
    alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  tensors_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    const std::string ctx_index = "tensor #" + std::to_string(t);
    const std::string_view tname = r.read_string(ctx_index, "name", kMaxTensorNameLength);
    if (tname.empty()) fail(name_, ": ", ctx_index, ": empty tensor name");
    const std::string ctx = quoted("tensor", tname);
    if (tensor_index_.find(tname) != tensor_index_.end()) fail(name_, ": ", ctx, ": duplicate tensor name");

    GGUFTensorInfo info;
    info.name = std::string(tname);
    const uint32_t n_dims = r.read<uint32_t>(ctx, "n_dims");
    if (n_dims < 1 || n_dims > kMaxDims) fail(name_, ": ", ctx, ": n_dims ", n_dims, " is outside 1..", kMaxDims);
    info.shape.resize(n_dims);
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r.read<uint64_t>(ctx, "dimension");
      if (dim == 0) fail(name_, ": ", ctx, ": dimension ", d, " is 0");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(name_, ": ", ctx, ": dimension ", d, " is ", dim, ", over the int64 limit (negative?)");
      info.shape[d] = static_cast<int64_t>(dim);
      if (__builtin_mul_overflow(n_elements, info.shape[d], &n_elements))
        fail(name_, ": ", ctx, ": element count overflows int64");
    }

    const uint32_t type_id = r.read<uint32_t>(ctx, "type");
    info.dtype = dtype_from_ggml_id(type_id);
    if (info.dtype == DType::Unknown)
      fail(name_, ": ", ctx, ": unknown tensor ", ggml_type_label(type_id), ", not supported by tessera");
    const DTypeTraits& traits = dtype_traits(info.dtype);
    if (!traits.supported) fail(name_, ": ", ctx, ": tensor type ", traits.name, " is not supported by tessera");
    if (info.shape[0] % traits.block_elems != 0)
      fail(name_, ": ", ctx, ": row length ", info.shape[0], " is not a multiple of the ", traits.name, " block size ",
           traits.block_elems);
    // n_bytes = blocks per row * block bytes * rows; each product checked.
    uint64_t n_bytes = static_cast<uint64_t>(info.shape[0] / traits.block_elems);
    bool overflow = __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(traits.block_bytes), &n_bytes);
    for (uint32_t d = 1; d < n_dims; ++d)
      overflow |= __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(info.shape[d]), &n_bytes);
    if (overflow) fail(name_, ": ", ctx, ": byte size overflows 64 bits");
    info.n_bytes = n_bytes;

    info.offset = r.read<uint64_t>(ctx, "data offset");
    if (info.offset % alignment_ != 0)
      fail(name_, ": ", ctx, ": data offset ", info.offset, " is not a multiple of the alignment ", alignment_);
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // Data section: starts at the header's end rounded up to the alignment.
  const uint64_t header_end = r.pos();
  const uint64_t data_start = (header_end + alignment_ - 1) / alignment_ * alignment_;
  for (GGUFTensorInfo& info : tensors_) {
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_start, info.offset, &begin) || __builtin_add_overflow(begin, info.n_bytes, &end))
      fail(name_, ": ", quoted("tensor", info.name), ": data offset ", info.offset, " + ", info.n_bytes,
           " bytes overflows 64 bits");
    if (end > size)
      fail(name_, ": ", quoted("tensor", info.name), ": data [", begin, ", ", end, ") runs past end of file (size ",
           size, ")");
    info.data = data + begin;
  }

  // No two tensors may share bytes.
  std::vector<const GGUFTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GGUFTensorInfo& info : tensors_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GGUFTensorInfo* a, const GGUFTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GGUFTensorInfo& prev = *by_offset[i - 1];
    const GGUFTensorInfo& next = *by_offset[i];
    if (prev.offset + prev.n_bytes > next.offset)
      fail(name_, ": ", quoted("tensor", next.name), ": data at offset ", next.offset, " overlaps ",
           quoted("tensor", prev.name), " [", prev.offset, ", ", prev.offset + prev.n_bytes, ")");
  }
}

bool GGUFFile::has(std::string_view key) const { return kv_.find(key) != kv_.end(); }

const GGUFValue* GGUFFile::find(std::string_view key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GGUFTensorInfo* GGUFFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<int64_t> GGUFFile::get_int(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer(v->type))
    fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected an integer");
  if (!is_unsigned(v->type)) return v->i;
  if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail(name_, ": key '", key, "': value ", v->u, " does not fit in int64");
  return static_cast<int64_t>(v->u);
}

std::optional<double> GGUFFile::get_float(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (is_float(v->type)) return v->f;
  if (is_integer(v->type) && v->type != GGUFType::BOOL)
    return is_unsigned(v->type) ? static_cast<double>(v->u) : static_cast<double>(v->i);
  fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected a number");
}

std::optional<bool> GGUFFile::get_bool(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GGUFType::BOOL)
    fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected bool");
  return v->i != 0;
}

std::optional<std::string_view> GGUFFile::get_string(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GGUFType::STRING)
    fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected string");
  return v->str;
}

const std::vector<std::string_view>& GGUFFile::get_string_array(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) fail(name_, ": missing key '", key, "'");
  if (v->type != GGUFType::ARRAY || v->elem_type != GGUFType::STRING)
    fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected array of string");
  return v->strs;
}

const std::vector<int64_t>& GGUFFile::get_int_array(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) fail(name_, ": missing key '", key, "'");
  if (v->type != GGUFType::ARRAY || !is_integer(v->elem_type))
    fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected array of integers");
  return v->ints;
}

const std::vector<double>& GGUFFile::get_float_array(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) fail(name_, ": missing key '", key, "'");
  if (v->type != GGUFType::ARRAY || !is_float(v->elem_type))
    fail(name_, ": key '", key, "' has type ", gguf_type_name(v->type, v->elem_type), ", expected array of f32 or f64");
  return v->floats;
}

}  // namespace tessera
