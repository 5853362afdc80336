// The forward through its op interface (ops.h): a forward given a backend explicitly (here a
// decorator around CpuOps) gives the same logits as the default CPU forward, bit for bit; every
// compute op runs inside exactly one component range, ranges never nest, and a step touches the
// components its layers have (compressor and indexer only on compressed layers); the scratch
// arena is back to empty after every call, also when the call fails.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <map>
#include <string>

#include "forward_test_util.h"
#include "model/deepseek_v4/cpu_ops.h"
#include "model/deepseek_v4/forwarding_ops.h"

namespace ds::dsv4::test {
namespace {

using cpu::NumericsMode;

// Records the component of every op and checks the range discipline.
class RecordingOps final : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;

  void component_begin(Component c) override {
    if (open_) ++nested_;
    open_ = true;
    current_ = c;
    ++begins_[size_t(c)];
    ForwardingOps::component_begin(c);
  }
  void component_end(Component c) override {
    if (!open_ || c != current_) ++mismatched_;
    open_ = false;
    ForwardingOps::component_end(c);
  }

  int nested_ = 0, mismatched_ = 0, outside_ = 0;
  std::array<int, kNumComponents> begins_{};
  std::map<std::string, std::map<std::string, int>> ops_by_component_;  // component -> op -> n

 protected:
  void before_op(const char* name) override {
    // Copies of results to the host are bookkeeping, not model work; everything else must be
    // attributed to a component.
    if (!open_ && std::strcmp(name, "copy_to_host") != 0) ++outside_;
    ++ops_by_component_[open_ ? component_name(current_) : "(none)"][name];
  }

