// Grouped output projection reference: one linear per group on a row slice of wo_a.
#include "kernels/cpu/output_projection.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <vector>

namespace ds::cpu {

void grouped_output_projection(const float* o, int64_t num_tokens, int64_t groups,
                               const LinearWeight& wo_a, bool quantize_activations, float* z) {
  const int64_t rank = wo_a.out_features / groups;
  const int64_t group_in = wo_a.in_features;  // (num_heads / groups) * head_dim
  assert(rank * groups == wo_a.out_features);
  std::vector<float> o_group(static_cast<size_t>(num_tokens * group_in));
  std::vector<float> z_group(static_cast<size_t>(num_tokens * rank));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* src = o + t * groups * group_in + g * group_in;
      std::copy(src, src + group_in, o_group.begin() + t * group_in);
    }
    linear(o_group.data(), num_tokens, slice_rows(wo_a, g * rank, rank), quantize_activations,
           z_group.data());
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::copy(z_group.begin() + t * rank, z_group.begin() + (t + 1) * rank,
                z + t * groups * rank + g * rank);
    }
  }
}

void output_projection(const float* o, int64_t num_tokens, int64_t groups, const LinearWeight& wo_a,
                       const LinearWeight& wo_b, bool quantize_wo_a_input, bool quantize_wo_b_input,
                       float* out) {
  std::vector<float> z(static_cast<size_t>(num_tokens * wo_a.out_features));
  grouped_output_projection(o, num_tokens, groups, wo_a, quantize_wo_a_input, z.data());
  linear(z.data(), num_tokens, wo_b, quantize_wo_b_input, out);
}

}  // namespace ds::cpu
