// Sparse sink attention reference (REF kernel.py sparse_attn_kernel semantics, written as an
// exact two-pass softmax per head instead of the online form). Parallel over heads.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/parallel.h"

namespace ds::cpu {

void sparse_attention(const SparseAttentionParams& p) {
  const int64_t hd = p.head_dim;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  DS_OMP_PARALLEL_FOR_IF(p.num_heads * p.num_keys * hd >= kParallelMinWork)
  for (int64_t h = 0; h < p.num_heads; ++h) {
    const float* qh = p.q + h * hd;
    float* oh = p.out + h * hd;
    thread_local std::vector<float> scores;
    scores.resize(size_t(p.num_keys));
    float score_max = neg_inf;
    for (int64_t j = 0; j < p.num_keys; ++j) {
      const float* k = p.keys[j];
      scores[size_t(j)] = dot_f32(qh, k, hd) * p.softmax_scale;
      score_max = std::max(score_max, scores[size_t(j)]);
    }
    std::fill(oh, oh + hd, 0.0f);
    if (p.lse) p.lse[h] = neg_inf;
    if (p.num_keys == 0) continue;
    // Weights relative to the score max (REF's m); the sink only joins the denominator. A sink far
    // above every score makes exp(sink - m) overflow to inf and the output 0, its correct limit.
    float key_sum = 0.0f;
    for (int64_t j = 0; j < p.num_keys; ++j) {
      const float e = std::exp(scores[size_t(j)] - score_max);
      scores[size_t(j)] = e;
      key_sum += e;
    }
    const float sink_term = p.sink ? std::exp(p.sink[h] - score_max) : 0.0f;
    const float denominator = key_sum + sink_term;
    for (int64_t j = 0; j < p.num_keys; ++j) {
      const float weight = scores[size_t(j)] / denominator;
      const float* v = p.keys[j];
      for (int64_t d = 0; d < hd; ++d) oh[d] += weight * v[d];
    }
    if (p.lse) p.lse[h] = score_max + std::log(key_sum);
  }
}

}  // namespace ds::cpu
