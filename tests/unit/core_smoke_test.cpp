#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/fp16.h"
#include "core/thread_pool.h"

using namespace tessera;

TEST(DType, BlockSizesMatchGgml) {
  EXPECT_EQ(dtype_row_bytes(DType::Q4_1, 64), 40);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 512), 420);
  EXPECT_EQ(dtype_from_ggml_id(4), DType::Unknown);  // removed Q4_2
  EXPECT_EQ(dtype_from_ggml_id(999), DType::Unknown);
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_fp16(f), h) << h;
  }
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<std::atomic<int>> hits(1000);
      pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}
