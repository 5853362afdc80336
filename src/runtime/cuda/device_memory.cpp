// Device memory of the CUDA backend (see device_memory.h).
#include "runtime/cuda/device_memory.h"

#include <algorithm>
#include <utility>

#include "kernels/cuda/common/cuda_check.h"

namespace ds::runtime {

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, const std::string& what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t err = cudaMalloc(&b.data_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // cudaMalloc's failure is not sticky: clear it
    b.data_ = nullptr;
    return resource_exhausted("CUDA backend: cannot allocate " + std::to_string(bytes >> 20) +
                              " MiB of device memory for " + what + " (" + cudaGetErrorString(err) +
                              ")");
  }
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);  // nothing useful to do with a failure here
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void* DeviceArena::alloc(size_t bytes) {
  const size_t n = align_up(std::max<size_t>(bytes, 1));
  if (used_ + n > buffer_.bytes()) return nullptr;
  void* p = static_cast<char*>(buffer_.data()) + used_;
  used_ += n;
  high_water_ = std::max(high_water_, used_);
  return p;
}

Status WeightStore::add(const void* host, size_t bytes) {
  if (host == nullptr || bytes == 0) return ok_status();
  auto [it, inserted] = entries_.try_emplace(host, Entry{bytes, nullptr});
  if (inserted) {
    order_.push_back(host);
  } else if (it->second.bytes != bytes) {
    return internal_error("CUDA backend: a weight is registered with two sizes (" +
                          std::to_string(it->second.bytes) + " and " + std::to_string(bytes) +
                          " bytes)");
  }
  return ok_status();
}

Status WeightStore::upload() {
  // Blocks of up to 1 GiB, filled in registration order.
  constexpr size_t kBlock = size_t(1) << 30;
  size_t i = 0;
  while (i < order_.size()) {
    if (entries_[order_[i]].device != nullptr) {
      ++i;
      continue;
    }
    size_t j = i, bytes = 0;
    while (j < order_.size() && entries_[order_[j]].device == nullptr &&
           (j == i || bytes + align_up(entries_[order_[j]].bytes) <= kBlock)) {
      bytes += align_up(entries_[order_[j]].bytes);
      ++j;
    }
    DS_ASSIGN_OR_RETURN(DeviceBuffer block, DeviceBuffer::allocate(bytes, "weights"));
    char* p = block.as<char>();
    for (size_t k = i; k < j; ++k) {
      Entry& e = entries_[order_[k]];
      DS_CUDA_RETURN_IF_ERROR(cudaMemcpy(p, order_[k], e.bytes, cudaMemcpyHostToDevice));
      e.device = p;
      p += align_up(e.bytes);
    }
    total_ += bytes;
    blocks_.push_back(std::move(block));
    i = j;
  }
  return ok_status();
}

const void* WeightStore::find(const void* host) const {
  if (host == nullptr) return nullptr;
  auto it = entries_.find(host);
  return it == entries_.end() ? nullptr : it->second.device;
}

Result<void*> WeightStore::allocate_derived(size_t bytes) {
  DS_ASSIGN_OR_RETURN(DeviceBuffer block, DeviceBuffer::allocate(bytes, "derived weights"));
  void* p = block.data();
  total_ += block.bytes();
  blocks_.push_back(std::move(block));
  return p;
}

}  // namespace ds::runtime
