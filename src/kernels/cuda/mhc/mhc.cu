// mHC kernels. Mixes: warp w of the grid takes (K chunk c, group g of 4 tokens) with chunk-major
// numbering, so the 8 warps of a block read the same fn chunk (L1 reuse) for 32 tokens; each lane
// accumulates 4 tokens x kMixes dot products plus the 4 sums of squares over float4 columns, the
// warp reduces them and lane 0 writes the partials. Finish: one block per token sums the partials
// in chunk order, applies rsqrt, the split and Sinkhorn (16 lanes of warp 0, one per element of
// the 4x4 matrix, exchanging row and column values by shuffles) in the CPU reference's operation
// order, then collapses the streams with float4 loads.
//
// Decode sizes (<= kFusedMaxTokens tokens) take one launch instead (mhc_fused_kernel): a cluster
// of kRanks CTAs per group of kT tokens, rank r owning the r-th eighth of hc * dim. Each warp
// accumulates its 128-float steps as above, reduces its partials with a reduce-scatter butterfly
// (every lane ends with whole sums of a few values: ~5x fewer shuffles than one warp_sum per
// value), the CTA adds its warps in order, and after a cluster barrier every rank adds the 8 ranks'
// partials in rank order through distributed shared memory (the same order in every rank, so all
// of them hold the same mixes). Every rank then collapses its eighth of u while an extra warp of
// rank i runs the split and Sinkhorn of token i of the group; with the block input's RMSNorm
// fused in, the ranks exchange their sums of u^2 (one mbarrier arrival per rank) and normalize
// the values they wrote.
#include <algorithm>
#include <cstdlib>

#include <cooperative_groups.h>

#include "kernels/cuda/mhc/mhc.h"
#include "core/env.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/norm/device_util.cuh"
#include "kernels/cuda/norm/norm.h"

namespace ds::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kTok = 4;                           // tokens per warp item
constexpr int kMixWarps = 8;                      // warps per block of the mixes kernel
constexpr int kPreMixes = (2 + kMhcHc) * kMhcHc;  // 24
constexpr int kFinishThreads = 256;

// K chunk per warp item: small chunks (many warps) when there are few tokens, long ones (fewer
// partials, more work per reduction) for prefill. Always divides hc_dim (a multiple of 128).
int64_t chunk_for(int64_t num_tokens, int64_t hc_dim) {
  int64_t chunk = num_tokens <= 16 ? 128 : (num_tokens <= 256 ? 512 : 1024);
  while (chunk > 128 && hc_dim % chunk != 0) chunk /= 2;
  return chunk;
}

// One lane's share of 4 columns [k, k + 4) of the mixes of tokens tok0 .. tok0 + kT - 1 (tokens
// past num_tokens read as zeros): acc[t][m] += fn[m] . x[t], ss[t] += x[t] . x[t].
template <int kMixes, int kT>
__device__ __forceinline__ void accumulate_columns(const float* __restrict__ x,
                                                   const float* __restrict__ fn, int64_t num_tokens,
                                                   int64_t tok0, int64_t hc_dim, int64_t k,
                                                   float (&acc)[kT][kMixes], float (&ss)[kT]) {
  float4 xv[kT];
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    const int64_t tok = tok0 + t;
    xv[t] = tok < num_tokens ? __ldg(reinterpret_cast<const float4*>(x + tok * hc_dim + k))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    ss[t] += xv[t].x * xv[t].x + xv[t].y * xv[t].y + xv[t].z * xv[t].z + xv[t].w * xv[t].w;
  }
#pragma unroll
  for (int m = 0; m < kMixes; ++m) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(fn + m * hc_dim + k));
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      acc[t][m] += f.x * xv[t].x + f.y * xv[t].y + f.z * xv[t].z + f.w * xv[t].w;
    }
  }
}

