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
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "forward/forward_test_util.h"
#include "kernels/cuda/attention/sparse_mla_decode.h"
#include "model/synthetic.h"
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

using dsv4::test::Divergence;
using dsv4::test::divergence;

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

// DeepSeek-V4-Flash's attention geometry (64 heads x 512 dims) on the tiny model's other
// dimensions, so that the forward runs the sparse MLA kernels the backend picks at Flash shapes
// (on compute capability 9.0 the sm_90a wgmma kernel for the 90-token prefill chunk, the mma.sync
// kernel for the decode steps): every op against the CPU on identical inputs (DualOps), as above.
TEST(CudaOpsFlashAttention, EveryOpMatchesCpuOnTheSameInputs) {
  SKIP_WITHOUT_GPU();
  DeepSeekV4Config c = dsv4::test::tiny_small_vocab_config();
  c.num_attention_heads = 64;
  c.head_dim = 512;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("ds_test_flash_attention_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  SyntheticOptions so;
  so.preset = SyntheticPreset::kTiny;
  so.seed = 77;
  ASSERT_TRUE(write_synthetic_checkpoint(c, so, dir).ok());
  auto model = dsv4::ModelWeights::load(dir);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ForwardOptions options = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  CudaOpsOptions o;
  o.max_sequences = 2;
  o.max_context = 1024;
  o.max_step_tokens = 256;
  o.cuda_graphs = false;  // DualOps synchronizes between ops
  auto gpu_ops = CudaOps::create(**model, options, o);
  ASSERT_TRUE(gpu_ops.ok()) << gpu_ops.status().to_string();
  test::DualOps dual(gpu_ops->get(), (*model)->config());
  Forward fwd(model->get(), options, &dual);
  (void)run_chunked(fwd, random_tokens(110, 23), prefill_then_decode(90, 20));
  // Prefill chunks (90 query tokens) plan the wgmma kernel where it runs, decode steps (1 token)
  // the mma.sync kernel.
  std::printf("[ metric ] sparse MLA wgmma kernel: %s\n",
              cuda::sparse_mla_wgmma_supported(64, 512) && cuda::sparse_mla_wgmma_preferred(90, 64)
                  ? "prefill chunks"
                  : "not run");
  bool attended = false;
  for (const auto& [op, e] : dual.errors) {
    std::printf("[ metric ] op %-28s calls %5ld worst rel error %.3g\n", op.c_str(), long(e.calls),
                e.worst);
    attended |= op.rfind("attend", 0) == 0;
    const bool exact = op == "embed" || op == "rope" || op == "round_bf16" ||
                       op == "simulate_fp8_kv" || op == "gather_rows" || op == "add_broadcast" ||
                       op == "mhc_post";
    EXPECT_LE(e.worst, exact ? 1e-6 : 1e-2) << op;
  }
  EXPECT_TRUE(attended);
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
    return st.ok() ? std::vector<float>(mo[0].logits.begin(), mo[0].logits.end())
                   : std::vector<float>{};
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

// CudaOpsOptions::tiled_fp8_min_bytes: with every FP8 weight also held in the small-M tile order
// (threshold 0; the tiny model's weights are all below the default) the copies show in
// weight_bytes() and tiled_fp8_weights(), every linear gets its copy, and the whole model still
// agrees with the CPU, prefill and graph-replayed decode alike. The tiny weights' rings are too
// short for the tiled kBulk plan (fp8_small_m_plan), so kAuto keeps the row-major plans here;
// the tiled reads, their bit-identity with the row-major ones and the plan's choice at Flash
// shapes are tested in test_gemm_cuda.
TEST_F(CudaOpsTest, TiledFp8WeightsMatchCpu) {
  CudaOpsOptions o = ops_->options();
  o.tiled_fp8_min_bytes = 0;
  auto tiled_ops = CudaOps::create(tiny_model(), options_, o);
  o.tiled_fp8_min_bytes = -1;
  auto plain_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(tiled_ops.ok() && plain_ops.ok());
  EXPECT_GT((*tiled_ops)->tiled_fp8_weights(), 0);
  EXPECT_EQ((*plain_ops)->tiled_fp8_weights(), 0);
  const dsv4::ModelWeights& m = tiny_model();
  int64_t fp8_bytes = 0;
  auto add = [&](const cpu::LinearWeight& w) {
    if (w.format == cpu::WeightFormat::kFp8Block && w.data)
      fp8_bytes += w.out_features * w.in_features;
  };
  // Every FP8 weight but wo_a (bf16 input: the tile order is read with FP8 activations only).
  for (const dsv4::LayerWeights& L : m.layers)
    for (const cpu::LinearWeight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_b, &L.indexer_wq_b,
                                       &L.shared.w1, &L.shared.w2, &L.shared.w3})
      add(*w);
  for (const dsv4::MtpWeights& M : m.mtp) {
    for (const cpu::LinearWeight* w :
         {&M.block.wq_a, &M.block.wq_b, &M.block.wkv, &M.block.wo_b, &M.block.indexer_wq_b,
          &M.block.shared.w1, &M.block.shared.w2, &M.block.shared.w3, &M.e_proj, &M.h_proj})
      add(*w);
  }
  ASSERT_GT(fp8_bytes, 0);
  EXPECT_GE((*tiled_ops)->weight_bytes(), (*plain_ops)->weight_bytes() + size_t(fp8_bytes));
  const auto tokens = random_tokens(150, 81);
  const auto schedule = prefill_then_decode(110, 40);
  expect_like_cpu(options_, tiled_ops->get(), "tiled fp8 weights, prefill 110 + decode 40",
                  [&](const Forward& f) { return run_chunked(f, tokens, schedule); });
  EXPECT_GE((*tiled_ops)->graph_replays(), 30);
}

// CudaOpsOptions::fused_pair_max_tokens: every layer's wq_a and wkv (main and MTP) also held
// concatenated (linear_pair: one GEMM with a split output at decode sizes), the copies counted
// in weight_bytes(), and prefill plus graph-replayed decode steps agreeing with the CPU as the
// unfused backend does (the fused GEMM sums in its own plan's order, so bits may differ from two
// GEMMs'; test_gemm_cuda checks the split against the unsplit fused GEMM bit for bit).
TEST_F(CudaOpsTest, FusedWqaWkvMatchesCpu) {
  CudaOpsOptions o = ops_->options();
  o.fused_pair_max_tokens = 16;
  auto fused_ops = CudaOps::create(tiny_model(), options_, o);
  o.fused_pair_max_tokens = 0;
  auto plain_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(fused_ops.ok() && plain_ops.ok());
  const dsv4::ModelWeights& m = tiny_model();
  EXPECT_EQ((*fused_ops)->fused_pairs(), int64_t(m.layers.size() + m.mtp.size()));
  EXPECT_EQ((*plain_ops)->fused_pairs(), 0);
  int64_t pair_bytes = 0;
  for (const dsv4::LayerWeights& L : m.layers)
    pair_bytes += (L.wq_a.out_features + L.wkv.out_features) * L.wq_a.in_features;
  EXPECT_GE((*fused_ops)->weight_bytes(), (*plain_ops)->weight_bytes() + size_t(pair_bytes));
  const auto tokens = random_tokens(150, 83);
  const auto schedule = prefill_then_decode(110, 40);
  expect_like_cpu(options_, fused_ops->get(), "fused wq_a + wkv, prefill 110 + decode 40",
                  [&](const Forward& f) { return run_chunked(f, tokens, schedule); });
  EXPECT_GE((*fused_ops)->graph_replays(), 30);
}

// CudaOpsOptions::fused_output_rope: attend de-rotates its output in the kernel that converts it
// (launch_rope_bf16) and wo_a reads that kernel's bf16 bits, in place of bf16 -> fp32, the rope op
// and fp32 -> bf16. The three launches compute the same values, so the logits are the separate
// path's bit for bit (prefill chunks, graph-replayed decode steps); and both agree with the CPU.
TEST_F(CudaOpsTest, FusedOutputRopeGivesTheSeparateOpsLogits) {
  CudaOpsOptions o = ops_->options();
  o.fused_output_rope = true;
  auto fused_ops = CudaOps::create(tiny_model(), options_, o);
  o.fused_output_rope = false;
  auto plain_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(fused_ops.ok() && plain_ops.ok());
  EXPECT_TRUE((*fused_ops)->fuses_attend_inverse_rope());
  EXPECT_FALSE((*plain_ops)->fuses_attend_inverse_rope());
  Forward fused(&tiny_model(), options_, fused_ops->get());
  Forward plain(&tiny_model(), options_, plain_ops->get());
  const auto tokens = random_tokens(160, 89);
  const auto schedule = prefill_then_decode(120, 40);
  const std::vector<float> want = run_chunked(plain, tokens, schedule);
  EXPECT_EQ(run_chunked(fused, tokens, schedule), want);
  EXPECT_GE((*fused_ops)->graph_replays(), 30);
  expect_like_cpu(options_, fused_ops->get(), "fused output rope, prefill 120 + decode 40",
                  [&](const Forward& f) { return run_chunked(f, tokens, schedule); });
}

// CudaOpsOptions::moe_route_in_logits: at decode sizes (<= 8 tokens) the MoE router logits kernel
// also routes and plans in its last CTA (cuda::MoeTuning::route_launch 1) instead of a second
// launch; the experts, weights and outputs are the two launches' bit for bit, so the logits of
// graph-replayed decode steps (one sequence: one token per step) and of the prefill chunks (the
// two launches either way) are the other form's; and both agree with the CPU.
TEST_F(CudaOpsTest, MoeRouteInLogitsGivesTheTwoLaunchesLogits) {
  CudaOpsOptions o = ops_->options();
  o.moe_route_in_logits = true;
  auto fused_ops = CudaOps::create(tiny_model(), options_, o);
  o.moe_route_in_logits = false;
  auto plain_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(fused_ops.ok() && plain_ops.ok());
  Forward fused(&tiny_model(), options_, fused_ops->get());
  Forward plain(&tiny_model(), options_, plain_ops->get());
  const auto tokens = random_tokens(100, 91);
  const auto schedule = prefill_then_decode(70, 30);
  const std::vector<float> want = run_chunked(plain, tokens, schedule);
  EXPECT_EQ(run_chunked(fused, tokens, schedule), want);
  EXPECT_GE((*fused_ops)->graph_replays(), 20);
  expect_like_cpu(options_, fused_ops->get(), "moe route in logits, prefill 70 + decode 30",
                  [&](const Forward& f) { return run_chunked(f, tokens, schedule); });
}

// CudaOpsOptions::fused_compress_max_tokens: every compressing layer's projections (CSA: the
// indexer compressor's and the attention compressor's wkv / wgate; HCA: the attention
// compressor's) also held as one bf16 weight, counted in weight_bytes(), and compress_layer's
// single GEMM (strided rows into the compressor kernels) agreeing with the CPU as the separate
// projections do: a 40-token prefill chunk and decode steps take it (<= 64 tokens), the 110-token
// chunk takes the separate GEMMs; a chunked prefill crosses HCA entries on both paths.
TEST_F(CudaOpsTest, FusedCompressorProjectionsMatchCpu) {
  CudaOpsOptions o = ops_->options();
  o.fused_compress_max_tokens = 64;
  auto fused_ops = CudaOps::create(tiny_model(), options_, o);
  o.fused_compress_max_tokens = 0;
  auto plain_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(fused_ops.ok() && plain_ops.ok());
  const dsv4::ModelWeights& m = tiny_model();
  int64_t compressing = 0, comp_bytes = 0;
  auto count = [&](const dsv4::LayerWeights& L) {
    if (L.compress_ratio == 0) return;
    ++compressing;
    comp_bytes += 2 * (L.compressor.wkv.out_features + L.compressor.wgate.out_features) *
                  L.compressor.wkv.in_features;
    if (L.kind == LayerKind::kCsa)
      comp_bytes += 2 *
                    (L.indexer_compressor.wkv.out_features +
                     L.indexer_compressor.wgate.out_features) *
                    L.indexer_compressor.wkv.in_features;
  };
  for (const dsv4::LayerWeights& L : m.layers) count(L);
  for (const dsv4::MtpWeights& M : m.mtp) count(M.block);
  ASSERT_GT(compressing, 0);
  EXPECT_EQ((*fused_ops)->fused_compressors(), compressing);
  EXPECT_EQ((*plain_ops)->fused_compressors(), 0);
  EXPECT_GE((*fused_ops)->weight_bytes(), (*plain_ops)->weight_bytes() + size_t(comp_bytes));
  const auto tokens = random_tokens(300, 97);
  const std::vector<int64_t> schedule = {110, 40, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                         1,   1,  1, 1, 1, 1, 1, 1, 1, 1, 90, 1};
  expect_like_cpu(options_, fused_ops->get(), "fused compressor projections, chunks + decode",
                  [&](const Forward& f) { return run_chunked(f, tokens, schedule); });
}

// SequenceChunk::argmax_only and backend_sample on the GPU (CudaOps::argmax_rows / sample_rows:
// the greedy or sampling kernel after the decode graph, 5 bytes per row to the host), alone and
// mixed with chunks that take logits, prefill and graph-replayed decode steps, against the argmax
// / cpu::sample_row draw of the same rows' logits.
TEST_F(CudaOpsTest, BackendTokenChunksGetTheTokensOfTheirLogits) {
  Forward gpu(&tiny_model(), options_, ops_.get());
  const int64_t replays = ops_->graph_replays();
  dsv4::test::expect_backend_tokens_like_logits(gpu);
  EXPECT_GE(ops_->graph_replays() - replays, 12);
}

// Component ranges timed with events (CudaOpsOptions::component_events, what `deepserve profile
// --graphs --event-timing` uses): the events are captured into the decode graphs and replayed,
// the logits stay bit-identical to the same graph path without events, every component the tiny
// model runs gets ranges with positive device time, the step-overhead ranges (host work) none,
// the device times sum to less than the host's wall time around the steps, and a take drains.
TEST_F(CudaOpsTest, EventTimedRangesInsideGraphsLeaveTheLogitsAlone) {
  CudaOpsOptions o = ops_->options();
  auto plain_ops = CudaOps::create(tiny_model(), options_, o);
  o.component_events = true;
  auto timed_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(plain_ops.ok() && timed_ops.ok());
  Forward plain_fwd(&tiny_model(), options_, plain_ops->get());
  Forward timed_fwd(&tiny_model(), options_, timed_ops->get());
  const auto tokens = random_tokens(140, 52);
  const auto schedule = prefill_then_decode(100, 40);
  std::array<double, dsv4::kNumComponents> s{};
  std::array<int64_t, dsv4::kNumComponents> n{};
  EXPECT_FALSE((*plain_ops)->take_component_times(s, n));
  const std::vector<float> plain = run_chunked(plain_fwd, tokens, schedule);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> timed = run_chunked(timed_fwd, tokens, schedule);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(timed, plain) << "event-timed graph path vs plain graph path";
  EXPECT_GE((*timed_ops)->graph_replays(), 30);
  ASSERT_TRUE((*timed_ops)->take_component_times(s, n));
  double total = 0;
  for (dsv4::Component c : {dsv4::Component::kEmbed, dsv4::Component::kMhc,
                            dsv4::Component::kAttentionProjections, dsv4::Component::kCompressor,
                            dsv4::Component::kIndexer, dsv4::Component::kAttention,
                            dsv4::Component::kMoe, dsv4::Component::kHead}) {
    // Every step (1 prefill + 40 decode, 38 of them replayed) opens each of these ranges.
    EXPECT_GE(n[size_t(c)], 41) << dsv4::component_name(c);
    EXPECT_GT(s[size_t(c)], 0) << dsv4::component_name(c);
  }
  for (double v : s) total += v;
  EXPECT_EQ(n[size_t(dsv4::Component::kStep)], 0);
  EXPECT_LT(total, wall);
  std::printf("[ metric ] event-timed components: %.3f ms of %.3f ms wall, %lld mhc ranges\n",
              total * 1e3, wall * 1e3, static_cast<long long>(n[size_t(dsv4::Component::kMhc)]));
  std::array<double, dsv4::kNumComponents> s2{};
  std::array<int64_t, dsv4::kNumComponents> n2{};
  ASSERT_TRUE((*timed_ops)->take_component_times(s2, n2));
  for (int c = 0; c < dsv4::kNumComponents; ++c) {
    EXPECT_EQ(n2[size_t(c)], 0);
    EXPECT_EQ(s2[size_t(c)], 0);
  }
}

bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  return cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost;
}

