// Grouped output projection of the attention (dsv4-model.md §7.8): the per-head outputs
// o[num_heads][head_dim] are split into `groups` groups of consecutive heads; group g is
// projected by its own rank-`rank` block of wo_a (wo_a is block-diagonal by group, stored as
// [groups * rank, num_heads * head_dim / groups]), then wo_b maps the concatenation back to the
// hidden size.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace ds::cpu {

// z[t][g*rank + r] = o[t][g] . wo_a[g*rank + r] with rank = wo_a.out_features / groups. For an
// FP8 wo_a, rank must be a multiple of 128 (the weight blocks then align with the groups).
//   o [num_tokens, num_heads * head_dim] (= [num_tokens, groups, wo_a.in_features])
//   z [num_tokens, wo_a.out_features]
void grouped_output_projection(const float* o, int64_t num_tokens, int64_t groups,
                               const LinearWeight& wo_a, bool quantize_activations, float* z);

// out = grouped_output_projection(o) @ wo_b^T. REF keeps wo_a in bf16 and never quantizes its
// input (§2: quantize_wo_a_input = false in both modes); wo_b is an FP8 linear whose input is
// quantized in reference mode.
//   o   [num_tokens, num_heads * head_dim]
//   out [num_tokens, wo_b.out_features]
void output_projection(const float* o, int64_t num_tokens, int64_t groups, const LinearWeight& wo_a,
                       const LinearWeight& wo_b, bool quantize_wo_a_input, bool quantize_wo_b_input,
                       float* out);

}  // namespace ds::cpu