template <int kMixes>
__global__ void __launch_bounds__(kMixWarps * 32)
    mhc_mixes_kernel(const float* __restrict__ x, const float* __restrict__ fn,
                     float* __restrict__ ws, int64_t num_tokens, int64_t hc_dim, int64_t chunk) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = (num_tokens + kTok - 1) / kTok;
  const int64_t num_chunks = hc_dim / chunk;
  const int64_t item = int64_t(blockIdx.x) * kMixWarps + (threadIdx.x >> 5);
  const bool has_item = item < groups * num_chunks;
  const int64_t c = item / groups, g = item % groups;
  // The mix weights are no kernel's output: the first 512 bytes (chunk >= 128 floats) of each row
  // of this chunk go to L2 while the previous kernel finishes (programmatic launch), then the wait.
  if (has_item) {
    for (int i = lane; i < kMixes * 4; i += 32) {
      const float* line = fn + (i / 4) * hc_dim + c * chunk + (i % 4) * 32;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
    }
  }
  pdl_begin();
  if (!has_item) return;
  float acc[kTok][kMixes];
  float ss[kTok];
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    ss[t] = 0.0f;
#pragma unroll
    for (int m = 0; m < kMixes; ++m) acc[t][m] = 0.0f;
  }
  const int64_t k_end = (c + 1) * chunk;
  for (int64_t k = c * chunk + lane * 4; k < k_end; k += 128)
    accumulate_columns<kMixes, kTok>(x, fn, num_tokens, g * kTok, hc_dim, k, acc, ss);
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    const int64_t tok = g * kTok + t;
    if (tok >= num_tokens) break;  // warp-uniform: padding tokens of the last group
    float* out = ws + (tok * num_chunks + c) * (kMixes + 1);
#pragma unroll
    for (int m = 0; m < kMixes; ++m) {
      const float v = ops::warp_sum(acc[t][m]);
      if (lane == 0) out[m] = v;
    }
    const float v = ops::warp_sum(ss[t]);
    if (lane == 0) out[kMixes] = v;
  }
}

template <int kMixes>
void launch_mixes(const float* x, const float* fn, float* ws, int64_t num_tokens, int64_t hc_dim,
                  cudaStream_t stream) {
  const int64_t chunk = chunk_for(num_tokens, hc_dim);
  const int64_t items = (num_tokens + kTok - 1) / kTok * (hc_dim / chunk);
  const int64_t grid = (items + kMixWarps - 1) / kMixWarps;
  (void)launch_pdl(mhc_mixes_kernel<kMixes>, dim3(unsigned(grid)), dim3(kMixWarps * 32), 0, stream,
                   x, fn, ws, num_tokens, hc_dim, chunk);
}

// Sums the partials of token `tok` into mixes[0..kMixes] (the last is the sum of squares) and
// scales the mixes by rsqrt(mean(x^2) + eps). Warp w takes mixes w, w + 8, ...: each lane adds
// chunks lane, lane + 32, ... and the warp reduces them, a fixed order (deterministic) with every
// load in flight at once.
template <int kMixes>
__device__ void gather_mixes(const float* ws, int64_t tok, int64_t num_chunks, int64_t hc_dim,
                             float norm_eps, float* mixes) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* base = ws + tok * num_chunks * (kMixes + 1);
  for (int m = warp; m <= kMixes; m += kFinishThreads / 32) {
    float s = 0.0f;
    for (int64_t c = lane; c < num_chunks; c += 32) s += base[c * (kMixes + 1) + m];
    s = ops::warp_sum(s);
    if (lane == 0) mixes[m] = s;
  }
  __syncthreads();
  if (threadIdx.x < kMixes) {
    const float r = 1.0f / sqrtf(mixes[kMixes] / float(hc_dim) + norm_eps);
    mixes[threadIdx.x] = __fmul_rn(mixes[threadIdx.x], r);
  }
  __syncthreads();
}

// u[d .. d + 4) = sum_i pre[i] * X[i][d ..] in the reference's order (fp32, no FMA contraction),
// rounded to bf16 values when `round`.
__device__ __forceinline__ float4 collapse4(const float* __restrict__ x, const float* pre,
                                            int64_t dim, int64_t d, bool round) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kMhcHc; ++i) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x + i * dim + d));
    acc[0] = __fadd_rn(acc[0], __fmul_rn(pre[i], v.x));
    acc[1] = __fadd_rn(acc[1], __fmul_rn(pre[i], v.y));
    acc[2] = __fadd_rn(acc[2], __fmul_rn(pre[i], v.z));
    acc[3] = __fadd_rn(acc[3], __fmul_rn(pre[i], v.w));
  }
  if (round) {
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k] = ops::round_bf16(acc[k]);
  }
  return make_float4(acc[0], acc[1], acc[2], acc[3]);
}

