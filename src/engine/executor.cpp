#include "engine/executor.h"

#include "core/error.h"

namespace tessera {

void Executor::swap_out(std::span<const BlockSwap> swaps) {
  TESSERA_CHECK(swaps.empty(), "executor: ", swaps.size(), " blocks to swap out but this executor has no host KV tier");
}

void Executor::swap_in(std::span<const BlockSwap> swaps) {
  TESSERA_CHECK(swaps.empty(), "executor: ", swaps.size(), " blocks to swap in but this executor has no host KV tier");
}

}  // namespace tessera
