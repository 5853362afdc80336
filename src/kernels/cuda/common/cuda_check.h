// Checking of every CUDA runtime call: DS_CUDA_RETURN_IF_ERROR turns a failed call into a Status
// that records the call, the file and the line; cuda_error_is_sticky tells whether the context is
// lost (reliability.md promise 7: crash-only on sticky faults).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/status.h"

namespace ds {

inline Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  return Status(StatusCode::kInternal, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                                           cudaGetErrorString(err) + ") in " + expr + " at " +
                                           file + ":" + std::to_string(line));
}

// Errors after which the CUDA context is unusable and the process must exit.
inline bool cuda_error_is_sticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

}  // namespace ds

#define DS_CUDA_RETURN_IF_ERROR(expr)                                          \
  do {                                                                         \
    cudaError_t ds_cuda_err_ = (expr);                                         \
    if (ds_cuda_err_ != cudaSuccess)                                           \
      return ::ds::cuda_status(ds_cuda_err_, #expr, __FILE__, __LINE__);       \
  } while (0)