// u[d] = sum_i pre[i] * X[i][d] (collapse4) for the
// float4 columns d = d_begin + 4 * (first + i * step) < d_end (first, step: this thread's share).
__device__ void collapse(const float* __restrict__ x, const float* pre, float* __restrict__ out,
                         int64_t dim, int64_t d_begin, int64_t d_end, bool round, int64_t first,
                         int64_t step) {
  for (int64_t d = d_begin + first * 4; d < d_end; d += step * 4)
    *reinterpret_cast<float4*>(out + d) = collapse4(x, pre, dim, d, round);
}

// pre_i = sigmoid(mix_i * scale + base_i) + eps (also the head's weights).
__device__ __forceinline__ float pre_weight(float mix, float scale, float base, float eps) {
  return ops::sigmoid_f32(__fadd_rn(__fmul_rn(mix, scale), base)) + eps;
}

// x / d for the Sinkhorn normalizations (d >= eps > 0, normal): the reciprocal estimate, one
// Newton step and one remainder correction, i.e. `/`'s fast path without its range check and
// slow-path call. It returns the IEEE quotient for all but rare operands and is always within
// one ulp of it (normal operands). The 40 divisions of a token's Sinkhorn are one dependent chain
// (session 28, H100: the cluster launch at 1 / 16 / 64 tokens 11.20 / 11.02 / 20.65 us with `/`,
// 10.60 / 10.41 / 20.22 with this).
__device__ __forceinline__ float sinkhorn_div(float x, float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = fmaf(r, fmaf(-d, r, 1.0f), r);
  const float q = __fmul_rn(x, r);
  return fmaf(fmaf(-q, d, x), r, q);
}

// The split of one token's scaled mixes (kPreMixes floats) and Sinkhorn of its comb matrix, run by
// all 32 lanes of one warp: writes post[0..hc) and comb[0..hc*hc) (global) and, when pre is not
// null, pre[0..hc). Lane l < 16 holds C[j][k] (j = l / 4, k = l % 4); lanes 16..31 mirror lanes
// 0..15 so that every shuffle has a valid source. Each row / column sum gathers its 4 values and
// adds them in the CPU reference's order (k or j ascending), as ds::cpu::mhc_sinkhorn does, with
// one division per normalization and lane (sinkhorn_div) instead of 16 on one thread.
__device__ void split_sinkhorn_warp(const float* mixes, const float* __restrict__ base,
                                    const float* __restrict__ scale, int iters, float eps,
                                    float* pre, float* post, float* comb) {
  constexpr int hc = kMhcHc;
  const unsigned full = 0xffffffffu;
  const int lane = int(threadIdx.x & 31);
  const int l = lane & 15, j = l >> 2, k = l & 3;
  if (lane < hc) {
    if (pre != nullptr) pre[lane] = pre_weight(mixes[lane], scale[0], base[lane], eps);
    const float m = __fadd_rn(__fmul_rn(mixes[hc + lane], scale[1]), base[hc + lane]);
    post[lane] = 2.0f * ops::sigmoid_f32(m);
  }
  float c = __fadd_rn(__fmul_rn(mixes[2 * hc + l], scale[2]), base[2 * hc + l]);
  // C[j][kk] and C[jj][k] from the lanes that hold them (lane & 16 keeps the mirror half apart).
  auto row = [&](float v, int kk) { return __shfl_sync(full, v, (lane & 16) | (j << 2) | kk); };
  auto col = [&](float v, int jj) { return __shfl_sync(full, v, (lane & 16) | (jj << 2) | k); };
  auto row_sum = [&](float v) {
    float sum = 0.0f;
#pragma unroll
    for (int kk = 0; kk < hc; ++kk) sum = __fadd_rn(sum, row(v, kk));
    return sum;
  };
  auto col_sum = [&](float v) {
    float sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < hc; ++jj) sum = __fadd_rn(sum, col(v, jj));
    return sum;
  };
  // Softmax over each row (over k) + eps, a column normalization, then (iters - 1) rounds of
  // rows then columns.
  float mx = row(c, 0);
