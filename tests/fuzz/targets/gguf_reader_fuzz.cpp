// GGUF reader: any byte string either parses into a file whose every tensor lies inside the
// input, or is rejected with tessera::Error. Any other exception, a crash, or a read outside
// the input (ASan: libFuzzer's buffer is exactly `size` bytes) is a finding.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "format/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<tessera::GGUFFile> file;
  try {
    file = tessera::GGUFFile::parse(data, size, "fuzz.gguf");
  } catch (const tessera::Error&) {
    return 0;
  }
  volatile uint8_t sink = 0;
  for (const tessera::GGUFTensorInfo& t : file->tensors()) {
    if (t.n_bytes == 0) continue;
    // Touch the first and last byte the reader promises: out of bounds is an ASan report.
    sink = sink + t.data[0] + t.data[t.n_bytes - 1];
    if (file->find_tensor(t.name) == nullptr) __builtin_trap();
  }
  for (const auto& [key, value] : file->metadata()) {
    if (!file->has(key)) __builtin_trap();
    for (std::string_view s : value.strs) sink = sink + (s.empty() ? 0 : s.back());
  }
  try {
    tessera::validate_tokenizer_metadata(*file);
  } catch (const tessera::Error&) {
  }
  return 0;
}