 private:
  bool open_ = false;
  Component current_ = Component::kEmbed;
};

class ForwardOps : public ::testing::TestWithParam<NumericsMode> {};

TEST_P(ForwardOps, ExplicitBackendGivesTheDefaultForwardsLogits) {
  const ModelWeights& model = tiny_model();
  const ForwardOptions options = ForwardOptions::for_mode(GetParam());
  CpuOps cpu(model.config());
  RecordingOps recording(&cpu);
  const Forward reference(&model, options);
  const Forward explicit_backend(&model, options, &recording);
  const auto tokens = random_tokens(150, 11);
  const auto a = run_chunked(reference, tokens, {37, 1, 5});
  const auto b = run_chunked(explicit_backend, tokens, {37, 1, 5});
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  EXPECT_EQ(recording.nested_, 0);
  EXPECT_EQ(recording.mismatched_, 0);
  EXPECT_EQ(recording.outside_, 0);
  EXPECT_EQ(cpu.mark(), 0u) << "scratch left in the arena after the calls";
  // The tiny model has SWA, CSA and HCA layers: every main-model component ran.
  for (Component c : {Component::kEmbed, Component::kMhc, Component::kNorm,
                      Component::kAttentionProjections, Component::kCompressor,
                      Component::kIndexer, Component::kAttention, Component::kMoe,
                      Component::kHead}) {
    EXPECT_GT(recording.begins_[size_t(c)], 0) << component_name(c);
  }
  EXPECT_EQ(recording.begins_[size_t(Component::kMtpInput)], 0);
  EXPECT_EQ(recording.begins_[size_t(Component::kCollective)], 0);  // one rank: no all-reduce
  // Ops land where they belong.
  auto& by = recording.ops_by_component_;
  EXPECT_GT(by["indexer"]["indexer_select"], 0);
  EXPECT_EQ(by["sparse attention"].count("linear"), 0u);
  EXPECT_GT(by["sparse attention"]["attend"], 0);
  EXPECT_GT(by["compressor"]["compress"], 0);
  EXPECT_GT(by["moe"]["moe"], 0);
  EXPECT_GT(by["head"]["linear"], 0);
  EXPECT_EQ(by.count("(none)"), 0u);
}

TEST_P(ForwardOps, MtpRunsInsideComponentsToo) {
  const ModelWeights& model = tiny_model();
  const ForwardOptions options = ForwardOptions::for_mode(GetParam());
  CpuOps cpu(model.config());
  RecordingOps recording(&cpu);
  const Forward f(&model, options, &recording);
  SequenceState state = f.new_sequence();
  const auto tokens = random_tokens(20, 12);
  SequenceChunk chunk{&state, tokens, {0, 19}};
  std::vector<ChunkOutput> out;
  ASSERT_TRUE(f.run(std::span<SequenceChunk>(&chunk, 1), &out, /*want_streams=*/true).ok());
  std::vector<int32_t> next = {int32_t(tokens[1]), int32_t(tokens[19])};
  MtpChunk m{&state, out[0].streams, next, {0, 1}};
  std::vector<ChunkOutput> mtp_out;
  ASSERT_TRUE(f.run_mtp(std::span<MtpChunk>(&m, 1), &mtp_out).ok());
  EXPECT_EQ(mtp_out[0].logits.size(), size_t(2 * kTinyVocab));
  EXPECT_GT(recording.begins_[size_t(Component::kMtpInput)], 0);
  EXPECT_EQ(recording.nested_, 0);
  EXPECT_EQ(recording.outside_, 0);
  EXPECT_EQ(cpu.mark(), 0u);
}

TEST_P(ForwardOps, FailedCallLeavesTheArenaEmptyAndTheStateUntouched) {
  const ModelWeights& model = tiny_model();
  CpuOps cpu(model.config());
  const Forward f(&model, ForwardOptions::for_mode(GetParam()), &cpu);
  SequenceState state = f.new_sequence();
  std::vector<int32_t> bad = {5, int32_t(kTinyVocab)};  // second id out of range
  SequenceChunk chunk{&state, bad, {1}};
  std::vector<ChunkOutput> out;
  EXPECT_FALSE(f.run(std::span<SequenceChunk>(&chunk, 1), &out).ok());
  EXPECT_EQ(state.position(), 0);
  EXPECT_EQ(cpu.mark(), 0u);
}

// A backend that rounds the outputs of rms_norm, rms_norm_heads, rope, mHC, attend and the indexer
// weight scaling itself when it says so (Ops::rounds_elementwise_outputs; CudaOps does it in those
// kernels): here CpuOps plus a round_bf16 of each such output, done on the inner backend (not
// counted). Counts the forward's own round_bf16 calls and the calls of those ops.
class SelfRoundingOps final : public ForwardingOps {
 public:
  // claims: what rounds_elementwise_outputs() says; rounds: whether the ops really round.
  SelfRoundingOps(Ops* inner, const DeepSeekV4Config& config, bool claims, bool rounds)
      : ForwardingOps(inner),
        claims_(claims),
        rounds_(rounds),
        attend_width_(config.num_attention_heads * config.head_dim) {}

  bool rounds_elementwise_outputs() const override { return claims_; }
  void begin_step(const StepPlan& plan) override {
    tokens_ = plan.num_tokens;
    ForwardingOps::begin_step(plan);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                float* y) override {
    ForwardingOps::rms_norm(x, w, rows, dim, eps, y);
    own_round(y, rows * dim);
  }
  void rms_norm_heads(float* x, int64_t rows, int64_t heads, int64_t head_dim, float eps) override {
    ForwardingOps::rms_norm_heads(x, rows, heads, head_dim, eps);
    own_round(x, rows * heads * head_dim);
  }
  void rope(float* x, int64_t heads, int64_t head_dim, int64_t rope_dim, const float* inv_freq,
            cpu::RopeDirection direction) override {
    ForwardingOps::rope(x, heads, head_dim, rope_dim, inv_freq, direction);
    own_round(x, tokens_ * heads * head_dim);
  }
  void mhc_pre(const cpu::MhcConfig& c, const cpu::MhcSiteWeights& w, const float* x, int64_t rows,
               float* u, float* post, float* comb) override {
    ForwardingOps::mhc_pre(c, w, x, rows, u, post, comb);
    own_round(u, rows * c.dim);
  }
  void mhc_post(const cpu::MhcConfig& c, const float* o, const float* x, const float* post,
                const float* comb, int64_t rows, float* x_new) override {
    ForwardingOps::mhc_post(c, o, x, post, comb, rows, x_new);
    own_round(x_new, rows * c.hc_mult * c.dim);
  }
  void mhc_head(const cpu::MhcConfig& c, const cpu::MhcHeadWeights& w, const float* x, int64_t rows,
                float* y) override {
    ForwardingOps::mhc_head(c, w, x, rows, y);
    own_round(y, rows * c.dim);
  }
  void attend(const AttendParams& p, const float* q, const float* kv, const int32_t* selected,
              float* o) override {
    ForwardingOps::attend(p, q, kv, selected, o);
    own_round(o, tokens_ * attend_width_);
  }
  void indexer_scale_weights(float* w, int64_t heads, int64_t head_dim) override {
    ForwardingOps::indexer_scale_weights(w, heads, head_dim);
    own_round(w, tokens_ * heads);
  }