#pragma unroll
  for (int kk = 1; kk < hc; ++kk) {
    const float v = row(c, kk);
    mx = mx < v ? v : mx;
  }
  c = ops::exp_f32(c - mx);
  c = __fadd_rn(sinkhorn_div(c, row_sum(c)), eps);
  c = sinkhorn_div(c, __fadd_rn(col_sum(c), eps));
  for (int it = 0; it + 1 < iters; ++it) {
    c = sinkhorn_div(c, __fadd_rn(row_sum(c), eps));
    c = sinkhorn_div(c, __fadd_rn(col_sum(c), eps));
  }
  if (lane < 16) comb[l] = c;
}

__global__ void __launch_bounds__(kFinishThreads)
    mhc_pre_finish_kernel(MhcPreParams p, int64_t num_chunks) {
  constexpr int hc = kMhcHc;
  __shared__ float mixes[kPreMixes + 1];
  __shared__ float pre[hc];
  pdl_begin();
  const int64_t tok = blockIdx.x;
  const int64_t hc_dim = hc * p.dim;
  gather_mixes<kPreMixes>(p.workspace, tok, num_chunks, hc_dim, p.norm_eps, mixes);
  if (threadIdx.x < 32) {
    split_sinkhorn_warp(mixes, p.base, p.scale, p.sinkhorn_iters, p.hc_eps, pre,
                        p.post + tok * hc, p.comb + tok * hc * hc);
  }
  __syncthreads();
  collapse(p.x + tok * hc_dim, pre, p.u + tok * p.dim, p.dim, 0, p.dim, p.round_bf16, threadIdx.x,
           kFinishThreads);
}

__global__ void __launch_bounds__(kFinishThreads)
    mhc_head_finish_kernel(MhcHeadParams p, int64_t num_chunks) {
  constexpr int hc = kMhcHc;
  __shared__ float mixes[hc + 1];
  __shared__ float pre[hc];
  pdl_begin();
  const int64_t tok = blockIdx.x;
  const int64_t hc_dim = hc * p.dim;
  gather_mixes<hc>(p.workspace, tok, num_chunks, hc_dim, p.norm_eps, mixes);
  if (threadIdx.x < hc)
    pre[threadIdx.x] = pre_weight(mixes[threadIdx.x], p.scale[0], p.base[threadIdx.x], p.hc_eps);
  __syncthreads();
  collapse(p.x + tok * hc_dim, pre, p.y + tok * p.dim, p.dim, 0, p.dim, p.round_bf16, threadIdx.x,
           kFinishThreads);
}

// ---- decode sizes: one cluster launch ----

constexpr int kRanks = 8;  // CTAs per cluster; rank r owns the r-th eighth of hc * dim
// Warps of the mixes and of the collapse per CTA (plus one for Sinkhorn): 16 for one token (each
// rank's 16 128-float steps of fn at Flash, one per warp: twice the loads in flight per SM of 8
// warps, where only 8 SMs stream the 1.5 MB of fn), 8 for 4 tokens (168 registers per thread).
constexpr int fused_warps(int tokens_per_cluster) {
  return tokens_per_cluster == 1 ? 16 : 8;
}
constexpr int64_t kFusedMaxTokens = 64;  // the auto rule's bound (prefill re-reads fn per cluster)

struct FusedArgs {
  const float* x;
  const float* fn;
  const float* base;
  const float* scale;
  float* out;   // u (pre) or y (head): [num_tokens, dim]
  float* post;  // pre only
  float* comb;  // pre only
  int64_t num_tokens, dim;
  int sinkhorn_iters;
  float hc_eps, norm_eps;
  bool round_bf16;
  const float* rms_weight;  // nullable: u = rms_norm(u) * rms_weight (pre only)
  float rms_eps;
};

