#pragma once
// GGUF v3 (and v2) reader. The file is memory-mapped; tensor data is used in place.
// Every count, length, offset, size and alignment is validated before use, and a bad file
// is rejected with a tessera::Error naming the problem (see docs/design/model-files.md).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace tessera {

enum class GGUFType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

// One metadata value. Scalars are widened (integers to int64/uint64, floats to double);
// strings and string arrays are views into the mapped file.
struct GGUFValue {
  GGUFType type = GGUFType::U8;
  GGUFType elem_type = GGUFType::U8;   // for ARRAY
  int64_t i = 0;                       // signed integers and BOOL
  uint64_t u = 0;                      // unsigned integers
  double f = 0;                        // F32, F64
  std::string_view str;                // STRING
  std::vector<std::string_view> strs;  // ARRAY of STRING
  std::vector<int64_t> ints;           // ARRAY of integers or BOOL
  std::vector<double> floats;          // ARRAY of F32/F64
  uint64_t array_len = 0;              // ARRAY
};

struct GGUFTensorInfo {
  std::string name;
  DType dtype = DType::Unknown;
  std::vector<int64_t> shape;  // GGML order: shape[0] is the innermost (row length)
  uint64_t offset = 0;         // relative to the data section
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  int64_t n_elements() const;
};

class GGUFFile {
 public:
  // Maps and validates the file. Throws tessera::Error on any problem.
  static std::unique_ptr<GGUFFile> open(const std::string& path);
  // Parses an in-memory image (tests and fuzzing). The bytes must outlive the object.
  static std::unique_ptr<GGUFFile> parse(const uint8_t* data, size_t size, std::string name = "<memory>");

  uint32_t version() const { return version_; }
  const std::string& name() const { return name_; }
  uint64_t alignment() const { return alignment_; }

  bool has(std::string_view key) const;
  const GGUFValue* find(std::string_view key) const;
  // Typed getters: nullopt when the key is missing; throws when present with the wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;   // any integer type or BOOL
  std::optional<double> get_float(std::string_view key) const;  // F32/F64 (integers widen)
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  // Throws when missing or of another type; the message names the key.
  const std::vector<std::string_view>& get_string_array(std::string_view key) const;
  const std::vector<int64_t>& get_int_array(std::string_view key) const;
  const std::vector<double>& get_float_array(std::string_view key) const;
  const std::map<std::string, GGUFValue, std::less<>>& metadata() const { return kv_; }

  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent

 private:
  GGUFFile() = default;
  void parse_image(const uint8_t* data, size_t size);

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GGUFValue, std::less<>> kv_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// "u32", "string", "array of f32", ... for messages.
std::string gguf_type_name(GGUFType type, GGUFType elem_type = GGUFType::U8);

// Checks the tokenizer arrays of a model file: `tokenizer.ggml.tokens` is a non-empty string
// array; `scores` (floats) and `token_type` (integers), when present, have the same length;
// `merges`, when present, is a string array; every `tokenizer.ggml.*_token_id` is an integer,
// and bos, eos, eot and eom ones lie inside the vocabulary (optional ones outside it are the
// tokenizer's to warn about and reset). Throws tessera::Error naming the file, key and value.
// Tokenizer::from_gguf runs it first.
void validate_tokenizer_metadata(const GGUFFile& file);

}  // namespace tessera
