// Kernel attributes that the CUDA runtime keeps per device. cudaFuncSetAttribute applies to the
// calling thread's current device only, so a kernel needing more than the default 48 KB of
// dynamic shared memory must be opted in on every GPU it runs on (with tensor/expert parallelism
// one process launches it on several); setting it once per process left the second GPU's launches
// failing with cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace ds::cuda {

// Makes cudaFuncAttributeMaxDynamicSharedMemorySize of `kernel` on the current device at least
// `bytes`: the attribute only ever grows to the largest size asked for per (kernel, device), so
// that a launch with a smaller ring never lowers it under a larger one. (Until session 12 it was
// set to each size once per (kernel, device, size): asking for 72 KB, then 18 KB, then 72 KB again
// left it at 18 KB and the third launch failed with cudaErrorInvalidValue.) Not stream ordered,
// so it is safe while a stream is being captured.
template <typename Kernel>
cudaError_t ensure_max_dynamic_smem(Kernel* kernel, int bytes) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> set_to;
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = set_to.find(key);
  if (it != set_to.end() && it->second >= bytes) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) set_to[key] = bytes;
  return e;
}

}  // namespace ds::cuda
