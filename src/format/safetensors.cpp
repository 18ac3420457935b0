#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/error.h"

namespace tessera {

namespace {

using json = nlohmann::json;

// The format's own reader refuses headers over 100 MB; a real one is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kMaxIndexBytes = 100'000'000;
constexpr size_t kMaxDims = 8;  // the format has no limit; no model tensor comes close

struct DTypeInfo {
  std::string_view name;
  SafetensorsDType type;
  int64_t size;
  DType compute;
};
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", SafetensorsDType::BOOL, 1, DType::Unknown},
    {"U8", SafetensorsDType::U8, 1, DType::Unknown},
    {"I8", SafetensorsDType::I8, 1, DType::Unknown},
    {"F8_E4M3", SafetensorsDType::F8_E4M3, 1, DType::Unknown},
    {"F8_E5M2", SafetensorsDType::F8_E5M2, 1, DType::Unknown},
    {"U16", SafetensorsDType::U16, 2, DType::Unknown},
    {"I16", SafetensorsDType::I16, 2, DType::Unknown},
    {"F16", SafetensorsDType::F16, 2, DType::F16},
    {"BF16", SafetensorsDType::BF16, 2, DType::BF16},
    {"U32", SafetensorsDType::U32, 4, DType::Unknown},
    {"I32", SafetensorsDType::I32, 4, DType::Unknown},
    {"F32", SafetensorsDType::F32, 4, DType::F32},
    {"U64", SafetensorsDType::U64, 8, DType::Unknown},
    {"I64", SafetensorsDType::I64, 8, DType::Unknown},
    {"F64", SafetensorsDType::F64, 8, DType::Unknown},
};
static_assert(std::size(kDTypes) == static_cast<size_t>(SafetensorsDType::F64) + 1);

const DTypeInfo* dtype_by_name(std::string_view name) {
  for (const DTypeInfo& d : kDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

// A non-negative JSON integer, or an error naming `ctx` and `what`.
uint64_t json_uint(const json& v, const std::string& file, const std::string& ctx, std::string_view what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail(file, ": ", ctx, ": ", what, " ", v.get<int64_t>(), " is negative");
  fail(file, ": ", ctx, ": ", what, " is ", v.dump(), ", expected a non-negative integer");
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDType t) { return kDTypes[static_cast<size_t>(t)].name; }
int64_t safetensors_dtype_size(SafetensorsDType t) { return kDTypes[static_cast<size_t>(t)].size; }

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded when the file was read
  return n;
}

void require_supported_dtype(const SafetensorsTensor& t, std::string_view file) {
  if (!t.supported())
    fail(file, ": tensor '", t.name, "' has dtype ", safetensors_dtype_name(t.stored),
         ", which tessera cannot compute with (only F32, F16 and BF16)");
}

json parse_model_json(std::string_view text, std::string_view file, int max_depth) {
  // Keys seen in each object still open, innermost last; nesting depth of all containers.
  std::vector<std::unordered_set<std::string>> open_objects;
  int depth = 0;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (++depth > max_depth) fail(file, ": JSON nested deeper than ", max_depth, " levels");
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        --depth;
        open_objects.pop_back();
        break;
      case json::parse_event_t::array_end:
        --depth;
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open_objects.back().insert(key).second) fail(file, ": duplicate key '", key, "' in JSON");
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    fail(file, ": invalid JSON: ", e.what());
  }
}

// ---------------------------------------------------------------------------------------
// One file.

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->file_ = std::make_unique<MappedFile>(path);
  f->name_ = path;
  f->parse_image(f->file_->data(), f->file_->size());
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  f->parse_image(data, size);
  return f;
}