// The step's logits land in page-locked memory (Ops::host_memory), each chunk's rows in its own
// buffer, through one copy_many_to_host per step; a buffer a caller brings from the heap is
// replaced. The copies themselves: random device values, poisoned destinations, exact equality.
TEST_F(CudaOpsTest, LogitsAreCopiedIntoPinnedHostMemory) {
  const std::shared_ptr<HostMemorySource> host = ops_->host_memory();
  ASSERT_NE(host, nullptr);
  const std::vector<int64_t> sizes = {129280, 1, 3 * 1024 + 7};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<float> src(static_cast<size_t>(total));
  uint64_t x = 88172645463325252ull;  // xorshift64: fresh values, none zero
  for (float& v : src) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = float(int64_t(x % 2000001) - 1000000) * 1e-3f + 0.5f;
  }
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, size_t(total) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, src.data(), size_t(total) * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  std::vector<HostVector<float>> dst;
  std::vector<dsv4::Ops::HostCopy> copies;
  int64_t at = 0;
  for (int64_t n : sizes) {
    dst.emplace_back(size_t(n), std::nanf(""), HostAllocator<float>(host));
    ASSERT_TRUE(is_pinned(dst.back().data()));
    copies.push_back({dev + at, n, dst.back().data()});
    at += n;
  }
  ops_->copy_many_to_host(copies);
  ASSERT_TRUE(ops_->step_status().ok()) << ops_->step_status().to_string();
  at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(std::equal(dst[i].begin(), dst[i].end(), src.begin() + at)) << "copy " << i;
    at += sizes[i];
  }
  cudaFree(dev);

  // Through the forward: three sequences in one step, outputs brought in from the heap.
  Forward fwd(&tiny_model(), options_, ops_.get());
  std::vector<SequenceState> states;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SequenceChunk> batch;
  for (int i = 0; i < 3; ++i) {
    states.push_back(fwd.new_sequence());
    prompts.push_back(random_tokens(20 + 7 * i, 90 + uint64_t(i)));
  }
  for (int i = 0; i < 3; ++i) {
    batch.push_back(
        {&states[size_t(i)], prompts[size_t(i)], {0, int64_t(prompts[i].size()) - 1}, {}});
  }
  std::vector<dsv4::ChunkOutput> out(3);
  for (auto& o : out) o.logits.assign(5, 1.0f);  // heap buffers of another size
  const Status st = fwd.run(batch, &out);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const int64_t vocab = tiny_model().config().vocab_size;
  for (const auto& o : out) {
    ASSERT_EQ(int64_t(o.logits.size()), 2 * vocab);
    EXPECT_TRUE(is_pinned(o.logits.data()));
    EXPECT_EQ(o.logits.get_allocator().source(), host);
    EXPECT_TRUE(
        std::all_of(o.logits.begin(), o.logits.end(), [](float v) { return std::isfinite(v); }));
  }
  for (auto& s : states) fwd.ops()->release_sequence(&s);
}

