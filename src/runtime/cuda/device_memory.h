// Device memory of the CUDA backend: one owning buffer type, the step arena (a LIFO bump
// allocator over one allocation made at start, so that a step never calls cudaMalloc), and the
// weight store that mirrors a model's host weights in device memory, found by host address.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace ds::runtime {

// One cudaMalloc'd block, freed on destruction. Movable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> allocate(size_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// LIFO scratch over one buffer: alloc() bumps, mark()/release() rewind. An allocation that does
// not fit returns nullptr and records the overflow (the caller turns it into a step error).
class DeviceArena {
 public:
  DeviceArena() = default;
  explicit DeviceArena(DeviceBuffer buffer) : buffer_(std::move(buffer)) {}

  void* alloc(size_t bytes);  // 256-byte aligned
  size_t mark() const { return used_; }
  void release(size_t mark) { used_ = mark < used_ ? mark : used_; }
  size_t capacity() const { return buffer_.bytes(); }
  size_t high_water() const { return high_water_; }

 private:
  DeviceBuffer buffer_;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

// Device copies of host arrays, keyed by the host address they were copied from (the views of
// ModelWeights point into the mapped checkpoint and into owned vectors, and every op receives
// those host addresses). All copies share a few large allocations.
class WeightStore {
 public:
  // Registers `bytes` bytes at `host` to be uploaded (the same address twice is one copy; a
  // different size for a known address is an error).
  Status add(const void* host, size_t bytes);
  // Allocates device memory for everything added and copies it (synchronously).
  Status upload();
  // The device copy of `host` (nullptr for nullptr); an unknown address is a programming error
  // and returns nullptr.
  const void* find(const void* host) const;
  template <typename T>
  const T* get(const T* host) const {
    return static_cast<const T*>(find(host));
  }
  // Device bytes allocated for weights.
  size_t device_bytes() const { return total_; }
  // A device block owned by the store (derived tensors such as fp32 scale grids).
  Result<void*> allocate_derived(size_t bytes);

 private:
  struct Entry {
    size_t bytes = 0;
    void* device = nullptr;
  };
  std::unordered_map<const void*, Entry> entries_;
  std::vector<const void*> order_;
  std::vector<DeviceBuffer> blocks_;
  size_t total_ = 0;
};

}  // namespace ds::runtime
