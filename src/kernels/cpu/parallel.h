// OpenMP helpers for the CPU reference kernels: DS_OMP_PARALLEL_FOR expands to an OpenMP
// work-sharing pragma when the library is built with OpenMP and to nothing otherwise (so builds
// without OpenMP neither fail nor warn about unknown pragmas).
#pragma once

#if defined(_OPENMP)
#define DS_OMP_PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#define DS_OMP_PARALLEL_FOR_DYNAMIC _Pragma("omp parallel for schedule(dynamic, 1)")
#else
#define DS_OMP_PARALLEL_FOR
#define DS_OMP_PARALLEL_FOR_DYNAMIC
#endif
