// The per-component profiler (profile.h) on the tiny model: every component range of a decode
// step and a prefill is timed, the ranges cover the measured step, each component carries the
// roofline's bytes/FLOPs for the same config (and every roofline row maps to a component), the
// JSON report holds the same numbers, and bad requests are errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <span>

#include <nlohmann/json.hpp>

#include "forward_test_util.h"
#include "model/deepseek_v4/cpu_ops.h"
#include "model/deepseek_v4/forwarding_ops.h"
#include "model/deepseek_v4/profile.h"

namespace ds::dsv4::test {
namespace {

ProfileRequest small_request() {
  ProfileRequest r;
  r.batch = 2;
  r.context = 140;  // past the first ratio-128 entry: every layer kind has compressed entries
  r.steps = 3;
  r.warmup_steps = 1;
  r.prefill_tokens = 64;
  return r;
}

TEST(Profile, DecodeAndPrefillComponentsCoverTheStep) {
  const ModelWeights& model = tiny_model();
  CpuOps cpu(model.config());
  auto result = run_profile(model, ForwardOptions::for_mode(cpu::NumericsMode::kReference), &cpu,
                            "cpu", small_request());
  ASSERT_TRUE(result.ok()) << result.status().message();
  for (const PhaseProfile* p : {&result->decode, &result->prefill}) {
    SCOPED_TRACE(p->phase);
    ASSERT_EQ(p->components.size(), size_t(kNumComponents));
    EXPECT_GT(p->step_s, 0);
    // The ranges are inside the measured call, and the call is almost all ranges (the rest is
    // validation and the plan layout, a few percent at most even on a loaded machine; issue #10
    // asks for 5% on the GPU, where the step overhead range covers the host work).
    EXPECT_LE(p->covered_s, p->step_s * 1.0001);
    EXPECT_GE(p->covered_s, p->step_s * 0.90);
    for (const ComponentProfile& cp : p->components) {
      // No MTP layer runs, and a single rank has no collectives.
      if (cp.component == Component::kMtpInput || cp.component == Component::kCollective) {
        EXPECT_EQ(cp.ranges, 0);
        continue;
      }
      EXPECT_GT(cp.ranges, 0) << component_name(cp.component);
      EXPECT_GT(cp.seconds, 0) << component_name(cp.component);
      if (cp.component == Component::kStep) {  // host work: no roofline bytes, no floor
        EXPECT_EQ(cp.bytes, 0);
        EXPECT_EQ(cp.floor_s, 0);
        continue;
      }
      if (cp.component != Component::kAttention) {
        EXPECT_GT(cp.bytes, 0) << component_name(cp.component);
      }
      EXPECT_GT(cp.floor_s, 0) << component_name(cp.component);
    }
    EXPECT_GT(p->floor_s, 0);
  }
  EXPECT_EQ(result->decode.tokens, 2);
  EXPECT_EQ(result->prefill.tokens, 64);
  // Routed experts dominate the roofline bytes of a decode step even on the tiny model.
  const ComponentProfile& moe = result->decode.components[size_t(Component::kMoe)];
  for (const ComponentProfile& cp : result->decode.components) EXPECT_LE(cp.bytes, moe.bytes);

  ASSERT_EQ(setenv("DS_COMMIT", "abc1234+uncommitted", 1), 0);
  const auto json = nlohmann::json::parse(profile_to_json(*result, "tiny"));
  unsetenv("DS_COMMIT");
  EXPECT_EQ(json["commit"], "abc1234+uncommitted");
  EXPECT_EQ(json["date"].get<std::string>().size(), 20u) << json["date"];  // 2026-11-30T03:06:00Z
  EXPECT_EQ(nlohmann::json::parse(profile_to_json(*result, "tiny"))["commit"], "unknown");
  EXPECT_EQ(json["decode"]["components"].size(), size_t(kNumComponents));
  EXPECT_DOUBLE_EQ(json["decode"]["step_s"].get<double>(), result->decode.step_s);
  EXPECT_EQ(json["decode"]["components"][size_t(Component::kMoe)]["component"], "moe");
  const std::string text = format_profile_report(*result, "tiny");
  EXPECT_NE(text.find("sparse attention"), std::string::npos);
  EXPECT_NE(text.find("components cover"), std::string::npos);
}

// A backend that times its ranges itself (Ops::take_component_times, as CudaOps does with
// events): 2 ms of "device time" per range of a component it saw, nothing for the step-overhead
// ranges (host work). The profile must report those times, not its host clock's, for every
// component but the step overhead, drop what the backend timed before the timed steps (cache
// fill, warm-up), and say so in the report and the JSON, even when told the steps replayed.
class SelfTimingOps final : public ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void component_end(Component c) override {
    ForwardingOps::component_end(c);
    if (c != Component::kStep) ++pending_[size_t(c)];
  }
  bool take_component_times(std::span<double> seconds, std::span<int64_t> ranges) override {
    for (size_t c = 0; c < pending_.size(); ++c) {
      seconds[c] += 2e-3 * double(pending_[c]);
      ranges[c] += pending_[c];
    }
    pending_.fill(0);
    ++takes;
    return true;
  }
  int takes = 0;

