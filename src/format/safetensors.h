#pragma once
// Safetensors reader: one file, or a Hugging Face model directory sharded through
// model.safetensors.index.json. Files are memory-mapped; tensor data is used in place.
// Every length, offset and size is validated before use, and a bad file is rejected with a
// tessera::Error naming the file and the tensor (see docs/design/model-files.md).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header, then the data.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]},
// offsets relative to the start of the data; "__metadata__" maps strings to strings.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace tessera {

// Every element type the format defines. Only F32, F16 and BF16 map to a tessera DType;
// the others can be read and inspected but not computed with.
enum class SafetensorsDType : uint8_t {
  BOOL,
  U8,
  I8,
  F8_E4M3,
  F8_E5M2,
  U16,
  I16,
  F16,
  BF16,
  U32,
  I32,
  F32,
  U64,
  I64,
  F64,
};
std::string_view safetensors_dtype_name(SafetensorsDType t);
int64_t safetensors_dtype_size(SafetensorsDType t);  // bytes per element

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType stored = SafetensorsDType::F32;  // as written in the file
  DType dtype = DType::Unknown;                     // F32/F16/BF16; Unknown for the others
  std::vector<int64_t> shape;                       // row-major, as written: shape.back() is the innermost (row length)
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  int64_t n_elements() const;  // 1 for a scalar (empty shape)
  bool supported() const { return dtype != DType::Unknown; }
};

class SafetensorsFile {
 public:
  // Maps and validates the file. Throws tessera::Error on any problem.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory image (tests and fuzzing). The bytes must outlive the object.
  static std::unique_ptr<SafetensorsFile> parse(const uint8_t* data, size_t size, std::string name = "<memory>");

  const std::string& name() const { return name_; }
  // In data order (sorted by offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find_tensor(std::string_view name) const;  // nullptr if absent
  // Throws when absent or when its dtype is not one tessera computes with; the message
  // names the file, the tensor and the dtype.
  const SafetensorsTensor& tensor(std::string_view name) const;
  // The "__metadata__" entries (empty when the header has none).
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse_image(const uint8_t* data, size_t size);

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

// The weights of a Hugging Face model directory, whether in one file or in shards.
class SafetensorsModel {
 public:
  // `path` is a directory holding model.safetensors (preferred, as transformers does) or
  // model.safetensors.index.json, or the path of either file. For an index, every shard it
  // names is opened once; the index and the shards must agree exactly (every listed tensor
  // is in its shard, every tensor of a shard is listed for that shard).
  static std::unique_ptr<SafetensorsModel> open(const std::string& path);

  const SafetensorsTensor* find_tensor(std::string_view name) const;  // nullptr if absent
  const SafetensorsTensor& tensor(std::string_view name) const;       // as SafetensorsFile::tensor
  // Every tensor of the model by name.
  const std::map<std::string, const SafetensorsTensor*, std::less<>>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  const std::string& name() const { return name_; }

 private:
  SafetensorsModel() = default;
  void open_index(const std::string& index_path);
  void add_file(std::unique_ptr<SafetensorsFile> file);

  std::string name_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> tensors_;
};

// Parses JSON from a model file strictly: nesting deeper than `max_depth` and duplicate keys
// in any object (which nlohmann would silently merge) are errors, as are syntax errors.
// Messages start with `file`. Shared by the safetensors, index and config.json readers.
nlohmann::json parse_model_json(std::string_view text, std::string_view file, int max_depth = 16);

// Throws unless the tensor's dtype is F32, F16 or BF16; the message names `file` and the tensor.
void require_supported_dtype(const SafetensorsTensor& t, std::string_view file);

}  // namespace tessera
