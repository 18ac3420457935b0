// Baseline x86-64 build of the CPU row kernels.
#define TESSERA_OPS_ISA "scalar"
namespace {
#include "backend/cpu/cpu_ops_impl.h"
}

namespace tessera::cpu {
const OpsTable& ops_table_scalar() { return kOpsTable; }
}  // namespace tessera::cpu
