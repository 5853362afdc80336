// Compressor kernels. Entry kernel: block (e, s) pools entry start_s / ratio + e of sequence s
// (blocks past the sequence's last completed window exit at once), one thread per output channel
// c. A slot at position p reads the call's kv / score + ape row when p >= start, else the ring
// (open window: row ratio + p % ratio for CSA, p % ratio for HCA; CSA previous window: row
// p % 4). The softmax and weighted sum run in the CPU reference's order with exp in double; the
// finish (bf16 rounding, RMSNorm with a block reduction, RoPE through a lane shuffle, FP8 blocks of
// 64 = two warps, or Hadamard in shared memory + FP4 blocks of 32 = one warp) follows
// ds::cpu::compressor_finish_entry step by step. Ring kernel: one thread per ring column of a
// sequence reads what the new previous-window rows need before writing any row.
#include <algorithm>

#include <cooperative_groups.h>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/func_attributes.h"
#include "kernels/cuda/compressor/compressor.h"
#include "kernels/cuda/norm/device_util.cuh"

namespace ds::cuda {
namespace {

constexpr int kMaxHeadDim = 1024;

struct SlotReader {
  const float* kv;
  const float* score;
  const float* ape;
  const float* ring_kv;
  const float* ring_score;
  int64_t row, start, open_start, ratio, width, stride;
  bool overlap;

  __device__ void load(int64_t pos, int64_t col, float& kv_out, float& score_out) const {
    const int64_t phase = pos & (ratio - 1);  // ratio is a power of two; right for pos < 0 too
    if (pos >= start) {
      const int64_t r = row + pos - start;
      kv_out = kv[r * stride + col];
      score_out = score[r * stride + col] + ape[phase * width + col];
    } else {
      const int64_t rr = (overlap && pos >= open_start) ? ratio + phase : phase;
      kv_out = ring_kv[rr * width + col];
      score_out = ring_score[rr * width + col];
    }
  }
};

// Floats between rows of the call's kv and score (CompressorParams::row_stride, 0: width).
__device__ __forceinline__ int64_t row_stride_of(const CompressorParams& p, int64_t width) {
  return p.row_stride > 0 ? p.row_stride : width;
}

// An entry's channel c after pooling (and rounding): the RMSNorm with the entry's sum of squares
// ss, rounded, then RoPE at the window's start position ratio * w; pair (2i, 2i+1) of the tail
// sits in adjacent lanes, so every lane of the warp calls this.
__device__ __forceinline__ float norm_rope_channel(float v, float ss, int64_t c, int64_t w,
                                                   const CompressorParams& p) {
  const int64_t nope = p.head_dim - p.rope_dim;
  const float r = 1.0f / sqrtf(ss / float(p.head_dim) + p.norm_eps);
  v = __fmul_rn(__fmul_rn(v, r), p.norm_weight[c]);
  if (p.round_bf16) v = ops::round_bf16(v);
  const float partner = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  if (c >= nope) {
    const int64_t i = (c - nope) / 2;
    const float angle = float(p.ratio * w) * p.inv_freq[i];
    double sd, cd;
    sincos(double(angle), &sd, &cd);
    const float cs = float(cd), sn = float(sd);
    if (((c - nope) & 1) == 0)
      v = __fsub_rn(__fmul_rn(v, cs), __fmul_rn(partner, sn));
    else
      v = __fadd_rn(__fmul_rn(partner, sn), __fmul_rn(v, cs));
    if (p.round_bf16) v = ops::round_bf16(v);
  }
  return v;
}

__global__ void __launch_bounds__(kMaxHeadDim) compressor_entry_kernel(CompressorParams p) {
  __shared__ float buf[kMaxHeadDim];
  __shared__ float scratch[33];
  __shared__ float warp_amax[32];
  const CompressorSeq s = p.seqs[blockIdx.y];
  const int64_t ratio = p.ratio, d = p.head_dim;
  const bool overlap = ratio == 4;
  const int64_t width = overlap ? 2 * d : d;
  const int64_t state_rows = overlap ? 2 * ratio : ratio;
  const int64_t first_w = s.start / ratio, end_w = (s.start + s.count) / ratio;
  const int64_t w = first_w + blockIdx.x;
  if (w >= end_w) return;  // uniform over the block
  const int c = threadIdx.x;
  const int64_t stride = row_stride_of(p, width);
  SlotReader rd{p.kv,   p.score, p.ape,           s.state, s.state + state_rows * width,
                s.row,  s.start, first_w * ratio, ratio,   width,
                stride, overlap};

  float v;
  if (overlap) {
    // Slots 0..3: A halves of the previous window; 4..7: B halves of window w.
    float kvs[8], scs[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rd.load(4 * (w - 1) + i, c, kvs[i], scs[i]);
      rd.load(4 * w + i, d + c, kvs[4 + i], scs[4 + i]);
    }
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = m < scs[i] ? scs[i] : m;
    float sum = 0.0f;
    float e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      e[i] = ops::exp_f32(scs[i] - m);
      sum += e[i];
    }
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = __fadd_rn(acc, __fmul_rn(kvs[i], e[i] / sum));
    v = acc;
  } else {
    // 128 slots in batches of kBatch whose loads are all issued before use (the loop is
    // latency-bound otherwise); three passes as in the reference: max, sum of exp, weighted sum.
    constexpr int kBatch = 16;
    const int64_t p0 = w * ratio;
    float m = -INFINITY;
    for (int64_t b = 0; b < ratio; b += kBatch) {
      float kvb[kBatch], scb[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) rd.load(p0 + b + i, c, kvb[i], scb[i]);
#pragma unroll
      for (int i = 0; i < kBatch; ++i) m = m < scb[i] ? scb[i] : m;
    }
    float sum = 0.0f;
    for (int64_t b = 0; b < ratio; b += kBatch) {
      float kvb[kBatch], scb[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) rd.load(p0 + b + i, c, kvb[i], scb[i]);
#pragma unroll
      for (int i = 0; i < kBatch; ++i) sum += ops::exp_f32(scb[i] - m);
    }
    float acc = 0.0f;
    for (int64_t b = 0; b < ratio; b += kBatch) {
      float kvb[kBatch], scb[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) rd.load(p0 + b + i, c, kvb[i], scb[i]);
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        acc = __fadd_rn(acc, __fmul_rn(kvb[i], ops::exp_f32(scb[i] - m) / sum));
    }
    v = acc;
  }

