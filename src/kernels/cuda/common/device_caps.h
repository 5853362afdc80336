// Per-device capabilities the kernel launchers ask for on every launch, queried once per device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace ds::cuda {

// Whether the current device launches thread-block clusters (compute capability 9.0+); one
// cached attribute query per device.
inline bool device_has_clusters() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};  // 0: not queried, 1: no, 2: yes
  int v = device < kMaxDevices ? known[device].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    int attr = 0;
    if (cudaDeviceGetAttribute(&attr, cudaDevAttrClusterLaunch, device) != cudaSuccess) attr = 0;
    v = attr ? 2 : 1;
    if (device < kMaxDevices) known[device].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

}  // namespace ds::cuda
