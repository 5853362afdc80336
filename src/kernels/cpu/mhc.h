// Manifold-constrained hyper-connections (dsv4-model.md §5): the residual stream is hc_mult
// parallel copies X[hc][dim]. Pre collapses them into the block input with the mixes
// m = (fn @ flatten(X)) * rsqrt(mean(X^2) + eps), split into pre/post weights and a Sinkhorn-
// normalized combination matrix C; post expands the block output back and mixes the streams
// through C^T; the final head collapses the streams without Sinkhorn.
#pragma once

#include <cstdint>

namespace ds::cpu {

struct MhcConfig {
  int64_t hc_mult = 4;          // number of streams (hc)
  int64_t dim = 0;              // hidden size per stream
  int64_t sinkhorn_iters = 20;  // hc_sinkhorn_iters
  float hc_eps = 1e-6f;         // hc_eps
  float norm_eps = 1e-6f;       // rms_norm_eps of the mixes' normalization
};

// One mHC site's parameters (hc_attn_* or hc_ffn_*), num_mixes = (2 + hc) * hc.
struct MhcSiteWeights {
  const float* fn;     // [num_mixes, hc * dim]
  const float* base;   // [num_mixes]
  const float* scale;  // [3]: pre, post, comb
};

// The final head collapse's parameters (hc_head_*).
struct MhcHeadWeights {
  const float* fn;     // [hc, hc * dim]
  const float* base;   // [hc]
  const float* scale;  // [1]
};

// §5.1: m = (fn @ x) * rsqrt(mean(x^2) + norm_eps) over the flattened streams of one token.
//   x     [hc * dim] (= X[hc][dim] flattened)
//   fn    [num_mixes, hc * dim]
//   mixes [num_mixes]
void mhc_mixes(const float* x, const float* fn, int64_t num_mixes, int64_t hc_dim, float norm_eps,
               float* mixes);

// §5.1 Sinkhorn normalization of a comb logit matrix, in place: row softmax + eps, one column
// normalization, then (iters - 1) rounds of row then column normalization (REF
// hc_split_sinkhorn: 20 normalization rounds in total for iters = 20). Row j is the input
// stream, column k the output stream.
//   comb [hc, hc] (in: scaled logits, out: the doubly stochastic matrix)
void mhc_sinkhorn(float* comb, int64_t hc, int64_t iters, float eps);

// §5.1 split of one token's mixes (REF hc_split_sinkhorn):
// pre = sigmoid(m[0:hc]*scale[0] + base[0:hc]) + eps, post = 2*sigmoid(m[hc:2hc]*scale[1] +
// base[hc:2hc]), comb = Sinkhorn(m[2hc:] viewed [hc][hc] * scale[2] + base[2hc:]).
//   mixes [num_mixes], scale [3], base [num_mixes]
//   pre [hc], post [hc], comb [hc, hc]
void mhc_split(const float* mixes, const float* scale, const float* base, int64_t hc, int64_t iters,
               float eps, float* pre, float* post, float* comb);

// §5.1 for num_tokens tokens: u = sum_i pre[i] * X[i] (fp32; REF then casts to bf16, which is the
// caller's choice), plus post and comb for mhc_post.
//   x    [num_tokens, hc, dim]
//   u    [num_tokens, dim]
//   post [num_tokens, hc]
//   comb [num_tokens, hc, hc]
void mhc_pre(const MhcConfig& config, const MhcSiteWeights& weights, const float* x,
             int64_t num_tokens, float* u, float* post, float* comb);

// §5.2: X_new[k] = post[k] * o + sum_j comb[j][k] * X[j] (the sum is C^T X: the row picks the
// input stream). x_new must not alias x.
//   o     [num_tokens, dim]
//   x     [num_tokens, hc, dim]
//   post  [num_tokens, hc]
//   comb  [num_tokens, hc, hc]
//   x_new [num_tokens, hc, dim]
void mhc_post(const MhcConfig& config, const float* o, const float* x, const float* post,
              const float* comb, int64_t num_tokens, float* x_new);

// §5.3: pre = sigmoid(m * scale[0] + base) + hc_eps with m the hc mixes of hc_head_fn,
// y = sum_i pre[i] * X[i]. No Sinkhorn, no post.
//   x [num_tokens, hc, dim]
//   y [num_tokens, dim]
void mhc_head(const MhcConfig& config, const MhcHeadWeights& weights, const float* x,
              int64_t num_tokens, float* y);

}  // namespace ds::cpu
