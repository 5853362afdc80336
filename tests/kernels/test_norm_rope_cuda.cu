// RMSNorm and RoPE on the GPU against the CPU reference (ds::cpu::rms_norm / rms_norm_heads /
// rope_rotate) on fresh random inputs at tiny and DeepSeek-V4-Flash shapes, outputs poisoned
// (NaN) before each run.
//
// Tolerances:
//  - RMSNorm fp32 output: 1e-5 relative (+1e-30). The sum of squares is a tree here and a running
//    sum on the CPU; the rsqrt differs by a few fp32 ulps at most (4096 terms), nothing else does
//    (the two multiplies are explicitly rounded in the reference's order).
//  - RMSNorm bf16-rounded output (and the bf16 copy): within 1 bf16 ulp, since a few-ulp fp32
//    difference can only move a value across one bf16 rounding boundary.
//  - RoPE: bit-exact except where the device's double sin/cos and libm round to different fp32
//    values (at most 1 fp32 ulp of cos/sin): <= 1e-6 relative + 1e-7 |x| absolute and at most
//    1 in 10^4 values not bit-identical. Same products and sums in the same order, no FMA.
//  - The RMSNorm kernel's RoPE / FP8 epilogue (RmsNormParams::rope_dim, simulate_fp8_kv): bit
//    for bit the separate kernels' output (launch_rms_norm(_heads), launch_rope,
//    launch_simulate_fp8_kv: the same arithmetic in the same order, on the same rounded inputs).
//    Against the CPU chain (rms_norm, bf16 rounding, rope_rotate, rounding, simulate_fp8_kv_nope)
//    the norm's 1-bf16-ulp freedom carries through: plain and rotated dims within 0.04 absolute
//    + 2^-7 relative (a 1-ulp input change moves a rotated value by up to one ulp of the larger
//    input, |x| < 8 here, plus its own rounding), FP8-simulated dims within one e4m3 step (12.5%
//    relative) or 1e-4 absolute (a subnormal step at these scales), and at most 1% of the values
//    not bit-identical.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/norm.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/elementwise/elementwise.h"
#include "kernels/cuda/norm/norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/ops_test_util.h"

namespace ds {
namespace {

using test::Dev;

struct NormCase {
  int64_t rows, dim, x_stride;
  bool weighted, round, bf16_out, in_place;
};

void check_norm(const NormCase& c, uint64_t seed) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " dim " + std::to_string(c.dim) + " stride " +
               std::to_string(c.x_stride) + (c.weighted ? " weighted" : "") +
               (c.round ? " round" : "") + (c.in_place ? " in-place" : ""));
  Rng rng(seed);
  std::vector<float> x = test::random_bf16_valued(rng, size_t(c.rows * c.x_stride), 3.0f);
  std::vector<float> w = test::random_normal(rng, size_t(c.dim), 0.2f, 1.0f);
  // CPU reference row by row (the reference takes dense rows).
  std::vector<float> want(static_cast<size_t>(c.rows * c.dim));
  for (int64_t r = 0; r < c.rows; ++r) {
    cpu::rms_norm(x.data() + r * c.x_stride, c.weighted ? w.data() : nullptr, 1, c.dim,
                  cpu::kRmsNormEps, want.data() + r * c.dim);
  }
  std::vector<float> want_rounded = want;
  for (auto& v : want_rounded) v = bf16_to_float(float_to_bf16(v));

