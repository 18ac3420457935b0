#include "format/safetensors_writer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tessera {

void write_safetensors(const std::string& path, std::span<const SafetensorsOutTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsOutTensor& t : tensors) {
    TESSERA_CHECK(names.insert(t.name).second, path, ": tensor '", t.name, "' written twice");
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      TESSERA_CHECK(d >= 0, path, ": tensor '", t.name, "' has a negative dimension");
      n *= static_cast<uint64_t>(d);
    }
    TESSERA_CHECK(n * static_cast<uint64_t>(safetensors_dtype_size(t.dtype)) == t.n_bytes, path, ": tensor '", t.name,
                  "' has ", t.n_bytes, " bytes for ", n, " elements of ", safetensors_dtype_name(t.dtype));
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.n_bytes}}};
    offset += t.n_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TESSERA_CHECK(out.good(), path, ": cannot open for writing");
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const SafetensorsOutTensor& t : tensors)
    out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.n_bytes));
  out.close();
  TESSERA_CHECK(out.good(), path, ": write failed");
}

}  // namespace tessera
