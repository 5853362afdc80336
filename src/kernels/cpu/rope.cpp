// RoPE references: REF precompute_freqs_cis (fp32 table, YaRN ramp) and apply_rotary_emb
// (complex multiply of interleaved pairs; inverse = conjugate).
#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace ds::cpu {

RopeConfig rope_config_for_layer(int64_t compress_ratio, int64_t rope_dim, double rope_theta,
                                 double compress_rope_theta, double yarn_factor,
                                 int64_t original_max_position, double beta_fast,
                                 double beta_slow) {
  RopeConfig config;
  config.rope_dim = rope_dim;
  config.yarn_factor = yarn_factor;
  config.original_max_position = original_max_position;
  config.beta_fast = beta_fast;
  config.beta_slow = beta_slow;
  if (compress_ratio == 0) {
    // REF: "disable YaRN and use base rope_theta in pure sliding-window attention".
    config.theta = rope_theta;
    config.yarn = false;
  } else {
    config.theta = compress_rope_theta;
    config.yarn = original_max_position > 0;
  }
  return config;
}

void rope_inv_freq(const RopeConfig& config, float* inv_freq) {
  const int64_t dim = config.rope_dim;
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // REF: 1 / base^(arange(0, dim, 2) / dim) in fp32; the power is evaluated in double and
    // rounded (correctly rounded, which torch's fp32 pow matches to within an ulp).
    const float exponent = float(2 * i) / float(dim);
    inv_freq[i] = 1.0f / float(std::pow(config.theta, double(exponent)));
  }
  if (!config.yarn) return;
  // §7.3 / REF find_correction_range: correction dims for beta_fast and beta_slow rotations.
  auto correction_dim = [&](double num_rotations) {
    return double(dim) *
           std::log(double(config.original_max_position) /
                    (num_rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(config.theta));
  };
  double low = std::max(std::floor(correction_dim(config.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(config.beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;
  const float factor = float(config.yarn_factor);
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp((float(i) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
    const float smooth = 1.0f - ramp;
    inv_freq[i] = inv_freq[i] / factor * (1.0f - smooth) + inv_freq[i] * smooth;
  }
}

void rope_rotate(float* x, int64_t num_heads, int64_t head_dim, int64_t rope_dim,
                 const float* inv_freq, int64_t position, RopeDirection direction) {
  const int64_t half = rope_dim / 2;
  thread_local std::vector<float> cos_table, sin_table;
  cos_table.resize(size_t(half));
  sin_table.resize(size_t(half));
  const float sign = direction == RopeDirection::kInverse ? -1.0f : 1.0f;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = float(position) * inv_freq[i];
    cos_table[size_t(i)] = float(std::cos(double(angle)));
    sin_table[size_t(i)] = sign * float(std::sin(double(angle)));
  }
  for (int64_t h = 0; h < num_heads; ++h) {
    float* slice = x + h * head_dim + (head_dim - rope_dim);
    for (int64_t i = 0; i < half; ++i) {
      const float re = slice[2 * i], im = slice[2 * i + 1];
      const float c = cos_table[size_t(i)], s = sin_table[size_t(i)];
      // (re + i im) * (c + i s)
      slice[2 * i] = re * c - im * s;
      slice[2 * i + 1] = re * s + im * c;
    }
  }
}

}  // namespace ds::cpu
