#pragma once
// Writes a safetensors file: the 8-byte header length, the JSON header (padded with spaces
// to a multiple of 8, as the reference writer does), then the tensors' bytes in the order given.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "format/safetensors.h"

namespace tessera {

struct SafetensorsOutTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t n_bytes = 0;  // must equal the shape's elements times the dtype's size
};

// Throws tessera::Error naming the tensor (size mismatch, duplicate name) or the file (I/O).
void write_safetensors(const std::string& path, std::span<const SafetensorsOutTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace tessera
