// Lightning indexer (dsv4-model.md §7.7, CSA layers): scores every visible ratio-4 compressed
// entry for one query token and selects the top-k entries the attention will see. Query: the
// indexer's wq_b projection of qr (done by the caller with linear()), RoPE on the rope tail at
// the query position, then (reference mode) a Hadamard rotation per head and FP4 simulation.
// Keys: the indexer compressor's finished entries (compressor_finish_entry with kIndexer).
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace ds::cpu {

struct IndexerQueryParams {
  int64_t num_heads = 64;            // index_n_heads
  int64_t head_dim = 128;            // index_head_dim
  int64_t rope_dim = 64;             // qk_rope_head_dim
  const float* inv_freq = nullptr;   // [rope_dim / 2], the layer's compressed (YaRN) table
  bool quantize_activations = true;  // §10.2 FP8 quantization of qr before the FP8 wq_b
  bool simulate_fp4 = true;          // NumericsFlags::indexer_fp4_simulation
  bool round_bf16 = true;            // round as REF's bf16 tensors (wq_b output, RoPE, Hadamard)
};

// The indexer query of one token: q = qr @ wq_b^T (rounded to bf16 when round_bf16), then
// indexer_prepare_query.
//   qr   [q_lora_rank] (the q_norm output, shared with the attention query)
//   wq_b [num_heads * head_dim, q_lora_rank]
//   q    [num_heads, head_dim]
void indexer_query(const IndexerQueryParams& params, const LinearWeight& wq_b, const float* qr,
                   int64_t position, float* q);

// In place on the projected query q = qr @ indexer.wq_b^T viewed [num_heads][head_dim]: RoPE of
// dims [head_dim - rope_dim, head_dim) at `position` (the layer's compressed table), then, when
// simulate_fp4, the orthonormal Hadamard of each head and FP4 simulation (e2m1, ue8m0 per 32).
// round_bf16 rounds after RoPE and after the Hadamard, as REF's bf16 tensors do.
//   q        [num_heads, head_dim]
//   inv_freq [rope_dim / 2]
void indexer_prepare_query(float* q, int64_t num_heads, int64_t head_dim, int64_t rope_dim,
                           const float* inv_freq, int64_t position, bool simulate_fp4,
                           bool round_bf16);

// w = (h @ weights_proj^T) * (head_dim^-0.5 * num_heads^-0.5); the caller does the bf16 linear.
// No softmax; weights may be negative.
//   projected [num_heads], weights [num_heads] (may alias)
void indexer_scale_weights(const float* projected, int64_t num_heads, int64_t head_dim,
                           float* weights);

// I(w) = sum_h weights[h] * ReLU(q[h] . keys[w]) for every key (fp32).
//   q       [num_heads, head_dim]
//   weights [num_heads]
//   keys    [num_keys, head_dim]
//   scores  [num_keys]
void indexer_scores(const float* q, const float* weights, const float* keys, int64_t num_keys,
                    int64_t num_heads, int64_t head_dim, float* scores);

// Indices of the min(k, n) largest scores, in descending score order (ties by lower index).
// Returns the count written.
//   scores  [n]
//   indices [min(k, n)]
int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* indices);

// §7.4/§7.7 selection for a query that sees num_visible = floor((t+1)/4) entries: when
// num_visible <= topk every entry is selected (0 .. num_visible-1, no scoring); otherwise the
// top-k entries by indexer score. Returns the count written.
//   q        [num_heads, head_dim] (prepared)
//   weights  [num_heads] (scaled)
//   keys     [num_visible, head_dim]
//   selected [min(topk, num_visible)]
int64_t indexer_select(const float* q, const float* weights, const float* keys, int64_t num_visible,
                       int64_t num_heads, int64_t head_dim, int64_t topk, int32_t* selected);

}  // namespace ds::cpu
