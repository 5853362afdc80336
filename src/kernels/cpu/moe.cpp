// MoE references (REF model.py Gate, Expert, MoE.forward).
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/cpu/indexer.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {

float sqrt_softplus(float logit) {
  const float softplus = logit > 20.0f ? logit : std::log1p(std::exp(logit));
  return std::sqrt(softplus);
}

void route_token(const RouterConfig& config, const float* logits, const float* bias,
                 const int32_t* hash_row, int32_t* experts, float* weights) {
  const int64_t e_count = config.num_experts, k = config.topk;
  thread_local std::vector<float> scores, biased;
  scores.resize(size_t(e_count));
  biased.resize(size_t(e_count));
  for (int64_t e = 0; e < e_count; ++e) {
    scores[size_t(e)] = sqrt_softplus(logits[e]);
    biased[size_t(e)] = scores[size_t(e)] + (bias ? bias[e] : 0.0f);
  }
  if (hash_row) {
    std::copy(hash_row, hash_row + k, experts);
  } else {
    // The bias only decides which experts are chosen (aux-free load balancing).
    topk_indices(biased.data(), e_count, k, experts);
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += scores[size_t(experts[i])];
  for (int64_t i = 0; i < k; ++i) {
    weights[i] = scores[size_t(experts[i])] / (sum + config.renorm_epsilon) * config.route_scale;
  }
}

void moe_route(const RouterConfig& config, const RouterWeights& router, const float* x,
               const int32_t* token_ids, int64_t num_tokens, int32_t* experts, float* weights) {
  std::vector<float> logits(static_cast<size_t>(num_tokens * config.num_experts));
  linear(x, num_tokens, router.gate, false, logits.data());
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t* hash_row = nullptr;
    if (router.tid2eid) {
      assert(token_ids && token_ids[t] >= 0 && token_ids[t] < router.vocab_size);
      hash_row = router.tid2eid + int64_t(token_ids[t]) * config.topk;
    }
    route_token(config, logits.data() + t * config.num_experts, router.bias, hash_row,
                experts + t * config.topk, weights + t * config.topk);
  }
}

void expert_swiglu(const ExpertWeights& weights, const ExpertOptions& options, const float* x,
                   int64_t num_tokens, const float* route_weight, float* y) {
  const int64_t inter = weights.w1.out_features;
  std::vector<float> a(static_cast<size_t>(num_tokens * inter)), b(size_t(num_tokens * inter));
  linear(x, num_tokens, weights.w1, options.quantize_activations, a.data());
  linear(x, num_tokens, weights.w3, options.quantize_activations, b.data());
  const float limit = options.swiglu_limit;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float rw = route_weight ? route_weight[t] : 1.0f;
    for (int64_t i = 0; i < inter; ++i) {
      float av = a[size_t(t * inter + i)], bv = b[size_t(t * inter + i)];
      if (options.round_bf16) {
        av = round_bf16(av);
        bv = round_bf16(bv);
      }
      if (limit > 0.0f) {
        av = std::min(av, limit);
        bv = std::clamp(bv, -limit, limit);
      }
      const float silu = av / (1.0f + std::exp(-av));
      float hidden = silu * bv;
      if (route_weight) hidden = rw * hidden;
      a[size_t(t * inter + i)] = options.round_bf16 ? round_bf16(hidden) : hidden;
    }
  }
  linear(a.data(), num_tokens, weights.w2, options.quantize_activations, y);
  if (options.round_bf16) round_to_bf16(y, num_tokens * weights.w2.out_features);
}

void moe_forward(const MoeParams& params, const float* x, const int32_t* token_ids,
                 int64_t num_tokens, float* y) {
  const RouterConfig& rc = params.router_config;
  const int64_t dim = params.shared.w1.in_features;
  std::vector<int32_t> experts(static_cast<size_t>(num_tokens * rc.topk));
  std::vector<float> route_weights(static_cast<size_t>(num_tokens * rc.topk));
  moe_route(rc, params.router, x, token_ids, num_tokens, experts.data(), route_weights.data());

  std::fill(y, y + num_tokens * dim, 0.0f);
  ExpertOptions routed_options{params.swiglu_limit, params.quantize_activations, params.round_bf16};
  // Gather the tokens routed to each expert, run it once on them, scatter-add (REF's loop).
  std::vector<float> x_group, w_group, y_group;
  std::vector<int64_t> token_of_row;
  const int64_t expert_end = params.expert_end < 0 ? rc.num_experts : params.expert_end;
  for (int64_t e = params.expert_begin; e < expert_end; ++e) {
    token_of_row.clear();
    w_group.clear();
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t i = 0; i < rc.topk; ++i) {
        if (experts[size_t(t * rc.topk + i)] == e) {
          token_of_row.push_back(t);
          w_group.push_back(route_weights[size_t(t * rc.topk + i)]);
        }
      }
    }
    if (token_of_row.empty()) continue;
    const int64_t rows = int64_t(token_of_row.size());
    x_group.resize(size_t(rows * dim));
    y_group.resize(size_t(rows * dim));
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(x + token_of_row[size_t(r)] * dim, x + (token_of_row[size_t(r)] + 1) * dim,
                x_group.begin() + r * dim);
    }
    expert_swiglu(params.experts[e], routed_options, x_group.data(), rows, w_group.data(),
                  y_group.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* yt = y + token_of_row[size_t(r)] * dim;
      for (int64_t d = 0; d < dim; ++d) yt[d] += y_group[size_t(r * dim + d)];
    }
  }
  if (!params.add_shared) return;
  ExpertOptions shared_options{params.shared_expert_clamp ? params.swiglu_limit : 0.0f,
                               params.quantize_activations, params.round_bf16};
  std::vector<float> y_shared(static_cast<size_t>(num_tokens * dim));
  expert_swiglu(params.shared, shared_options, x, num_tokens, nullptr, y_shared.data());
  for (int64_t i = 0; i < num_tokens * dim; ++i) y[i] += y_shared[size_t(i)];
}

}  // namespace ds::cpu
