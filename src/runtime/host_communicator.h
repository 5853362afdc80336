// HostCommunicator: the all-reduce of a tensor/expert-parallel group whose ranks are threads of
// one process and whose data is in host memory (the CPU backend's ranks, and tests). Each rank
// posts its buffer; once all have, every rank sums the buffers in rank order (so every rank gets
// the same bits, as the forward requires: ops.h all_reduce_sum) and the group leaves together.
// The product's GPU ranks use NCCL instead (cuda/nccl_communicator.h).
//
// abort() releases every rank waiting in all_reduce_sum (and every later call) with false, so a
// rank that failed in its step cannot leave the others waiting forever (model_runner.h).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ds::runtime {

class HostCommunicator {
 public:
  explicit HostCommunicator(int world) : world_(world), ptrs_(size_t(world), nullptr) {}

  int world_size() const { return world_; }

  // In place: x[i] = sum over the ranks of x[i] (rank order). Every rank must call it with the
  // same n. False (x untouched or partly summed) when the group was aborted.  x [n]
  bool all_reduce_sum(int rank, float* x, int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return false;
    ptrs_[size_t(rank)] = x;
    if (!arrive(lock)) return false;  // every rank's input is posted
    std::vector<float> sum(ptrs_[0], ptrs_[0] + n);
    lock.unlock();
    for (int r = 1; r < world_; ++r) {
      const float* p = ptrs_[size_t(r)];
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += p[i];
    }
    lock.lock();
    if (!arrive(lock)) return false;  // everyone has read every input
    std::copy(sum.begin(), sum.end(), x);
    return true;
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  bool aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

 private:
  // A reusable barrier under mu_: false when aborted while waiting.
  bool arrive(std::unique_lock<std::mutex>& lock) {
    const uint64_t phase = phase_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return !aborted_;
    }
    cv_.wait(lock, [&] { return phase_ != phase || aborted_; });
    return !aborted_;
  }

  const int world_;
  std::vector<float*> ptrs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t phase_ = 0;
  bool aborted_ = false;
};

}  // namespace ds::runtime
