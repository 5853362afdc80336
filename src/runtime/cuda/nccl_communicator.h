// NcclCommunicator: the all-reduce of a tensor/expert-parallel group (docs/parallelism.md) over
// NCCL, for ranks that are threads of one process with one GPU each.
//
// NCCL is loaded at run time: no build machine has its headers or libraries, and a deepserve
// binary must start (and serve on one GPU) where NCCL is absent. The library is
// $DEEPSERVE_NCCL_LIBRARY if set, else "libnccl.so.2" from the loader's search path; it is opened
// once per process and never closed. The few entry points used are declared here from NCCL's
// documented C ABI (nccl_communicator.cpp), version 2.9.6 or newer (CUDA graph capture of
// collectives).
//
// Numerics: NCCL's ring and tree all-reduce sum the ranks in an order of its choosing (not rank
// order), but every rank receives the same bits: the reduced value is computed once per element
// and then broadcast. So replicated work stays identical on every rank, as the forward requires
// (ops.h); the sum may differ from a single-rank computation (or from the CPU test
// communicator's rank-order sum) by fp32 rounding.
//
// Failure: a rank that stops calling the collectives (an error in its step) leaves the others
// waiting inside the all-reduce; the caller then aborts the whole group (abort(), which
// model_runner.h's tensor-parallel runner calls on every rank's communicator).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds::runtime {

// The environment variable naming the NCCL library to load.
inline constexpr const char* kNcclLibraryEnv = "DEEPSERVE_NCCL_LIBRARY";

// Whether NCCL could be loaded (the first call loads it): ok, or kFailedPrecondition saying why
// and naming DEEPSERVE_NCCL_LIBRARY.
Status nccl_status();
// The loaded library's version, e.g. "2.21.5" (empty when NCCL is not loaded).
std::string nccl_version_string();
// Tests: loads `library` afresh (not cached, not used by communicators) and resolves every entry
// point; the same errors as nccl_status().
Status probe_nccl_library(const std::string& library);

class NcclCommunicator {
 public:
  // One communicator per device, rank i on devices[i], all of one group (ncclCommInitAll). Devices
  // must be distinct (NCCL does not support two ranks on one GPU). Each communicator is then
  // driven by one thread (its rank's); the calling thread's current device is left unchanged.
  static Result<std::vector<std::unique_ptr<NcclCommunicator>>> create_local(
      const std::vector<int>& devices);
  ~NcclCommunicator();  // ncclCommDestroy, after the caller has finished its streams' work
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }

  // In place: x[i] = sum over the ranks of x[i], fp32, enqueued on `stream` (of this rank's
  // device; capturable into a CUDA graph). Every rank must call it with the same n, in the same
  // order relative to its other collectives. n == 0 does nothing.  x [n] device memory
  Status all_reduce_sum(float* x, int64_t n, cudaStream_t stream);

  // ncclCommAbort: ends this rank's outstanding collectives (a rank waiting for a peer that
  // will never arrive returns) and frees the communicator; later all-reduces fail. Callable from
  // any thread while the rank's own thread waits. Idempotent.
  void abort();

 private:
  NcclCommunicator(void* comm, int rank, int world_size, int device)
      : comm_(comm), rank_(rank), world_size_(world_size), device_(device) {}

  std::atomic<void*> comm_;  // ncclComm_t; null once aborted
  int rank_;
  int world_size_;
  int device_;
};

}  // namespace ds::runtime
