// mHC on the GPU against the CPU reference (ds::cpu::mhc_pre / mhc_post / mhc_head) on fresh
// random inputs at tiny (dim 256) and DeepSeek-V4-Flash (dim 4096) shapes, 1..4096 tokens,
// outputs poisoned (NaN) before each run. mhc_pre / mhc_head have two paths (split-K kernels and,
// at decode sizes, one cluster launch); both are checked against the CPU at both kinds of sizes,
// and a second launch must give the same bits (each path is deterministic).
//
// Tolerances:
//  - post / comb / pre-derived values: 2e-5 absolute. The mixes are fp32 dots over hc*dim = 16384
//    terms summed in a different order (split-K partials here, 8 lanes on the CPU): relative error
//    ~ sqrt(16384) * 2^-24 of sum |fn x| (a few units) ~ 1e-5 at worst; sigmoid, softmax and the
//    Sinkhorn normalizations are contractive.
//  - u / y (fp32): 1e-5 relative to sum_i |x_i| (the pre error carried through) plus 1e-6.
//  - u / y rounded to bf16: the same bound plus one bf16 ulp of the value (|bf16(a) - bf16(b)| <=
//    |a - b| + 1 ulp). Not "1 ulp" alone: u = sum_i pre_i x_i often cancels to |u| << sum |x_i|,
//    where the absolute pre error is many ulps of u.
//  - u with the block input's RMSNorm fused in (y = u * r * w, r = rsqrt(mean(u^2) + eps)): the
//    u bound above (with one bf16 ulp of u when rounded: u may round the other way) times r |w|,
//    plus 1e-5 |y| for r (a sum of squares in another order), plus one bf16 ulp of y when
//    rounded.
//  - mhc_post with the CPU's own post / comb: bit-exact (same products and sums in the same
//    order, no FMA contraction), rounded or not.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/mhc.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/mhc/mhc.h"
#include "kernels/ops_test_util.h"