// Reduce-scatter over the warp: on return v[0 .. N/32) of lane l hold the warp sums of the input
// values l * (N/32) .. l * (N/32) + N/32 - 1 (fixed butterfly order: deterministic). N is a power
// of two >= 32; N - 1 shuffles per lane instead of 5 N for one warp_sum per value. One level per
// instantiation (kHalf = N/2, N/4, ..., N/32, exchanging with lane ^ (kHalf * 32 / N)) so that
// every index is a constant and v stays in registers.
template <int N, int kHalf = N / 2>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[N], int lane) {
  constexpr int kOther = kHalf * 32 / N;
  const bool upper = (lane & kOther) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOther);
  }
  if constexpr (kHalf > N / 32) warp_reduce_scatter<N, kHalf / 2>(v, lane);
}

__host__ __device__ constexpr int pow2_at_least(int n) {
  int p = 32;
  while (p < n) p *= 2;
  return p;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// kPre: mhc_pre (kMixes = 24: pre, post, comb + Sinkhorn, optionally the RMSNorm of u);
// otherwise mhc_head (kMixes = hc). Grid: kRanks CTAs (one cluster) per group of kT tokens.
// Warps 0 .. kFusedWarps - 1 compute the mixes and the collapse; the last warp runs the Sinkhorn
// of token tok0 + rank (ranks < kT), so it never delays the collapse, the norm's exchange or the
// other ranks.
template <int kMixes, int kT, bool kPre>
__global__ void __launch_bounds__(fused_warps(kT) * 32 + 32) mhc_fused_kernel(FusedArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int hc = kMhcHc;
  constexpr int kFusedWarps = fused_warps(kT);
  constexpr int kFusedThreads = kFusedWarps * 32 + 32;
  constexpr int kMain = kFusedWarps * 32;
  constexpr int kVals = kT * (kMixes + 1);  // per token: kMixes dots, then the sum of squares
  constexpr int kPad = pow2_at_least(kVals);
  constexpr int kPerLane = kPad / 32;
  __shared__ float part[kFusedWarps][kPad];
  __shared__ float red[kVals];    // this CTA's sums (read by every rank of the cluster)
  __shared__ float mixes[kVals];  // the cluster's sums, then the scaled mixes
  __shared__ float pre[kT][hc];
  __shared__ float ss_part[kFusedWarps][kT];  // norm: per-warp sums of u^2
  __shared__ float ss_rank[kRanks][kT];       // norm: every rank's sums (written by that rank)
  __shared__ alignas(8) uint64_t ss_ready;    // norm: kRanks arrivals, one per rank
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const bool main_warp = warp < kFusedWarps;
  const bool norm = kPre && a.rms_weight != nullptr;
  const int64_t tok0 = int64_t(blockIdx.x / kRanks) * kT;
  const int64_t hc_dim = hc * a.dim, slice = hc_dim / kRanks, k0 = rank * slice;
  const int64_t steps = slice / 128;  // 128-float steps of this rank, warp w takes w, w + W, ...
  if (main_warp) {
    for (int64_t s = warp; s < steps; s += kFusedWarps) {
      // fn is no kernel's output: its lines go to L2 before the wait.
      for (int i = lane; i < kMixes * 4; i += 32) {
        const float* line = a.fn + (i / 4) * hc_dim + k0 + s * 128 + (i % 4) * 32;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
      }
    }
  }
  if (norm && threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&ss_ready)),
                 "r"(kRanks) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  pdl_begin();
  if (main_warp) {
    float acc[kT][kMixes], ss[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      ss[t] = 0.0f;
#pragma unroll
      for (int m = 0; m < kMixes; ++m) acc[t][m] = 0.0f;
    }
    for (int64_t s = warp; s < steps; s += kFusedWarps)
      accumulate_columns<kMixes, kT>(a.x, a.fn, a.num_tokens, tok0, hc_dim,
                                     k0 + s * 128 + lane * 4, acc, ss);
    float v[kPad];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
#pragma unroll
      for (int m = 0; m < kMixes; ++m) v[t * (kMixes + 1) + m] = acc[t][m];
      v[t * (kMixes + 1) + kMixes] = ss[t];
    }
#pragma unroll
    for (int i = kVals; i < kPad; ++i) v[i] = 0.0f;
    warp_reduce_scatter<kPad>(v, lane);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) part[warp][lane * kPerLane + i] = v[i];
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < kVals; i += kFusedThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kFusedWarps; ++w) sum += part[w][i];
    red[i] = sum;
  }
  // Every rank's red is complete and visible (release / acquire at cluster scope); the norm's
  // barrier is initialized before anyone can arrive on it.
  cluster.sync();
  for (int i = int(threadIdx.x); i < kVals; i += kFusedThreads) {
    float r[kRanks];
#pragma unroll
    for (int q = 0; q < kRanks; ++q) r[q] = cluster.map_shared_rank(red, q)[i];
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kRanks; ++q) sum += r[q];
    mixes[i] = sum;
  }
  // This CTA has read the other ranks' red; it waits for them to finish reading its own only
  // before it exits (below), so the arrive goes out now.
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
  __syncthreads();
  if (threadIdx.x < kT * kMixes) {  // x rsqrt(mean(x^2) + eps), as gather_mixes
    const int t = int(threadIdx.x) / kMixes, m = int(threadIdx.x) % kMixes;
    const float r = 1.0f / sqrtf(mixes[t * (kMixes + 1) + kMixes] / float(hc_dim) + a.norm_eps);
    mixes[t * (kMixes + 1) + m] = __fmul_rn(mixes[t * (kMixes + 1) + m], r);
  }
  __syncthreads();
  if (threadIdx.x < kT * hc) {
    const int t = int(threadIdx.x) / hc, i = int(threadIdx.x) % hc;
    pre[t][i] = pre_weight(mixes[t * (kMixes + 1) + i], a.scale[0], a.base[i], a.hc_eps);
  }
  __syncthreads();
  if (!main_warp) {
    if constexpr (kPre) {
      const int64_t tok = tok0 + rank;
      if (rank < kT && tok < a.num_tokens)
        split_sinkhorn_warp(&mixes[rank * (kMixes + 1)], a.base, a.scale, a.sinkhorn_iters,
                            a.hc_eps, nullptr, a.post + tok * hc, a.comb + tok * hc * hc);
    }
  } else {
    // This rank's eighth of u for each token; with the norm, u is written unnormalized first and
    // each thread keeps the sum of its values' squares.
    const int64_t share = a.dim / kRanks, d0 = rank * share;
    float ss[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      ss[t] = 0.0f;
      const int64_t tok = tok0 + t;
      if (tok >= a.num_tokens) continue;
      for (int64_t d = d0 + int64_t(threadIdx.x) * 4; d < d0 + share; d += kMain * 4) {
        const float4 u = collapse4(a.x + tok * hc_dim, pre[t], a.dim, d, a.round_bf16);
        *reinterpret_cast<float4*>(a.out + tok * a.dim + d) = u;
        ss[t] += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
      }
    }
    if (norm) {
      // Sums of u^2 per token: warps in order, then ranks in order (the same in every rank),
      // exchanged through distributed shared memory with one barrier arrival per rank.
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const float v = ops::warp_sum(ss[t]);
        if (lane == 0) ss_part[warp][t] = v;
      }
      asm volatile("bar.sync 1, %0;" ::"r"(kMain) : "memory");
      if (threadIdx.x == 0) {
        float mine[kT];
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          mine[t] = 0.0f;
#pragma unroll
          for (int w = 0; w < kFusedWarps; ++w) mine[t] += ss_part[w][t];
        }
        for (int q = 0; q < kRanks; ++q) {
          float* dst = cluster.map_shared_rank(&ss_rank[rank][0], q);
#pragma unroll
          for (int t = 0; t < kT; ++t) dst[t] = mine[t];
          uint32_t remote;
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                       : "=r"(remote)
                       : "r"(smem_addr(&ss_ready)), "r"(q));
          asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote)
                       : "memory");
        }
        uint32_t done = 0;
        while (!done) {
          asm volatile(
              "{\n .reg .pred p;\n"
              " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
              " selp.u32 %0, 1, 0, p;\n}"
              : "=r"(done)
              : "r"(smem_addr(&ss_ready))
              : "memory");
        }
      }
      asm volatile("bar.sync 1, %0;" ::"r"(kMain) : "memory");
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const int64_t tok = tok0 + t;
        if (tok >= a.num_tokens) continue;
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < kRanks; ++q) sum += ss_rank[q][t];
        const float r = 1.0f / sqrtf(sum / float(a.dim) + a.rms_eps);
        // Each thread re-reads the u values it wrote above (its own writes: visible to it).
        for (int64_t d = d0 + int64_t(threadIdx.x) * 4; d < d0 + share; d += kMain * 4) {
          float* row = a.out + tok * a.dim + d;
          const float4 u = *reinterpret_cast<const float4*>(row);
          const float4 w = __ldg(reinterpret_cast<const float4*>(a.rms_weight + d));
          float y[4] = {__fmul_rn(__fmul_rn(u.x, r), w.x), __fmul_rn(__fmul_rn(u.y, r), w.y),
                        __fmul_rn(__fmul_rn(u.z, r), w.z), __fmul_rn(__fmul_rn(u.w, r), w.w)};
          if (a.round_bf16) {
#pragma unroll
            for (int k = 0; k < 4; ++k) y[k] = ops::round_bf16(y[k]);
          }
          *reinterpret_cast<float4*>(row) = make_float4(y[0], y[1], y[2], y[3]);
        }
      }
    }
  }
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}