void SafetensorsFile::parse_image(const uint8_t* data, size_t size) {
  if (size < 8) fail(name_, ": file is ", size, " bytes, too short for the 8-byte header length (truncated)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);  // little-endian
  if (header_len > size - 8)
    fail(name_, ": header length ", header_len, " runs past end of file (size ", size, ", truncated)");
  if (header_len > kMaxHeaderBytes)
    fail(name_, ": header length ", header_len, " is over the limit of ", kMaxHeaderBytes);
  const std::string_view text(reinterpret_cast<const char*>(data + 8), header_len);
  const json header = parse_model_json(text, name_);
  if (!header.is_object()) fail(name_, ": header is not a JSON object");

  const uint8_t* base = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      if (!entry.is_object()) fail(name_, ": '__metadata__' is not a JSON object");
      for (const auto& [mkey, mvalue] : entry.items()) {
        if (!mvalue.is_string())
          fail(name_, ": '__metadata__' entry '", mkey, "' is ", mvalue.type_name(), ", expected a string");
        metadata_.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    if (key.empty()) fail(name_, ": a tensor has an empty name");
    const std::string ctx = "tensor '" + key + "'";
    if (!entry.is_object()) fail(name_, ": ", ctx, ": entry is ", entry.type_name(), ", expected an object");
    SafetensorsTensor t;
    t.name = key;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) fail(name_, ": ", ctx, ": missing or non-string 'dtype'");
    const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
    const DTypeInfo* dtype = dtype_by_name(dtype_name);
    if (!dtype) fail(name_, ": ", ctx, ": unknown dtype '", dtype_name, "'");
    t.stored = dtype->type;
    t.dtype = dtype->compute;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) fail(name_, ": ", ctx, ": missing or non-array 'shape'");
    if (shape_it->size() > kMaxDims)
      fail(name_, ": ", ctx, ": ", shape_it->size(), " dimensions, over the limit of ", kMaxDims);
    uint64_t n_elements = 1;
    bool overflow = false;
    for (size_t d = 0; d < shape_it->size(); ++d) {
      const uint64_t dim = json_uint((*shape_it)[d], name_, ctx, "dimension " + std::to_string(d));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(name_, ": ", ctx, ": dimension ", d, " is ", dim, ", over the int64 limit");
      t.shape.push_back(static_cast<int64_t>(dim));
      overflow |= __builtin_mul_overflow(n_elements, dim, &n_elements);
    }
    uint64_t n_bytes = 0;
    overflow |= __builtin_mul_overflow(n_elements, static_cast<uint64_t>(dtype->size), &n_bytes);
    if (overflow || n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(name_, ": ", ctx, ": element count or byte size overflows 64 bits");

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      fail(name_, ": ", ctx, ": 'data_offsets' must be an array of two integers [begin, end]");
    const uint64_t begin = json_uint((*offsets_it)[0], name_, ctx, "data offset begin");
    const uint64_t end = json_uint((*offsets_it)[1], name_, ctx, "data offset end");
    if (begin > end) fail(name_, ": ", ctx, ": data offsets [", begin, ", ", end, ") are reversed");
    if (end > data_size)
      fail(name_, ": ", ctx, ": data [", begin, ", ", end, ") runs past the end of the data (", data_size, " bytes)");
    if (end - begin != n_bytes)
      fail(name_, ": ", ctx, ": data [", begin, ", ", end, ") holds ", end - begin, " bytes but shape ",
           shape_it->dump(), " of ", dtype->name, " needs ", n_bytes);
    t.data = base + begin;
    t.n_bytes = n_bytes;
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.data != b.data ? a.data < b.data : a.n_bytes < b.n_bytes;
  });
  // No two tensors may share bytes (empty tensors share none).
  const SafetensorsTensor* prev = nullptr;
  for (const SafetensorsTensor& t : tensors_) {
    if (t.n_bytes == 0) continue;
    if (prev && prev->data + prev->n_bytes > t.data)
      fail(name_, ": tensor '", t.name, "': data at offset ", t.data - base, " overlaps tensor '", prev->name, "' [",
           prev->data - base, ", ", prev->data - base + prev->n_bytes, ")");
    prev = &t;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const SafetensorsTensor* SafetensorsFile::find_tensor(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsTensor* t = find_tensor(name);
  if (!t) fail(name_, ": no tensor '", name, "'");
  require_supported_dtype(*t, name_);
  return *t;
}

// ---------------------------------------------------------------------------------------
// A model directory.

std::unique_ptr<SafetensorsModel> SafetensorsModel::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::unique_ptr<SafetensorsModel> m(new SafetensorsModel());
  m->name_ = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path single = fs::path(path) / "model.safetensors";
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single, ec)) {
      m->add_file(SafetensorsFile::open(single.string()));
    } else if (fs::exists(index, ec)) {
      m->open_index(index.string());
    } else {
      fail(path, ": no model.safetensors or model.safetensors.index.json in this directory");
    }
  } else if (ends_with(path, ".index.json")) {
    m->open_index(path);
  } else {
    m->add_file(SafetensorsFile::open(path));
  }
  return m;
}

void SafetensorsModel::add_file(std::unique_ptr<SafetensorsFile> file) {
  for (const SafetensorsTensor& t : file->tensors()) tensors_.emplace(t.name, &t);
  shards_.push_back(std::move(file));
}

void SafetensorsModel::open_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  const MappedFile file(index_path);
  if (file.size() > kMaxIndexBytes)
    fail(index_path, ": ", file.size(), " bytes, over the limit of ", kMaxIndexBytes, " for an index");
  const json index =
      parse_model_json(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()), index_path);
  if (!index.is_object()) fail(index_path, ": not a JSON object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) fail(index_path, ": missing or non-object 'weight_map'");
  if (map_it->empty()) fail(index_path, ": 'weight_map' lists no tensors");

  // shard file name -> the tensors the index puts in it
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string()) fail(index_path, ": 'weight_map' entry '", tensor, "' is not a string");
    const std::string& s = shard.get_ref<const std::string&>();
    // Shards are plain file names beside the index: nothing may point elsewhere.
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\0') != std::string::npos)
      fail(index_path, ": tensor '", tensor, "': shard name '", s, "' is not a plain file name");
    by_shard[s].push_back(tensor);
  }

  const fs::path dir = fs::path(index_path).parent_path();
  for (const auto& [shard_name, listed] : by_shard) {
    auto shard = SafetensorsFile::open((dir / shard_name).string());
    for (const std::string& t : listed)
      if (!shard->find_tensor(t))
        fail(index_path, ": tensor '", t, "' is mapped to '", shard_name, "', which does not contain it");
    for (const SafetensorsTensor& t : shard->tensors()) {
      const auto it = map_it->find(t.name);
      if (it == map_it->end()) fail(shard->name(), ": tensor '", t.name, "' is not listed in ", index_path);
      if (it->get_ref<const std::string&>() != shard_name)
        fail(shard->name(), ": tensor '", t.name, "' is listed in ", index_path, " as being in '",
             it->get_ref<const std::string&>(), "'");
    }
    add_file(std::move(shard));
  }
}

const SafetensorsTensor* SafetensorsModel::find_tensor(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const SafetensorsTensor& SafetensorsModel::tensor(std::string_view name) const {
  const SafetensorsTensor* t = find_tensor(name);
  if (!t) fail(name_, ": no tensor '", name, "'");
  // Name the shard that holds it.
  for (const auto& shard : shards_)
    if (shard->find_tensor(name) == t) require_supported_dtype(*t, shard->name());
  return *t;
}

}  // namespace tessera
