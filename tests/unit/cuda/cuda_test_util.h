#pragma once
// Helpers of the CUDA conformance tests. They use only the backend interface, so they build
// (and skip) in a build without CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/fp16.h"
#include "backend/cuda/cuda_factory.h"

namespace tessera::cudatest {

// Skips the test when this build or machine has no CUDA device.
#define TESSERA_REQUIRE_CUDA()                                                 \
  do {                                                                         \
    if (!::tessera::cuda_compiled()) GTEST_SKIP() << "built without CUDA";     \
    if (::tessera::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// The devices a test runs on: the CPU always, CUDA where a device is visible.
inline std::vector<std::string> test_devices() {
  std::vector<std::string> d = {"cpu"};
  if (cuda_compiled() && cuda_device_count() > 0) d.push_back("cuda");
  return d;
}

// A device buffer of T owned by the test, filled from and read back to host vectors.
template <typename T>
class DeviceVec {
 public:
  DeviceVec(Backend& be, size_t n) : be_(be), n_(n), p_(be.alloc(sizeof(T) * std::max<size_t>(n, 1))) {}
  DeviceVec(Backend& be, const std::vector<T>& host) : DeviceVec(be, host.size()) { put(host); }
  ~DeviceVec() { be_.free(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() { return static_cast<T*>(p_); }
  void put(const std::vector<T>& host) { be_.copy_to_device(p_, host.data(), sizeof(T) * host.size()); }
  std::vector<T> read() {
    std::vector<T> h(n_);
    be_.copy_to_host(h.data(), p_, sizeof(T) * n_);
    return h;
  }

 private:
  Backend& be_;
  size_t n_;
  void* p_;
};

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||got - ref|| / ||ref||, NaN-proof (a NaN anywhere gives infinity).
template <typename A, typename B>
double rel_err(const std::vector<A>& got, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(static_cast<double>(got[i]))) return INFINITY;
    const double d = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Host arrays of one AttentionBatch.
struct HostBatch {
  std::vector<int32_t> positions, slots, q_start, kv_len, tables;
  std::vector<int32_t> tree_mask;  // empty, or AttentionBatch::tree_mask's bits per row
  int max_blocks = 0;
  // Makes the last sequence's rows a draft tree (ForwardBatch::set_tree's masks; earlier
  // sequences keep causal masks): row 1 + j follows row 1 + parents[j].
  void set_tree(const std::vector<int16_t>& parents) {
    tree_mask.clear();
    for (size_t s = 0; s + 1 < q_start.size(); ++s)
      for (int i = 0; i < q_start[s + 1] - q_start[s]; ++i)
        tree_mask.push_back(i >= 31 ? -1 : static_cast<int32_t>((2u << i) - 1u));
    const int first = q_start[q_start.size() - 2];
    tree_mask[first] = 1;
    for (size_t j = 0; j < parents.size(); ++j)
      tree_mask[first + 1 + j] =
          static_cast<int32_t>(static_cast<uint32_t>(tree_mask[first + 1 + parents[j]]) | (1u << (1 + j)));
  }
  // The batch over the host arrays (for the CPU backend).
  AttentionBatch view() const {
    AttentionBatch b;
    b.n_tokens = static_cast<int>(positions.size());
    b.n_seqs = static_cast<int>(kv_len.size());
    b.one_row_each = b.n_tokens == b.n_seqs;
    for (int s = 0; b.one_row_each && s < b.n_seqs; ++s) b.one_row_each = q_start[s + 1] - q_start[s] == 1;
    for (int s = 0; s < b.n_seqs; ++s) b.max_rows = std::max(b.max_rows, q_start[s + 1] - q_start[s]);
    b.positions = positions.data();
    b.slot_mapping = slots.data();
    b.q_start = q_start.data();
    b.kv_len = kv_len.data();
    b.block_tables = tables.data();
    b.max_blocks = max_blocks;
    if (!tree_mask.empty()) b.tree_mask = reinterpret_cast<const uint32_t*>(tree_mask.data());
    return b;
  }
  // The same batch with its arrays copied to `be` (ops take device arrays), alive as long
  // as this HostBatch.
  AttentionBatch device_view(Backend& be) const {
    AttentionBatch b = view();
    const auto up = [&](const std::vector<int32_t>& v) {
      uploads.push_back(std::make_shared<DeviceVec<int32_t>>(be, v));
      return uploads.back()->get();
    };
    b.positions = up(positions);
    b.slot_mapping = up(slots);
    b.q_start = up(q_start);
    b.kv_len = up(kv_len);
    b.block_tables = up(tables);
    if (!tree_mask.empty()) b.tree_mask = reinterpret_cast<const uint32_t*>(up(tree_mask));
    return b;
  }
  mutable std::vector<std::shared_ptr<DeviceVec<int32_t>>> uploads;
};

// x as the integer decode kernels see it (quantize_q8.cu; the CPU backend's Q8 numerics): per
// row, columns taken in the order perm gives (stored column j reads input column perm[j];
// nullptr: in order), quantized per 32 of them with d = fp16(amax / 127) and
// q = nearbyint(x * 127 / amax), then q * d put back where each came from. Exact in f32.
inline std::vector<float> q8_round_trip(const std::vector<float>& x, int n, int64_t ldx, int64_t cols,
                                        const int32_t* perm = nullptr) {
  std::vector<float> out(x);
  for (int i = 0; i < n; ++i)
    for (int64_t b = 0; b < cols; b += 32) {
      const int64_t e = std::min<int64_t>(b + 32, cols);
      float amax = 0.0f;
      for (int64_t j = b; j < e; ++j) amax = std::fmax(amax, std::fabs(x[i * ldx + (perm ? perm[j] : j)]));
      const float d = fp16_to_f32(f32_to_fp16(amax / 127.0f));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t j = b; j < e; ++j) {
        const int64_t k = i * ldx + (perm ? perm[j] : j);
        out[k] = static_cast<float>(std::nearbyint(x[k] * id) * double(d));
      }
    }
  return out;
}

inline std::unique_ptr<Backend> make_cuda() { return make_backend(BackendOptions{"cuda", 0}); }
inline std::unique_ptr<Backend> make_cpu() { return make_backend(BackendOptions{"cpu", 2}); }

}  // namespace tessera::cudatest
