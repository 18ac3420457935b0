// safetensors header: any byte string either parses into tensors that lie inside the input
// or is rejected with tessera::Error (which includes JSON syntax, depth and duplicate keys).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<tessera::SafetensorsFile> file;
  try {
    file = tessera::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  } catch (const tessera::Error&) {
    return 0;
  }
  volatile uint8_t sink = 0;
  for (const tessera::SafetensorsTensor& t : file->tensors()) {
    if (t.n_bytes > 0) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
    if (file->find_tensor(t.name) != &t) __builtin_trap();
    try {
      (void)file->tensor(t.name);  // throws for dtypes tessera does not compute with
    } catch (const tessera::Error&) {
    }
  }
  return 0;
}
