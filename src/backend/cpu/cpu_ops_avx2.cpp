// AVX2 + FMA + F16C build of the CPU row kernels (same source as the scalar build).
#define TESSERA_OPS_ISA "avx2"
namespace {
#include "backend/cpu/cpu_ops_impl.h"
}

namespace tessera::cpu {
const OpsTable* ops_table_avx2_impl() { return &kOpsTable; }
}  // namespace tessera::cpu
