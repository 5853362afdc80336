// The fp32 dot product shared by the CPU reference kernels (linear rows, attention scores,
// indexer scores, mHC mixes).
#pragma once

#include <cstdint>

namespace ds::cpu {

// sum_k a[k] * b[k] in fp32 with 8 interleaved partial sums (lane l takes the terms k = l mod 8),
// combined pairwise at the end. Still plain fp32 accumulation; the independent lanes let the
// compiler vectorize the loop without reassociating anything (a single running sum cannot be
// vectorized without -ffast-math) and make the rounding error smaller, not larger.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[k + l] * b[k + l];
  }
  for (; k < n; ++k) lanes[0] += a[k] * b[k];
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

}  // namespace ds::cpu
