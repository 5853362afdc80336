// mHC kernels. Mixes: warp w of the grid takes (K chunk c, group g of 4 tokens) with chunk-major
// numbering, so the 8 warps of a block read the same fn chunk (L1 reuse) for 32 tokens; each lane
// accumulates 4 tokens x kMixes dot products plus the 4 sums of squares over float4 columns, the
// warp reduces them and lane 0 writes the partials. Finish: one block per token sums the partials
// in chunk order, applies rsqrt, the split and Sinkhorn (16 lanes of warp 0, one per element of
// the 4x4 matrix, exchanging row and column values by shuffles) in the CPU reference's operation
// order, then collapses the streams with float4 loads.
#include <algorithm>

#include "kernels/cuda/mhc/mhc.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/norm/device_util.cuh"

namespace ds::cuda {
namespace {

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
  for (int64_t k = c * chunk + lane * 4; k < k_end; k += 128) {
    float4 xv[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      const int64_t tok = g * kTok + t;
      xv[t] = tok < num_tokens ? __ldg(reinterpret_cast<const float4*>(x + tok * hc_dim + k))
                               : make_float4(0.f, 0.f, 0.f, 0.f);
      ss[t] += xv[t].x * xv[t].x + xv[t].y * xv[t].y + xv[t].z * xv[t].z + xv[t].w * xv[t].w;
    }
#pragma unroll
    for (int m = 0; m < kMixes; ++m) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(fn + m * hc_dim + k));
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        acc[t][m] += f.x * xv[t].x + f.y * xv[t].y + f.z * xv[t].z + f.w * xv[t].w;
      }
    }
  }
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

// u[d] = sum_i pre[i] * X[i][d] in the reference's order (fp32, no FMA contraction).
__device__ void collapse(const float* __restrict__ x, const float* pre, float* __restrict__ out,
                         int64_t dim, bool round) {
  for (int64_t d = int64_t(threadIdx.x) * 4; d < dim; d += kFinishThreads * 4) {
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
    *reinterpret_cast<float4*>(out + d) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  }
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
    // Warp 0: lane l < 16 holds C[j][k] (j = l / 4, k = l % 4); lanes 16..31 mirror lanes 0..15
    // so that every shuffle has a valid source. Each row / column sum gathers its 4 values and
    // adds them in the CPU reference's order (k or j ascending), so every lane computes exactly
    // what ds::cpu::mhc_sinkhorn computes for its element, with one division per normalization
    // instead of 16 on one thread (20 rounds of IEEE divisions: the serial chain was the kernel).
    const unsigned full = 0xffffffffu;
    const int lane = int(threadIdx.x);
    const int l = lane & 15, j = l >> 2, k = l & 3;
    const float eps = p.hc_eps;
    if (lane < hc) {
      pre[lane] =
          ops::sigmoid_f32(__fadd_rn(__fmul_rn(mixes[lane], p.scale[0]), p.base[lane])) + eps;
      const float m = __fadd_rn(__fmul_rn(mixes[hc + lane], p.scale[1]), p.base[hc + lane]);
      p.post[tok * hc + lane] = 2.0f * ops::sigmoid_f32(m);
    }
    float c = __fadd_rn(__fmul_rn(mixes[2 * hc + l], p.scale[2]), p.base[2 * hc + l]);
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
    c = __fadd_rn(__fdiv_rn(c, row_sum(c)), eps);
    c = __fdiv_rn(c, __fadd_rn(col_sum(c), eps));
    for (int it = 0; it + 1 < p.sinkhorn_iters; ++it) {
      c = __fdiv_rn(c, __fadd_rn(row_sum(c), eps));
      c = __fdiv_rn(c, __fadd_rn(col_sum(c), eps));
    }
    if (lane < 16) p.comb[tok * hc * hc + l] = c;
  }
  __syncthreads();
  collapse(p.x + tok * hc_dim, pre, p.u + tok * p.dim, p.dim, p.round_bf16);
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
  if (threadIdx.x < hc) {
    pre[threadIdx.x] = ops::sigmoid_f32(__fadd_rn(__fmul_rn(mixes[threadIdx.x], p.scale[0]),
                                                  p.base[threadIdx.x])) +
                       p.hc_eps;
  }
  __syncthreads();
  collapse(p.x + tok * hc_dim, pre, p.y + tok * p.dim, p.dim, p.round_bf16);
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

void launch_mhc_pre(const MhcPreParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  const int64_t hc_dim = kMhcHc * p.dim;
  launch_mixes<kPreMixes>(p.x, p.fn, p.workspace, p.num_tokens, hc_dim, stream);
  const int64_t num_chunks = hc_dim / chunk_for(p.num_tokens, hc_dim);
  (void)launch_pdl(mhc_pre_finish_kernel, dim3(unsigned(p.num_tokens)), dim3(kFinishThreads), 0,
                   stream, p, num_chunks);
}

void launch_mhc_head(const MhcHeadParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
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
