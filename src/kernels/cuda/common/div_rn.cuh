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
// The result is bit for bit `x / d` for every x where d = 1 + expf(-x): test_moe_cuda's
// DivRnGe1MatchesIeeeDivisionForSilu checks all 2^32 inputs on the GPU (passed on H100, session
// 26, so rcp.approx is good enough at the near-midpoint input below); the CPU test
// (tests/kernels/test_div_rn_ref.cpp) checks the arithmetic of div_rn.h from the correctly rounded
// reciprocal on a sample of inputs, and shows that from an estimate one ulp off the near-midpoint
// x = 2^-23 rounds down (so the GPU's bits depend on rcp.approx there). For other uses, test the
// operand range first: the claim rests on |x| staying normal after the scaling.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common/div_rn.h"

namespace ds::cuda {

__device__ __forceinline__ float div_rn_ge1(float x, float d) {
  return div_rn_ge1_with(x, d, [](float v) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
  });
}

// silu(x) = x / (1 + e^-x) with the division rounded as `/` (the CPU reference's expression).
__device__ __forceinline__ float silu_dev(float x) {
  return div_rn_ge1(x, 1.0f + expf(-x));
}

}  // namespace ds::cuda