bool fused_shape_ok(int64_t dim) {
  return dim > 0 && (kMhcHc * dim) % (kRanks * 128) == 0;
}

// DEEPSERVE_MHC_FUSED=0 turns the size rule off (path 0 then runs the split-K kernels): an A/B
// switch for whole-step benchmarks. Read once.
bool fused_rule_enabled() {
  static const bool enabled = !env_switched_off("DEEPSERVE_MHC_FUSED");
  return enabled;
}

bool take_fused(int path, int64_t num_tokens, int64_t dim) {
  if (path == 1 || !fused_shape_ok(dim) || !device_has_clusters()) return false;
  return path == 2 || (num_tokens <= kFusedMaxTokens && fused_rule_enabled());
}

template <int kMixes, bool kPre>
void launch_fused(const FusedArgs& a, cudaStream_t stream) {
  const bool one = a.num_tokens == 1;
  const int64_t per = one ? 1 : 4;
  const int64_t groups = (a.num_tokens + per - 1) / per;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(groups * kRanks));
  cfg.blockDim = dim3(unsigned(fused_warps(int(per)) * 32 + 32));
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kRanks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ops_pdl_enabled() ? 2 : 1;
  if (one)
    (void)cudaLaunchKernelEx(&cfg, mhc_fused_kernel<kMixes, 1, kPre>, a);
  else
    (void)cudaLaunchKernelEx(&cfg, mhc_fused_kernel<kMixes, 4, kPre>, a);
}

