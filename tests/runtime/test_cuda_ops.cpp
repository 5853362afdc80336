// The whole DeepSeek-V4 forward on the CUDA backend against the CPU reference backend, on the
// tiny model (tests/forward/forward_test_util.h): prefill, token-by-token decode, chunked
// prefill, a batch of sequences at different positions mixing prefill chunks and decode tokens,
// the MTP layer, and the backend's limits (label gpu: skipped without a GPU).
//
// Tolerance. Each op is checked on identical inputs by EveryOpMatchesCpuOnTheSameInputs (the
// strong check: 1e-2 relative, exact where the math is). End to end, the two backends differ in
// fp32 summation order, and reference numerics amplify such differences: every linear
// requantizes its input to FP8 (3 mantissa bits), ~30 bf16 rounding points per layer, top-k
// routing and top-k key selection turn an ulp into a different code, expert or key. Measured on
// the CPU alone, nudging every linear output by one fp32 ulp moves the tiny model's logits by
// up to 0.76 of their largest value and changes the argmax of 28% of the rows (300-token
// prefill). So the end-to-end tests compare the GPU's divergence from the CPU with that
// baseline, computed in the same test on the same tokens (forward_test_util.h
// make_ulp_perturbed_cpu_ops): mean over rows of max|gpu - cpu| / max|cpu| at most twice the
// baseline's + 0.01, and argmax agreement at most 0.15 below the baseline's. A wrong op (a
// missing key, a wrong position, a stale ring) breaks the per-op test and, end to end, drives
// the argmax agreement to chance (about 1/1024).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "forward/forward_test_util.h"
#include "runtime/cuda/cuda_ops.h"
#include "runtime/dual_ops.h"

namespace ds::runtime {
namespace {

using dsv4::Forward;
using dsv4::ForwardOptions;
using dsv4::SequenceChunk;
using dsv4::SequenceState;
using dsv4::test::random_tokens;
using dsv4::test::run_chunked;
using dsv4::test::tiny_model;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU"

// Chunk sizes for run_chunked (which cycles them): one prefill chunk, then single tokens.
std::vector<int64_t> prefill_then_decode(int64_t prefill, int64_t decode_steps) {
  std::vector<int64_t> sizes = {prefill};
  sizes.insert(sizes.end(), size_t(decode_steps), 1);
  return sizes;
}

struct Divergence {
  double mean_rel = 0;  // mean over rows of max|a - b| / max|b|
  double argmax = 0;    // fraction of rows with the same argmax
};

Divergence divergence(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  Divergence d;
  const int64_t rows = int64_t(b.size()) / vocab;
  if (rows == 0 || a.size() != b.size()) return {INFINITY, 0};
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    double diff = 0, scale = 1e-6;
    for (int64_t v = 0; v < vocab; ++v) {
      diff = std::isfinite(x[v]) ? std::max(diff, double(std::fabs(x[v] - y[v]))) : INFINITY;
      scale = std::max(scale, double(std::fabs(y[v])));
    }
    d.mean_rel += diff / scale / double(rows);
    same += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
  }
  d.argmax = double(same) / double(rows);
  return d;
}

// `run` produces logits with a given forward; compares the GPU's against the CPU's with the
// ulp-perturbed CPU backend's divergence as the yardstick (see the header).
template <typename Run>
void expect_like_cpu(const ForwardOptions& options, CudaOps* gpu_ops, const char* what, Run run) {
  const dsv4::ModelWeights& m = tiny_model();
  const int64_t vocab = m.config().vocab_size;
  Forward cpu(&m, options);
  Forward gpu(&m, options, gpu_ops);
  auto perturbed_ops = dsv4::test::make_ulp_perturbed_cpu_ops(m.config(), 1);
  Forward perturbed(&m, options, perturbed_ops.get());
  const std::vector<float> c = run(cpu), g = run(gpu), p = run(perturbed);
  const Divergence dg = divergence(g, c, vocab), db = divergence(p, c, vocab);
  std::printf(
      "[ metric ] %s: gpu vs cpu mean rel %.4f argmax %.3f | ulp-perturbed cpu vs cpu "
      "mean rel %.4f argmax %.3f\n",
      what, dg.mean_rel, dg.argmax, db.mean_rel, db.argmax);
  EXPECT_LE(dg.mean_rel, 2 * db.mean_rel + 0.01) << what;
  EXPECT_GE(dg.argmax, db.argmax - 0.15) << what;
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
    CudaOpsOptions o;
    o.max_sequences = 4;
    o.max_context = 1024;
    o.max_step_tokens = 512;
    auto ops = CudaOps::create(tiny_model(), options_, o);
    ASSERT_TRUE(ops.ok()) << ops.status().to_string();
    ops_ = std::move(ops).value();
  }