  Dev<float> d_x(x), d_w(w);
  Dev<float> d_y(static_cast<size_t>(c.rows * c.dim));
  Dev<uint16_t> d_yb(static_cast<size_t>(c.rows * c.dim));
  ASSERT_EQ(d_y.buf.poison(), cudaSuccess);
  ASSERT_EQ(d_yb.buf.poison(), cudaSuccess);
  cuda::RmsNormParams p;
  p.x = d_x.get();
  p.weight = c.weighted ? d_w.get() : nullptr;
  p.y = c.in_place ? d_x.get() : d_y.get();
  p.y_bf16 = c.bf16_out ? d_yb.get() : nullptr;
  p.num_rows = c.rows;
  p.dim = c.dim;
  p.x_stride = c.x_stride;
  p.y_stride = c.in_place ? c.x_stride : c.dim;
  p.round_bf16 = c.round;
  cuda::launch_rms_norm(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got;
  if (c.in_place) {
    std::vector<float> all = d_x.host();
    for (int64_t r = 0; r < c.rows; ++r)
      got.insert(got.end(), all.begin() + r * c.x_stride, all.begin() + r * c.x_stride + c.dim);
  } else {
    got = d_y.host();
  }
  test::Diff d =
      c.round ? test::compare_bf16(got, want_rounded, 1) : test::compare(got, want, 1e-30, 1e-5);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
  if (c.bf16_out) {
    std::vector<uint16_t> bits = d_yb.host();
    std::vector<float> gb(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) gb[i] = bf16_to_float(bits[i]);
    test::Diff db = test::compare_bf16(gb, want_rounded, 1);
    EXPECT_EQ(db.beyond, 0) << "bf16 copy: " << test::describe(db);
  }
}

TEST(RmsNormCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  check_norm({1, 256, 256, true, false, false, false}, 1);   // attn_norm, decode
  check_norm({16, 256, 256, true, true, true, false}, 2);    // rounded + bf16 copy
  check_norm({64, 128, 128, true, true, false, true}, 3);    // q_norm, in place
  check_norm({5, 128, 132, false, false, false, false}, 4);  // strided, unweighted
}

TEST(RmsNormCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 16, 64, 4096}) {
    check_norm({n, 4096, 4096, true, true, true, false}, 10 + uint64_t(n));  // attn/ffn/final norm
    check_norm({n, 1024, 1024, true, false, false, false}, 20 + uint64_t(n));  // q_norm
    check_norm({n, 512, 512, true, true, false, true}, 30 + uint64_t(n));      // kv_norm in place
  }
  check_norm({64 * 4, 4096, 4096, true, true, false, false}, 40);  // MTP hnorm over N*hc rows
}

void check_norm_heads(int64_t tokens, int64_t heads, int64_t hd, bool round, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(tokens) + " heads " + std::to_string(heads));
  Rng rng(seed);
  std::vector<float> x = test::random_bf16_valued(rng, size_t(tokens * heads * hd), 2.0f);
  std::vector<float> want = x;
  cpu::rms_norm_heads(want.data(), tokens, heads, hd, cpu::kRmsNormEps);
  if (round)
    for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
  Dev<float> d_x(x);
  cuda::RmsNormHeadsParams p;
  p.x = d_x.get();
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.head_dim = hd;
  p.token_stride = heads * hd;
  p.round_bf16 = round;
  cuda::launch_rms_norm_heads(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got = d_x.host();
  test::Diff d = round ? test::compare_bf16(got, want, 1) : test::compare(got, want, 1e-30, 1e-5);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
}

TEST(RmsNormCuda, PerHeadQueryNorm) {
  DS_REQUIRE_GPU();
  check_norm_heads(16, 4, 128, true, 50);  // tiny
  for (int64_t n : {1, 16, 64, 4096}) check_norm_heads(n, 64, 512, n % 2 == 0, 60 + uint64_t(n));
}

struct RopeCase {
  int64_t tokens, heads, head_dim, rope_dim;
  bool yarn, inverse, round;
  int64_t max_position;
};

