#include "bench/membw.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace tessera {

double measure_read_bandwidth(Backend& backend) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  if (!cpu) return 0;                           // device backends report their own figures
  constexpr size_t kFloats = size_t{64} << 20;  // 256 MiB
  std::vector<float> buf(kFloats, 1.0f);
  ThreadPool& pool = cpu->pool();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> sums(pool.size(), 0);
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int t, int n) {
      const size_t b = kFloats * t / n, e = kFloats * (t + 1) / n;
      float acc[8] = {};
      for (size_t i = b; i + 8 <= e; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += buf[i + k];
      sums[t] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sums[0] < 0) std::memset(buf.data(), 0, 4);  // keeps the sums observable
    best = std::max(best, kFloats * sizeof(float) / s);
  }
  return best;
}

}  // namespace tessera