// ---- Speculative checkpoint / rollback (docs/speculative.md, docs/cuda_backend.md) ----

// One forward call of `tokens` for one sequence; the logits of every row.
std::vector<float> feed(const Forward& f, SequenceState* s, std::span<const int32_t> tokens) {
  std::vector<int64_t> rows(tokens.size());
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = int64_t(r);
  std::vector<SequenceChunk> batch = {{s, tokens, rows, {}}};
  std::vector<dsv4::ChunkOutput> out;
  const Status st = f.run(batch, &out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return st.ok() ? std::vector<float>(out[0].logits.begin(), out[0].logits.end())
                 : std::vector<float>{};
}

// prefix n tokens; checkpoint; verify chunk tokens[n, n + k] with rows j.. replaced by
// rejected ones (salt picks them; salt < 0: no checkpoint, no verify, the j accepted tokens as
// one chunk instead, i.e. a state that never saw the rejected rows); rollback to n + j; `more`
// tokens (their logits returned). `rings_before` / `rings_after` (GPU only) receive the
// compressor rings before and after the rollback (after the accepted chunk for salt < 0).
std::vector<float> speculate(const Forward& f, const std::vector<int32_t>& tokens, int64_t n,
                             int64_t k, int64_t j, int salt, int64_t more,
                             std::vector<float>* rings_before, std::vector<float>* rings_after) {
  auto* cuda_ops = dynamic_cast<CudaOps*>(f.ops());
  auto read_rings = [&](SequenceState* s, std::vector<float>* dst) {
    if (dst == nullptr || cuda_ops == nullptr) return;
    auto r = cuda_ops->read_compressor_rings(s);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) *dst = std::move(r).value();
  };
  SequenceState s = f.new_sequence();
  feed(f, &s, std::span(tokens.data(), size_t(n)));
  if (salt < 0) {
    if (j > 0) feed(f, &s, std::span(tokens.data() + n, size_t(j)));
    read_rings(&s, rings_after);
  } else {
    EXPECT_TRUE(f.checkpoint(&s, false, k + 1).ok());
    std::vector<int32_t> verify(tokens.begin() + n, tokens.begin() + n + k + 1);
    for (int64_t i = j; i <= k; ++i) {
      verify[size_t(i)] = int32_t(2 + (verify[size_t(i)] + 7 + 500 * salt) % 1000);
    }
    feed(f, &s, verify);
    read_rings(&s, rings_before);
    const Status rs = f.rollback(&s, false, n + j);
    EXPECT_TRUE(rs.ok()) << rs.to_string();
    read_rings(&s, rings_after);
  }
  std::vector<float> logits = feed(f, &s, std::span(tokens.data() + n + j, size_t(more)));
  f.ops()->release_sequence(&s);
  return logits;
}

