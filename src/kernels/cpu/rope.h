// Rotary position embedding (dsv4-model.md §7.3): the frequency table (plain for ratio-0 layers;
// YaRN frequency interpolation with compress_rope_theta for CSA/HCA layers, no magnitude
// scaling), the interleaved (GPT-J style) rotation of the last rope_dim dims of each head, and
// its inverse (the complex conjugate), used to de-rotate the attention output.
#pragma once

#include <cstdint>

namespace ds::cpu {

struct RopeConfig {
  int64_t rope_dim = 64;   // qk_rope_head_dim; pairs i = 0 .. rope_dim/2 - 1
  double theta = 10000.0;  // rope_theta (ratio-0 layers) or compress_rope_theta (CSA/HCA)
  // YaRN frequency interpolation (CSA/HCA layers only; always applied there, §7.3).
  bool yarn = false;
  double yarn_factor = 16.0;              // rope_scaling.factor
  int64_t original_max_position = 65536;  // rope_scaling.original_max_position_embeddings
  double beta_fast = 32.0;                // rope_scaling.beta_fast
  double beta_slow = 1.0;                 // rope_scaling.beta_slow
};

// The table of a layer: theta = rope_theta and no YaRN for compress_ratio 0 (SWA layers and MTP),
// theta = compress_rope_theta with YaRN otherwise. The YaRN fields come from rope_scaling.
RopeConfig rope_config_for_layer(int64_t compress_ratio, int64_t rope_dim, double rope_theta,
                                 double compress_rope_theta, double yarn_factor,
                                 int64_t original_max_position, double beta_fast, double beta_slow);

// inv_freq_i = theta^(-2i/rope_dim); with YaRN, low = floor(cd(beta_fast)),
// high = ceil(cd(beta_slow)), cd(n) = rope_dim * ln(orig / (2 pi n)) / (2 ln theta),
// ramp_i = clamp((i - low) / (high - low), 0, 1), f_i = inv_freq_i/factor * ramp_i
// + inv_freq_i * (1 - ramp_i) (REF precompute_freqs_cis, evaluated in fp32 in the same order).
//   inv_freq [rope_dim / 2]
void rope_inv_freq(const RopeConfig& config, float* inv_freq);

enum class RopeDirection : uint8_t {
  kForward,  // multiply pair i by e^{+i * position * f_i}
  kInverse,  // multiply by the conjugate (§7.3 output de-rotation)
};

// Rotates dims [head_dim - rope_dim, head_dim) of every head at one position, in place. Pair i is
// (2i, 2i+1) of that slice (interleaved, sglang is_neox_style=False). The angle is
// fp32(position) * f_i rounded to fp32, as REF's torch.outer in fp32.
//   x        [num_heads, head_dim]
//   inv_freq [rope_dim / 2]
void rope_rotate(float* x, int64_t num_heads, int64_t head_dim, int64_t rope_dim,
                 const float* inv_freq, int64_t position, RopeDirection direction);

}  // namespace ds::cpu