void check_rope(const RopeCase& c, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(c.tokens) + " heads " + std::to_string(c.heads) + " hd " +
               std::to_string(c.head_dim) + (c.yarn ? " yarn" : "") +
               (c.inverse ? " inverse" : ""));
  Rng rng(seed);
  const cpu::RopeConfig cfg = cpu::rope_config_for_layer(c.yarn ? 4 : 0, c.rope_dim, 10000.0,
                                                         160000.0, 16.0, 65536, 32.0, 1.0);
  std::vector<float> inv_freq(static_cast<size_t>(c.rope_dim / 2));
  cpu::rope_inv_freq(cfg, inv_freq.data());
  std::vector<float> x = test::random_bf16_valued(rng, size_t(c.tokens * c.heads * c.head_dim));
  std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
  for (auto& p : pos) p = int64_t(rng.below(uint64_t(c.max_position)));
  if (c.tokens > 1) pos[1] = c.max_position - 1;
  std::vector<float> want = x;
  for (int64_t t = 0; t < c.tokens; ++t) {
    cpu::rope_rotate(want.data() + t * c.heads * c.head_dim, c.heads, c.head_dim, c.rope_dim,
                     inv_freq.data(), pos[size_t(t)],
                     c.inverse ? cpu::RopeDirection::kInverse : cpu::RopeDirection::kForward);
  }
  if (c.round)
    for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
  Dev<float> d_x(x), d_f(inv_freq);
  Dev<int64_t> d_pos(pos);
  cuda::RopeParams p;
  p.x = d_x.get();
  p.inv_freq = d_f.get();
  p.positions = d_pos.get();
  p.num_tokens = c.tokens;
  p.num_heads = c.heads;
  p.head_dim = c.head_dim;
  p.rope_dim = c.rope_dim;
  p.token_stride = c.heads * c.head_dim;
  p.inverse = c.inverse;
  p.round_bf16 = c.round;
  cuda::launch_rope(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got = d_x.host();
  test::Diff d = c.round ? test::compare_bf16(got, want, 1) : test::compare(got, want, 1e-7, 1e-6);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
  EXPECT_LE(d.differ, std::max<int64_t>(1, d.count / 10000)) << test::describe(d);

  // launch_rope_bf16 on the same values as bf16 bits (x is bf16-valued), in place: its fp32
  // output must be launch_rope's bit for bit and its bf16 output those values' bits.
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = float_to_bf16(x[i]);
  Dev<uint16_t> d_bits(bits);
  Dev<float> d_y(x.size());
  ASSERT_EQ(d_y.buf.poison(), cudaSuccess);
  p.x = d_y.get();
  ASSERT_TRUE(cuda::rope_bf16_supported(p, d_bits.get(), d_bits.get()));
  cuda::launch_rope_bf16(p, d_bits.get(), d_bits.get(), nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got2 = d_y.host();
  const std::vector<uint16_t> out_bits = d_bits.host();
  int64_t differ = 0, bad_bits = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    differ += std::memcmp(&got2[i], &got[i], 4) != 0;
    bad_bits += out_bits[i] != float_to_bf16(got2[i]);
  }
  EXPECT_EQ(differ, 0) << "launch_rope_bf16 against launch_rope";
  EXPECT_EQ(bad_bits, 0) << "launch_rope_bf16's bf16 output against its fp32 output";
}

TEST(RopeCuda, TinyShapes) {
  DS_REQUIRE_GPU();
  check_rope({16, 4, 128, 64, false, false, false, 4096}, 70);  // SWA layer query
  check_rope({64, 1, 128, 64, true, false, true, 4096}, 71);    // CSA kv, rounded
  check_rope({16, 4, 128, 64, true, true, false, 4096}, 72);    // output de-rotation
}

TEST(RopeCuda, FlashShapes) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 16, 64, 4096}) {
    check_rope({n, 64, 512, 64, n % 2 == 1, false, false, 1 << 20}, 80 + uint64_t(n));  // q
    check_rope({n, 1, 512, 64, true, false, false, 1 << 20}, 90 + uint64_t(n));         // kv
    check_rope({n, 64, 512, 64, true, true, false, 1 << 20}, 100 + uint64_t(n));        // o
  }
  check_rope({64, 64, 128, 64, true, false, true, 1 << 20}, 110);  // indexer query heads
}

TEST(RopeCuda, InverseUndoesForward) {
  DS_REQUIRE_GPU();
  // Forward then inverse at the same positions returns the input up to rounding (|err| <= 1e-6
  // for |x| ~ 1): a check of the sign convention that does not go through the CPU reference.
  Rng rng(120);
  const int64_t n = 8, h = 4, hd = 128, rd = 64;
  std::vector<float> x = test::random_normal(rng, size_t(n * h * hd));
  std::vector<float> inv_freq(static_cast<size_t>(rd / 2));
  cpu::rope_inv_freq(cpu::RopeConfig{}, inv_freq.data());
  std::vector<int64_t> pos = {0, 1, 7, 100, 4095, 65536, 1000000, 3};
  Dev<float> d_x(x), d_f(inv_freq);
  Dev<int64_t> d_pos(pos);
  cuda::RopeParams p{d_x.get(), d_f.get(), d_pos.get(), n, h, hd, rd, h * hd, false, false};
  cuda::launch_rope(p, nullptr);
  p.inverse = true;
  cuda::launch_rope(p, nullptr);
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got = d_x.host();
  test::Diff d = test::compare(got, x, 2e-6, 0);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
  EXPECT_GT(d.differ, 0);  // the rope part was really rotated and rounded (not a no-op)
}

