// Mixture of experts (dsv4-model.md §8): the router (sqrt-softplus scores; learned top-k by
// score + bias with the bias used for selection only, or hash routing through a tid2eid row;
// weights renormalized over the chosen experts and scaled by routed_scaling_factor), the routed
// SwiGLU expert with the clamp min(a, limit) / clamp(b, ±limit), the shared expert (clamp
// optional: off in reference mode, on in hf mode) and the combine f = sum_e y_e + y_s.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace ds::cpu {

struct RouterConfig {
  int64_t num_experts = 256;    // n_routed_experts
  int64_t topk = 6;             // num_experts_per_tok
  float route_scale = 1.5f;     // routed_scaling_factor
  float renorm_epsilon = 0.0f;  // 0 (reference) or 1e-20 (hf), NumericsFlags::router_renorm_epsilon
};

// s = sqrt(softplus(logit)) with torch's softplus (beta 1, threshold 20: x itself above 20).
float sqrt_softplus(float logit);

// One token from its router logits: scores s = sqrt_softplus(logits); the experts are
// hash_row[0..topk) when hash_row is given (hash layers), else the top-k of s + bias (bias
// nullable = 0); weights = s[idx] / (sum s[idx] + eps) * route_scale.
//   logits   [num_experts]
//   bias     [num_experts], nullable (hash layers have none)
//   hash_row [topk], nullable (the token's tid2eid row)
//   experts  [topk]
//   weights  [topk]
void route_token(const RouterConfig& config, const float* logits, const float* bias,
                 const int32_t* hash_row, int32_t* experts, float* weights);

struct RouterWeights {
  LinearWeight gate;                 // [num_experts, dim], bf16 or fp32; REF computes in fp32
  const float* bias = nullptr;       // [num_experts], nullable (hash layers)
  const int32_t* tid2eid = nullptr;  // [vocab_size, topk], nullable (learned layers)
  int64_t vocab_size = 0;            // rows of tid2eid
};

// Router for num_tokens tokens: logits = x @ gate^T (fp32, never quantized), then route_token.
//   x         [num_tokens, dim]
//   token_ids [num_tokens], needed when tid2eid is set (ids must be < vocab_size)
//   experts   [num_tokens, topk]
//   weights   [num_tokens, topk]
void moe_route(const RouterConfig& config, const RouterWeights& router, const float* x,
               const int32_t* token_ids, int64_t num_tokens, int32_t* experts, float* weights);

// One SwiGLU expert: w1, w3 [inter, dim], w2 [dim, inter].
struct ExpertWeights {
  LinearWeight w1;
  LinearWeight w2;
  LinearWeight w3;
};

struct ExpertOptions {
  // swiglu_limit; 0 disables the clamp (a = min(a, limit), b = clamp(b, -limit, limit)).
  float swiglu_limit = 10.0f;
  bool quantize_activations = true;  // §10.2 FP8 activation quantization of the w1/w3/w2 inputs
  // Round w1/w3 outputs, the w2 input and the w2 output to bf16, as REF's bf16 tensors do.
  bool round_bf16 = false;
};

// y = (route_weight * silu(a) * b) @ w2^T with a = x @ w1^T, b = x @ w3^T (clamped per options).
// The route weight multiplies in before w2 as in REF; route_weight nullable (1, shared expert).
//   x            [num_tokens, dim]
//   route_weight [num_tokens], nullable
//   y            [num_tokens, dim]
void expert_swiglu(const ExpertWeights& weights, const ExpertOptions& options, const float* x,
                   int64_t num_tokens, const float* route_weight, float* y);

struct MoeParams {
  RouterConfig router_config;
  RouterWeights router;
  const ExpertWeights* experts = nullptr;  // [num_experts]
  ExpertWeights shared;                    // the single shared expert
  float swiglu_limit = 10.0f;
  bool shared_expert_clamp = false;  // NumericsFlags::shared_expert_clamp
  bool quantize_activations = true;  // NumericsFlags::activation_quantization
  bool round_bf16 = false;           // see ExpertOptions::round_bf16
  // Expert parallelism: only routed experts in [expert_begin, expert_end) run here (-1 = all), and
  // the shared expert only when add_shared; the partial sums of the ranks add up to the whole.
  int64_t expert_begin = 0;
  int64_t expert_end = -1;
  bool add_shared = true;
};

// The whole MoE for num_tokens tokens: route, run each routed expert on its tokens, add the
// shared expert, f = sum_e y_e + y_s accumulated in fp32 (REF casts f to bf16 afterwards; that is
// the caller's choice).
//   x         [num_tokens, dim]
//   token_ids [num_tokens], nullable unless the layer hash-routes
//   y         [num_tokens, dim]
void moe_forward(const MoeParams& params, const float* x, const int32_t* token_ids,
                 int64_t num_tokens, float* y);

}  // namespace ds::cpu
