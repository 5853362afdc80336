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

// Runs enqueue() (launches on `stream`, returns a Status) once: straight on the stream, or
// captured into a CUDA graph that is instantiated and launched once; then synchronizes the
// stream. Any error fails the current test.
template <class Enqueue>
void run_on_stream_or_graph(cudaStream_t stream, bool use_graph, const Enqueue& enqueue) {
  cudaGraphExec_t exec = nullptr;
  if (use_graph) {
    cudaGraph_t graph;
    DS_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const auto st = enqueue();
    DS_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st.to_string();
    DS_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    DS_CUDA_ASSERT(cudaGraphDestroy(graph));
    DS_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  } else {
    const auto st = enqueue();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  DS_CUDA_ASSERT(cudaStreamSynchronize(stream));
  if (exec) DS_CUDA_ASSERT(cudaGraphExecDestroy(exec));
}

}  // namespace ds::test
