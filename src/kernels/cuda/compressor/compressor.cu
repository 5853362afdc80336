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
  const int64_t stride = p.row_stride > 0 ? p.row_stride : width;
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
    const float ss = ops::block_sum(v * v, scratch);
    const float r = 1.0f / sqrtf(ss / float(d) + p.norm_eps);
    v = __fmul_rn(__fmul_rn(v, r), p.norm_weight[c]);
    if (p.round_bf16) v = ops::round_bf16(v);
    // RoPE at the window's start position; pair (2i, 2i+1) of the tail sits in adjacent lanes.
    const float partner = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    if (c >= nope) {
      const int64_t i = (c - nope) / 2;
      const float angle = float(ratio * w) * p.inv_freq[i];
      double sd, cd;
      sincos(double(angle), &sd, &cd);
      const float cs = float(cd), sn = float(sd);
      if (((c - nope) & 1) == 0)
        v = __fsub_rn(__fmul_rn(v, cs), __fmul_rn(partner, sn));
      else
        v = __fadd_rn(__fmul_rn(partner, sn), __fmul_rn(v, cs));
      if (p.round_bf16) v = ops::round_bf16(v);
    }
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
  const int64_t stride = p.row_stride > 0 ? p.row_stride : width;
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
  if (p.max_count > 0) {
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
