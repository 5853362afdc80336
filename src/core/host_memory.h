// Host buffers a device backend copies results into (the logits of a step). A backend may supply
// page-locked memory through a HostMemorySource so that device-to-host copies run at the link's
// speed: a copy into pageable memory goes through the driver's staging buffers (the [64, 129280]
// fp32 logits of a B = 64 decode step took ~4.4 ms that way on the H200, docs/cuda_backend.md).
// HostVector is a std::vector whose allocator draws from such a source, or from the heap when
// the source is null (the CPU backend), so code that reads the buffer sees a plain vector.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

namespace ds {

// Where a backend's host buffers come from. allocate throws std::bad_alloc when it cannot.
class HostMemorySource {
 public:
  virtual ~HostMemorySource() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
};

// A stateful allocator: the source travels with the container on copy, move and swap, and a
// buffer is always returned to the source that made it (the source lives as long as a buffer of
// it does, through the shared_ptr).
template <typename T>
class HostAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  HostAllocator() = default;
  explicit HostAllocator(std::shared_ptr<HostMemorySource> source) : source_(std::move(source)) {}
  template <typename U>
  HostAllocator(const HostAllocator<U>& other) : source_(other.source()) {}  // NOLINT: rebind

  T* allocate(size_t n) {
    if (!source_) return std::allocator<T>().allocate(n);
    return static_cast<T*>(source_->allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (!source_) {
      std::allocator<T>().deallocate(p, n);
    } else {
      source_->deallocate(p, n * sizeof(T));
    }
  }

  const std::shared_ptr<HostMemorySource>& source() const { return source_; }

  template <typename U>
  bool operator==(const HostAllocator<U>& other) const {
    return source_ == other.source();
  }

 private:
  std::shared_ptr<HostMemorySource> source_;  // null: the heap
};

template <typename T>
using HostVector = std::vector<T, HostAllocator<T>>;

}  // namespace ds
