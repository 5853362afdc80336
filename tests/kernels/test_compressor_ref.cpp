// Compressor references (dsv4-model.md §7.6): entries against a double implementation of the
// pooling formula written from the spec (CSA overlapping windows, HCA plain windows), the CSA w = 0
// window ignoring its empty "previous" slots, prefill == token-by-token push (bit for bit, for
// any chunking), state reset per sequence, the projection, and the entry post-processing.
//
// Tolerances: pooled entries vs double 4e-6 * max|kv| (a per-channel softmax over 8 or 128 slots
// in fp32: exp and division each within an ulp or two, the weighted sum of up to 128 terms adds
// about sqrt(128) * 2^-24 = 7e-7 relative). Prefill vs push: exact (both call the same pooling
// routine on identical fp32 inputs in the same order). Post-processing: exact against the
// composition of the individually tested kernels, plus grid properties of the simulations.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/compressor.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"

namespace ds::cpu {
namespace {

struct Inputs {
  std::vector<float> kv, score, ape;  // [T, width], [T, width], [ratio, width]
};

Inputs random_inputs(const CompressorConfig& c, int64_t tokens, uint64_t seed) {
  Rng rng(seed);
  Inputs in;
  in.kv.resize(tokens * c.width());
  in.score.resize(tokens * c.width());
  in.ape.resize(c.ratio * c.width());
  for (auto& v : in.kv) v = rng.normal();
  for (auto& v : in.score) v = rng.normal() * 2.0f;
  for (auto& v : in.ape) v = rng.normal();
  return in;
}

// §7.6 from the spec, in double: entry w pools (CSA) the A halves of tokens 4(w-1)..4w-1 and the
// B halves of tokens 4w..4w+3, or (HCA) the tokens ratio*w .. ratio*w + ratio-1.
std::vector<double> expected_entry(const CompressorConfig& c, const Inputs& in, int64_t w) {
  const int64_t d = c.head_dim, width = c.width(), r = c.ratio;
  std::vector<double> out(d);
  for (int64_t ch = 0; ch < d; ++ch) {
    std::vector<double> kv, score;
    if (c.overlap()) {
      if (w > 0) {
        for (int64_t i = 0; i < r; ++i) {
          const int64_t t = r * (w - 1) + i;
          kv.push_back(in.kv[t * width + ch]);
          score.push_back(double(in.score[t * width + ch]) + in.ape[i * width + ch]);
        }
      }
      for (int64_t i = 0; i < r; ++i) {
        const int64_t t = r * w + i;
        kv.push_back(in.kv[t * width + d + ch]);
        score.push_back(double(in.score[t * width + d + ch]) + in.ape[i * width + d + ch]);
      }
    } else {
      for (int64_t i = 0; i < r; ++i) {
        const int64_t t = r * w + i;
        kv.push_back(in.kv[t * width + ch]);
        score.push_back(double(in.score[t * width + ch]) + in.ape[i * width + ch]);
      }
    }
    double m = -1e300, sum = 0, acc = 0;
    for (double s : score) m = std::max(m, s);
    for (double s : score) sum += std::exp(s - m);
    for (size_t i = 0; i < kv.size(); ++i) acc += kv[i] * std::exp(score[i] - m) / sum;
    out[ch] = acc;
  }
  return out;
}

// Pushes tokens [0, tokens) one by one; returns the entries in order.
std::vector<float> push_all(const CompressorConfig& c, const Inputs& in, int64_t tokens) {
  CompressorState state;
  compressor_state_reset(c, &state);
  std::vector<float> entries, entry(c.head_dim);
  for (int64_t t = 0; t < tokens; ++t) {
    if (compressor_push(c, &state, in.ape.data(), in.kv.data() + t * c.width(),
                        in.score.data() + t * c.width(), t, entry.data())) {
      EXPECT_EQ((t + 1) % c.ratio, 0);
      entries.insert(entries.end(), entry.begin(), entry.end());
    }
  }
  return entries;
}

// Processes tokens [0, tokens) in chunks of the given sizes (cycled) through compressor_prefill.
std::vector<float> prefill_chunks(const CompressorConfig& c, const Inputs& in, int64_t tokens,
                                  const std::vector<int64_t>& chunk_sizes) {
  CompressorState state;
  compressor_state_reset(c, &state);
  std::vector<float> entries;
  std::vector<float> buffer((tokens / c.ratio + 2) * c.head_dim);
  int64_t t = 0;
  for (size_t i = 0; t < tokens; ++i) {
    const int64_t n = std::min(chunk_sizes[i % chunk_sizes.size()], tokens - t);
    const int64_t count = compressor_prefill(c, &state, in.ape.data(), in.kv.data() + t * c.width(),
                                             in.score.data() + t * c.width(), t, n, buffer.data());
    EXPECT_EQ(count, (t + n) / c.ratio - t / c.ratio);
    entries.insert(entries.end(), buffer.begin(), buffer.begin() + count * c.head_dim);
    t += n;
  }
  return entries;
}

void check_entries_against_formula(const CompressorConfig& c, int64_t tokens, uint64_t seed) {
  Inputs in = random_inputs(c, tokens, seed);
  std::vector<float> entries = push_all(c, in, tokens);
  ASSERT_EQ(int64_t(entries.size()), (tokens / c.ratio) * c.head_dim);
  double kv_max = 0;
  for (float v : in.kv) kv_max = std::max(kv_max, std::fabs(double(v)));
  for (int64_t w = 0; w < tokens / c.ratio; ++w) {
    std::vector<double> expected = expected_entry(c, in, w);
    for (int64_t ch = 0; ch < c.head_dim; ++ch) {
      ASSERT_NEAR(entries[w * c.head_dim + ch], expected[ch], 4e-6 * kv_max)
          << "w=" << w << " ch=" << ch;
    }
  }
}

TEST(Compressor, StateResetValues) {
  CompressorConfig csa{4, 32, 8};
  CompressorState state;
  compressor_state_reset(csa, &state);
  ASSERT_EQ(state.kv.size(), size_t(8 * 64));
  for (float v : state.kv) EXPECT_EQ(v, 0.0f);
  for (float v : state.score) EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
  CompressorConfig hca{128, 16, 8};
  compressor_state_reset(hca, &state);
  EXPECT_EQ(state.kv.size(), size_t(128 * 16));
}

TEST(Compressor, CsaEntriesMatchFormula) {
  check_entries_against_formula({4, 32, 8}, 37, 1);
}
TEST(Compressor, HcaEntriesMatchFormula) {
  check_entries_against_formula({128, 16, 8}, 300, 2);
}
TEST(Compressor, CsaFlashWidth) {
  check_entries_against_formula({4, 512, 64}, 13, 3);
}
TEST(Compressor, HcaFlashWidth) {
  check_entries_against_formula({128, 512, 64}, 256, 4);
}
TEST(Compressor, IndexerCompressorShape) {
  check_entries_against_formula({4, 128, 64}, 20, 5);
}

TEST(Compressor, CsaFirstWindowHasZeroWeightOnPreviousSlots) {
  // Entry 0 pools only the B halves of tokens 0..3 (4 slots): the empty previous slots (kv 0,
  // score -inf) get weight exactly 0. Checked against a 4-slot softmax in double, and by making
  // the A halves of tokens 0..3 irrelevant (they only feed entry 1).
  CompressorConfig c{4, 16, 8};
  Inputs in = random_inputs(c, 4, 9);
  std::vector<float> e0 = push_all(c, in, 4);
  for (int64_t ch = 0; ch < 16; ++ch) {
    double m = -1e300, sum = 0, acc = 0;
    for (int i = 0; i < 4; ++i)
      m = std::max(m, double(in.score[i * 32 + 16 + ch]) + in.ape[i * 32 + 16 + ch]);
    for (int i = 0; i < 4; ++i) {
      const double e = std::exp(double(in.score[i * 32 + 16 + ch]) + in.ape[i * 32 + 16 + ch] - m);
      sum += e;
      acc += e * in.kv[i * 32 + 16 + ch];
    }
    EXPECT_NEAR(e0[ch], acc / sum, 4e-6 * 4);
  }
  Inputs changed = in;
  for (int i = 0; i < 4; ++i) {
    for (int ch = 0; ch < 16; ++ch) {
      changed.kv[i * 32 + ch] = 1000.0f;
      changed.score[i * 32 + ch] = 50.0f;
    }
  }
  std::vector<float> e0_changed = push_all(c, changed, 4);
  for (int64_t ch = 0; ch < 16; ++ch) EXPECT_EQ(e0_changed[ch], e0[ch]);
}

TEST(Compressor, PrefillEqualsTokenByTokenPush) {
  for (CompressorConfig c : {CompressorConfig{4, 32, 8}, CompressorConfig{128, 16, 8}}) {
    const int64_t tokens = c.ratio == 4 ? 45 : 400;
    Inputs in = random_inputs(c, tokens, 77);
    std::vector<float> reference = push_all(c, in, tokens);
    // One prefill over everything, prefills of every single length 1..tokens followed by
    // pushes (through chunk lists), and assorted chunkings that start mid-window.
    const std::vector<std::vector<int64_t>> chunkings = {
        {tokens}, {1}, {3}, {4}, {5}, {7, 1, 12}, {130, 2, 4, 129}, {8, 3}, {129, 127, 128}};
    for (const auto& chunks : chunkings) {
      std::vector<float> got = prefill_chunks(c, in, tokens, chunks);
      ASSERT_EQ(got.size(), reference.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], reference[i])
            << "ratio " << c.ratio << " first chunk " << chunks[0] << " i " << i;
      }
    }
    for (int64_t first = 1; first < tokens; first += (c.ratio == 4 ? 1 : 37)) {
      std::vector<float> got = prefill_chunks(c, in, tokens, {first, 1});
      ASSERT_EQ(got, reference) << "ratio " << c.ratio << " prefill " << first << " then decode";
    }
  }
}