struct EpilogueCase {
  int64_t tokens, heads, head_dim, rope_dim;
  bool weighted, fp8;  // weighted: one kv vector per token (heads 1); else the heads of q
};

// The epilogue against the three separate kernels (bits) and against the CPU chain.
void check_norm_epilogue(const EpilogueCase& c, uint64_t seed) {
  SCOPED_TRACE("tokens " + std::to_string(c.tokens) + " heads " + std::to_string(c.heads) + " hd " +
               std::to_string(c.head_dim) + (c.weighted ? " weighted" : "") +
               (c.fp8 ? " fp8" : ""));
  ASSERT_TRUE(cuda::rms_norm_epilogue_supported(c.head_dim, c.rope_dim));
  Rng rng(seed);
  const int64_t n = c.tokens * c.heads * c.head_dim, rows = c.tokens * c.heads;
  const cpu::RopeConfig cfg =
      cpu::rope_config_for_layer(4, c.rope_dim, 10000.0, 160000.0, 16.0, 65536, 32.0, 1.0);
  std::vector<float> inv_freq(static_cast<size_t>(c.rope_dim / 2));
  cpu::rope_inv_freq(cfg, inv_freq.data());
  std::vector<float> x = test::random_bf16_valued(rng, size_t(n), 3.0f);
  std::vector<float> w = test::random_normal(rng, size_t(c.head_dim), 0.2f, 1.0f);
  std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
  for (auto& p : pos) p = int64_t(rng.below(uint64_t(1) << 20));
  pos[0] = 0;
  Dev<float> d_fused(x), d_sep(x), d_w(w), d_f(inv_freq);
  Dev<int64_t> d_pos(pos);

  // Separate kernels.
  if (c.weighted) {
    cuda::RmsNormParams p;
    p.x = d_sep.get();
    p.weight = d_w.get();
    p.y = d_sep.get();
    p.num_rows = rows;
    p.dim = c.head_dim;
    p.x_stride = p.y_stride = c.head_dim;
    p.eps = cpu::kRmsNormEps;
    p.round_bf16 = true;
    cuda::launch_rms_norm(p, nullptr);
  } else {
    cuda::RmsNormHeadsParams p;
    p.x = d_sep.get();
    p.num_tokens = c.tokens;
    p.num_heads = c.heads;
    p.head_dim = c.head_dim;
    p.token_stride = c.heads * c.head_dim;
    p.eps = cpu::kRmsNormEps;
    p.round_bf16 = true;
    cuda::launch_rms_norm_heads(p, nullptr);
  }
  cuda::RopeParams rp{d_sep.get(), d_f.get(),  d_pos.get(),          c.tokens, c.heads,
                      c.head_dim,  c.rope_dim, c.heads * c.head_dim, false,    true};
  cuda::launch_rope(rp, nullptr);
  if (c.fp8) {
    cuda::SimulateFp8KvParams sp{d_sep.get(), rows, c.head_dim, c.rope_dim, c.head_dim};
    cuda::launch_simulate_fp8_kv(sp, nullptr);
  }
  // One launch.
  if (c.weighted) {
    cuda::RmsNormParams p;
    p.x = d_fused.get();
    p.weight = d_w.get();
    p.y = d_fused.get();
    p.num_rows = rows;
    p.dim = c.head_dim;
    p.x_stride = p.y_stride = c.head_dim;
    p.eps = cpu::kRmsNormEps;
    p.round_bf16 = true;
    p.rope_dim = c.rope_dim;
    p.inv_freq = d_f.get();
    p.positions = d_pos.get();
    p.simulate_fp8_kv = c.fp8;
    cuda::launch_rms_norm(p, nullptr);
  } else {
    cuda::RmsNormHeadsParams p;
    p.x = d_fused.get();
    p.num_tokens = c.tokens;
    p.num_heads = c.heads;
    p.head_dim = c.head_dim;
    p.token_stride = c.heads * c.head_dim;
    p.eps = cpu::kRmsNormEps;
    p.round_bf16 = true;
    p.rope_dim = c.rope_dim;
    p.inv_freq = d_f.get();
    p.positions = d_pos.get();
    p.simulate_fp8_kv = c.fp8;
    cuda::launch_rms_norm_heads(p, nullptr);
  }
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = d_fused.host(), sep = d_sep.host();
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&got[size_t(i)], &sep[size_t(i)], 4) != 0;
  EXPECT_EQ(differ, 0) << "of " << n << " values differ from the separate kernels";

  // CPU chain.
  std::vector<float> want = x;
  if (c.weighted)
    cpu::rms_norm(want.data(), w.data(), rows, c.head_dim, cpu::kRmsNormEps, want.data());
  else
    cpu::rms_norm_heads(want.data(), c.tokens, c.heads, c.head_dim, cpu::kRmsNormEps);
  for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
  for (int64_t t = 0; t < c.tokens; ++t)
    cpu::rope_rotate(want.data() + t * c.heads * c.head_dim, c.heads, c.head_dim, c.rope_dim,
                     inv_freq.data(), pos[size_t(t)], cpu::RopeDirection::kForward);
  for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
  if (c.fp8) cpu::simulate_fp8_kv_nope(want.data(), rows, c.head_dim, c.rope_dim);
  std::vector<float> g8, w8, gb, wb;
  for (int64_t i = 0; i < n; ++i) {
    const bool simulated = c.fp8 && i % c.head_dim < c.head_dim - c.rope_dim;
    (simulated ? g8 : gb).push_back(got[size_t(i)]);
    (simulated ? w8 : wb).push_back(want[size_t(i)]);
  }
  const test::Diff db = test::compare(gb, wb, 0.04, 1.0 / 128);
  EXPECT_EQ(db.beyond, 0) << test::describe(db);
  int64_t all_differ = db.differ;
  if (c.fp8) {
    const test::Diff d8 = test::compare(g8, w8, 1e-4, 0.125);
    EXPECT_EQ(d8.beyond, 0) << "fp8-simulated dims: " << test::describe(d8);
    all_differ += d8.differ;
  }
  EXPECT_LE(all_differ, std::max<int64_t>(1, n / 100)) << "of " << n;
}