__global__ void mhc_post_kernel(MhcPostParams p) {
  constexpr int hc = kMhcHc;
  pdl_begin();
  const int64_t quads = p.dim / 4;
  const int64_t total = p.num_tokens * quads;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < total;
       q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tok = q / quads, d = (q % quads) * 4;
    const float4 o = __ldg(reinterpret_cast<const float4*>(p.o + tok * p.dim + d));
    float4 xv[hc];
#pragma unroll
    for (int j = 0; j < hc; ++j)
      xv[j] = __ldg(reinterpret_cast<const float4*>(p.x + (tok * hc + j) * p.dim + d));
    const float* post = p.post + tok * hc;
    const float* comb = p.comb + tok * hc * hc;
#pragma unroll
    for (int k = 0; k < hc; ++k) {
      const float pk = __ldg(post + k);
      float a0 = __fmul_rn(pk, o.x), a1 = __fmul_rn(pk, o.y), a2 = __fmul_rn(pk, o.z),
            a3 = __fmul_rn(pk, o.w);
#pragma unroll
      for (int j = 0; j < hc; ++j) {
        const float cjk = __ldg(comb + j * hc + k);
        a0 = __fadd_rn(a0, __fmul_rn(cjk, xv[j].x));
        a1 = __fadd_rn(a1, __fmul_rn(cjk, xv[j].y));
        a2 = __fadd_rn(a2, __fmul_rn(cjk, xv[j].z));
        a3 = __fadd_rn(a3, __fmul_rn(cjk, xv[j].w));
      }
      if (p.round_bf16) {
        a0 = ops::round_bf16(a0);
        a1 = ops::round_bf16(a1);
        a2 = ops::round_bf16(a2);
        a3 = ops::round_bf16(a3);
      }
      *reinterpret_cast<float4*>(p.x_new + (tok * hc + k) * p.dim + d) =
          make_float4(a0, a1, a2, a3);
    }
  }
}

}  // namespace

