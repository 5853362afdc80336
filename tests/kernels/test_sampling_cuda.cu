// Greedy sampling and logprobs on the GPU against a host computation in double: argmax with the
// lowest-index tie rule and the top-k ids (bit-exact: they depend only on comparisons of the
// input values), logprobs = x - logsumexp(row) within 2e-5 absolute (the fp32 sum of up to 129280
// exps in a different order: relative error ~1e-6 in the sum, i.e. ~1e-6 in the log, plus the
// fp32 rounding of x - lse for |x - lse| up to ~30). Logits are bf16-valued so that exact ties are
// common, and rows with planted ties at the maximum check the tie rule. Outputs are poisoned.
// Random sampling (launch_sample_rows) against cpu::sample_rows, token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling/sampling.h"
#include "kernels/ops_test_util.h"

namespace ds {
namespace {

using test::Dev;

void check_sampling(int64_t rows, int64_t vocab, int top_k, bool with_tokens, uint64_t seed) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " vocab " + std::to_string(vocab) + " top_k " +
               std::to_string(top_k));
  Rng rng(seed);
  const int64_t stride = vocab + (vocab % 7 == 0 ? 0 : 3);  // odd stride: no alignment assumed
  std::vector<float> logits = test::random_bf16_valued(rng, size_t(rows * stride), 3.0f);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits.data() + r * stride;
    if (r % 3 == 1) {  // plant a tie at the maximum: two (or three) equal best values
      const float mx = *std::max_element(x, x + vocab) + 1.0f;
      const int64_t a = int64_t(rng.below(uint64_t(vocab))),
                    b = int64_t(rng.below(uint64_t(vocab)));
      x[a] = mx;
      x[b] = mx;
      x[vocab - 1] = mx;
    }
    tokens[size_t(r)] = int32_t(rng.below(uint64_t(vocab)));
  }
  // Host reference.
  std::vector<int32_t> want_arg(static_cast<size_t>(rows)),
      want_ids(static_cast<size_t>(rows * top_k));
  std::vector<double> want_lp(static_cast<size_t>(rows * top_k)),
      want_tok(static_cast<size_t>(rows));
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * stride;
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = std::max(top_k, 1);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    double mx = x[order[0]], sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(x[i]) - mx);
    const double lse = mx + std::log(sum);
    want_arg[size_t(r)] = order[0];
    for (int j = 0; j < top_k; ++j) {
      want_ids[size_t(r * top_k + j)] = order[size_t(j)];
      want_lp[size_t(r * top_k + j)] = x[order[size_t(j)]] - lse;
    }
    want_tok[size_t(r)] = x[with_tokens ? tokens[size_t(r)] : order[0]] - lse;
  }
  Dev<float> d_logits(logits);
  Dev<int32_t> d_tokens(tokens), d_arg(static_cast<size_t>(rows)),
      d_ids(static_cast<size_t>(std::max<int64_t>(rows * top_k, 1)));
  Dev<float> d_lp(static_cast<size_t>(std::max<int64_t>(rows * top_k, 1))),
      d_tok(static_cast<size_t>(rows));
  Dev<float> d_ws(static_cast<size_t>(cuda::sampling_workspace_floats(rows, vocab)));
  Dev<uint8_t> d_finite(static_cast<size_t>(rows));
  for (auto* b : {&d_lp.buf, &d_tok.buf, &d_ws.buf}) ASSERT_EQ(b->poison(), cudaSuccess);
  for (auto* b : {&d_arg.buf, &d_ids.buf}) ASSERT_EQ(b->poison(), cudaSuccess);
  ASSERT_EQ(d_finite.buf.poison(), cudaSuccess);
  cuda::SampleParams p;
  p.logits = d_logits.get();
  p.rows = rows;
  p.vocab = vocab;
  p.stride = stride;
  p.argmax = d_arg.get();
  p.top_k = top_k;
  p.top_logprobs = d_lp.get();
  p.top_ids = d_ids.get();
  p.token_ids = with_tokens ? d_tokens.get() : nullptr;
  p.token_logprobs = d_tok.get();
  p.finite = d_finite.get();
  p.workspace = d_ws.get();
  cuda::launch_sample_greedy(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(d_arg.host(), want_arg);
  EXPECT_EQ(d_finite.host(), std::vector<uint8_t>(size_t(rows), 1));
  std::vector<float> tok = d_tok.host();
  int64_t bad_tok = 0;
  for (int64_t r = 0; r < rows; ++r)
    bad_tok += !(std::fabs(tok[size_t(r)] - want_tok[size_t(r)]) <= 2e-5);
  EXPECT_EQ(bad_tok, 0);
  if (top_k > 0) {
    std::vector<int32_t> ids = d_ids.host();
    ids.resize(want_ids.size());
    EXPECT_EQ(ids, want_ids);
    std::vector<float> lp = d_lp.host();
    int64_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < want_lp.size(); ++i) {
      const double e = std::fabs(lp[i] - want_lp[i]);
      worst = std::max(worst, e);
      bad += !(e <= 2e-5);
    }
    EXPECT_EQ(bad, 0) << "max |err| " << worst;
  }
}