TEST(Compressor, ResetStartsEachSequenceFresh) {
  // Sequence A leaves state behind; after a reset, sequence B's entries equal those of B alone.
  CompressorConfig c{4, 32, 8};
  Inputs a = random_inputs(c, 10, 1), b = random_inputs(c, 12, 2);
  b.ape = a.ape;  // same layer
  std::vector<float> b_alone = push_all(c, b, 12);
  CompressorState state;
  compressor_state_reset(c, &state);
  std::vector<float> entry(32), b_after(0);
  for (int64_t t = 0; t < 10; ++t) {
    compressor_push(c, &state, a.ape.data(), a.kv.data() + t * 64, a.score.data() + t * 64, t,
                    entry.data());
  }
  compressor_state_reset(c, &state);
  for (int64_t t = 0; t < 12; ++t) {
    if (compressor_push(c, &state, b.ape.data(), b.kv.data() + t * 64, b.score.data() + t * 64, t,
                        entry.data())) {
      b_after.insert(b_after.end(), entry.begin(), entry.end());
    }
  }
  EXPECT_EQ(b_after, b_alone);
}

TEST(Compressor, ProjectIsTwoBf16Linears) {
  CompressorConfig c{4, 16, 8};
  const int64_t dim = 64, tokens = 3;
  Rng rng(4);
  std::vector<uint16_t> wkv(c.width() * dim), wgate(c.width() * dim);
  for (auto& v : wkv) v = float_to_bf16(rng.normal() * 0.1f);
  for (auto& v : wgate) v = float_to_bf16(rng.normal() * 0.1f);
  std::vector<float> h(tokens * dim);
  for (auto& v : h) v = rng.normal();
  std::vector<float> kv(tokens * c.width()), score(tokens * c.width());
  std::vector<float> kv_ref(kv.size()), score_ref(score.size());
  const LinearWeight wkv_view{WeightFormat::kBF16, c.width(), dim, wkv.data(), nullptr, 1.0f};
  const LinearWeight wgate_view{WeightFormat::kBF16, c.width(), dim, wgate.data(), nullptr, 1.0f};
  compressor_project(c, wkv_view, wgate_view, h.data(), tokens, kv.data(), score.data());
  linear_bf16(h.data(), tokens, wkv.data(), c.width(), dim, kv_ref.data());
  linear_bf16(h.data(), tokens, wgate.data(), c.width(), dim, score_ref.data());
  EXPECT_EQ(kv, kv_ref);
  EXPECT_EQ(score, score_ref);
}

