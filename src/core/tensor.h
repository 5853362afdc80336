// TensorView: a non-owning view of typed memory (pointer, dtype, shape, strides, device). Views
// are how kernels, weights and checkpoints refer to data; ownership lives elsewhere (mapped
// files, arenas, device pools).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/dtype.h"

namespace ds {

enum class Device : uint8_t { kCpu, kCuda };

inline constexpr int kMaxRank = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};    // [rank]
  std::array<int64_t, kMaxRank> strides{};  // [rank], in elements

  // A contiguous row-major view.
  static TensorView contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                               Device device = Device::kCpu);
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::kCpu) {
    return contiguous(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device);
  }

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  int64_t dim(int i) const { return shape[size_t(i)]; }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  // "BF16[129280, 4096]"
  std::string describe() const;
};

}  // namespace ds