 private:
  std::array<int64_t, kNumComponents> pending_{};
};

TEST(Profile, ABackendsDeviceTimesReplaceTheHostClock) {
  const ModelWeights& model = tiny_model();
  CpuOps cpu(model.config());
  SelfTimingOps self_timing(&cpu);
  ProfileRequest req = small_request();
  req.step_time_only = true;  // as `--graphs --event-timing` asks
  auto result = run_profile(model, ForwardOptions::for_mode(cpu::NumericsMode::kReference),
                            &self_timing, "cuda", req);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_FALSE(result->request.step_time_only);
  EXPECT_NE(result->request.component_timing.find("device events"), std::string::npos);
  EXPECT_GE(self_timing.takes, 3);  // reset before decode, decode, reset + prefill
  for (const PhaseProfile* p : {&result->decode, &result->prefill}) {
    SCOPED_TRACE(p->phase);
    for (const ComponentProfile& cp : p->components) {
      if (cp.component == Component::kStep) {
        EXPECT_GT(cp.seconds, 0);  // the host clock's (the fake gives it nothing)
        continue;
      }
      // Exactly the backend's 2 ms per range per step, whatever the host clock read.
      EXPECT_NEAR(cp.seconds, 2e-3 * double(cp.ranges), 1e-12) << component_name(cp.component);
    }
  }
  const ComponentProfile& moe = result->decode.components[size_t(Component::kMoe)];
  EXPECT_GT(moe.ranges, 0);
  const auto json = nlohmann::json::parse(profile_to_json(*result, "tiny"));
  EXPECT_TRUE(json["components_timed"].get<bool>());
  EXPECT_NE(json["component_timing"].get<std::string>().find("device events"), std::string::npos);
  EXPECT_EQ(json["decode"]["components"].size(), size_t(kNumComponents));
  EXPECT_NE(format_profile_report(*result, "tiny").find("device events"), std::string::npos);

  // A backend that does not time (CpuOps): the host clock, and the report says so.
  auto host = run_profile(model, ForwardOptions::for_mode(cpu::NumericsMode::kReference), &cpu,
                          "cpu", small_request());
  ASSERT_TRUE(host.ok());
  // Same ranges per step as the host-timed run: the fill's and warm-up's were dropped.
  for (int c = 0; c < kNumComponents; ++c) {
    EXPECT_EQ(result->decode.components[size_t(c)].ranges,
              host->decode.components[size_t(c)].ranges)
        << component_name(Component(c));
  }
  EXPECT_EQ(nlohmann::json::parse(profile_to_json(*host, "tiny"))["component_timing"],
            "host clock, synchronized ranges");
}

TEST(Profile, EveryRooflineRowBelongsToAComponent) {
  // Rows of a step with MTP speculation on include the MTP rows; each must map to the component
  // whose ops do that work (a typo in a row name would land in "moe", the fallback).
  RooflineRequest rr;
  rr.mtp_draft_tokens = 1;
  auto roof = compute_roofline(tiny_model().config(), rr);
  ASSERT_TRUE(roof.ok());
  for (const RooflineRow& row : roof->decode.rows) {
    const Component c = component_of_roofline_row(row.component);
    const bool moe_row = row.component == "gate" || row.component == "hash routing rows" ||
                         row.component == "shared expert" || row.component == "routed experts" ||
                         row.component == "MTP routed experts";
    if (moe_row) {
      EXPECT_EQ(c, row.component == "MTP routed experts" ? Component::kMtpInput : Component::kMoe)
          << row.component;
    } else {
      EXPECT_NE(c, Component::kMoe) << row.component;
    }
  }
}

TEST(Profile, BadRequestsAreErrors) {
  const ModelWeights& model = tiny_model();
  CpuOps cpu(model.config());
  const ForwardOptions options = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  ProfileRequest r = small_request();
  r.batch = 0;
  EXPECT_FALSE(run_profile(model, options, &cpu, "cpu", r).ok());
  r = small_request();
  r.context = model.config().max_position_embeddings;
  EXPECT_FALSE(run_profile(model, options, &cpu, "cpu", r).ok());
  r = small_request();
  r.steps = 0;
  EXPECT_FALSE(run_profile(model, options, &cpu, "cpu", r).ok());
  EXPECT_EQ(cpu.mark(), 0u);
}

}  // namespace
}  // namespace ds::dsv4::test
