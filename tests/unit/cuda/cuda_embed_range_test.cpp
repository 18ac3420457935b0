// The vocabulary-parallel embedding (Backend::embed_range) on CUDA against the CPU backend:
// a table slice of rows [first, first + rows), ids inside and outside it. Skips without a GPU.
#include "backend/cpu/cpu_backend.h"
#include "cuda_test_util.h"
#include "quant/quant.h"

using namespace tessera;
using namespace tessera::cudatest;

TEST(CudaOps, EmbedRangeGivesTheSliceRowsAndZerosElsewhere) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  CpuBackend cpu(1);
  std::mt19937 rng(21);
  for (DType type : {DType::F32, DType::BF16, DType::Q8_0, DType::Q4_K}) {
    const int64_t cols = dtype_traits(type).block_elems == 256 ? 512 : 96, rows = 20, first = 40;
    const int64_t rb = dtype_row_bytes(type, cols);
    std::vector<uint8_t> bytes(rows * rb);
    auto vals = randn(rows * cols, rng, 0.5f);
    for (int64_t r = 0; r < rows; ++r) quantize_row(type, vals.data() + r * cols, bytes.data() + r * rb, cols);
    const WeightMatrix host{bytes.data(), type, rows, cols};
    auto dev = gpu->upload(bytes.data(), bytes.size());
    WeightMatrix table = host;
    table.data = dev.get();
    const std::vector<int32_t> ids = {0, 40, 59, 60, 39, 45, 100000, 41};
    const int n = static_cast<int>(ids.size());
    DeviceVec<float> out(*gpu, std::vector<float>(n * cols, NAN));
    DeviceVec<int32_t> dids(*gpu, ids);
    gpu->embed_range(table, first, dids.get(), n, out.get());
    std::vector<float> ref(n * cols, NAN);
    cpu.embed_range(host, first, ids.data(), n, ref.data());
    const auto got = out.read();
    for (int i = 0; i < n; ++i) {
      const bool inside = ids[i] >= first && ids[i] < first + rows;
      for (int64_t c = 0; c < cols; ++c) {
        if (!inside) {
          EXPECT_EQ(ref[i * cols + c], 0.0f);
        }
        EXPECT_NEAR(got[i * cols + c], ref[i * cols + c], 1e-6 * (1 + std::fabs(ref[i * cols + c])))
            << dtype_name(type) << " id " << ids[i];
      }
    }
  }
}