// The finite flag and the argmax next to non-finite values: row r % 4 = 0 finite, 1 a NaN, 2 a
// +inf, 3 a -inf at a random position (the argmax of a row with a NaN is that of its other
// values; NaN never wins). The argmax alone (top_k 0, no logprobs) is what the engine asks for.
void check_finite_flags(int64_t rows, int64_t vocab, uint64_t seed) {
  SCOPED_TRACE("finite flags: rows " + std::to_string(rows) + " vocab " + std::to_string(vocab));
  Rng rng(seed);
  std::vector<float> logits = test::random_bf16_valued(rng, size_t(rows * vocab), 3.0f);
  std::vector<uint8_t> want_finite(static_cast<size_t>(rows));
  std::vector<int32_t> want_arg(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits.data() + r * vocab;
    const int64_t at = int64_t(rng.below(uint64_t(vocab)));
    const int kind = int(r % 4);
    if (kind == 1) x[at] = std::nanf("");
    if (kind == 2) x[at] = INFINITY;
    if (kind == 3) x[at] = -INFINITY;
    want_finite[size_t(r)] = kind == 0 ? 1 : 0;
    int64_t best = at == 0 ? 1 : 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isnan(x[i]) && x[i] > x[best]) best = i;
    }
    want_arg[size_t(r)] = int32_t(best);
  }
  Dev<float> d_logits(logits);
  Dev<int32_t> d_arg(static_cast<size_t>(rows));
  Dev<uint8_t> d_finite(static_cast<size_t>(rows));
  Dev<float> d_ws(static_cast<size_t>(cuda::sampling_workspace_floats(rows, vocab)));
  ASSERT_EQ(d_arg.buf.poison(), cudaSuccess);
  ASSERT_EQ(d_finite.buf.poison(), cudaSuccess);
  ASSERT_EQ(d_ws.buf.poison(), cudaSuccess);
  cuda::SampleParams p;
  p.logits = d_logits.get();
  p.rows = rows;
  p.vocab = vocab;
  p.stride = vocab;
  p.argmax = d_arg.get();
  p.finite = d_finite.get();
  p.workspace = d_ws.get();
  cuda::launch_sample_greedy(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(d_finite.host(), want_finite);
  const std::vector<int32_t> arg = d_arg.host();
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(arg[size_t(r)], want_arg[size_t(r)]) << "row " << r;
}

