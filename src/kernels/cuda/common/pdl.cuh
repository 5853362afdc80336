// Programmatic dependent launch (PDL, sm_90+) for the small op kernels of a decode step.
//
// A kernel launched with launch_pdl may become resident while the previous kernel of the stream
// still runs; it must call pdl_begin() before it touches global memory that an earlier kernel
// writes or reads (pdl_begin waits until the previous grid has completed and its writes are
// visible, so everything after it is ordered as in a plain launch, transitively: the previous
// kernel could not complete before its own wait returned). pdl_begin also lets the next kernel
// of the stream become resident now, so that its launch and its own pre-wait loads (the GEMMs'
// weights) overlap this kernel instead of following it. Data that no kernel writes (weights) may
// be read or prefetched before pdl_begin. On older GPUs, and in kernels launched without the
// attribute, both instructions are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/env.h"

namespace ds::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether launch_pdl sets the attribute: yes unless DEEPSERVE_OPS_PDL=0 (read once; an A/B switch
// for benchmarks: without the attribute the kernels run in plain stream order).
inline bool ops_pdl_enabled() {
  static const bool enabled = !env_switched_off("DEEPSERVE_OPS_PDL");
  return enabled;
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the stream's
// previous kernel when `pdl` (and ops_pdl_enabled()). The kernel must begin with pdl_begin()
// (above). A launch error is returned and, like any runtime error, also left for the caller's
// cudaGetLastError.
template <typename... Params, typename... Args>
cudaError_t launch_pdl_if(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && ops_pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// launch_pdl_if(true, ...): the op kernels of a decode step.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  return launch_pdl_if(true, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace ds::cuda
