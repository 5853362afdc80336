// OpenMP helpers for the CPU reference kernels: DS_OMP_PARALLEL_FOR expands to an OpenMP
// work-sharing pragma when the library is built with OpenMP and to nothing otherwise (so builds
// without OpenMP neither fail nor warn about unknown pragmas).
#pragma once

#include <cstdint>

//
// The _IF forms run the loop in parallel only when `cond` holds: a parallel region costs a
// wake-up of every worker and a barrier (microseconds on idle cores, milliseconds when the cores
// are shared with other processes), so small loops stay on the calling thread. Which thread runs
// an iteration never changes its result.
#if defined(_OPENMP)
#define DS_OMP_PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#define DS_OMP_PARALLEL_FOR_DYNAMIC _Pragma("omp parallel for schedule(dynamic, 1)")
#define DS_OMP_PRAGMA_(x) _Pragma(#x)
#define DS_OMP_PARALLEL_FOR_IF(cond) DS_OMP_PRAGMA_(omp parallel for schedule(static) if(cond))
#define DS_OMP_PARALLEL_FOR_DYNAMIC_IF(cond) \
  DS_OMP_PRAGMA_(omp parallel for schedule(dynamic, 1) if(cond))
#else
#define DS_OMP_PARALLEL_FOR
#define DS_OMP_PARALLEL_FOR_DYNAMIC
#define DS_OMP_PARALLEL_FOR_IF(cond)
#define DS_OMP_PARALLEL_FOR_DYNAMIC_IF(cond)
#endif

namespace ds::cpu {
// Multiply-adds below which a loop is not worth a parallel region (about 0.1 ms of work).
inline constexpr int64_t kParallelMinWork = int64_t(1) << 19;
}  // namespace ds::cpu