  ForwardOptions options_ = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  std::unique_ptr<CudaOps> ops_;
};

// Every op of the forward on identical inputs (DualOps copies the GPU op's inputs into the CPU
// op's buffers): prefill across the window, CSA selection and an HCA entry, then decode steps.
// Per op: the worst max|gpu - cpu| / max|cpu| over its calls. Exact ops (embed, RoPE, rounding,
// FP8 simulation, gather, add, mHC post) must agree to 1e-6; the others differ by fp32 summation
// order and, behind a bf16 rounding point, by one bf16 ulp (2^-8 = 0.0039) of the largest value:
// 1e-2 leaves room for that and fails on any wrong index, position or weight.
TEST_F(CudaOpsTest, EveryOpMatchesCpuOnTheSameInputs) {
  CudaOpsOptions o = ops_->options();
  o.cuda_graphs = false;  // DualOps synchronizes between ops: nothing to capture
  auto gpu_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(gpu_ops.ok()) << gpu_ops.status().to_string();
  test::DualOps dual(gpu_ops->get(), tiny_model().config());
  Forward fwd(&tiny_model(), options_, &dual);
  const auto tokens = random_tokens(160, 17);
  const auto schedule = prefill_then_decode(140, 20);
  const std::vector<float> dual_logits = run_chunked(fwd, tokens, schedule);
  // The same forward without the side-by-side CPU ops and their synchronization: bit for bit
  // the same GPU work (a difference would mean a missing dependency between launches).
  Forward plain(&tiny_model(), options_, ops_.get());
  const std::vector<float> plain_logits = run_chunked(plain, tokens, schedule);
  EXPECT_EQ(plain_logits, dual_logits);
  for (const auto& [op, e] : dual.errors) {
    std::printf("[ metric ] op %-28s calls %5ld worst rel error %.3g\n", op.c_str(), long(e.calls),
                e.worst);
    const bool exact = op == "embed" || op == "rope" || op == "round_bf16" ||
                       op == "simulate_fp8_kv" || op == "gather_rows" || op == "add_broadcast" ||
                       op == "mhc_post";
    EXPECT_LE(e.worst, exact ? 1e-6 : 1e-2) << op;
  }
  EXPECT_GT(dual.errors.size(), size_t(15));
}

TEST_F(CudaOpsTest, PrefillMatchesCpu) {
  // 300 tokens: past the window (16), CSA selections (topk 8 of up to 75 entries) and two HCA
  // entries (ratio 128).
  const auto tokens = random_tokens(300, 11);
  expect_like_cpu(options_, ops_.get(), "prefill 300",
                  [&](const Forward& f) { return run_chunked(f, tokens, {300}); });
}

TEST_F(CudaOpsTest, DecodeMatchesCpu) {
  // Prefill 120, then 40 single-token steps (crosses the 128-token HCA boundary; graphs on).
  const auto tokens = random_tokens(160, 12);
  expect_like_cpu(options_, ops_.get(), "prefill 120 + decode 40", [&](const Forward& f) {
    return run_chunked(f, tokens, prefill_then_decode(120, 40));
  });
}

