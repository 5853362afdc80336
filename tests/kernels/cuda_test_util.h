// Helpers for CUDA kernel tests: skip without a GPU, RAII device buffers, poisoning of outputs
// before each run (so a kernel that skips a write is caught), and a checking macro for tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#define DS_CUDA_ASSERT(expr)                                                          \
  do {                                                                                \
    cudaError_t ds_err_ = (expr);                                                     \
    ASSERT_EQ(ds_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(ds_err_); \
  } while (0)

// Skips the current test when no CUDA device is usable.
#define DS_REQUIRE_GPU()                                                   \
  do {                                                                     \
    int ds_n_ = 0;                                                         \
    if (cudaGetDeviceCount(&ds_n_) != cudaSuccess || ds_n_ == 0) {         \
      (void)cudaGetLastError();                                            \
      GTEST_SKIP() << "no CUDA device";                                    \
    }                                                                      \
  } while (0)

namespace ds::test {

inline constexpr uint8_t kPoisonByte = 0xFF;  // NaN in fp32/bf16/e4m3/e8m0; -1 in integers

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (cudaMalloc(&ptr_, bytes() ? bytes() : 1) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return count_ * sizeof(T); }
  bool ok() const { return ptr_ != nullptr; }
  cudaError_t upload(const std::vector<T>& host) {
    return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t download(std::vector<T>& host) const {
    host.resize(count_);
    return cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost);
  }
  cudaError_t poison() { return cudaMemset(ptr_, kPoisonByte, bytes()); }

 private:
  void* ptr_ = nullptr;
  size_t count_;
};

}  // namespace ds::test