  if (p.finish) {
    const int64_t rope_dim = p.rope_dim, nope = d - rope_dim;
    if (p.round_bf16) v = ops::round_bf16(v);
    v = norm_rope_channel(v, ops::block_sum(v * v, scratch), c, w, p);
    if (p.simulate_quantization) {
      const int lane = c & 31, warp = c >> 5;
      if (p.kind == CompressorEntryKind::kAttention) {
        // Blocks of 64 over the nope part: two warps (nope is a multiple of 64).
        const float a = ops::warp_max(fabsf(v));
        if (lane == 0) warp_amax[warp] = a;
        __syncthreads();
        if (c < nope) v = ops::fp8_simulate(v, fmaxf(warp_amax[warp & ~1], warp_amax[warp | 1]));
      } else {
        buf[c] = v;
        __syncthreads();
        for (int64_t h = 1; h < d; h *= 2) {
          if ((c & h) == 0) {
            const float a = buf[c], b = buf[c + h];
            buf[c] = a + b;
            buf[c + h] = a - b;
          }
          __syncthreads();
        }
        const float scale = float(1.0 / sqrt(double(d)));
        v = buf[c] * scale;
        if (p.round_bf16) v = ops::round_bf16(v);
        v = ops::fp4_simulate(v, ops::warp_max(fabsf(v)));  // blocks of 32 = one warp
      }
    }
  }
  p.entries[(s.entry_row + w - first_w) * d + c] = v;
}

// HCA entries (ratio 128, attention kind or raw): a cluster of d / 64 CTAs per entry, rank r
// owning channels [64 r, 64 r + 64). The CTA's 256 threads load the window's 128 slots x 64
// channels of kv and score into shared memory at once (one latency instead of 24 dependent
// batches), evaluate every exp and weight in parallel, and one thread per channel runs the three
// reductions over the slots in the reference's order from shared memory (max, sum of exp,
// weighted sum: compressor_entry_kernel's arithmetic, so the pooled values are its bits). The
// finish is compressor_entry_kernel's too: its RMSNorm sum is block_sum's over d / 32 warps,
// reproduced with the warps' sums exchanged through distributed shared memory (rank order =
// warp order), RoPE through the lane shuffle, FP8 blocks of 64 = one rank.
constexpr int kHcaSlots = 128;
constexpr int kHcaChannels = 64;  // per rank
constexpr int kHcaThreads = 256;
constexpr int kHcaMaxRanks = kMaxHeadDim / kHcaChannels / 2;  // 8: d <= 512 (portable clusters)
constexpr int kHcaSmemBytes = 2 * kHcaSlots * kHcaChannels * int(sizeof(float));

__global__ void __launch_bounds__(kHcaThreads) compressor_hca_entry_kernel(CompressorParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  extern __shared__ float hca_smem[];
  float* kv_s = hca_smem;                              // [slot][channel]
  float* w_s = hca_smem + kHcaSlots * kHcaChannels;    // score, then exp, then weight
  __shared__ float col_max[kHcaChannels], col_sum[kHcaChannels];
  __shared__ float warp_ss[2 * kHcaMaxRanks];         // every rank's two warp sums of v^2
  __shared__ float warp_amax[2];
  cg::cluster_group cluster = cg::this_cluster();
  const int ranks = int(cluster.num_blocks());
  const int rank = int(cluster.block_rank());
  const CompressorSeq s = p.seqs[blockIdx.y];
  const int64_t ratio = p.ratio, d = p.head_dim, width = d;
  const int64_t first_w = s.start / ratio, end_w = (s.start + s.count) / ratio;
  const int64_t w = first_w + blockIdx.x / ranks;
  if (w >= end_w) return;  // uniform over the cluster
  const int64_t stride = row_stride_of(p, width);
  SlotReader rd{p.kv,   p.score, p.ape,           s.state, s.state + ratio * width,
                s.row,  s.start, first_w * ratio, ratio,   width,
                stride, false};
  const int tid = int(threadIdx.x);
  const int64_t c0 = int64_t(rank) * kHcaChannels, p0 = w * ratio;
  // Loads: thread t takes channel t % 64 of slots t / 64, t / 64 + 4, ... (a warp reads 32
  // consecutive channels of one slot: 128-byte pieces).
  {
    constexpr int kPer = kHcaSlots * kHcaChannels / kHcaThreads;  // 32
    const int ch = tid % kHcaChannels, s0 = tid / kHcaChannels;
    float kvv[kPer], scv[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) rd.load(p0 + s0 + 4 * i, c0 + ch, kvv[i], scv[i]);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      kv_s[(s0 + 4 * i) * kHcaChannels + ch] = kvv[i];
      w_s[(s0 + 4 * i) * kHcaChannels + ch] = scv[i];
    }
  }
  __syncthreads();
  if (tid < kHcaChannels) {
    float m = -INFINITY;
#pragma unroll 32  // the loads of 32 slots in flight, then the dependent chain
    for (int i = 0; i < kHcaSlots; ++i) {
      const float v = w_s[i * kHcaChannels + tid];
      m = m < v ? v : m;
    }
    col_max[tid] = m;
  }
  __syncthreads();
  for (int i = tid; i < kHcaSlots * kHcaChannels; i += kHcaThreads)
    w_s[i] = ops::exp_f32(w_s[i] - col_max[i % kHcaChannels]);
  __syncthreads();
  if (tid < kHcaChannels) {
    float sum = 0.0f;
#pragma unroll 32
    for (int i = 0; i < kHcaSlots; ++i) sum += w_s[i * kHcaChannels + tid];
    col_sum[tid] = sum;
  }
  __syncthreads();
  for (int i = tid; i < kHcaSlots * kHcaChannels; i += kHcaThreads)
    w_s[i] = w_s[i] / col_sum[i % kHcaChannels];
  __syncthreads();
  const bool chan = tid < kHcaChannels;  // warps 0 and 1: one channel per thread from here
  const int lane = tid & 31, warp = tid >> 5;
  const int64_t c = c0 + tid;
  float v = 0.0f;
  if (chan) {
    float acc = 0.0f;
#pragma unroll 32
    for (int i = 0; i < kHcaSlots; ++i)
      acc = __fadd_rn(acc, __fmul_rn(kv_s[i * kHcaChannels + tid], w_s[i * kHcaChannels + tid]));
    v = acc;
  }
  if (p.finish) {
    if (chan && p.round_bf16) v = ops::round_bf16(v);
    // block_sum(v * v) of the d-thread kernel: warp sums (the same 32 channels per warp), then
    // the d / 32 warp sums in warp order by one warp.
    if (chan) {
      const float ws = ops::warp_sum(v * v);
      if (lane == 0) {
        for (int q = 0; q < ranks; ++q)
          cluster.map_shared_rank(warp_ss, q)[2 * rank + warp] = ws;
      }
    }
    cluster.sync();
    if (!chan) return;
    const int num_warps = 2 * ranks;
    const float ss = ops::warp_sum(lane < num_warps ? warp_ss[lane] : 0.0f);
    const int64_t nope = d - p.rope_dim;
    v = norm_rope_channel(v, ss, c, w, p);
    if (p.simulate_quantization) {  // attention kind: this rank's 64 channels are one block
      const float a = ops::warp_max(fabsf(v));
      if (lane == 0) warp_amax[warp] = a;
      asm volatile("bar.sync 1, 64;" ::: "memory");
      if (c < nope) v = ops::fp8_simulate(v, fmaxf(warp_amax[0], warp_amax[1]));
    }
  } else if (!chan) {
    return;
  }
  p.entries[(s.entry_row + w - first_w) * d + c] = v;
#endif
}

