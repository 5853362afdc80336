// Numerics modes of the forward (dsv4-model.md §2): reference and hf differ exactly in the rows of
// the §2 table (cpu::NumericsFlags) plus the bf16 rounding of activations (on in reference mode,
// where REF keeps bf16 tensors; off in hf mode, whose goldens are fp32). Each item is switched on
// its own, starting from the reference options, and the test records which outputs change:
//   - fp8_kv_simulation, activation_quantization, round_bf16: every position's logits change;
//   - indexer_fp4_simulation: only the top-k selection can change (the indexer feeds nothing
//     else), so only positions with more visible CSA entries than index_topk (t >= 35 here) may
//     change, and some do on a 300-token sequence;
//   - router_renorm_epsilon (1e-20 added to a sum of order 1): no fp32 change at all;
//   - shared_expert_clamp: no change on the synthetic model, whose shared-expert pre-activations
//     stay far below swiglu_limit = 10 (the clamp itself is tested in tests/kernels).
// Switching every item gives hf mode exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "forward_test_util.h"

namespace ds::dsv4::test {
namespace {

using cpu::NumericsMode;

constexpr int64_t kLength = 300;

struct Diff {
  int64_t first_position = -1;  // first position whose logits differ, -1 if none
  int64_t positions_changed = 0;
  double max_abs = 0;
  double rms_diff = 0;             // over all logits
  double rms_logit = 0;            // of the first operand
  double median_position_max = 0;  // median over positions of max |dlogit|
};

Diff compare(const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  std::vector<double> per_position;
  for (int64_t p = 0; p < kLength; ++p) {
    bool changed = false;
    double position_max = 0;
    for (int64_t v = 0; v < kTinyVocab; ++v) {
      const size_t i = size_t(p * kTinyVocab + v);
      if (std::memcmp(&a[i], &b[i], 4) != 0) changed = true;
      d.max_abs = std::max(d.max_abs, double(std::fabs(a[i] - b[i])));
      position_max = std::max(position_max, double(std::fabs(a[i] - b[i])));
      d.rms_diff += double(a[i] - b[i]) * double(a[i] - b[i]);
      d.rms_logit += double(a[i]) * double(a[i]);
    }
    per_position.push_back(position_max);
    if (changed) {
      if (d.first_position < 0) d.first_position = p;
      ++d.positions_changed;
    }
  }
  std::sort(per_position.begin(), per_position.end());
  d.median_position_max = per_position[per_position.size() / 2];
  d.rms_diff = std::sqrt(d.rms_diff / double(a.size()));
  d.rms_logit = std::sqrt(d.rms_logit / double(a.size()));
  return d;
}

class ForwardModes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokens_ = random_tokens(kLength, 11);
    reference_ = logits(ForwardOptions::for_mode(NumericsMode::kReference));
  }
  static std::vector<float> logits(const ForwardOptions& options) {
    Forward f(&tiny_model(), options);
    return run_chunked(f, tokens_, {kLength});
  }
  static Diff toggled(const std::function<void(ForwardOptions*)>& toggle, const char* name) {
    ForwardOptions options = ForwardOptions::for_mode(NumericsMode::kReference);
    toggle(&options);
    const Diff d = compare(reference_, logits(options));
    std::printf(
        "[ modes  ] %-24s changes %3lld of %lld positions (first %lld), max |dlogit| %.3g, "
        "median %.3g, rms %.3g (rms logit %.3g)\n",
        name, (long long)d.positions_changed, (long long)kLength, (long long)d.first_position,
        d.max_abs, d.median_position_max, d.rms_diff, d.rms_logit);
    return d;
  }
  static inline std::vector<int32_t> tokens_;
  static inline std::vector<float> reference_;
};

TEST_F(ForwardModes, Fp8KvSimulationChangesEveryPosition) {
  const Diff d =
      toggled([](ForwardOptions* o) { o->flags.fp8_kv_simulation = false; }, "fp8_kv_simulation");
  EXPECT_EQ(d.positions_changed, kLength);
}

TEST_F(ForwardModes, ActivationQuantizationChangesEveryPosition) {
  const Diff d = toggled([](ForwardOptions* o) { o->flags.activation_quantization = false; },
                         "activation_quantization");
  EXPECT_EQ(d.positions_changed, kLength);
}

TEST_F(ForwardModes, Bf16RoundingChangesEveryPosition) {
  const Diff d = toggled([](ForwardOptions* o) { o->round_bf16 = false; }, "round_bf16");
  EXPECT_EQ(d.positions_changed, kLength);
}

TEST_F(ForwardModes, IndexerFp4SimulationOnlyChangesTheTopkSelection) {
  const Diff d = toggled([](ForwardOptions* o) { o->flags.indexer_fp4_simulation = false; },
                         "indexer_fp4_simulation");
  // index_topk 8: every visible entry is selected while floor((t+1)/4) <= 8, i.e. t < 35.
  const int64_t first_real_selection = 4 * (tiny_small_vocab_config().index_topk + 1) - 1;
  EXPECT_GT(d.positions_changed, 0);
  EXPECT_GE(d.first_position, first_real_selection);
}

TEST_F(ForwardModes, RouterEpsilonIsInvisibleInFp32) {
  const Diff d = toggled([](ForwardOptions* o) { o->flags.router_renorm_epsilon = 1e-20f; },
                         "router_renorm_epsilon");
  EXPECT_EQ(d.positions_changed, 0);
}

TEST_F(ForwardModes, SharedExpertClampIsInactiveOnTheSyntheticModel) {
  const Diff d = toggled([](ForwardOptions* o) { o->flags.shared_expert_clamp = true; },
                         "shared_expert_clamp");
  EXPECT_EQ(d.positions_changed, 0);
}

TEST_F(ForwardModes, AllItemsTogetherGiveHfMode) {
  ForwardOptions o = ForwardOptions::for_mode(NumericsMode::kReference);
  o.flags.fp8_kv_simulation = false;
  o.flags.indexer_fp4_simulation = false;
  o.flags.activation_quantization = false;
  o.flags.shared_expert_clamp = true;
  o.flags.router_renorm_epsilon = 1e-20f;
  o.round_bf16 = false;
  const auto hf = logits(ForwardOptions::for_mode(NumericsMode::kHf));
  EXPECT_EQ(std::memcmp(hf.data(), logits(o).data(), hf.size() * 4), 0);
  const Diff d = compare(reference_, hf);
  std::printf("[ modes  ] reference vs hf: max |dlogit| %.3g, rms dlogit %.3g (rms logit %.3g)\n",
              d.max_abs, d.rms_diff, d.rms_logit);
  EXPECT_EQ(d.positions_changed, kLength);
}

}  // namespace
}  // namespace ds::dsv4::test
