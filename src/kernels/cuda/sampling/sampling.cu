// Greedy sampling + logprobs. Pass 1 (block per (split, row), 512 threads): each thread scans its
// strided elements keeping an online max / sum of exp and a sorted register list of its best kK
// (value desc, index asc; elements arrive in increasing index, so a strict compare keeps the
// lowest index first among equal values); warps merge their lanes' lists in kK rounds of a
// shuffle arg-max, warp 0 merges the warps' lists, and the block writes [max, sum, kK values,
// kK indices] to the workspace. Pass 2 (one warp per row) merges the splits the same way and
// combines the (max, sum) pairs in split order (deterministic), then writes the outputs.
#include <algorithm>
#include <climits>

#include "kernels/cuda/norm/device_util.cuh"
#include "kernels/cuda/sampling/sampling.h"

namespace ds::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSplits = 32;

int64_t splits_for(int64_t rows, int64_t vocab) {
  int64_t s = std::max<int64_t>(1, (2 * 132 + rows - 1) / std::max<int64_t>(rows, 1));
  s = std::min<int64_t>(s, std::max<int64_t>(1, vocab / 4096));
  return std::min<int64_t>(s, kMaxSplits);
}

// [max, sum, k values, k indices, non-finite flag]
constexpr int64_t record_floats(int k) {
  return 3 + 2 * int64_t(k);
}

__device__ __forceinline__ bool better(float v1, int i1, float v2, int i2) {
  return v1 > v2 || (v1 == v2 && i1 < i2);
}

// Online softmax pair merge: (m, s) with s = sum exp(x - m); m = -inf means empty.
__device__ __forceinline__ void merge_ms(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// kK rounds: the warp's best (value, index) among the lanes' list heads; the owner pops it.
// Lane 0 writes round r to out_v[r] / out_i[r].
template <int kK>
__device__ void warp_merge(float (&v)[kK], int (&ix)[kK], float* out_v, int* out_i) {
  const int lane = threadIdx.x & 31;
  for (int r = 0; r < kK; ++r) {
    float bv = v[0];
    int bi = ix[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      out_v[r] = bv;
      out_i[r] = bi;
    }
    if (ix[0] == bi && bi != INT_MAX) {
#pragma unroll
      for (int j = 0; j + 1 < kK; ++j) {
        v[j] = v[j + 1];
        ix[j] = ix[j + 1];
      }
      v[kK - 1] = -INFINITY;
      ix[kK - 1] = INT_MAX;
    }
  }
}

template <int kK>
__global__ void __launch_bounds__(kThreads) sample_split_kernel(SampleParams p, int64_t splits) {
  __shared__ float sv[kWarps][kK];
  __shared__ int si[kWarps][kK];
  __shared__ float sm[kWarps], ssum[kWarps];
  __shared__ float out_v[kK];
  __shared__ int out_i[kK];
  const int64_t row = blockIdx.y, split = blockIdx.x;
  const int64_t per = (p.vocab + splits - 1) / splits;
  const int64_t lo = split * per, hi = min(p.vocab, lo + per);
  const float* x = p.logits + row * p.stride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float v[kK];
  int ix[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    v[j] = -INFINITY;
    ix[j] = INT_MAX;
  }
  float m = -INFINITY, s = 0.0f;
  bool bad = false;  // a NaN or infinity seen
  // Batches of kLoadBatch strided elements: every load of a batch is issued before any use.
  constexpr int kLoadBatch = 8;
  for (int64_t base = lo + threadIdx.x; base < hi; base += int64_t(kThreads) * kLoadBatch) {
    float vals[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int64_t i = base + int64_t(u) * kThreads;
      vals[u] = i < hi ? __ldg(x + i) : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int64_t i = base + int64_t(u) * kThreads;
      const float val = vals[u];
      if (i >= hi) break;
      bad = bad || !isfinite(val);
      if (val > m) {
        s = s * expf(m - val) + 1.0f;  // m = -inf: 0 * 0 + 1
        m = val;
      } else {
        s += expf(val - m);
      }
      if (val > v[kK - 1]) {
        v[kK - 1] = val;
        ix[kK - 1] = int(i);
#pragma unroll
        for (int j = kK - 1; j > 0; --j) {
          if (v[j] > v[j - 1]) {
            const float tv = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tv;
            const int ti = ix[j];
            ix[j] = ix[j - 1];
            ix[j - 1] = ti;
          }
        }
      }
    }
  }
  // Warp: (m, s) by a butterfly, lists by kK rounds.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o);
    const float s2 = __shfl_xor_sync(0xFFFFFFFFu, s, o);
    merge_ms(m, s, m2, s2);
  }
  warp_merge<kK>(v, ix, sv[warp], si[warp]);
  if (lane == 0) {
    sm[warp] = m;
    ssum[warp] = s;
  }
  const bool block_bad = __syncthreads_or(bad) != 0;
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    v[j] = lane < kWarps ? sv[lane][j] : -INFINITY;
    ix[j] = lane < kWarps ? si[lane][j] : INT_MAX;
  }
  warp_merge<kK>(v, ix, out_v, out_i);
  __syncwarp();
  float* rec = p.workspace + (row * splits + split) * record_floats(kK);
  if (lane == 0) {
    float bm = -INFINITY, bs = 0.0f;
    for (int w = 0; w < kWarps; ++w) merge_ms(bm, bs, sm[w], ssum[w]);
    rec[0] = bm;
    rec[1] = bs;
    rec[2 + 2 * kK] = block_bad ? 1.0f : 0.0f;
  }
  for (int j = lane; j < kK; j += 32) {
    rec[2 + j] = out_v[j];
    rec[2 + kK + j] = __int_as_float(out_i[j]);
  }
}

