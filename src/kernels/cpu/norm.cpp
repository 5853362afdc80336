// RMSNorm: fp32 sum of squares, then x * (1/sqrt(mean + eps)) * w as REF's RMSNorm computes it
// (rsqrt first, then the weight).
#include "kernels/cpu/norm.h"

#include <cmath>

namespace ds::cpu {

void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum_sq += xr[i] * xr[i];
    const float rsqrt = 1.0f / std::sqrt(sum_sq / float(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const float normalized = xr[i] * rsqrt;
      yr[i] = weight ? normalized * weight[i] : normalized;
    }
  }
}

void rms_norm_heads(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, float eps) {
  rms_norm(x, nullptr, num_tokens * num_heads, head_dim, eps, x);
}

}  // namespace ds::cpu
