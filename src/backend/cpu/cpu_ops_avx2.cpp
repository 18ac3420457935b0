// AVX2 + FMA + F16C build of the CPU row kernels (same source as the scalar build).
#define TESSERA_OPS_ISA "avx2"
// The kernel source's own includes, outside the namespace it is compiled into.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "backend/kv_codec.h"
#include "core/fp16.h"

namespace {
#include "backend/cpu/cpu_ops_impl.h"
}

namespace tessera::cpu {
const OpsTable* ops_table_avx2_impl() { return &kOpsTable; }
}  // namespace tessera::cpu