// max |a - b| over finite pairs / max |b|; infinity where one side is -inf and the other not.
double ring_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / scale;
}

// Two sequences verify the same accepted rows followed by different rejected rows. After the
// rollback their compressor rings must be bit-identical and they must continue with
// bit-identical logits: the rejected rows leave no trace (the window ring and the compressed
// entries need no restore, see cuda_ops.cpp). Before the rollback the rings differ in the cases
// where a rejected row completed a compression window (the check can fail). Prefixes put the
// verify chunk of 1 + 4 rows across a CSA window boundary (2, 13) and across the HCA boundary at
// 128 (125), with every accepted count 0..5.
//
// The rolled-back rings also equal those of a sequence that only ever saw the accepted rows
// (one chunk of j tokens): the same rows pushed through the same compressor kernel. The two
// differ only where the GPU's arithmetic differs between a chunk of 5 rows and one of j rows
// upstream of the compressors, so the bound is loose (5e-2 of the largest value); a ring that
// misses or repeats a row differs by O(1) or by an infinite score.
TEST_F(CudaOpsTest, SpeculativeRollbackLeavesNoTraceOfRejectedRows) {
  CudaOpsOptions o = ops_->options();
  o.max_checkpoint_tokens = 5;
  auto spec_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(spec_ops.ok()) << spec_ops.status().to_string();
  const Forward gpu(&tiny_model(), options_, spec_ops->get());
  constexpr int64_t k = 4;
  const auto tokens = random_tokens(160, 41);
  int64_t differed_before = 0, cases = 0, exact_vs_never = 0;
  double worst_vs_never = 0;
  for (int64_t n : {2, 13, 125}) {
    for (int64_t j = 0; j <= k + 1; ++j) {
      const std::string what = "prefix " + std::to_string(n) + ", accepted rows " +
                               std::to_string(j);
      std::vector<float> a_before, a_after, b_before, b_after, c_after;
      const auto a = speculate(gpu, tokens, n, k, j, 0, 6, &a_before, &a_after);
      const auto b = speculate(gpu, tokens, n, k, j, 1, 6, &b_before, &b_after);
      speculate(gpu, tokens, n, k, j, -1, 6, nullptr, &c_after);
      ASSERT_FALSE(a_after.empty()) << what;
      EXPECT_EQ(a_after, b_after) << what << ": compressor rings after the rollback";
      EXPECT_EQ(a, b) << what << ": logits of the continuation";
      const double d = ring_difference(a_after, c_after);
      EXPECT_LE(d, 5e-2) << what << ": rolled-back rings vs never-seen rings";
      worst_vs_never = std::max(worst_vs_never, d);
      exact_vs_never += a_after == c_after;
      differed_before += a_before != b_before;
      ++cases;
    }
  }
  std::printf(
      "[ metric ] rings differed before the rollback in %lld of %lld cases; rolled-back vs "
      "never-seen rings: bit-identical in %lld, worst rel difference %.3g\n",
      (long long)differed_before, (long long)cases, (long long)exact_vs_never, worst_vs_never);
  EXPECT_GT(differed_before, 0);
}