  int forward_rounds_ = 0;     // round_bf16 calls made by the forward
  int elementwise_calls_ = 0;  // calls of the eight ops above

 protected:
  void before_op(const char* name) override {
    if (std::strcmp(name, "round_bf16") == 0) ++forward_rounds_;
    for (const char* op : {"rms_norm", "rms_norm_heads", "rope", "mhc_pre", "mhc_post", "mhc_head",
                           "attend", "indexer_scale_weights"})
      if (std::strcmp(name, op) == 0) ++elementwise_calls_;
  }

 private:
  void own_round(float* x, int64_t n) {
    if (rounds_) inner()->round_bf16(x, n);
  }
  bool claims_, rounds_;
  int64_t attend_width_;  // heads * head_dim
  int64_t tokens_ = 0;
};

// Chunked prefill + decode logits, then MTP draft logits from the last chunk's streams.
std::vector<float> run_with_mtp(const Forward& f, const std::vector<int32_t>& tokens) {
  std::vector<float> logits = run_chunked(f, tokens, {37, 1, 5});
  SequenceState state = f.new_sequence();
  SequenceChunk chunk{&state, tokens, {0, int64_t(tokens.size()) - 1}};
  std::vector<ChunkOutput> out;
  EXPECT_TRUE(f.run(std::span<SequenceChunk>(&chunk, 1), &out, /*want_streams=*/true).ok());
  std::vector<int32_t> next = {tokens[1], tokens.back()};
  MtpChunk m{&state, out[0].streams, next, {0, 1}};
  std::vector<ChunkOutput> mtp_out;
  EXPECT_TRUE(f.run_mtp(std::span<MtpChunk>(&m, 1), &mtp_out).ok());
  logits.insert(logits.end(), mtp_out[0].logits.begin(), mtp_out[0].logits.end());
  return logits;
}

// Reference numerics: a backend that rounds those outputs itself gives the default forward's
// logits bit for bit, and the forward skips exactly one round_bf16 per call of those ops; one
// that claims to but does not round gives other logits (the forward relies on the claim).
TEST(ForwardOpsRounding, BackendRoundedOutputsSkipTheForwardsRounding) {
  const ModelWeights& model = tiny_model();
  const ForwardOptions options = ForwardOptions::for_mode(NumericsMode::kReference);
  ASSERT_TRUE(options.round_bf16);
  const auto tokens = random_tokens(60, 21);
  CpuOps cpu(model.config());
  const std::vector<float> want = run_with_mtp(Forward(&model, options), tokens);

  SelfRoundingOps separate(&cpu, model.config(), /*claims=*/false, /*rounds=*/false);
  EXPECT_EQ(run_with_mtp(Forward(&model, options, &separate), tokens), want);
  SelfRoundingOps fused(&cpu, model.config(), /*claims=*/true, /*rounds=*/true);
  EXPECT_EQ(run_with_mtp(Forward(&model, options, &fused), tokens), want);
  EXPECT_EQ(fused.elementwise_calls_, separate.elementwise_calls_);
  EXPECT_GT(fused.elementwise_calls_, 0);
  EXPECT_EQ(separate.forward_rounds_ - fused.forward_rounds_, separate.elementwise_calls_);
  EXPECT_GT(fused.forward_rounds_, 0);  // the linears' and the attention's rounding stay

  SelfRoundingOps lying(&cpu, model.config(), /*claims=*/true, /*rounds=*/false);
  EXPECT_NE(run_with_mtp(Forward(&model, options, &lying), tokens), want);
  EXPECT_EQ(cpu.mark(), 0u);
}

// A backend that fuses mhc_pre with the block input's RMSNorm (Ops::fuses_mhc_pre_norm), wq_a
// with wkv (Ops::fuses_linear_pair) and the q / kv norms with their RoPE (Ops::fuses_norm_rope),
// as the CUDA backend does, is called through mhc_pre_norm (inside the mhc range, once per site
// and call), linear_pair (once per layer and call) and norm_rope (twice); with Ops' default
// implementations (the unfused ops and the forward's roundings) the logits are the unfused
// forward's bit for bit, in both numerics modes.
class FusingMhcNormOps final : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  bool fuses_mhc_pre_norm() const override { return true; }
  bool fuses_linear_pair() const override { return true; }
  bool fuses_norm_rope() const override { return true; }
  void norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t hd, float eps,
                 int64_t rd, const float* f, bool fp8, bool round) override {
    ++(w == nullptr ? norm_rope_q_calls_ : norm_rope_kv_calls_);
    Ops::norm_rope(x, w, rows, heads, hd, eps, rd, f, fp8, round);
  }
  int norm_rope_q_calls_ = 0, norm_rope_kv_calls_ = 0;
  void linear_pair(const float* x, int64_t rows, const cpu::LinearWeight& w0,
                   const cpu::LinearWeight& w1, bool q, float* y0, float* y1,
                   bool round) override {
    ++pair_calls_;
    Ops::linear_pair(x, rows, w0, w1, q, y0, y1, round);
  }
  int pair_calls_ = 0;
  void mhc_pre_norm(const cpu::MhcConfig& config, const cpu::MhcSiteWeights& weights,
                    const float* x, int64_t rows, const float* norm_weight, float eps, bool round,
                    float* u, float* post, float* comb) override {
    ++fused_calls_;
    if (!in_mhc_) ++outside_mhc_;
    Ops::mhc_pre_norm(config, weights, x, rows, norm_weight, eps, round, u, post, comb);
  }
  void component_begin(Component c) override {
    in_mhc_ = c == Component::kMhc;
    ForwardingOps::component_begin(c);
  }
  int fused_calls_ = 0, outside_mhc_ = 0;

 private:
  bool in_mhc_ = false;
};

