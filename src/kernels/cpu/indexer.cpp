// Lightning indexer references (REF model.py Indexer.forward for one query position).
#include "kernels/cpu/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"

namespace ds::cpu {

void indexer_prepare_query(float* q, int64_t num_heads, int64_t head_dim, int64_t rope_dim,
                           const float* inv_freq, int64_t position, bool simulate_fp4,
                           bool round_bf16) {
  rope_rotate(q, num_heads, head_dim, rope_dim, inv_freq, position, RopeDirection::kForward);
  if (round_bf16) round_to_bf16(q, num_heads * head_dim);
  if (!simulate_fp4) return;
  hadamard_transform(q, num_heads, head_dim);
  if (round_bf16) round_to_bf16(q, num_heads * head_dim);
  simulate_fp4_blocks(q, num_heads * head_dim, kFp4Block);
}

void indexer_query(const IndexerQueryParams& params, const LinearWeight& wq_b, const float* qr,
                   int64_t position, float* q) {
  linear(qr, 1, wq_b, params.quantize_activations, q);
  if (params.round_bf16) round_to_bf16(q, params.num_heads * params.head_dim);
  indexer_prepare_query(q, params.num_heads, params.head_dim, params.rope_dim, params.inv_freq,
                        position, params.simulate_fp4, params.round_bf16);
}

void indexer_scale_weights(const float* projected, int64_t num_heads, int64_t head_dim,
                           float* weights) {
  // REF: weights_proj(x) * (softmax_scale * n_heads^-0.5), softmax_scale = head_dim^-0.5.
  const float scale = float(std::pow(double(head_dim), -0.5) * std::pow(double(num_heads), -0.5));
  for (int64_t h = 0; h < num_heads; ++h) weights[h] = projected[h] * scale;
}

void indexer_scores(const float* q, const float* weights, const float* keys, int64_t num_keys,
                    int64_t num_heads, int64_t head_dim, float* scores) {
  DS_OMP_PARALLEL_FOR_IF(num_keys * num_heads * head_dim >= kParallelMinWork)
  for (int64_t w = 0; w < num_keys; ++w) {
    const float* k = keys + w * head_dim;
    float total = 0.0f;
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* qh = q + h * head_dim;
      total += weights[h] * std::max(dot_f32(qh, k, head_dim), 0.0f);
    }
    scores[w] = total;
  }
}

int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* indices) {
  const int64_t count = std::min(k, n);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  std::copy(order.begin(), order.begin() + count, indices);
  return count;
}

int64_t indexer_select(const float* q, const float* weights, const float* keys, int64_t num_visible,
                       int64_t num_heads, int64_t head_dim, int64_t topk, int32_t* selected) {
  if (num_visible <= topk) {
    // §7.7: the selection is "everything"; scoring would not change it.
    for (int64_t w = 0; w < num_visible; ++w) selected[w] = int32_t(w);
    return num_visible;
  }
  std::vector<float> scores(static_cast<size_t>(num_visible));
  indexer_scores(q, weights, keys, num_visible, num_heads, head_dim, scores.data());
  return topk_indices(scores.data(), num_visible, topk, selected);
}

}  // namespace ds::cpu