TEST_F(CudaOpsTest, ChunkedPrefillMatchesCpu) {
  // Odd chunk sizes: chunks that end inside a compression window and inside the window ring.
  const auto tokens = random_tokens(270, 13);
  expect_like_cpu(options_, ops_.get(), "chunked prefill 37/64/1/3/100", [&](const Forward& f) {
    return run_chunked(f, tokens, {37, 64, 1, 3, 100});
  });
}

TEST_F(CudaOpsTest, MixedBatchMatchesCpu) {
  // Three sequences; each step advances them by different chunk sizes (prefill chunks and decode
  // tokens in one batch), all rows' logits compared.
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(200, 21), random_tokens(140, 22),
                                                     random_tokens(90, 23)};
  const std::vector<std::vector<int64_t>> schedule = {
      {50, 7, 1}, {60, 1, 40}, {1, 1, 1}, {89, 132, 1}, {1, 1, 47}};
  expect_like_cpu(options_, ops_.get(), "mixed batch of 3", [&](const Forward& f) {
    std::vector<SequenceState> states;
    for (size_t i = 0; i < prompts.size(); ++i) states.push_back(f.new_sequence());
    std::vector<int64_t> done(prompts.size(), 0);
    std::vector<float> logits;
    for (const auto& step : schedule) {
      std::vector<SequenceChunk> batch;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const int64_t n = std::min<int64_t>(step[i], int64_t(prompts[i].size()) - done[i]);
        if (n <= 0) continue;
        std::vector<int64_t> rows(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) rows[size_t(r)] = r;
        batch.push_back({&states[i], std::span(prompts[i].data() + done[i], size_t(n)), rows, {}});
        done[i] += n;
      }
      std::vector<dsv4::ChunkOutput> out;
      const Status st = f.run(batch, &out);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) return std::vector<float>{};
      for (const auto& o : out) logits.insert(logits.end(), o.logits.begin(), o.logits.end());
    }
    for (auto& s : states) f.ops()->release_sequence(&s);
    return logits;
  });
}

TEST_F(CudaOpsTest, MtpMatchesCpu) {
  const auto tokens = random_tokens(64, 31);
  expect_like_cpu(options_, ops_.get(), "MTP draft logits, 63 rows", [&](const Forward& f) {
    SequenceState s = f.new_sequence();
    std::vector<int64_t> rows(63);
    for (int64_t r = 0; r < 63; ++r) rows[size_t(r)] = r;
    std::vector<SequenceChunk> batch = {{&s, std::span(tokens.data(), 63), rows, {}}};
    std::vector<dsv4::ChunkOutput> out;
    Status st = f.run(batch, &out, /*want_streams=*/true);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return std::vector<float>{};
    std::vector<dsv4::MtpChunk> mb = {{&s, out[0].streams, std::span(tokens.data() + 1, 63), rows}};
    std::vector<dsv4::ChunkOutput> mo;
    st = f.run_mtp(mb, &mo);
    EXPECT_TRUE(st.ok()) << st.to_string();
    f.ops()->release_sequence(&s);
    return st.ok() ? mo[0].logits : std::vector<float>{};
  });
}

TEST_F(CudaOpsTest, LimitsAreErrorsAndLeaveTheSequenceUntouched) {
  Forward gpu(&tiny_model(), options_, ops_.get());
  SequenceState s = gpu.new_sequence();
  const auto tokens = random_tokens(600, 41);  // > max_step_tokens (512)
  std::vector<SequenceChunk> batch = {{&s, tokens, {0}, {}}};
  std::vector<dsv4::ChunkOutput> out;
  const Status st = gpu.run(batch, &out);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_EQ(s.position(), 0);
  gpu.ops()->release_sequence(&s);

  // Slots: four live sequences fit, a fifth does not until one is released.
  std::vector<SequenceState> states;
  for (int i = 0; i < 5; ++i) states.push_back(gpu.new_sequence());
  auto step = [&](SequenceState* state) {
    std::vector<SequenceChunk> b = {{state, std::span(tokens.data(), 5), {4}, {}}};
    std::vector<dsv4::ChunkOutput> o;
    return gpu.run(b, &o);
  };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(step(&states[size_t(i)]).ok());
  EXPECT_EQ(step(&states[4]).code(), StatusCode::kResourceExhausted);
  gpu.ops()->release_sequence(&states[0]);
  EXPECT_TRUE(step(&states[4]).ok());
  for (auto& st2 : states) gpu.ops()->release_sequence(&st2);
}

