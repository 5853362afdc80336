// Hopper warpgroup-MMA helpers shared by the kernels with an sm_90a path (attention's sparse MLA
// decode, the lightning indexer): the shared-memory matrix descriptor with the 128-byte swizzle,
// the fence / commit / wait of wgmma groups, the generic-to-async proxy fence, the barrier of one
// of a CTA's first two warpgroups, and the register fence that pins an accumulator across them.
// Every function is inline and only instantiated where an sm_90a path calls it.
#pragma once

#include <cstdint>

namespace ds::cuda::wgmma {

// Shared-memory matrix descriptor (PTX ISA, wgmma matrix descriptor): start address >> 4, leading
// byte offset `lbo` >> 4 (unused by K-major swizzled operands: 16), stride byte offset 1024 (8
// rows of 128 bytes), swizzle mode 1 = 128 bytes. A K step of 16 bf16 / 32 e4m3 adds 32 bytes to
// the start address.
__device__ __forceinline__ uint64_t desc(uint32_t saddr, uint32_t lbo = 16) {
  return uint64_t((saddr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier of warpgroup wg (0 or 1) alone: ids 1 and 2 (__syncthreads uses 0). Immediate ids, so
// ptxas reserves 3 barriers, not all 16.
__device__ __forceinline__ void warpgroup_bar(int wg) {
  if (wg == 0)
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of x across a wgmma fence or wait.
__device__ __forceinline__ void fence_operand(float& x) {
  asm volatile("" : "+f"(x)::"memory");
}

}  // namespace ds::cuda::wgmma