__global__ void compressor_ring_kernel(CompressorParams p) {
  const CompressorSeq s = p.seqs[blockIdx.y];
  const int64_t ratio = p.ratio, d = p.head_dim;
  const bool overlap = ratio == 4;
  const int64_t width = overlap ? 2 * d : d;
  const int64_t state_rows = overlap ? 2 * ratio : ratio;
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= width || s.count <= 0) return;
  float* ring_kv = s.state;
  float* ring_score = s.state + state_rows * width;
  const int64_t end = s.start + s.count;
  const int64_t open_end = end / ratio * ratio;  // first position of the window open at the end
  const int64_t stride = row_stride_of(p, width);
  auto chunk = [&](int64_t pos, float& kv_out, float& score_out) {
    const int64_t r = s.row + pos - s.start;
    kv_out = p.kv[r * stride + col];
    score_out = p.score[r * stride + col] + p.ape[(pos & (ratio - 1)) * width + col];
  };
  // CSA: a window completed in this call becomes the previous window (rows 0..3). Read it (from
  // the call or the ring's current rows) before the current rows are overwritten below.
  float prev_kv[4], prev_score[4];
  const bool new_previous = overlap && open_end > s.start;
  if (new_previous) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t pos = open_end - 4 + i;
      if (pos >= s.start)
        chunk(pos, prev_kv[i], prev_score[i]);
      else {
        prev_kv[i] = ring_kv[(4 + i) * width + col];
        prev_score[i] = ring_score[(4 + i) * width + col];
      }
    }
  }
  const int64_t cur_base = overlap ? ratio : 0;
  for (int64_t pos = open_end > s.start ? open_end : s.start; pos < end; ++pos) {
    float kvv, sc;
    chunk(pos, kvv, sc);
    const int64_t rr = cur_base + (pos & (ratio - 1));
    ring_kv[rr * width + col] = kvv;
    ring_score[rr * width + col] = sc;
  }
  if (new_previous) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ring_kv[i * width + col] = prev_kv[i];
      ring_score[i * width + col] = prev_score[i];
    }
  }
}

