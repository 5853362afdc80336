// IEEE-rounded division for denominators >= 1, without the slow-path subroutine of `/`.
//
// ptxas compiles a float `/` (div.rn.f32) into a reciprocal estimate, FMA refinements, a range
// check (FCHK) and a CALL to a slow path for the operands the refinement cannot handle: denormal
// or near-overflow operands, quotients and remainders. A CALL inside a wgmma kernel's epilogue
// costs registers around it and, once the epilogue sits in a loop with wgmma, ptxas warns that
// the wgmma pipeline crosses a function boundary (C7510). div_rn_ge1 keeps the fast path and
// handles the few out-of-range operands that a denominator >= 1 allows without a call:
//   - d = +inf: x / inf is x * 0 (a signed zero; NaN for infinite or NaN x);
//   - d > 2^64: both operands scaled by 2^-64 (exact: |x| is then large enough to stay normal in
//     the use below, and the quotient is the same number);
//   - x = +-0 or +-inf: the quotient is x (the corrections would lose -0's sign and make inf NaN);
//   - |x| tiny: the remainder of the refinement stays exact, so the rounding is still IEEE's.
// The result is bit for bit `x / d` for every x where d = 1 + expf(-x) (tested exhaustively over
// all 2^32 inputs in test_moe_cuda, DivRnGe1MatchesIeeeDivisionForSilu). For other uses, test the
// operand range first: the claim rests on |x| staying normal after the scaling.
#pragma once

#include <cuda_runtime.h>

namespace ds::cuda {

__device__ __forceinline__ float div_rn_ge1(float x, float d) {
  // Selects, not branches: in an unrolled epilogue, branches per element cost more than the FMAs.
  const float s = d > 0x1p64f ? 0x1p-64f : 1.0f;
  const float xs = x * s, ds = d * s;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(ds));
  r = fmaf(r, fmaf(-ds, r, 1.0f), r);  // one Newton step: r within an ulp of 1 / d
  float q = __fmul_rn(xs, r);
  q = fmaf(fmaf(-ds, q, xs), r, q);  // the remainder x - d q is exact (FMA); two corrections
  q = fmaf(fmaf(-ds, q, xs), r, q);
  // x = +-0 or +-inf with d finite: x / d is x (the corrections would give +0 for -0, NaN for
  // inf); d = inf: x * 0 (+-0, NaN for infinite x).
  const float inf = __int_as_float(0x7f800000), ax = fabsf(x);
  return d == inf ? x * 0.0f : ax == 0.0f || ax == inf ? x : q;
}

// silu(x) = x / (1 + e^-x) with the division rounded as `/` (the CPU reference's expression).
__device__ __forceinline__ float silu_dev(float x) {
  return div_rn_ge1(x, 1.0f + expf(-x));
}

}  // namespace ds::cuda
