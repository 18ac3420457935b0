#pragma once
// Shared-memory mbarriers and the bulk copy engine (cp.async.bulk, sm_90), shared by the
// kernels that stream weights through shared memory (gemv_bulk.cu, decode_stack.cu).
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace tessera::cuda {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

// Makes the initialized barriers visible to the copy engine (once, before the first copy).
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also expects `bytes` of copies to complete on the barrier.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// One plain arrival (a consumer releasing a buffer).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// A spin that cannot end (a bug in a persistent kernel's schedule) traps after this long
// instead of hanging the device: the launch fails and the next CUDA call reports it.
// Builds for compute-sanitizer raise it (-DTESSERA_CUDA_SPIN_LIMIT_S=900 in the CUDA flags):
// instrumented, one block can wait on another for longer than 20 s without any bug.
#ifndef TESSERA_CUDA_SPIN_LIMIT_S
#define TESSERA_CUDA_SPIN_LIMIT_S 20
#endif
constexpr uint64_t kSpinLimitNs = uint64_t{TESSERA_CUDA_SPIN_LIMIT_S} * 1000 * 1000 * 1000;

// mbar_wait that traps after kSpinLimitNs.
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = global_timer_ns();
  while (!mbar_try_wait(bar, parity))
    if (global_timer_ns() - t0 > kSpinLimitNs) __trap();
}

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Adds to a counter other blocks poll, ordering this thread's earlier writes (and, after a
// block barrier, its block's) before the addition; no reply to wait for.
__device__ __forceinline__ void red_release_gpu_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Polls a counter (acquire) until it reaches `target`; traps after kSpinLimitNs.
__device__ __forceinline__ void spin_until_at_least(const unsigned* p, unsigned target) {
  if (ld_acquire_gpu(p) >= target) return;
  const uint64_t t0 = global_timer_ns();
  while (ld_acquire_gpu(p) < target) {
    __nanosleep(20);
    if (global_timer_ns() - t0 > kSpinLimitNs) __trap();
  }
}

// Global → shared copy of `bytes` (a multiple of 16, both ends 16-byte aligned) by the copy
// engine, counted against `bar`'s expected transaction bytes.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// An L2 policy for cache-hinted copies: evict_first marks lines read once (a weight stream)
// as the first to go, so they do not push out lines still wanted (prefetched chunks, KV).
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}

// bulk_copy with an L2 cache policy (l2_policy_evict_first).
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

}  // namespace tessera::cuda