namespace ds {
namespace {

using test::Dev;
constexpr int64_t kHc = 4;

struct SiteInputs {
  std::vector<float> x, fn, base, scale;  // [N, hc, dim], [M, hc*dim], [M], [3]
};

SiteInputs random_site(Rng& rng, int64_t tokens, int64_t dim, int64_t mixes) {
  SiteInputs s;
  s.x = test::random_bf16_valued(rng, size_t(tokens * kHc * dim), 1.5f);
  s.fn = test::random_normal(rng, size_t(mixes * kHc * dim), 0.03f);
  s.base = test::random_normal(rng, size_t(mixes), 0.5f);
  s.scale = {rng.uniform(0.3f, 1.5f), rng.uniform(0.3f, 1.5f), rng.uniform(0.3f, 1.5f)};
  return s;
}

// Per-element bound for a collapse sum_i pre_i x_i: 1e-5 * sum_i |x_i| + 1e-6, plus one bf16 ulp
// of the larger magnitude when both sides were rounded to bf16.
// bf16 ulp of v (8 significant bits).
double bf16_ulp(double v) {
  int exp2 = 0;
  std::frexp(std::fabs(v), &exp2);
  return std::ldexp(1.0, exp2 - 8);
}

// With the norm, `gain` is r of the token times |w| of the column and `u_pre` the CPU's u before
// it ([tokens * dim] each): the collapse bound, plus one ulp of the rounded u_pre when rounded (u
// may round the other way), is scaled by the gain, and 1e-5 |want| is added for r.
test::Diff compare_collapse(const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<float>& x, int64_t tokens, int64_t dim, bool rounded,
                            const std::vector<double>* gain = nullptr,
                            const std::vector<float>* u_pre = nullptr) {
  test::Diff d;
  d.count = int64_t(want.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < dim; ++k) {
      const size_t i = size_t(t * dim + k);
      double mag = 0;
      for (int64_t j = 0; j < kHc; ++j) mag += std::fabs(x[size_t((t * kHc + j) * dim + k)]);
      const double e = std::fabs(double(got[i]) - want[i]);
      const double ulp =
          rounded ? bf16_ulp(std::max(std::fabs(got[i]), std::fabs(want[i]))) : 0.0;
      if (got[i] != want[i]) ++d.differ;
      double bound = 1e-5 * mag + 1e-6;
      if (gain != nullptr) {
        if (rounded) bound += bf16_ulp((*u_pre)[i]);
        bound = bound * (*gain)[i] + 1e-5 * std::fabs(want[i]);
      }
      if (!(e <= bound + ulp)) {
        ++d.beyond;
        if (d.first_bad < 0) {
          d.first_bad = int64_t(i);
          d.got_bad = got[i];
          d.want_bad = want[i];
        }
      }
      d.max_abs = std::max(d.max_abs, e);
    }
  }
  return d;
}

void check_pre(int64_t tokens, int64_t dim, bool round, uint64_t seed, int path = 0,
               bool with_norm = false) {
  SCOPED_TRACE("mhc_pre tokens " + std::to_string(tokens) + " dim " + std::to_string(dim) +
               " path " + std::to_string(path) + (with_norm ? " + rms_norm" : ""));
  Rng rng(seed);
  const int64_t mixes = (2 + kHc) * kHc;
  SiteInputs s = random_site(rng, tokens, dim, mixes);
  cpu::MhcConfig cfg;
  cfg.dim = dim;
  std::vector<float> u(static_cast<size_t>(tokens * dim)), post(static_cast<size_t>(tokens * kHc)),
      comb(static_cast<size_t>(tokens * kHc * kHc));
  cpu::mhc_pre(cfg, cpu::MhcSiteWeights{s.fn.data(), s.base.data(), s.scale.data()}, s.x.data(),
               tokens, u.data(), post.data(), comb.data());
  if (round)
    for (auto& v : u) v = bf16_to_float(float_to_bf16(v));
  // The fused norm: the CPU's rms_norm of the (rounded) u, rounded again.
  const std::vector<float> norm_w = test::random_normal(rng, size_t(dim), 0.3f);
  std::vector<double> gain;
  const std::vector<float> u_pre = u;
  if (with_norm) {
    const float eps = 1e-6f;
    for (int64_t t = 0; t < tokens; ++t) {
      double ssq = 0;
      for (int64_t k = 0; k < dim; ++k) {
        const double v = u[size_t(t * dim + k)];
        ssq += v * v;
      }
      const double r = 1.0 / std::sqrt(ssq / double(dim) + eps);
      for (int64_t k = 0; k < dim; ++k) gain.push_back(r * std::fabs(norm_w[size_t(k)]));
    }
    cpu::rms_norm(u.data(), norm_w.data(), tokens, dim, eps, u.data());
    if (round)
      for (auto& v : u) v = bf16_to_float(float_to_bf16(v));
  }

  Dev<float> d_x(s.x), d_fn(s.fn), d_base(s.base), d_scale(s.scale), d_norm(norm_w);
  Dev<float> d_u(u.size()), d_post(post.size()), d_comb(comb.size());
  Dev<float> d_ws(static_cast<size_t>(cuda::mhc_workspace_floats(tokens, dim)));
  for (auto* b : {&d_u.buf, &d_post.buf, &d_comb.buf, &d_ws.buf})
    ASSERT_EQ(b->poison(), cudaSuccess);
  cuda::MhcPreParams p;
  p.x = d_x.get();
  p.fn = d_fn.get();
  p.base = d_base.get();
  p.scale = d_scale.get();
  p.u = d_u.get();
  p.post = d_post.get();
  p.comb = d_comb.get();
  p.workspace = d_ws.get();
  p.num_tokens = tokens;
  p.dim = dim;
  p.round_bf16 = round;
  p.path = path;
  if (with_norm) p.rms_weight = d_norm.get();
  cuda::launch_mhc_pre(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got_u = d_u.host(), got_post = d_post.host(), got_comb = d_comb.host();
  test::Diff dp = test::compare(got_post, post, 2e-5, 0);
  EXPECT_EQ(dp.beyond, 0) << "post: " << test::describe(dp);
  test::Diff dc = test::compare(got_comb, comb, 2e-5, 0);
  EXPECT_EQ(dc.beyond, 0) << "comb: " << test::describe(dc);
  test::Diff du = compare_collapse(got_u, u, s.x, tokens, dim, round,
                                   with_norm ? &gain : nullptr, &u_pre);
  EXPECT_EQ(du.beyond, 0) << "u: " << test::describe(du);
  // Again into poisoned outputs: the same bits.
  for (auto* b : {&d_u.buf, &d_post.buf, &d_comb.buf, &d_ws.buf})
    ASSERT_EQ(b->poison(), cudaSuccess);
  cuda::launch_mhc_pre(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(test::compare(d_u.host(), got_u, 0, 0).differ, 0) << "u differs between launches";
  EXPECT_EQ(test::compare(d_post.host(), got_post, 0, 0).differ, 0) << "post differs";
  EXPECT_EQ(test::compare(d_comb.host(), got_comb, 0, 0).differ, 0) << "comb differs";
}

TEST(MhcCuda, PreTiny) {
  DS_REQUIRE_GPU();
  check_pre(1, 256, false, 1);
  check_pre(16, 256, true, 2);
  check_pre(67, 256, false, 3);  // not a multiple of the 4-token warp group
}

TEST(MhcCuda, PreFlash) {
  DS_REQUIRE_GPU();
  for (int64_t n : {1, 16, 64, 4096}) check_pre(n, 4096, n >= 64, 10 + uint64_t(n));
  check_pre(300, 4096, false, 9);
}

// Each path at the other's sizes: the split-K kernels at decode sizes, the cluster launch at
// token counts that are not a multiple of its 4-token groups and at prefill-like counts.
TEST(MhcCuda, PreBothPaths) {
  DS_REQUIRE_GPU();
  for (int64_t dim : {256, 4096}) {
    ASSERT_TRUE(cuda::mhc_fused_supported(dim)) << "dim " << dim;
    for (int64_t n : {1, 2, 5, 16, 64}) check_pre(n, dim, n % 2 == 1, 60 + uint64_t(n), 1);
    for (int64_t n : {1, 3, 6, 63, 67, 300}) check_pre(n, dim, n % 2 == 0, 70 + uint64_t(n), 2);
  }
  // hc * dim = 512 is not a multiple of the 8 ranks x 128 floats: path 2 runs the split-K kernels.
  EXPECT_FALSE(cuda::mhc_fused_supported(128));
  check_pre(3, 128, false, 80, 2);
}

// The block input's RMSNorm fused in, on every path (the split-K path runs launch_rms_norm after
// its kernels; the cluster launch normalizes in place with one more exchange between its ranks).
TEST(MhcCuda, PreWithNorm) {
  DS_REQUIRE_GPU();
  for (int path : {0, 1, 2}) {
    for (int64_t n : {1, 5, 16, 64}) check_pre(n, 4096, n != 5, 100 + uint64_t(n), path, true);
    check_pre(3, 256, true, 110, path, true);
    check_pre(2, 256, false, 111, path, true);
  }
  check_pre(67, 4096, true, 112, 2, true);
  check_pre(300, 4096, true, 113, 0, true);
}

void check_post(int64_t tokens, int64_t dim, bool round, uint64_t seed) {
  SCOPED_TRACE("mhc_post tokens " + std::to_string(tokens) + " dim " + std::to_string(dim));
  Rng rng(seed);
  std::vector<float> o = test::random_bf16_valued(rng, size_t(tokens * dim), 2.0f);
  std::vector<float> x = test::random_bf16_valued(rng, size_t(tokens * kHc * dim), 1.5f);
  std::vector<float> post(static_cast<size_t>(tokens * kHc)),
      comb(static_cast<size_t>(tokens * kHc * kHc));
  for (auto& v : post) v = rng.uniform(0.0f, 2.0f);
  for (int64_t t = 0; t < tokens; ++t) {  // a doubly stochastic comb, as Sinkhorn makes
    std::vector<float> logits = test::random_normal(rng, size_t(kHc * kHc));
    cpu::mhc_sinkhorn(logits.data(), kHc, 20, 1e-6f);
    std::copy(logits.begin(), logits.end(), comb.begin() + t * kHc * kHc);
  }
  cpu::MhcConfig cfg;
  cfg.dim = dim;
  std::vector<float> want(static_cast<size_t>(tokens * kHc * dim));
  cpu::mhc_post(cfg, o.data(), x.data(), post.data(), comb.data(), tokens, want.data());
  if (round)
    for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
  Dev<float> d_o(o), d_x(x), d_post(post), d_comb(comb), d_y(want.size());
  ASSERT_EQ(d_y.buf.poison(), cudaSuccess);
  cuda::MhcPostParams p{d_o.get(), d_x.get(), d_post.get(), d_comb.get(),
                        d_y.get(), tokens,    dim,          round};
  cuda::launch_mhc_post(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  test::Diff d = test::compare(d_y.host(), want, 0, 0);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
}

TEST(MhcCuda, PostBitExact) {
  DS_REQUIRE_GPU();
  check_post(3, 256, false, 20);
  check_post(16, 256, true, 21);
  for (int64_t n : {1, 16, 64, 4096}) check_post(n, 4096, n % 2 == 0, 30 + uint64_t(n));
}

void check_head(int64_t tokens, int64_t dim, bool round, uint64_t seed, int path = 0) {
  SCOPED_TRACE("mhc_head tokens " + std::to_string(tokens) + " dim " + std::to_string(dim) +
               " path " + std::to_string(path));
  Rng rng(seed);
  SiteInputs s = random_site(rng, tokens, dim, kHc);
  s.scale.resize(1);
  cpu::MhcConfig cfg;
  cfg.dim = dim;
  std::vector<float> want(static_cast<size_t>(tokens * dim));
  cpu::mhc_head(cfg, cpu::MhcHeadWeights{s.fn.data(), s.base.data(), s.scale.data()}, s.x.data(),
                tokens, want.data());
  if (round)
    for (auto& v : want) v = bf16_to_float(float_to_bf16(v));
  Dev<float> d_x(s.x), d_fn(s.fn), d_base(s.base), d_scale(s.scale), d_y(want.size());
  Dev<float> d_ws(static_cast<size_t>(cuda::mhc_workspace_floats(tokens, dim)));
  ASSERT_EQ(d_y.buf.poison(), cudaSuccess);
  ASSERT_EQ(d_ws.buf.poison(), cudaSuccess);
  cuda::MhcHeadParams p;
  p.x = d_x.get();
  p.fn = d_fn.get();
  p.base = d_base.get();
  p.scale = d_scale.get();
  p.y = d_y.get();
  p.workspace = d_ws.get();
  p.num_tokens = tokens;
  p.dim = dim;
  p.round_bf16 = round;
  p.path = path;
  cuda::launch_mhc_head(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = d_y.host();
  test::Diff d = compare_collapse(got, want, s.x, tokens, dim, round);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
  ASSERT_EQ(d_y.buf.poison(), cudaSuccess);
  cuda::launch_mhc_head(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(test::compare(d_y.host(), got, 0, 0).differ, 0) << "y differs between launches";
}

TEST(MhcCuda, Head) {
  DS_REQUIRE_GPU();
  check_head(2, 256, false, 40);
  check_head(5, 256, true, 41);
  for (int64_t n : {1, 16, 64}) check_head(n, 4096, n == 16, 50 + uint64_t(n));
  for (int64_t n : {1, 7, 64}) check_head(n, 4096, n == 7, 90 + uint64_t(n), 1);
  for (int64_t n : {3, 130}) check_head(n, 4096, n == 3, 95 + uint64_t(n), 2);
  check_head(5, 256, false, 99, 2);
}

}  // namespace
}  // namespace ds