// The continuation after a rollback against the CPU, which is bit-exact with a state that never
// saw the rejected rows (ForwardSpeculative tests), within the end-to-end yardstick: 9 rollbacks
// (prefixes 2, 13, 125; 0, 2 and 5 accepted rows), 30 continuation rows each.
TEST_F(CudaOpsTest, SpeculativeRollbackMatchesCpu) {
  CudaOpsOptions o = ops_->options();
  o.max_checkpoint_tokens = 5;
  auto spec_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(spec_ops.ok()) << spec_ops.status().to_string();
  const auto tokens = random_tokens(170, 42);
  expect_like_cpu(options_, spec_ops->get(), "continuations after 9 rollbacks",
                  [&](const Forward& f) {
                    std::vector<float> all;
                    for (int64_t n : {2, 13, 125}) {
                      for (int64_t j : {0, 2, 5}) {
                        const auto l = speculate(f, tokens, n, 4, j, 0, 30, nullptr, nullptr);
                        all.insert(all.end(), l.begin(), l.end());
                      }
                    }
                    return all;
                  });
}

TEST_F(CudaOpsTest, CheckpointLimitsAreErrors) {
  Forward plain(&tiny_model(), options_, ops_.get());  // created without max_checkpoint_tokens
  SequenceState s = plain.new_sequence();
  const auto tokens = random_tokens(10, 43);
  feed(plain, &s, std::span(tokens.data(), 5));
  const Status st = plain.checkpoint(&s, false, 2);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  plain.ops()->release_sequence(&s);

  CudaOpsOptions o = ops_->options();
  o.max_checkpoint_tokens = 3;
  auto spec_ops = CudaOps::create(tiny_model(), options_, o);
  ASSERT_TRUE(spec_ops.ok());
  Forward f(&tiny_model(), options_, spec_ops->get());
  SequenceState t = f.new_sequence();
  feed(f, &t, std::span(tokens.data(), 5));
  EXPECT_EQ(f.checkpoint(&t, false, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(f.checkpoint(&t, false, 3).ok());
  feed(f, &t, std::span(tokens.data() + 5, 3));
  EXPECT_TRUE(f.rollback(&t, false, 6).ok());
  EXPECT_EQ(t.position(), 6);
  f.ops()->release_sequence(&t);
}

// --gpu-memory-utilization: max_sequences slots and as many KV pages as the budget leaves after
// everything allocated and the step arena. Plenty of memory gives every slot room for
// max_context (the cap); a budget of about 100 full-length sequences' worth beyond one backend's
// own footprint is filled with pages (loose bounds: cudaMalloc rounds allocations and libraries
// allocate lazily); a budget below what is already used is a clear error.
TEST(CudaOpsMemory, PagesComeFromTheMemoryBudget) {
  SKIP_WITHOUT_GPU();
  const ForwardOptions options = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  CudaOpsOptions o;
  o.max_sequences = 4;
  o.max_context = 4096;  // 16 pages per sequence
  o.max_step_tokens = 256;
  o.gpu_memory_utilization = 0.95;
  {
    auto ops = CudaOps::create(tiny_model(), options, o);
    ASSERT_TRUE(ops.ok()) << ops.status().to_string();
    EXPECT_EQ((*ops)->options().max_sequences, 4);
    EXPECT_EQ((*ops)->kv_pages_total(), 4 * 16);
  }
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  o.gpu_memory_utilization = 0;
  o.max_sequences = 1;
  size_t state1 = 0, footprint = 0;
  int64_t page_bytes = 0;
  {
    auto one = CudaOps::create(tiny_model(), options, o);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    EXPECT_EQ((*one)->kv_pages_total(), 16);
    size_t free1 = 0;
    ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    state1 = (*one)->state_bytes();
    page_bytes = (*one)->kv_page_bytes();
    footprint = free0 - free1;
  }
  ASSERT_GT(state1, 0u);
  ASSERT_GT(page_bytes, 0);
  const double used = double(total - free0);
  o.max_sequences = 8;
  const double budget = 100.0 * double(state1);
  o.gpu_memory_utilization = (used + double(footprint) + budget) / double(total);
  {
    auto ops = CudaOps::create(tiny_model(), options, o);
    ASSERT_TRUE(ops.ok()) << ops.status().to_string();
    const int64_t slots = (*ops)->options().max_sequences, pages = (*ops)->kv_pages_total();
    std::printf("[ metric ] one full-length sequence %.2f MiB, one page %.1f KiB, one backend "
                "%.1f MiB; a budget of ~100 sequences gave %lld slots and %lld pages\n",
                double(state1) / (1 << 20), double(page_bytes) / 1024,
                double(footprint) / (1 << 20), (long long)slots, (long long)pages);
    EXPECT_EQ(slots, 8);
    EXPECT_EQ(pages, 8 * 16);  // the cap: more pages than 8 full sequences could never be used
  }
  o.max_sequences = 1000;
  {
    auto ops = CudaOps::create(tiny_model(), options, o);
    ASSERT_TRUE(ops.ok()) << ops.status().to_string();
    const int64_t pages = (*ops)->kv_pages_total();
    std::printf("[ metric ] max_sequences 1000: %lld slots, %lld pages (%.1f full sequences)\n",
                (long long)(*ops)->options().max_sequences, (long long)pages, double(pages) / 16);
    EXPECT_GE(pages, 16);
    EXPECT_GE(double((*ops)->state_bytes()), 0.5 * budget);
    EXPECT_LE(double((*ops)->state_bytes()), 1.05 * budget);
  }
  o.gpu_memory_utilization = std::max(0.001, used / double(total) - 0.001);
  auto none = CudaOps::create(tiny_model(), options, o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("--gpu-memory-utilization"), std::string::npos)
      << none.status().message();
  // An explicit page count or byte size takes precedence over the budget.
  o.gpu_memory_utilization = 0.9;
  o.kv_pages = 5;
  {
    auto ops = CudaOps::create(tiny_model(), options, o);
    ASSERT_TRUE(ops.ok()) << ops.status().to_string();
    EXPECT_EQ((*ops)->kv_pages_total(), 5);
  }
  o.kv_pages = 0;
  o.kv_cache_bytes = uint64_t(7 * page_bytes + page_bytes / 2);
  {
    auto ops = CudaOps::create(tiny_model(), options, o);
    ASSERT_TRUE(ops.ok()) << ops.status().to_string();
    EXPECT_EQ((*ops)->kv_pages_total(), 7);
  }
  o.kv_cache_bytes = uint64_t(page_bytes / 2);
  auto tiny = CudaOps::create(tiny_model(), options, o);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), StatusCode::kInvalidArgument) << tiny.status().to_string();
}