TEST_P(ForwardOps, FusedOpsGiveTheUnfusedLogits) {
  const ModelWeights& model = tiny_model();
  const ForwardOptions options = ForwardOptions::for_mode(GetParam());
  CpuOps cpu(model.config());
  FusingMhcNormOps fusing(&cpu);
  const auto tokens = random_tokens(90, 23);
  const auto want = run_chunked(Forward(&model, options), tokens, {37, 1, 5});
  const auto got = run_chunked(Forward(&model, options, &fusing), tokens, {37, 1, 5});
  EXPECT_EQ(got, want);
  // Two sites per layer and forward call.
  EXPECT_GT(fusing.fused_calls_, 0);
  EXPECT_EQ(fusing.fused_calls_ % (2 * model.config().num_hidden_layers), 0);
  EXPECT_EQ(fusing.outside_mhc_, 0);
  EXPECT_EQ(2 * fusing.pair_calls_, fusing.fused_calls_);
  // One norm_rope for q and one for kv per layer and call.
  EXPECT_EQ(fusing.norm_rope_q_calls_, fusing.pair_calls_);
  EXPECT_EQ(fusing.norm_rope_kv_calls_, fusing.pair_calls_);
  EXPECT_EQ(cpu.mark(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, ForwardOps,
                         ::testing::Values(NumericsMode::kReference, NumericsMode::kHf),
                         [](const auto& info) {
                           return info.param == NumericsMode::kReference ? "reference" : "hf";
                         });

}  // namespace
}  // namespace ds::dsv4::test
