// Baseline x86-64 build of the CPU row kernels.
#define TESSERA_OPS_ISA "scalar"
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
const OpsTable& ops_table_scalar() { return kOpsTable; }
}  // namespace tessera::cpu