// ---- KV pages shared by the sequences (cuda_ops.h) ----

// Six pages for four slots of up to 1024 tokens (4 pages each): sequences take pages as they
// grow, so their page tables interleave (A: pages 0, 3; B: 1, then C's page 2 after C is
// released, with C's entries still in it; D: 4, 5). Every row's
// logits still match the CPU's, and the page counts follow ceil(position / 256).
TEST(CudaOpsPaging, SharedPagesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const ForwardOptions options = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  CudaOpsOptions o;
  o.max_sequences = 4;
  o.max_context = 1024;
  o.max_step_tokens = 512;
  o.kv_pages = 6;
  auto created = CudaOps::create(tiny_model(), options, o);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  CudaOps* gpu = created->get();
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(340, 81), random_tokens(330, 82),
                                                     random_tokens(120, 83), random_tokens(300, 84)};
  // Tokens per step for sequences A, B, C, D (0: not in the step); C ends after step 2 and D
  // starts after it.
  const std::vector<std::vector<int64_t>> schedule = {
      {100, 100, 60, 0}, {200, 1, 60, 0}, {1, 200, 0, 0}, {1, 1, 0, 150},
      {28, 18, 0, 140},  {1, 1, 0, 1},    {1, 1, 0, 1}};
  std::vector<std::vector<int64_t>> held;  // GPU only: pages held after each step
  expect_like_cpu(options, gpu, "shared KV pages, 4 sequences", [&](const Forward& f) {
    const bool on_gpu = f.ops() == gpu;
    std::vector<SequenceState> states;
    for (size_t i = 0; i < prompts.size(); ++i) states.push_back(f.new_sequence());
    std::vector<int64_t> done(prompts.size(), 0);
    std::vector<float> logits;
    for (size_t step = 0; step < schedule.size(); ++step) {
      if (step == 2) f.ops()->release_sequence(&states[2]);
      std::vector<SequenceChunk> batch;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const int64_t n = std::min<int64_t>(schedule[step][i], int64_t(prompts[i].size()) - done[i]);
        if (n <= 0) continue;
        std::vector<int64_t> rows(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) rows[size_t(r)] = r;
        batch.push_back({&states[i], std::span(prompts[i].data() + done[i], size_t(n)), rows, {}});
        done[i] += n;
      }
      std::vector<dsv4::ChunkOutput> out;
      const Status st = f.run(batch, &out);
      EXPECT_TRUE(st.ok()) << "step " << step << ": " << st.to_string();
      if (!st.ok()) return std::vector<float>{};
      for (const auto& co : out) logits.insert(logits.end(), co.logits.begin(), co.logits.end());
      if (on_gpu) {
        std::vector<int64_t> h;
        for (const SequenceState& s : states) h.push_back(gpu->kv_pages_held(&s));
        held.push_back(h);
      }
    }
    for (auto& s : states) f.ops()->release_sequence(&s);
    return logits;
  });
  ASSERT_EQ(held.size(), schedule.size());
  // After step 2: A at 300 (2 pages), B at 101 (1), C released (0).
  EXPECT_EQ(held[2], (std::vector<int64_t>{2, 2, 0, 0}));
  EXPECT_EQ(held.back(), (std::vector<int64_t>{2, 2, 0, 2}));  // D at 292: every page in use
  EXPECT_EQ(gpu->kv_pages_free(), 6);                          // all back after the releases
}

