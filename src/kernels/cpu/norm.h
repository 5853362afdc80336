// RMSNorm references (dsv4-model.md §1 conventions): RMSNorm_w(v) = v * rsqrt(mean(v^2) + eps)
// * w computed in fp32, eps = 1e-6 everywhere in DeepSeek-V4; the unweighted form drops w.
#pragma once

#include <cstdint>

namespace ds::cpu {

inline constexpr float kRmsNormEps = 1e-6f;

// Row-wise RMSNorm. weight == nullptr gives the unweighted form. y may alias x.
//   x      [num_rows, dim]
//   weight [dim], nullable
//   y      [num_rows, dim]
void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y);

// §7.1: unweighted RMSNorm of every head of every token, in place.
//   x [num_tokens, num_heads, head_dim]
void rms_norm_heads(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, float eps);

}  // namespace ds::cpu
