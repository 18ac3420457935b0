#pragma once
// The CUDA backend's diagnostics, chosen by the one environment variable it reads:
//
//   TESSERA_CUDA_DIAG=item[,item...]
//     profile      per-op device time, printed when the backend closes (cuda_profile.h); turns
//                  decode graphs off: the ops inside a replayed graph cannot be timed one by one
//     probe=PATH   per-block timestamps of the decode kernels, written to PATH when the backend
//                  closes (builds configured with -DTESSERA_CUDA_PROBE=ON only; probe.cuh)
//
// Nothing else in src/backend/cuda reads the environment: the kernels' choices are fixed
// (cuda_tuning.h) and the user's are command-line options (BackendOptions).
#include <string>
#include <string_view>

#include "core/error.h"

namespace tessera::cuda {

struct Diagnostics {
  bool profile = false;
  std::string probe_file;  // empty: no probe
};

// A TESSERA_CUDA_DIAG value (null or empty: none); throws tessera::Error naming an unknown or
// malformed item. Inline so that tests of any build can check it.
inline Diagnostics parse_diagnostics(const char* value) {
  Diagnostics d;
  std::string_view rest = value ? value : "";
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    if (item == "profile")
      d.profile = true;
    else if (item.starts_with("probe=") && item.size() > 6)
      d.probe_file = std::string(item.substr(6));
    else
      fail("TESSERA_CUDA_DIAG: unknown item '", item, "' (expected profile or probe=PATH, comma-separated)");
  }
  return d;
}

// The process's, read once on first use (cuda_diag.cpp).
const Diagnostics& diagnostics();

}  // namespace tessera::cuda