template <int kK>
__global__ void sample_merge_kernel(SampleParams p, int64_t splits) {
  __shared__ float out_v[kK];
  __shared__ int out_i[kK];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x;
  const float* recs = p.workspace + row * splits * record_floats(kK);
  float v[kK];
  int ix[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    v[j] = lane < splits ? recs[lane * record_floats(kK) + 2 + j] : -INFINITY;
    ix[j] = lane < splits ? __float_as_int(recs[lane * record_floats(kK) + 2 + kK + j]) : INT_MAX;
  }
  warp_merge<kK>(v, ix, out_v, out_i);
  __syncwarp();
  if (lane != 0) return;
  float m = -INFINITY, s = 0.0f;
  for (int64_t k = 0; k < splits; ++k)
    merge_ms(m, s, recs[k * record_floats(kK)], recs[k * record_floats(kK) + 1]);
  const float lse = m + logf(s);
  if (p.argmax) p.argmax[row] = out_i[0] == INT_MAX ? 0 : out_i[0];  // all NaN: 0
  if (p.finite) {
    bool bad = false;
    for (int64_t k = 0; k < splits; ++k) bad = bad || recs[k * record_floats(kK) + 2 + 2 * kK] != 0;
    p.finite[row] = bad ? 0 : 1;
  }
  for (int j = 0; j < p.top_k && j < kK; ++j) {
    p.top_logprobs[row * p.top_k + j] = out_v[j] - lse;
    p.top_ids[row * p.top_k + j] = out_i[j];
  }
  if (p.token_logprobs) {
    const int64_t tok = p.token_ids ? p.token_ids[row] : out_i[0];
    p.token_logprobs[row] = p.logits[row * p.stride + tok] - lse;
  }
}

template <int kK>
void launch_k(const SampleParams& p, cudaStream_t stream) {
  const int64_t splits = splits_for(p.rows, p.vocab);
  sample_split_kernel<kK>
      <<<dim3(unsigned(splits), unsigned(p.rows)), kThreads, 0, stream>>>(p, splits);
  sample_merge_kernel<kK><<<unsigned(p.rows), 32, 0, stream>>>(p, splits);
}

}  // namespace

int64_t sampling_workspace_floats(int64_t rows, int64_t vocab) {
  return rows * splits_for(rows, vocab) * record_floats(kMaxTopLogprobs);
}

void launch_sample_greedy(const SampleParams& params, cudaStream_t stream) {
  if (params.rows <= 0 || params.vocab <= 0) return;
  if (params.top_k > 0)
    launch_k<kMaxTopLogprobs>(params, stream);
  else
    launch_k<1>(params, stream);
}

}  // namespace ds::cuda
