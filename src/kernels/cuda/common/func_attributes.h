// Kernel attributes that the CUDA runtime keeps per device. cudaFuncSetAttribute applies to the
// calling thread's current device only, so a kernel needing more than the default 48 KB of
// dynamic shared memory must be opted in on every GPU it runs on (with tensor/expert parallelism
// one process launches it on several); setting it once per process left the second GPU's launches
// failing with cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <tuple>

namespace ds::cuda {

// Sets cudaFuncAttributeMaxDynamicSharedMemorySize of `kernel` to `bytes` on the current device,
// once per (kernel, device, bytes); later calls only look it up. Not stream ordered, so it is
// safe while a stream is being captured.
template <typename Kernel>
cudaError_t ensure_max_dynamic_smem(Kernel* kernel, int bytes) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, bytes);
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(key) != 0) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.insert(key);
  return e;
}

}  // namespace ds::cuda