// A step whose sequences need more pages than are free is a kResourceExhausted error that
// advances no sequence; it succeeds once another sequence returns its pages.
TEST(CudaOpsPaging, RunningOutOfPagesIsAnErrorUntilPagesAreFreed) {
  SKIP_WITHOUT_GPU();
  const ForwardOptions options = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  CudaOpsOptions o;
  o.max_sequences = 4;
  o.max_context = 2048;
  o.max_step_tokens = 512;
  o.kv_pages = 3;
  auto created = CudaOps::create(tiny_model(), options, o);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  Forward gpu(&tiny_model(), options, created->get());
  const auto tokens = random_tokens(520, 91);
  SequenceState a = gpu.new_sequence(), b = gpu.new_sequence();
  auto step = [&](SequenceState* s, int64_t n) {
    std::vector<SequenceChunk> batch = {
        {s, std::span(tokens.data() + s->position(), size_t(n)), {n - 1}, {}}};
    std::vector<dsv4::ChunkOutput> out;
    return gpu.run(batch, &out);
  };
  ASSERT_TRUE(step(&a, 300).ok());  // 2 pages
  ASSERT_TRUE(step(&b, 200).ok());  // 1 page: none left
  const Status st = step(&b, 100);  // b would need a second page
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("out of KV pages"), std::string::npos) << st.message();
  EXPECT_EQ(b.position(), 200);
  EXPECT_EQ((*created)->kv_pages_held(&b), 1);
  gpu.ops()->release_sequence(&a);
  EXPECT_EQ((*created)->kv_pages_free(), 2);
  EXPECT_TRUE(step(&b, 100).ok());
  EXPECT_EQ(b.position(), 300);
  EXPECT_EQ((*created)->kv_pages_held(&b), 2);
  gpu.ops()->release_sequence(&b);
  EXPECT_EQ((*created)->kv_pages_free(), 3);
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
