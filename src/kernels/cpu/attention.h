// Sparse attention with a per-head sink (dsv4-model.md §7.4, §7.5) for one query token over an
// explicit key set (the union of window keys and selected compressed entries; K = V, one shared
// vector per key). The sink is one logit per head that adds mass to the softmax denominator and
// contributes no value. The inverse RoPE of the output's rope slice (§7.3) is a separate call
// (rope_rotate with RopeDirection::kInverse).
#pragma once

#include <cstdint>

namespace ds::cpu {

struct SparseAttentionParams {
  const float* q = nullptr;            // [num_heads, head_dim] (one query token)
  const float* const* keys = nullptr;  // [num_keys] pointers to [head_dim] vectors, used as K and V
  int64_t num_keys = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  float softmax_scale = 0.0f;   // 512^-0.5 for DeepSeek-V4 (head_dim^-0.5)
  const float* sink = nullptr;  // [num_heads] sink logits, nullable (no sink: plain softmax)
  float* out = nullptr;         // [num_heads, head_dim]
  // [num_heads], nullable: log(sum_j exp(s_j)) over the keys only (the sink is excluded), with
  // s_j = (q . k_j) * softmax_scale; -inf when num_keys == 0. This is what a split-KV kernel
  // merges before applying the sink.
  float* lse = nullptr;
};

// o[h] = sum_j exp(s_j - m) k_j / (sum_j exp(s_j - m) + exp(sink[h] - m)) with m = max_j s_j,
// fp32 throughout (§7.5). With no keys, o[h] = 0.
void sparse_attention(const SparseAttentionParams& params);

}  // namespace ds::cpu