// Decode steps replayed from CUDA graphs give the eager path's logits bit for bit (the graph
// holds the same launches on the same buffers), for one sequence and for a batch of three. Two
// eager backends agree bit for bit too (the GPU path is deterministic).
TEST_F(CudaOpsTest, GraphDecodeEqualsEagerDecode) {
  CudaOpsOptions o = ops_->options();
  o.max_sequences = 8;
  auto graph_ops = CudaOps::create(tiny_model(), options_, o);
  o.cuda_graphs = false;
  auto eager_ops = CudaOps::create(tiny_model(), options_, o);
  auto eager_ops2 = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(graph_ops.ok() && eager_ops.ok() && eager_ops2.ok());
  Forward graph_fwd(&tiny_model(), options_, graph_ops->get());
  Forward eager_fwd(&tiny_model(), options_, eager_ops->get());
  Forward eager_fwd2(&tiny_model(), options_, eager_ops2->get());
  const auto tokens = random_tokens(140, 51);
  const auto schedule = prefill_then_decode(100, 40);
  const std::vector<float> eager = run_chunked(eager_fwd, tokens, schedule);
  EXPECT_EQ(run_chunked(eager_fwd2, tokens, schedule), eager) << "eager vs eager";
  EXPECT_EQ(run_chunked(graph_fwd, tokens, schedule), eager) << "graph vs eager";
  EXPECT_GE((*graph_ops)->graph_captures(), 1);
  EXPECT_GE((*graph_ops)->graph_replays(), 30);
  EXPECT_EQ((*eager_ops)->graph_replays(), 0);

  // A batch of three sequences at different positions, decoding together.
  auto batch_decode = [&](const Forward& fwd) {
    std::vector<SequenceState> states;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 3; ++i) {
      states.push_back(fwd.new_sequence());
      prompts.push_back(random_tokens(60 + 45 * i, 60 + uint64_t(i)));
    }
    for (int i = 0; i < 3; ++i) {
      std::vector<SequenceChunk> b = {{&states[size_t(i)], prompts[size_t(i)], {}, {}}};
      std::vector<dsv4::ChunkOutput> o2;
      const Status st = fwd.run(b, &o2);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    std::vector<float> logits;
    for (int step = 0; step < 20; ++step) {
      std::vector<int32_t> ids = random_tokens(3, 70 + uint64_t(step));
      std::vector<SequenceChunk> b;
      for (int i = 0; i < 3; ++i) {
        b.push_back({&states[size_t(i)], std::span(&ids[size_t(i)], 1), {0}, {}});
      }
      std::vector<dsv4::ChunkOutput> o2;
      const Status st = fwd.run(b, &o2);
      EXPECT_TRUE(st.ok()) << st.to_string();
      for (const auto& co : o2) logits.insert(logits.end(), co.logits.begin(), co.logits.end());
    }
    for (auto& s2 : states) fwd.ops()->release_sequence(&s2);
    return logits;
  };
  const int64_t replays = (*graph_ops)->graph_replays();
  EXPECT_EQ(batch_decode(graph_fwd), batch_decode(eager_fwd)) << "batch of 3, graph vs eager";
  EXPECT_GE((*graph_ops)->graph_replays() - replays, 15);
}

TEST(CudaOpsCreate, HfNumericsIsRefused) {
  SKIP_WITHOUT_GPU();
  auto ops = CudaOps::create(tiny_model(), ForwardOptions::for_mode(cpu::NumericsMode::kHf),
                             CudaOpsOptions{});
  ASSERT_FALSE(ops.ok());
  EXPECT_EQ(ops.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds::runtime
