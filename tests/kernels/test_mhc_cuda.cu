// mHC on the GPU against the CPU reference (ds::cpu::mhc_pre / mhc_post / mhc_head) on fresh
// random inputs at tiny (dim 256) and DeepSeek-V4-Flash (dim 4096) shapes, 1..4096 tokens,
// outputs poisoned (NaN) before each run.
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
//  - mhc_post with the CPU's own post / comb: bit-exact (same products and sums in the same
//    order, no FMA contraction), rounded or not.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/mhc.h"
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
test::Diff compare_collapse(const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<float>& x, int64_t tokens, int64_t dim,
                            bool rounded) {
  test::Diff d;
  d.count = int64_t(want.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < dim; ++k) {
      const size_t i = size_t(t * dim + k);
      double mag = 0;
      for (int64_t j = 0; j < kHc; ++j) mag += std::fabs(x[size_t((t * kHc + j) * dim + k)]);
      const double e = std::fabs(double(got[i]) - want[i]);
      double ulp = 0;
      if (rounded) {
        int exp2 = 0;
        std::frexp(std::max(std::fabs(got[i]), std::fabs(want[i])), &exp2);
        ulp = std::ldexp(1.0, exp2 - 8);  // bf16: 8 significant bits
      }
      if (got[i] != want[i]) ++d.differ;
      if (!(e <= 1e-5 * mag + 1e-6 + ulp)) {
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

void check_pre(int64_t tokens, int64_t dim, bool round, uint64_t seed) {
  SCOPED_TRACE("mhc_pre tokens " + std::to_string(tokens) + " dim " + std::to_string(dim));
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

  Dev<float> d_x(s.x), d_fn(s.fn), d_base(s.base), d_scale(s.scale);
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
  cuda::launch_mhc_pre(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  test::Diff dp = test::compare(d_post.host(), post, 2e-5, 0);
  EXPECT_EQ(dp.beyond, 0) << "post: " << test::describe(dp);
  test::Diff dc = test::compare(d_comb.host(), comb, 2e-5, 0);
  EXPECT_EQ(dc.beyond, 0) << "comb: " << test::describe(dc);
  test::Diff du = compare_collapse(d_u.host(), u, s.x, tokens, dim, round);
  EXPECT_EQ(du.beyond, 0) << "u: " << test::describe(du);
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

void check_head(int64_t tokens, int64_t dim, bool round, uint64_t seed) {
  SCOPED_TRACE("mhc_head tokens " + std::to_string(tokens) + " dim " + std::to_string(dim));
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
  cuda::launch_mhc_head(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  test::Diff d = compare_collapse(d_y.host(), want, s.x, tokens, dim, round);
  EXPECT_EQ(d.beyond, 0) << test::describe(d);
}

TEST(MhcCuda, Head) {
  DS_REQUIRE_GPU();
  check_head(2, 256, false, 40);
  check_head(5, 256, true, 41);
  for (int64_t n : {1, 16, 64}) check_head(n, 4096, n == 16, 50 + uint64_t(n));
}

}  // namespace
}  // namespace ds