// launch_sample_rows against cpu::sample_rows: the same token and finite flag bit for bit (the
// kernel follows the reference's fixed-point arithmetic). Rows cycle through greedy, plain,
// top-k, top-p, min-p and combined draws at several temperatures and draws; logits of four kinds:
// 0 normal (sigma 3: every token has mass, the radix search runs over the whole row), 1 bf16
// values (ties), 2 peaked (a few tokens far above the rest: most masses are 0), 3 integers in
// [-3, 3] (tens of thousands of ties at each value: the tie walk in id order). Row 5 holds a NaN.
void check_sample_rows(int64_t rows, int64_t vocab, int kind, uint64_t seed, bool graph = false) {
  SCOPED_TRACE("sample_rows: rows " + std::to_string(rows) + " vocab " + std::to_string(vocab) +
               " kind " + std::to_string(kind));
  Rng rng(seed);
  const int64_t stride = vocab + (vocab % 2 == 0 ? 5 : 0);
  std::vector<float> logits(static_cast<size_t>(rows * stride));
  for (float& v : logits) {
    const float g = rng.normal();
    v = kind == 0   ? 3.0f * g
        : kind == 1 ? bf16_to_float(float_to_bf16(3.0f * g))
        : kind == 2 ? (rng.below(997) == 0 ? 25.0f + g : g)
                    : float(std::clamp(int(std::lround(1.5f * g)), -3, 3));
  }
  if (rows > 5) logits[size_t(5 * stride + vocab / 2)] = std::nanf("");
  const std::vector<cpu::RowSampling> kinds = {
      {0.0, 0, 1.0, 0.0, 0.5},    {1.0, 0, 1.0, 0.0, 0.37},  {0.7, 0, 0.9, 0.0, 0.81},
      {1.2, 40, 1.0, 0.0, 0.05},  {1.0, 0, 1.0, 0.05, 0.66}, {0.8, 50, 0.8, 0.02, 0.999},
      {1.5, 0, 0.5, 0.0, 0.0},    {0.6, 1, 1.0, 0.0, 0.9},   {2.0, 5000, 0.95, 0.0, 0.42},
      {1.0, 0, 0.999, 0.1, 0.17}, {0.9, 3, 0.2, 0.0, 0.73}};
  std::vector<cpu::RowSampling> params(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    params[size_t(r)] = kinds[size_t(r) % kinds.size()];
    params[size_t(r)].uniform = std::fmod(params[size_t(r)].uniform + 0.113 * double(r), 1.0);
  }
  std::vector<int32_t> want_ids(static_cast<size_t>(rows));
  std::vector<uint8_t> want_finite(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    cpu::sample_rows(logits.data() + r * stride, 1, vocab, &params[size_t(r)], &want_ids[size_t(r)],
                     &want_finite[size_t(r)]);
  }
  Dev<float> d_logits(logits);
  Dev<cpu::RowSampling> d_params(params);
  Dev<int32_t> d_ids(static_cast<size_t>(rows));
  Dev<uint8_t> d_finite(static_cast<size_t>(rows));
  ASSERT_EQ(d_ids.buf.poison(), cudaSuccess);
  ASSERT_EQ(d_finite.buf.poison(), cudaSuccess);
  cuda::SampleRowsParams p;
  p.logits = d_logits.get();
  p.rows = rows;
  p.vocab = vocab;
  p.stride = stride;
  p.params = d_params.get();
  p.ids = d_ids.get();
  p.finite = d_finite.get();
  if (graph) {  // captured once, replayed twice (the outputs poisoned in between)
    cudaStream_t stream = nullptr;
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    DS_CUDA_ASSERT(cudaStreamCreate(&stream));
    DS_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cuda::launch_sample_rows(p, stream);
    DS_CUDA_ASSERT(cudaStreamEndCapture(stream, &g));
    DS_CUDA_ASSERT(cudaGraphInstantiate(&exec, g, 0));
    for (int k = 0; k < 2; ++k) {
      ASSERT_EQ(d_ids.buf.poison(), cudaSuccess);
      DS_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      DS_CUDA_ASSERT(cudaStreamSynchronize(stream));
      EXPECT_EQ(d_ids.host(), want_ids) << "replay " << k;
    }
    DS_CUDA_ASSERT(cudaGraphExecDestroy(exec));
    DS_CUDA_ASSERT(cudaGraphDestroy(g));
    DS_CUDA_ASSERT(cudaStreamDestroy(stream));
  } else {
    cuda::launch_sample_rows(p, nullptr);
    DS_CUDA_ASSERT(cudaGetLastError());
    DS_CUDA_ASSERT(cudaDeviceSynchronize());
  }
  EXPECT_EQ(d_finite.host(), want_finite);
  const std::vector<int32_t> ids = d_ids.host();
  int differ = 0, off_argmax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (ids[size_t(r)] != want_ids[size_t(r)] && ++differ <= 5) {
      ADD_FAILURE() << "row " << r << ": token " << ids[size_t(r)] << ", reference "
                    << want_ids[size_t(r)];
    }
    const float* x = logits.data() + r * stride;
    off_argmax += want_ids[size_t(r)] != int32_t(std::max_element(x, x + vocab) - x) ? 1 : 0;
  }
  EXPECT_EQ(differ, 0);
  // The draws are not all the argmax (else the comparison could not tell them apart).
  if (rows >= 11 && vocab >= 1000 && kind != 2) EXPECT_GE(off_argmax, 3);
}

TEST(SamplingCuda, SampleRowsTinyVocab) {
  DS_REQUIRE_GPU();
  for (int kind = 0; kind < 4; ++kind) check_sample_rows(33, 1000, kind, 40 + uint64_t(kind));
  check_sample_rows(11, 7, 0, 50);  // fewer tokens than top-k and threads
  check_sample_rows(22, 1, 1, 51);  // a single token
}

TEST(SamplingCuda, SampleRowsFlashVocab) {
  DS_REQUIRE_GPU();
  for (int kind = 0; kind < 4; ++kind) check_sample_rows(22, 129280, kind, 60 + uint64_t(kind));
  check_sample_rows(64, 129280, 1, 70, /*graph=*/true);
}

TEST(SamplingCuda, FiniteFlags) {
  DS_REQUIRE_GPU();
  check_finite_flags(8, 1024, 21);
  check_finite_flags(64, 129280, 22);
}

TEST(SamplingCuda, TinyVocab) {
  DS_REQUIRE_GPU();
  check_sampling(1, 1024, 0, false, 1);
  check_sampling(16, 1024, 5, true, 2);
  check_sampling(64, 1024, 20, false, 3);
  check_sampling(3, 37, 20, true, 4);  // an odd vocabulary barely above k
}

TEST(SamplingCuda, FlashVocab) {
  DS_REQUIRE_GPU();
  check_sampling(1, 129280, 0, false, 10);
  check_sampling(1, 129280, 20, true, 11);
  check_sampling(16, 129280, 1, false, 12);
  check_sampling(64, 129280, 20, true, 13);
  check_sampling(256, 129280, 5, true, 14);
}

}  // namespace
}  // namespace ds