TEST(RmsNormCuda, RopeAndFp8Epilogue) {
  DS_REQUIRE_GPU();
  check_norm_epilogue({16, 4, 128, 64, false, false}, 130);  // tiny q
  check_norm_epilogue({16, 1, 128, 64, true, true}, 131);    // tiny kv
  check_norm_epilogue({5, 1, 128, 64, true, false}, 132);    // kv without the FP8 simulation
  for (int64_t n : {1, 16, 64, 512}) {
    check_norm_epilogue({n, 64, 512, 64, false, false}, 140 + uint64_t(n));  // Flash q
    check_norm_epilogue({n, 1, 512, 64, true, true}, 150 + uint64_t(n));     // Flash kv
  }
  // A nope part of 464 dims: it ends inside the block [448, 512) (blocks of 64 from dim 0).
  check_norm_epilogue({7, 1, 512, 48, true, true}, 160);
  // Many rows (one warp per row instead of dim / 4 threads).
  check_norm_epilogue({1024, 1, 512, 64, true, true}, 161);
  check_norm_epilogue({20, 64, 512, 64, false, false}, 162);  // 1280 rows
  EXPECT_FALSE(cuda::rms_norm_epilogue_supported(4096, 64));  // wider than 1024
  EXPECT_FALSE(cuda::rms_norm_epilogue_supported(512, 63));   // odd rope_dim
  EXPECT_FALSE(cuda::rms_norm_epilogue_supported(384, 64));   // not a power of two
}

}  // namespace
}  // namespace ds
