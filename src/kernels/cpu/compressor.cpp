// Compressor references (REF model.py Compressor.forward: the prefill branch with
// overlap_transform and the decode branch with the state ring). Both the push and the chunk form
// pool through pool_slots(), so they round identically.
#include "kernels/cpu/compressor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"

namespace ds::cpu {

namespace {

// Per-channel softmax over the slots' scores, then the weighted sum of their kv values:
// out[c] = sum_i kv_i[c] * softmax_i(score[c]). Each pointer is already offset to the slot's
// d-wide half. Slots with score -inf get weight 0.
void pool_slots(int64_t num_slots, const float* const* kv_slots, const float* const* score_slots,
                int64_t d, float* out) {
  for (int64_t c = 0; c < d; ++c) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < num_slots; ++i) m = std::max(m, score_slots[i][c]);
    float sum = 0.0f;
    for (int64_t i = 0; i < num_slots; ++i) sum += std::exp(score_slots[i][c] - m);
    float acc = 0.0f;
    for (int64_t i = 0; i < num_slots; ++i) {
      acc += kv_slots[i][c] * (std::exp(score_slots[i][c] - m) / sum);
    }
    out[c] = acc;
  }
}

// Maximum ratio supported by the fixed-size pointer arrays below (HCA uses 128).
constexpr int64_t kMaxSlots = 2 * 128;

}  // namespace

void compressor_state_reset(const CompressorConfig& config, CompressorState* state) {
  const size_t n = size_t(config.state_rows() * config.width());
  state->kv.assign(n, 0.0f);
  state->score.assign(n, -std::numeric_limits<float>::infinity());
}

void compressor_project(const CompressorConfig& config, const LinearWeight& wkv,
                        const LinearWeight& wgate, const float* h, int64_t num_tokens, float* kv,
                        float* score) {
  linear(h, num_tokens, wkv, false, kv);
  linear(h, num_tokens, wgate, false, score);
}

bool compressor_push(const CompressorConfig& config, CompressorState* state, const float* ape,
                     const float* kv_t, const float* score_t, int64_t position, float* entry) {
  const int64_t ratio = config.ratio, d = config.head_dim, width = config.width();
  assert(config.state_rows() <= kMaxSlots &&
         state->kv.size() == size_t(config.state_rows() * width));
  const int64_t phase = position % ratio;
  // CSA: token goes to row ratio + t%ratio (rows 0..ratio-1 keep the previous window); HCA:
  // t%ratio.
  const int64_t row = config.overlap() ? ratio + phase : phase;
  float* kv_row = state->kv.data() + row * width;
  float* score_row = state->score.data() + row * width;
  for (int64_t c = 0; c < width; ++c) {
    kv_row[c] = kv_t[c];
    score_row[c] = score_t[c] + ape[phase * width + c];
  }
  if ((position + 1) % ratio != 0) return false;

  const float* kv_slots[kMaxSlots];
  const float* score_slots[kMaxSlots];
  if (config.overlap()) {
    // Previous window's A halves (rows 0..ratio-1, cols 0:d), current window's B halves
    // (rows ratio..2ratio-1, cols d:2d).
    for (int64_t i = 0; i < ratio; ++i) {
      kv_slots[i] = state->kv.data() + i * width;
      score_slots[i] = state->score.data() + i * width;
      kv_slots[ratio + i] = state->kv.data() + (ratio + i) * width + d;
      score_slots[ratio + i] = state->score.data() + (ratio + i) * width + d;
    }
    pool_slots(2 * ratio, kv_slots, score_slots, d, entry);
    // The current window becomes the previous one.
    std::copy(state->kv.begin() + ratio * width, state->kv.end(), state->kv.begin());
    std::copy(state->score.begin() + ratio * width, state->score.end(), state->score.begin());
  } else {
    for (int64_t i = 0; i < ratio; ++i) {
      kv_slots[i] = state->kv.data() + i * width;
      score_slots[i] = state->score.data() + i * width;
    }
    pool_slots(ratio, kv_slots, score_slots, d, entry);
  }
  return true;
}

