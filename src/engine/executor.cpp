#include "engine/executor.h"

#include "core/error.h"

namespace tessera {

void Executor::swap_out(std::span<const BlockSwap> swaps) {
  TESSERA_CHECK(swaps.empty(), "executor: ", swaps.size(), " blocks to swap out but this executor has no host KV tier");
}

void Executor::swap_in(std::span<const BlockSwap> swaps) {
  TESSERA_CHECK(swaps.empty(), "executor: ", swaps.size(), " blocks to swap in but this executor has no host KV tier");
}

std::shared_ptr<HostKvTier> Executor::make_staging(int n_blocks) {
  fail("executor: cannot stage ", n_blocks, " KV blocks: ", kv_transfer_refusal());
}

void Executor::export_blocks(std::span<const int32_t> blocks, HostKvTier&) {
  fail("executor: cannot export ", blocks.size(), " KV blocks: ", kv_transfer_refusal());
}

void Executor::import_blocks(std::span<const int32_t> blocks, const HostKvTier&) {
  fail("executor: cannot import ", blocks.size(), " KV blocks: ", kv_transfer_refusal());
}

}  // namespace tessera