int64_t mhc_workspace_floats(int64_t max_tokens, int64_t dim) {
  const int64_t hc_dim = kMhcHc * dim;
  int64_t best = 0;
  for (int64_t n :
       {std::min<int64_t>(max_tokens, 16), std::min<int64_t>(max_tokens, 256), max_tokens}) {
    if (n <= 0) continue;
    best = std::max(best, n * (hc_dim / chunk_for(n, hc_dim)) * (kPreMixes + 1));
  }
  return best;
}

bool mhc_fused_supported(int64_t dim) {
  return fused_shape_ok(dim) && device_has_clusters();
}

void launch_mhc_pre(const MhcPreParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  if (take_fused(p.path, p.num_tokens, p.dim)) {
    launch_fused<kPreMixes, true>(FusedArgs{p.x, p.fn, p.base, p.scale, p.u, p.post, p.comb,
                                            p.num_tokens, p.dim, p.sinkhorn_iters, p.hc_eps,
                                            p.norm_eps, p.round_bf16, p.rms_weight, p.rms_eps},
                                  stream);
    return;
  }
  const int64_t hc_dim = kMhcHc * p.dim;
  launch_mixes<kPreMixes>(p.x, p.fn, p.workspace, p.num_tokens, hc_dim, stream);
  const int64_t num_chunks = hc_dim / chunk_for(p.num_tokens, hc_dim);
  (void)launch_pdl(mhc_pre_finish_kernel, dim3(unsigned(p.num_tokens)), dim3(kFinishThreads), 0,
                   stream, p, num_chunks);
  if (p.rms_weight != nullptr) {
    RmsNormParams n;
    n.x = p.u;
    n.weight = p.rms_weight;
    n.y = p.u;
    n.num_rows = p.num_tokens;
    n.dim = n.x_stride = n.y_stride = p.dim;
    n.eps = p.rms_eps;
    n.round_bf16 = p.round_bf16;
    launch_rms_norm(n, stream);
  }
}

void launch_mhc_head(const MhcHeadParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  if (take_fused(p.path, p.num_tokens, p.dim)) {
    launch_fused<kMhcHc, false>(FusedArgs{p.x, p.fn, p.base, p.scale, p.y, nullptr, nullptr,
                                          p.num_tokens, p.dim, 0, p.hc_eps, p.norm_eps,
                                          p.round_bf16, nullptr, 0.0f},
                                stream);
    return;
  }
  const int64_t hc_dim = kMhcHc * p.dim;
  launch_mixes<kMhcHc>(p.x, p.fn, p.workspace, p.num_tokens, hc_dim, stream);
  const int64_t num_chunks = hc_dim / chunk_for(p.num_tokens, hc_dim);
  (void)launch_pdl(mhc_head_finish_kernel, dim3(unsigned(p.num_tokens)), dim3(kFinishThreads), 0,
                   stream, p, num_chunks);
}

void launch_mhc_post(const MhcPostParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  const int64_t total = p.num_tokens * (p.dim / 4);
  const int64_t grid = std::min<int64_t>((total + 255) / 256, 132 * 16);
  (void)launch_pdl(mhc_post_kernel, dim3(unsigned(grid)), dim3(256), 0, stream, p);
}

}  // namespace ds::cuda