__global__ void compressor_reset_kernel(const CompressorSeq* seqs, int64_t half) {
  float* state = seqs[blockIdx.y].state;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < half;
       i += int64_t(gridDim.x) * blockDim.x) {
    state[i] = 0.0f;
    state[half + i] = -INFINITY;
  }
}

}  // namespace

void launch_compressor(const CompressorParams& p, cudaStream_t stream) {
  if (p.num_seqs <= 0) return;
  const int64_t width = (p.ratio == 4 ? 2 : 1) * p.head_dim;
  const int64_t max_entries = p.max_count / p.ratio + 1;
  const int ranks = int(p.head_dim / kHcaChannels);
  const bool hca_cluster =
      p.ratio == kHcaSlots && (!p.finish || p.kind == CompressorEntryKind::kAttention) &&
      p.head_dim % kHcaChannels == 0 && ranks >= 1 && ranks <= kHcaMaxRanks &&
      (p.rope_dim <= 0 || (p.head_dim - p.rope_dim) % kHcaChannels == 0) &&
      device_has_clusters() &&
      ensure_max_dynamic_smem(compressor_hca_entry_kernel, kHcaSmemBytes) == cudaSuccess;
  if (p.max_count > 0 && hca_cluster) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(max_entries * ranks), unsigned(p.num_seqs));
    cfg.blockDim = dim3(kHcaThreads);
    cfg.dynamicSmemBytes = kHcaSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(ranks);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, compressor_hca_entry_kernel, p);
  } else if (p.max_count > 0) {
    compressor_entry_kernel<<<dim3(unsigned(max_entries), unsigned(p.num_seqs)),
                              unsigned(p.head_dim), 0, stream>>>(p);
  }
  compressor_ring_kernel<<<dim3(unsigned((width + 255) / 256), unsigned(p.num_seqs)), 256, 0,
                           stream>>>(p);
}

void launch_compressor_state_reset(const CompressorSeq* seqs, int64_t num_seqs, int64_t ratio,
                                   int64_t head_dim, cudaStream_t stream) {
  if (num_seqs <= 0) return;
  const int64_t half = compressor_state_floats(ratio, head_dim) / 2;
  const int64_t blocks = std::min<int64_t>((half + 255) / 256, 64);
  compressor_reset_kernel<<<dim3(unsigned(blocks), unsigned(num_seqs)), 256, 0, stream>>>(seqs,
                                                                                          half);
}

}  // namespace ds::cuda
