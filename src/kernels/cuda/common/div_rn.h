// The arithmetic of div_rn_ge1 (div_rn.cuh) around a reciprocal estimate, as host and device code:
// the GPU passes rcp.approx (MUFU.RCP); the CPU test (tests/kernels/test_div_rn_ref.cpp, in CI)
// passes the correctly rounded reciprocal, and its neighbours one ulp away for the one input where
// they round differently (x = 2^-23: the Newton step does not always reach the rounded reciprocal).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define DS_DIV_RN_FN __host__ __device__ __forceinline__
#else
#define DS_DIV_RN_FN inline
#endif

namespace ds::cuda {

// x / d rounded as IEEE division, for d >= 1 (+inf and NaN included), given rcp(v) ~ 1 / v for
// v in [1, 2^64]. See div_rn.cuh for the operand cases.
template <typename Rcp>
DS_DIV_RN_FN float div_rn_ge1_with(float x, float d, Rcp rcp) {
  // Selects, not branches: in an unrolled epilogue, branches per element cost more than the FMAs.
  const float s = d > 0x1p64f ? 0x1p-64f : 1.0f;
  const float xs = x * s, ds = d * s;
  float r = rcp(ds);
  r = fmaf(r, fmaf(-ds, r, 1.0f), r);  // one Newton step (not always the rounded 1 / d)
#if defined(__CUDA_ARCH__)
  float q = __fmul_rn(xs, r);  // never contracted into an FMA
#else
  float q = xs * r;
#endif
  q = fmaf(fmaf(-ds, q, xs), r, q);  // the remainder x - d q is exact (FMA); two corrections
  q = fmaf(fmaf(-ds, q, xs), r, q);
  // x = +-0 or +-inf with d finite: x / d is x (the corrections would give +0 for -0, NaN for
  // inf); d = inf: x * 0 (+-0, NaN for infinite x).
  const float inf = INFINITY, ax = fabsf(x);
  return d == inf ? x * 0.0f : ax == 0.0f || ax == inf ? x : q;
}

}  // namespace ds::cuda