int64_t compressor_prefill(const CompressorConfig& config, CompressorState* state, const float* ape,
                           const float* kv, const float* score, int64_t start_position,
                           int64_t num_tokens, float* entries) {
  const int64_t ratio = config.ratio, d = config.head_dim, width = config.width();
  const int64_t end = start_position + num_tokens;
  int64_t count = 0;
  int64_t t = start_position;
  auto local = [&](int64_t position) { return position - start_position; };

  // 1. Tokens before the first window boundary inside the chunk go through the ring (the last
  //    of them may complete a window that started before the chunk).
  for (; t < end && t % ratio != 0; ++t) {
    if (compressor_push(config, state, ape, kv + local(t) * width, score + local(t) * width, t,
                        entries + count * d)) {
      ++count;
    }
  }

  // 2. Windows that lie entirely inside the chunk, pooled straight from kv/score + ape.
  std::vector<float> score_ape(
      static_cast<size_t>(2 * ratio * width));  // [2 * ratio, width] scratch
  int64_t last_window_start = -1;
  for (; t + ratio <= end; t += ratio) {
    const float* kv_slots[kMaxSlots];
    const float* score_slots[kMaxSlots];
    // Current window: score + ape[i], the same fp32 sum the ring stores.
    float* cur_score = score_ape.data() + ratio * width;
    for (int64_t i = 0; i < ratio; ++i) {
      for (int64_t c = 0; c < width; ++c) {
        cur_score[i * width + c] = score[(local(t) + i) * width + c] + ape[i * width + c];
      }
    }
    if (config.overlap()) {
      const bool previous_in_chunk = t - ratio >= start_position;
      float* prev_score = score_ape.data();
      for (int64_t i = 0; i < ratio; ++i) {
        if (previous_in_chunk) {
          for (int64_t c = 0; c < d; ++c) {
            prev_score[i * width + c] =
                score[(local(t) - ratio + i) * width + c] + ape[i * width + c];
          }
          kv_slots[i] = kv + (local(t) - ratio + i) * width;
          score_slots[i] = prev_score + i * width;
        } else {
          // The previous window is in the ring's rows 0..ratio-1 (kv 0 / score -inf for w = 0).
          kv_slots[i] = state->kv.data() + i * width;
          score_slots[i] = state->score.data() + i * width;
        }
        kv_slots[ratio + i] = kv + (local(t) + i) * width + d;
        score_slots[ratio + i] = cur_score + i * width + d;
      }
      pool_slots(2 * ratio, kv_slots, score_slots, d, entries + count * d);
    } else {
      for (int64_t i = 0; i < ratio; ++i) {
        kv_slots[i] = kv + (local(t) + i) * width;
        score_slots[i] = cur_score + i * width;
      }
      pool_slots(ratio, kv_slots, score_slots, d, entries + count * d);
    }
    ++count;
    last_window_start = t;
  }
  // CSA: the last complete window becomes the ring's previous window (rows 0..ratio-1).
  if (config.overlap() && last_window_start >= 0) {
    for (int64_t i = 0; i < ratio; ++i) {
      const int64_t src = local(last_window_start) + i;
      for (int64_t c = 0; c < width; ++c) {
        state->kv[size_t(i * width + c)] = kv[src * width + c];
        state->score[size_t(i * width + c)] = score[src * width + c] + ape[i * width + c];
      }
    }
  }

  // 3. The remainder (an incomplete window) goes into the ring's current slots.
  for (; t < end; ++t) {
    if (compressor_push(config, state, ape, kv + local(t) * width, score + local(t) * width, t,
                        entries + count * d)) {
      ++count;  // unreachable: the window is incomplete
    }
  }
  return count;
}

void compressor_finish_entry(const CompressorConfig& config, const CompressorFinishParams& params,
                             int64_t entry_index, float* entry) {
  const int64_t d = config.head_dim, rd = config.rope_dim;
  if (params.round_bf16) round_to_bf16(entry, d);  // REF: kv.to(bf16) before the norm
  rms_norm(entry, params.norm_weight, 1, d, params.norm_eps, entry);
  if (params.round_bf16) round_to_bf16(entry, d);
  // RoPE at the window's start position (§7.6).
  rope_rotate(entry, 1, d, rd, params.inv_freq, config.ratio * entry_index,
              RopeDirection::kForward);
  if (params.round_bf16) round_to_bf16(entry, d);
  if (!params.simulate_quantization) return;
  if (params.kind == CompressorKind::kAttention) {
    simulate_fp8_kv_nope(entry, 1, d, rd);
  } else {
    hadamard_transform(entry, 1, d);
    if (params.round_bf16) round_to_bf16(entry, d);
    simulate_fp4_blocks(entry, d, kFp4Block);
  }
}

}  // namespace ds::cpu
