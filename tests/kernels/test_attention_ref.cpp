// Sparse sink attention (dsv4-model.md §7.5) and the grouped output projection (§7.8) against
// hand-computed cases and independent double implementations, at tiny and DeepSeek-V4-Flash
// shapes (one decode token, 64 heads x 512, 128 window + 512 compressed keys).
//
// Attention tolerance, derived per output: a score is an fp32 dot of head_dim terms, error
// <= ds = 8 sqrt(hd) 2^-24 sum_d |q_d k_d| * scale (8 sigma of a random walk); softmax weights
// then carry a relative error <= 4 ds, and the weighted sum of n values adds 8 sqrt(n) 2^-24;
// so |o - o_ref| <= (4 ds_max + 8 sqrt(n) 2^-24) * sum_j p_j |v_j| (+1e-7 absolute floor).
// The projection tests compare with a dense linear over the materialized block-diagonal matrix,
// which performs the same fp32 operations, so they are exact.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/output_projection.h"

namespace ds::cpu {
namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

// Double reference of §7.5 for one head; sink = -inf means no sink.
std::vector<double> attention_double(const float* q, const std::vector<const float*>& keys,
                                     int64_t hd, double scale, double sink, double* lse,
                                     double* max_abs_dot) {
  const size_t n = keys.size();
  std::vector<double> s(n);
  double m = -1e300;
  *max_abs_dot = 0;
  for (size_t j = 0; j < n; ++j) {
    double dot = 0, abs_dot = 0;
    for (int64_t d = 0; d < hd; ++d) {
      dot += double(q[d]) * keys[j][d];
      abs_dot += std::fabs(double(q[d]) * keys[j][d]);
    }
    s[j] = dot * scale;
    *max_abs_dot = std::max(*max_abs_dot, abs_dot);
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (size_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
  const double denominator = sum + (std::isinf(sink) ? 0.0 : std::exp(sink - m));
  std::vector<double> o(size_t(hd), 0.0);
  for (size_t j = 0; j < n; ++j) {
    const double p = std::exp(s[j] - m) / denominator;
    for (int64_t d = 0; d < hd; ++d) o[size_t(d)] += p * keys[j][d];
  }
  *lse = m + std::log(sum);
  return o;
}

void check_attention(int64_t heads, int64_t hd, int64_t num_window, int64_t num_pool,
                     int64_t num_selected, bool with_sink, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> q(heads * hd), window(num_window * hd), pool(num_pool * hd), sink(heads);
  for (auto& v : q) v = rng.normal();
  for (auto& v : window) v = rng.normal();
  for (auto& v : pool) v = rng.normal();
  for (auto& v : sink) v = rng.normal() * 2.0f;
  // Key set: all window keys and a strided selection of the compressed pool.
  std::vector<const float*> keys;
  for (int64_t j = 0; j < num_window; ++j) keys.push_back(window.data() + j * hd);
  for (int64_t j = 0; j < num_selected; ++j) {
    keys.push_back(pool.data() + ((j * 7) % num_pool) * hd);
  }
  const float scale = float(1.0 / std::sqrt(double(hd)));
  std::vector<float> out(heads * hd, std::nanf("")), lse(heads);
  SparseAttentionParams p;
  p.q = q.data();
  p.keys = keys.data();
  p.num_keys = int64_t(keys.size());
  p.num_heads = heads;
  p.head_dim = hd;
  p.softmax_scale = scale;
  p.sink = with_sink ? sink.data() : nullptr;
  p.out = out.data();
  p.lse = lse.data();
  sparse_attention(p);
  const double u = std::ldexp(1.0, -24);
  for (int64_t h = 0; h < heads; ++h) {
    double lse_ref, max_abs_dot;
    std::vector<double> o =
        attention_double(q.data() + h * hd, keys, hd, scale, with_sink ? sink[h] : -INFINITY,
                         &lse_ref, &max_abs_dot);
    const double ds = 8 * std::sqrt(double(hd)) * u * max_abs_dot * scale;
    const double rel = 4 * ds + 8 * std::sqrt(double(keys.size())) * u;
    for (int64_t d = 0; d < hd; ++d) {
      // sum_j p_j |v_j| <= max_j |v_j|; bound with the max over keys for simplicity.
      double vmax = 0;
      for (const float* k : keys) vmax = std::max(vmax, std::fabs(double(k[d])));
      ASSERT_NEAR(out[h * hd + d], o[size_t(d)], rel * vmax + 1e-7) << "h=" << h << " d=" << d;
    }
    EXPECT_NEAR(lse[h], lse_ref, 2 * ds + 1e-6);
  }
}

TEST(SparseAttention, HandComputedSingleKeyWithSink) {
  // q = [1, 0], k = [2, 3], scale 0.5 -> s = 1; sink 0: weight e / (e + 1).
  const std::vector<float> q = {1.0f, 0.0f}, k = {2.0f, 3.0f}, sink = {0.0f};
  const float* keys[] = {k.data()};
  std::vector<float> out(2), lse(1);
  SparseAttentionParams p;
  p.q = q.data();
  p.keys = keys;
  p.num_keys = 1;
  p.num_heads = 1;
  p.head_dim = 2;
  p.softmax_scale = 0.5f;
  p.sink = sink.data();
  p.out = out.data();
  p.lse = lse.data();
  sparse_attention(p);
  const double w = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(out[0], 2.0 * w, 1e-6);
  EXPECT_NEAR(out[1], 3.0 * w, 1e-6);
  EXPECT_NEAR(lse[0], 1.0, 1e-6);  // the sink is excluded from the LSE
}

TEST(SparseAttention, SinkOfMinusInfinityIsPlainSoftmax) {
  Rng rng(5);
  const int64_t heads = 4, hd = 128, n = 20;
  std::vector<float> q(heads * hd), kv(n * hd), sink(heads, kNegInf);
  for (auto& v : q) v = rng.normal();
  for (auto& v : kv) v = rng.normal();
  std::vector<const float*> keys;
  for (int64_t j = 0; j < n; ++j) keys.push_back(kv.data() + j * hd);
  std::vector<float> with_inf(heads * hd), without(heads * hd);
  SparseAttentionParams p;
  p.q = q.data();
  p.keys = keys.data();
  p.num_keys = n;
  p.num_heads = heads;
  p.head_dim = hd;
  p.softmax_scale = 0.0883883f;
  p.sink = sink.data();
  p.out = with_inf.data();
  sparse_attention(p);
  p.sink = nullptr;
  p.out = without.data();
  sparse_attention(p);
  for (size_t i = 0; i < with_inf.size(); ++i) EXPECT_EQ(with_inf[i], without[i]);
  // And both equal the double softmax attention (checked with the derived tolerance).
  check_attention(heads, hd, n, 1, 0, false, 5);
}

TEST(SparseAttention, TinyShapeWithSink) {
  // §14: 4 heads x 128, window 16, a handful of compressed entries.
  check_attention(4, 128, 16, 40, 8, true, 11);
}

TEST(SparseAttention, FlashDecodeToken) {
  // One token, 64 heads x 512, 128 window keys + 512 selected compressed keys.
  check_attention(64, 512, 128, 2048, 512, true, 13);
}

TEST(SparseAttention, NoKeysAndDominantSink) {
  const std::vector<float> q = {1.0f, 1.0f}, k = {1.0f, -1.0f}, sink = {1000.0f};
  std::vector<float> out = {7.0f, 7.0f}, lse(1);
  SparseAttentionParams p;
  p.q = q.data();
  p.num_heads = 1;
  p.head_dim = 2;
  p.softmax_scale = 1.0f;
  p.sink = sink.data();
  p.out = out.data();
  p.lse = lse.data();
  sparse_attention(p);  // no keys: zero output, LSE -inf
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(lse[0], kNegInf);
  const float* keys[] = {k.data()};
  p.keys = keys;
  p.num_keys = 1;
  sparse_attention(p);  // the sink takes all the mass: output -> 0, no NaN
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(SparseAttention, LseMergesSplitsAndAppliesSinkAfterwards) {
  // Attention over keys A u B without sink equals the LSE-weighted merge of A and B; applying
  // the sink afterwards as o * e^lse / (e^lse + e^sink) equals attention with the sink. Tolerance
  // 1e-6: a few fp32 roundings on O(1) values.
  Rng rng(17);
  const int64_t hd = 64, n = 30;
  std::vector<float> q(hd), kv(n * hd);
  for (auto& v : q) v = rng.normal();
  for (auto& v : kv) v = rng.normal();
  std::vector<const float*> keys;
  for (int64_t j = 0; j < n; ++j) keys.push_back(kv.data() + j * hd);
  auto run = [&](int64_t first, int64_t count, const float* sink, float* out, float* lse) {
    SparseAttentionParams p;
    p.q = q.data();
    p.keys = keys.data() + first;
    p.num_keys = count;
    p.num_heads = 1;
    p.head_dim = hd;
    p.softmax_scale = 0.125f;
    p.sink = sink;
    p.out = out;
    p.lse = lse;
    sparse_attention(p);
  };
  std::vector<float> o_all(hd), o_a(hd), o_b(hd), o_sink(hd);
  float lse_all, lse_a, lse_b, lse_sink;
  const float sink = 0.7f;
  run(0, n, nullptr, o_all.data(), &lse_all);
  run(0, 12, nullptr, o_a.data(), &lse_a);
  run(12, n - 12, nullptr, o_b.data(), &lse_b);
  run(0, n, &sink, o_sink.data(), &lse_sink);
  const double m = std::max(lse_a, lse_b);
  const double wa = std::exp(lse_a - m), wb = std::exp(lse_b - m);
  EXPECT_NEAR(lse_all, m + std::log(wa + wb), 1e-6);
  EXPECT_NEAR(lse_sink, lse_all, 1e-6);
  for (int64_t d = 0; d < hd; ++d) {
    EXPECT_NEAR(o_all[d], (wa * o_a[d] + wb * o_b[d]) / (wa + wb), 1e-6);
    const double with_sink = o_all[d] / (1.0 + std::exp(double(sink) - lse_all));
    EXPECT_NEAR(o_sink[d], with_sink, 1e-6);
  }
}

// ---- Grouped output projection (§7.8) --------------------------------------------------------

struct Fp8Matrix {
  std::vector<uint8_t> codes, scales;
  int64_t n, k;
  LinearWeight view() const {
    return {WeightFormat::kFp8Block, n, k, codes.data(), scales.data(), 1.0f};
  }
  float at(int64_t r, int64_t c) const {
    return e4m3_to_float(codes[r * k + c]) *
           e8m0_to_float(scales[(r / 128) * ((k + 127) / 128) + c / 128]);
  }
};
Fp8Matrix random_fp8(Rng& rng, int64_t n, int64_t k) {
  Fp8Matrix m{{}, {}, n, k};
  m.codes.resize(n * k);
  // Random finite e4m3 codes (0x7F / 0xFF are NaN).
  for (auto& c : m.codes) {
    c = uint8_t(rng.below(256));
    if ((c & 0x7F) == 0x7F) c = 0x7E;
  }
  m.scales.resize(((n + 127) / 128) * ((k + 127) / 128));
  for (auto& s : m.scales) s = uint8_t(127 - 9 + rng.below(4));
  return m;
}

void check_grouped(int64_t tokens, int64_t heads, int64_t hd, int64_t groups, int64_t rank,
                   bool quantize, int64_t row_stride, uint64_t seed) {
  Rng rng(seed);
  const int64_t group_in = heads * hd / groups;
  Fp8Matrix wo_a = random_fp8(rng, groups * rank, group_in);
  std::vector<float> o(tokens * heads * hd);
  for (auto& v : o) v = rng.normal();
  std::vector<float> z(tokens * groups * rank);
  grouped_output_projection(o.data(), tokens, groups, wo_a.view(), quantize, z.data());
  // Dense block-diagonal matrix [groups * rank, heads * hd], row r nonzero only on its group's
  // columns; activation quantization blocks (128) align with the groups, so the dense linear
  // does the same fp32 operations.
  const int64_t rows_checked = (groups * rank + row_stride - 1) / row_stride;
  std::vector<float> dense(rows_checked * heads * hd, 0.0f);
  for (int64_t i = 0; i < rows_checked; ++i) {
    const int64_t r = i * row_stride, g = r / rank;
    for (int64_t c = 0; c < group_in; ++c) dense[i * heads * hd + g * group_in + c] = wo_a.at(r, c);
  }
  std::vector<float> expected(tokens * rows_checked);
  linear(o.data(), tokens,
         {WeightFormat::kF32, rows_checked, heads * hd, dense.data(), nullptr, 1.0f}, false,
         expected.data());
  if (quantize) {
    // The F32 path never quantizes, so quantize o the same way first (§10.2).
    std::vector<float> oq = o;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t b = 0; b < heads * hd; b += 128) {
        float amax = 0;
        for (int64_t i = b; i < b + 128; ++i)
          amax = std::max(amax, std::fabs(oq[t * heads * hd + i]));
        const float s = e8m0_to_float(e8m0_ceil_pow2(std::max(amax, 1e-4f) / 448.0f));
        for (int64_t i = b; i < b + 128; ++i) {
          float& v = oq[t * heads * hd + i];
          v = e4m3_to_float(float_to_e4m3(std::clamp(v / s, -448.0f, 448.0f))) * s;
        }
      }
    }
    linear(oq.data(), tokens,
           {WeightFormat::kF32, rows_checked, heads * hd, dense.data(), nullptr, 1.0f}, false,
           expected.data());
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < rows_checked; ++i) {
      ASSERT_EQ(z[t * groups * rank + i * row_stride], expected[t * rows_checked + i])
          << "t=" << t << " row=" << i * row_stride;
    }
  }
}

TEST(GroupedOutputProjection, TinyShapeEqualsBlockDiagonalLinear) {
  // §14: 4 heads x 128, o_groups 2, o_lora_rank 128.
  check_grouped(3, 4, 128, 2, 128, false, 1, 21);
  check_grouped(3, 4, 128, 2, 128, true, 1, 22);
}

TEST(GroupedOutputProjection, FlashShapeEqualsBlockDiagonalLinear) {
  // Flash: 64 heads x 512, 8 groups, rank 1024 (wo_a [8192, 4096]); every 61st row checked.
  check_grouped(1, 64, 512, 8, 1024, false, 61, 23);
}

TEST(OutputProjection, ComposesGroupedAndWoB) {
  Rng rng(31);
  const int64_t tokens = 2, heads = 4, hd = 128, groups = 2, rank = 128, dim = 256;
  Fp8Matrix wo_a = random_fp8(rng, groups * rank, heads * hd / groups);
  Fp8Matrix wo_b = random_fp8(rng, dim, groups * rank);
  std::vector<float> o(tokens * heads * hd);
  for (auto& v : o) v = rng.normal();
  std::vector<float> out(tokens * dim), z(tokens * groups * rank), expected(tokens * dim);
  output_projection(o.data(), tokens, groups, wo_a.view(), wo_b.view(), false, true, out.data());
  grouped_output_projection(o.data(), tokens, groups, wo_a.view(), false, z.data());
  linear(z.data(), tokens, wo_b.view(), true, expected.data());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], expected[i]);
}

}  // namespace
}  // namespace ds::cpu