std::vector<float> flash_compressed_inv_freq() {
  std::vector<float> f(32);
  rope_inv_freq(rope_config_for_layer(4, 64, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0), f.data());
  return f;
}

TEST(CompressorFinish, AttentionEntryReferenceMode) {
  CompressorConfig c{4, 512, 64};
  Rng rng(6);
  std::vector<float> entry(512), norm_w(512);
  for (auto& v : entry) v = rng.normal() * 3.0f;
  for (auto& v : norm_w) v = round_bf16(rng.uniform(0.5f, 1.5f));
  std::vector<float> f = flash_compressed_inv_freq();
  CompressorFinishParams p;
  p.kind = CompressorKind::kAttention;
  p.norm_weight = norm_w.data();
  p.inv_freq = f.data();
  std::vector<float> got = entry;
  compressor_finish_entry(c, p, 7, got.data());
  // Composition: bf16 -> RMSNorm -> bf16 -> RoPE at position 4 * 7 = 28 -> bf16 -> FP8 nope.
  std::vector<float> expected = entry;
  round_to_bf16(expected.data(), 512);
  rms_norm(expected.data(), norm_w.data(), 1, 512, 1e-6f, expected.data());
  round_to_bf16(expected.data(), 512);
  rope_rotate(expected.data(), 1, 512, 64, f.data(), 28, RopeDirection::kForward);
  round_to_bf16(expected.data(), 512);
  const std::vector<float> before_fp8 = expected;
  simulate_fp8_kv_nope(expected.data(), 1, 512, 64);
  EXPECT_EQ(got, expected);
  // Grid properties: the rope tail is untouched bf16; every nope value is e4m3 times its block's
  // power-of-two scale 2^ceil(log2(amax / 448)).
  for (int i = 448; i < 512; ++i) EXPECT_EQ(got[i], before_fp8[i]);
  for (int b = 0; b < 448; b += 64) {
    float amax = 0;
    for (int i = b; i < b + 64; ++i) amax = std::max(amax, std::fabs(before_fp8[i]));
    const float s = std::ldexp(1.0f, int(std::ceil(std::log2(double(amax) / 448.0))));
    for (int i = b; i < b + 64; ++i) {
      EXPECT_EQ(e4m3_to_float(float_to_e4m3(got[i] / s)), got[i] / s) << i;
      EXPECT_LE(std::fabs(got[i] - before_fp8[i]), std::fabs(before_fp8[i]) / 16 + s / 512) << i;
    }
  }
}

