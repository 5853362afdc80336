// Unit tests of the Prometheus text (names, histogram buckets) and the API-key helpers (AU1, AU2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <sstream>

#include "server/auth.h"
#include "server/metrics.h"

namespace ds::server {
namespace {

// name{labels} -> value, from exposition text.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(5.0);
  std::string text;
  h.render(&text, "x_seconds", "help", "a=\"b\"");
  auto s = Samples(text);
  EXPECT_EQ(s["x_seconds_bucket{a=\"b\",le=\"0.1\"}"], 1);
  EXPECT_EQ(s["x_seconds_bucket{a=\"b\",le=\"1\"}"], 3);
  EXPECT_EQ(s["x_seconds_bucket{a=\"b\",le=\"+Inf\"}"], 4);
  EXPECT_EQ(s["x_seconds_count{a=\"b\"}"], 4);
  EXPECT_DOUBLE_EQ(s["x_seconds_sum{a=\"b\"}"], 6.05);
  EXPECT_NE(text.find("# TYPE x_seconds histogram"), std::string::npos);
}

TEST(Metrics, VllmNamesUnderOurPrefix) {
  ServerMetrics m;
  deepserve::EngineMetrics e;
  e.num_requests_running = 3;
  e.num_requests_waiting = 2;
  e.kv_cache_usage = 0.25;
  e.prompt_tokens_total = 100;
  e.generation_tokens_total = 50;
  e.spec_draft_tokens_total = 9;
  e.spec_accepted_tokens_total = 7;
  e.num_preemptions_total = 4;
  e.engine_steps_total = 12;
  e.prefill_steps_total = 5;
  e.step_schedule_seconds_total = 0.25;
  e.step_forward_seconds_total = 1.5;
  e.step_sample_seconds_total = 0.125;
  e.step_emit_seconds_total = 0.0625;
  e.step_speculate_seconds_total = 2.5;
  e.step_decode_tokens_total = 40;
  e.step_prefill_tokens_total = 300;
  m.time_to_first_token.observe(0.2);
  m.count_finished(deepserve::FinishReason::kStop);
  const std::string text = m.render(&e, "tiny\"model");
  auto s = Samples(text);
  const std::string l = "{model_name=\"tiny\\\"model\"}";
  EXPECT_EQ(s["deepserve:num_requests_running" + l], 3);
  EXPECT_EQ(s["deepserve:num_requests_waiting" + l], 2);
  EXPECT_EQ(s["deepserve:kv_cache_usage_perc" + l], 0.25);
  EXPECT_EQ(s["deepserve:prompt_tokens_total" + l], 100);
  EXPECT_EQ(s["deepserve:generation_tokens_total" + l], 50);
  EXPECT_EQ(s["deepserve:num_preemptions_total" + l], 4);
  EXPECT_EQ(s["deepserve:spec_decode_num_draft_tokens_total" + l], 9);
  EXPECT_EQ(s["deepserve:spec_decode_num_accepted_tokens_total" + l], 7);
  EXPECT_EQ(s["deepserve:engine_steps_total" + l], 12);
  EXPECT_EQ(s["deepserve:engine_prefill_steps_total" + l], 5);
  const std::string ml = "{model_name=\"tiny\\\"model\",";
  EXPECT_EQ(s["deepserve:engine_step_seconds_total" + ml + "phase=\"schedule\"}"], 0.25);
  EXPECT_EQ(s["deepserve:engine_step_seconds_total" + ml + "phase=\"forward\"}"], 1.5);
  EXPECT_EQ(s["deepserve:engine_step_seconds_total" + ml + "phase=\"sample\"}"], 0.125);
  EXPECT_EQ(s["deepserve:engine_step_seconds_total" + ml + "phase=\"emit\"}"], 0.0625);
  EXPECT_EQ(s["deepserve:engine_step_seconds_total" + ml + "phase=\"speculate\"}"], 2.5);
  EXPECT_EQ(s["deepserve:engine_step_tokens_total" + ml + "kind=\"decode\"}"], 40);
  EXPECT_EQ(s["deepserve:engine_step_tokens_total" + ml + "kind=\"prefill\"}"], 300);
  EXPECT_EQ(s["deepserve:time_to_first_token_seconds_count" + l], 1);
  EXPECT_EQ(s.count("deepserve:inter_token_latency_seconds_count" + l), 1u);
  EXPECT_EQ(s.count("deepserve:e2e_request_latency_seconds_count" + l), 1u);
  EXPECT_EQ(
      s["deepserve:request_success_total{model_name=\"tiny\\\"model\",finished_reason=\"stop\"}"],
      1);
  // Every sample line belongs to a declared metric family.
  std::istringstream in(text);
  std::string line;
  std::string family;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) family = line.substr(7, line.find(' ', 7) - 7);
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind(family, 0), 0u) << line;
  }
}

// The heap gauge follows live allocations (the load test's leak check relies on it) and both
// process gauges are in the exposition.
TEST(Metrics, ProcessMemoryFollowsLiveAllocations) {
  const ProcessMemory before = process_memory();
  ASSERT_GT(before.resident_bytes, 0);
  ASSERT_GE(before.heap_allocated_bytes, 0) << "no allocator statistics on this platform";
  constexpr size_t kBytes = size_t(48) << 20;
  auto* block = static_cast<volatile unsigned char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  for (size_t i = 0; i < kBytes; i += 4096) block[i] = static_cast<unsigned char>(i >> 12);
  const ProcessMemory held = process_memory();
  std::free(const_cast<unsigned char*>(block));
  const ProcessMemory after = process_memory();
  EXPECT_GE(held.heap_allocated_bytes - before.heap_allocated_bytes, int64_t(kBytes));
  EXPECT_GE(held.resident_bytes - before.resident_bytes, int64_t(kBytes) / 2);
  EXPECT_LE(after.heap_allocated_bytes, held.heap_allocated_bytes - int64_t(kBytes));

  ServerMetrics m;
  auto s = Samples(m.render(nullptr, "tiny"));
  EXPECT_GT(s["process_resident_memory_bytes"], 0);
  EXPECT_GT(s["deepserve:heap_allocated_bytes{model_name=\"tiny\"}"], 0);
}

TEST(AU2, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(constant_time_equal("secret", "secret2"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), "a"));
}

TEST(AU1, PresentedKeys) {
  const std::string k = "sk-test";
  EXPECT_TRUE(api_key_matches("", {}, {}));
  EXPECT_TRUE(api_key_matches(k, {"Bearer sk-test"}, {}));
  EXPECT_TRUE(api_key_matches(k, {}, {"sk-test"}));
  EXPECT_TRUE(api_key_matches(k, {"Bearer sk-test"}, {"sk-test"}));
  EXPECT_FALSE(api_key_matches(k, {}, {}));
  EXPECT_FALSE(api_key_matches(k, {"Bearer wrong"}, {}));
  EXPECT_FALSE(api_key_matches(k, {"Bearer "}, {}));
  EXPECT_FALSE(api_key_matches(k, {"sk-test"}, {}));
  EXPECT_FALSE(api_key_matches(k, {"Basic sk-test"}, {}));
  EXPECT_FALSE(api_key_matches(k, {"Bearer sk-test", "Bearer sk-test"}, {}));
  EXPECT_FALSE(api_key_matches(k, {}, {""}));
  EXPECT_FALSE(api_key_matches(k, {"Bearer sk-test"}, {"other"}));
}

}  // namespace
}  // namespace ds::server
