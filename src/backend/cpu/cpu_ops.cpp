#include "backend/cpu/cpu_ops.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tessera::cpu {

const OpsTable* ops_table_avx2_impl();

const OpsTable* ops_table_avx2() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok ? ops_table_avx2_impl() : nullptr;
}

const OpsTable& ops_table() {
  static const OpsTable* chosen = [] {
    const char* forced = std::getenv("TESSERA_ISA");
    if (forced && std::strcmp(forced, "scalar") == 0) return &ops_table_scalar();
    if (const OpsTable* t = ops_table_avx2()) return t;
    return &ops_table_scalar();
  }();
  return *chosen;
}

int64_t attention_scratch_floats(int max_q_rows, int group, int block_size, int head_dim) {
  const int64_t n_q = static_cast<int64_t>(max_q_rows) * group;
  // kf, vf, sgn: [bs, hd]; sc: [n_q, bs]; o, qs, sq: [n_q, hd]; m, l: [n_q]; coef: [bs]; rot: [hd];
  // position-aware key centering: qp [n_q, hd], cm, tab: [bs, hd], mb, cs: [hd]
  return 5 * block_size * head_dim + n_q * block_size + 4 * n_q * head_dim + 2 * n_q + block_size + 3 * head_dim + 64;
}

}  // namespace tessera::cpu