TEST(CompressorFinish, IndexerEntryReferenceModeAndHfMode) {
  CompressorConfig c{4, 128, 64};
  Rng rng(8);
  std::vector<float> entry(128), norm_w(128);
  for (auto& v : entry) v = rng.normal();
  for (auto& v : norm_w) v = rng.uniform(0.5f, 1.5f);
  std::vector<float> f = flash_compressed_inv_freq();
  CompressorFinishParams p;
  p.kind = CompressorKind::kIndexer;
  p.norm_weight = norm_w.data();
  p.inv_freq = f.data();
  std::vector<float> got = entry;
  compressor_finish_entry(c, p, 3, got.data());
  std::vector<float> expected = entry;
  round_to_bf16(expected.data(), 128);
  rms_norm(expected.data(), norm_w.data(), 1, 128, 1e-6f, expected.data());
  round_to_bf16(expected.data(), 128);
  rope_rotate(expected.data(), 1, 128, 64, f.data(), 12, RopeDirection::kForward);
  round_to_bf16(expected.data(), 128);
  hadamard_transform(expected.data(), 1, 128);
  round_to_bf16(expected.data(), 128);
  std::vector<float> before_fp4 = expected;
  simulate_fp4_blocks(expected.data(), 128, 32);
  EXPECT_EQ(got, expected);
  // FP4 grid: each value / its block scale is an e2m1 value.
  for (int b = 0; b < 128; b += 32) {
    float amax = 0;
    for (int i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(before_fp4[i]));
    const float s = e8m0_to_float(e8m0_ceil_pow2(amax / 6.0f));
    for (int i = b; i < b + 32; ++i) {
      EXPECT_EQ(e2m1_to_float(float_to_e2m1(got[i] / s)), got[i] / s) << i;
    }
  }
  // hf mode: no rounding, no simulation -> RMSNorm then RoPE only, checked against double.
  p.simulate_quantization = false;
  p.round_bf16 = false;
  std::vector<float> hf = entry;
  compressor_finish_entry(c, p, 3, hf.data());
  double ss = 0;
  for (float v : entry) ss += double(v) * v;
  const double rs = 1.0 / std::sqrt(ss / 128 + 1e-6);
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(hf[i], entry[i] * rs * norm_w[i],
                4e-6 * std::fabs(entry[i] * rs * norm_w[i]) + 1e-7);
  for (int i = 0; i < 32; ++i) {
    const double angle = double(float(12) * f[i]);
    const double re = entry[64 + 2 * i] * rs * norm_w[64 + 2 * i];
    const double im = entry[65 + 2 * i] * rs * norm_w[65 + 2 * i];
    EXPECT_NEAR(hf[64 + 2 * i], re * std::cos(angle) - im * std::sin(angle), 1e-5);
    EXPECT_NEAR(hf[65 + 2 * i], re * std::sin(angle) + im * std::cos(angle), 1e-5);
  }
}

}  // namespace
}  // namespace ds::cpu
