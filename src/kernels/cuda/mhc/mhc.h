// Manifold-constrained hyper-connections on the GPU (dsv4-model.md §5): mhc_pre (mixes over the
// flattened hc streams, the pre/post split, Sinkhorn of the comb matrix, the collapse into the
// block input u), mhc_post (X_new[k] = post[k] * o + sum_j C[j][k] X[j], rows of C pick the
// input stream) and mhc_head (the final collapse, no Sinkhorn). CPU references: ds::cpu::mhc_pre
// / mhc_post / mhc_head (src/kernels/cpu/mhc.h).
//
// mhc_pre and mhc_head run in two kernels: a split-K GEMV/GEMM for the mixes (each warp takes 4
// tokens x one K chunk; fn chunks are shared through L1 by the warps of a block) writing partial
// sums to a caller-provided workspace, then one block per token that adds the partials in a fixed
// order (deterministic), splits, runs Sinkhorn and writes u. hc must be 4 (DeepSeek-V4).
// Decode sizes (<= 64 tokens) run in one launch instead, a cluster of 8 CTAs per 4 tokens (1 at
// one token) that sums the partials through distributed shared memory; it needs thread-block
// clusters (compute capability 9.0+) and hc * dim a multiple of 1024, else the two kernels run.
// Both are deterministic; they sum the mixes in different orders (within the tests' tolerance).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

inline constexpr int kMhcHc = 4;  // hc_mult supported by these kernels

// Floats of workspace mhc_pre / mhc_head need for any num_tokens <= max_tokens.
int64_t mhc_workspace_floats(int64_t max_tokens, int64_t dim);

// Whether the one-launch path can run for this dim on the current device.
bool mhc_fused_supported(int64_t dim);

struct MhcPreParams {
  const float* x = nullptr;      // [num_tokens, hc, dim] residual streams (16-byte aligned)
  const float* fn = nullptr;     // [(2 + hc) * hc, hc * dim]
  const float* base = nullptr;   // [(2 + hc) * hc]
  const float* scale = nullptr;  // [3]: pre, post, comb (device memory)
  float* u = nullptr;            // [num_tokens, dim]
  float* post = nullptr;         // [num_tokens, hc]
  float* comb = nullptr;         // [num_tokens, hc, hc], row j = input stream, column k = output
  float* workspace = nullptr;    // [mhc_workspace_floats(num_tokens, dim)]
  int64_t num_tokens = 0;
  int64_t dim = 0;  // hidden size per stream; hc * dim a multiple of 128
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
  bool round_bf16 = false;  // round u to bf16 values (REF casts u to bf16)
  // Optional: the block input's RMSNorm fused in (the forward's attn_norm / ffn_norm): u becomes
  // rms_norm(u) * rms_weight, computed from the (rounded) u and rounded again when round_bf16, as
  // mhc_pre followed by launch_rms_norm in place would give. [dim]
  const float* rms_weight = nullptr;
  float rms_eps = 1e-6f;
  // 0: by size (the one launch at <= 64 tokens where supported); 1: the two kernels; 2: the one
  // launch where mhc_fused_supported (any token count), else the two kernels.
  int path = 0;
};

void launch_mhc_pre(const MhcPreParams& params, cudaStream_t stream);

struct MhcPostParams {
  const float* o = nullptr;     // [num_tokens, dim] block output
  const float* x = nullptr;     // [num_tokens, hc, dim] the site's input streams
  const float* post = nullptr;  // [num_tokens, hc]
  const float* comb = nullptr;  // [num_tokens, hc, hc]
  float* x_new = nullptr;       // [num_tokens, hc, dim]; must not alias x
  int64_t num_tokens = 0;
  int64_t dim = 0;          // a multiple of 4
  bool round_bf16 = false;  // round X_new to bf16 values (the residual streams are bf16)
};

// Elementwise; with the same post/comb as the CPU its output is bit-identical (same operation
// order, no FMA contraction).
void launch_mhc_post(const MhcPostParams& params, cudaStream_t stream);

struct MhcHeadParams {
  const float* x = nullptr;      // [num_tokens, hc, dim]
  const float* fn = nullptr;     // [hc, hc * dim]
  const float* base = nullptr;   // [hc]
  const float* scale = nullptr;  // [1]
  float* y = nullptr;            // [num_tokens, dim]
  float* workspace = nullptr;    // [mhc_workspace_floats(num_tokens, dim)]
  int64_t num_tokens = 0;
  int64_t dim = 0;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
  bool round_bf16 = false;
  int path = 0;  // as MhcPreParams::path
};

void launch_mhc_head(const MhcHeadParams& params, cudaStream_t stream);

}  // namespace ds::cuda
