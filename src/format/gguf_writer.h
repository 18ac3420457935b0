#pragma once
// GGUF v3 writer: metadata (the reader's GGUFValue, so a file's keys copy across as read) and
// tensors in the GGML block types, each aligned to general.alignment (32 unless the metadata
// says). What `tessera quantize` writes; read back by GGUFFile and by llama.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace tessera {

class GGUFWriter {
 public:
  // Keys are written in the order set; setting a key again replaces its value. Nested arrays
  // (which GGUFValue does not hold) are refused.
  void set(const std::string& key, const GGUFValue& value);
  void set_string(const std::string& key, std::string_view value);
  void set_u32(const std::string& key, uint32_t value);
  // A tensor of GGML type `dtype` (F32, F16, BF16 or a GGML block type), shape in GGML order
  // (shape[0] the row length); `data` holds its bytes and must outlive write().
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
                  uint64_t n_bytes);
  // Writes the file (to path + ".tmp", then renamed). Throws tessera::Error on I/O failure.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    uint64_t n_bytes;
  };
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace tessera
