// ModelRunner (src/runtime/model_runner.h) on CPU ranks: the tensor/expert-parallel runner gives
// exactly what hand-built rank threads over the same shards give (the runner adds only threads,
// per-rank states and error handling), keeps ranks' sequence states in step across releases and
// restarts, reports an error every rank sees alike and stays usable, and when one rank fails
// alone it releases the rank left waiting in an all-reduce (no hang) and refuses later calls.
// The profiler through two ranks. Configurations a model or machine cannot take are clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "forward/forward_test_util.h"
#include "model/deepseek_v4/cpu_ops.h"
#include "model/deepseek_v4/forwarding_ops.h"
#include "model/deepseek_v4/profile.h"
#include "model/deepseek_v4/sharding.h"
#include "runtime/model_runner.h"

namespace ds::runtime {
namespace {

using dsv4::ChunkOutput;
using dsv4::ForwardOptions;
using dsv4::SequenceChunk;
using dsv4::SequenceState;
using dsv4::test::random_tokens;
using dsv4::test::tiny_model;

const ForwardOptions& options() {
  static const ForwardOptions o = ForwardOptions::for_mode(cpu::NumericsMode::kReference);
  return o;
}

std::unique_ptr<ModelRunner> make_runner(int world, RankOpsWrapper wrap = {},
                                         double grace_s = 20) {
  ParallelConfig p;
  p.tensor_parallel_size = world;
  p.failure_grace_s = grace_s;
  auto r = make_model_runner("cpu", tiny_model(), options(), BackendLimits{}, p, std::move(wrap));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Two sequences of different lengths: prefills of 37 and 90 tokens, then 12 decode steps of
// both together; the first sequence is then released and restarted (same state object) with a
// prefill of 20 tokens and 3 decode steps next to the second. Returns every logits row in order.
std::vector<float> drive(ModelRunner* runner) {
  const std::vector<int32_t> a = random_tokens(60, 11), b = random_tokens(110, 12);
  SequenceState sa = runner->new_sequence(), sb = runner->new_sequence();
  std::vector<float> logits;
  std::vector<ChunkOutput> out;
  auto step = [&](std::vector<SequenceChunk> batch) {
    const Status st = runner->run(std::span<SequenceChunk>(batch), &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    for (const ChunkOutput& o : out) logits.insert(logits.end(), o.logits.begin(), o.logits.end());
  };
  step({{&sa, std::span<const int32_t>(a.data(), 37), {36}},
        {&sb, std::span<const int32_t>(b.data(), 90), {0, 89}}});
  for (int i = 0; i < 12; ++i) {
    step({{&sa, std::span<const int32_t>(a.data() + 37 + i, 1), {0}},
          {&sb, std::span<const int32_t>(b.data() + 90 + i, 1), {0}}});
  }
  runner->release_sequence(&sa);
  sa = runner->new_sequence();
  step({{&sa, std::span<const int32_t>(a.data() + 40, 20), {19}}});
  for (int i = 0; i < 3; ++i) {
    step({{&sa, std::span<const int32_t>(a.data() + 50 + i, 1), {0}},
          {&sb, std::span<const int32_t>(b.data() + 102 + i, 1), {0}}});
  }
  runner->release_sequence(&sa);
  runner->release_sequence(&sb);
  return logits;
}

// The same schedule on hand-built rank threads: shard_model, a CpuOps per rank and the host
// all-reduce, as tests/forward/test_forward_sharded.cpp checks against the single rank.
std::vector<float> drive_by_hand(int world) {
  std::vector<std::unique_ptr<dsv4::ModelWeights>> shards;
  for (int r = 0; r < world; ++r) {
    dsv4::ShardSpec spec;
    spec.world_size = world;
    spec.rank = r;
    auto s = dsv4::shard_model(tiny_model(), spec);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return {};
    shards.push_back(std::move(s).value());
  }
  HostCommunicator comm(world);
  class Link final : public dsv4::ForwardingOps {
   public:
    Link(dsv4::Ops* inner, HostCommunicator* c, int r) : ForwardingOps(inner), c_(c), r_(r) {}
    void all_reduce_sum(float* x, int64_t n) override { EXPECT_TRUE(c_->all_reduce_sum(r_, x, n)); }

   private:
    HostCommunicator* c_;
    int r_;
  };
  std::vector<std::vector<float>> logits(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      dsv4::CpuOps cpu(shards[size_t(r)]->config());
      Link link(&cpu, &comm, r);
      // A one-rank runner over this rank's shard: drive() needs the runner interface.
      auto local = make_model_runner("cpu", *shards[size_t(r)], options(), BackendLimits{},
                                     ParallelConfig{},
                                     [&](int, dsv4::Ops*) -> dsv4::Ops* { return &link; });
      ASSERT_TRUE(local.ok()) << local.status().to_string();
      logits[size_t(r)] = drive(local->get());
    });
  }
  for (std::thread& t : threads) t.join();
  return logits[0];
}

TEST(ModelRunner, TwoCpuRanksMatchHandBuiltRankThreadsBitForBit) {
  auto runner = make_runner(2);
  ASSERT_NE(runner, nullptr);
  EXPECT_EQ(runner->world_size(), 2);
  EXPECT_EQ(runner->config().num_attention_heads, tiny_model().config().num_attention_heads);
  EXPECT_FALSE(runner->kv_capacity().has_value());  // CPU ranks: growable host state
  EXPECT_NE(runner->describe().find("cpu x2"), std::string::npos) << runner->describe();
  const std::vector<float> got = drive(runner.get());
  const std::vector<float> want = drive_by_hand(2);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_GT(got.size(), 0u);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  // A second pass on the same runner (states released and made anew) gives the same again.
  EXPECT_EQ(drive(runner.get()), got);
}

TEST(ModelRunner, AnErrorEveryRankSeesIsReturnedAndTheRunnerStaysUsable) {
  auto runner = make_runner(2);
  ASSERT_NE(runner, nullptr);
  SequenceState s = runner->new_sequence();
  const std::vector<int32_t> bad = {5, int32_t(tiny_model().config().vocab_size)};
  std::vector<ChunkOutput> out;
  std::vector<SequenceChunk> batch = {{&s, bad, {1}}};
  const Status st = runner->run(std::span<SequenceChunk>(batch), &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  const std::vector<int32_t> good = random_tokens(8, 3);
  batch = {{&s, good, {7}}};
  const Status ok = runner->run(std::span<SequenceChunk>(batch), &out);
  EXPECT_TRUE(ok.ok()) << ok.to_string();
  EXPECT_EQ(s.position(), 8);
  runner->release_sequence(&s);
}

// Rank 1 fails in its third step and stops taking part in the all-reduces: rank 0 would wait
// in its first all-reduce forever; the runner aborts the group after the grace period.
class FailingOps final : public dsv4::ForwardingOps {
 public:
  FailingOps(dsv4::Ops* inner, int fail_at_step) : ForwardingOps(inner), fail_at_(fail_at_step) {}
  void begin_step(const dsv4::StepPlan& plan) override {
    failing_ = ++steps_ >= fail_at_;
    ForwardingOps::begin_step(plan);
  }
  void all_reduce_sum(float* x, int64_t n) override {
    if (!failing_) ForwardingOps::all_reduce_sum(x, n);
  }
  Status step_status() const override {
    if (failing_) return internal_error("injected device fault");
    return ForwardingOps::step_status();
  }

 private:
  int fail_at_;
  int steps_ = 0;
  bool failing_ = false;
};

TEST(ModelRunner, ARankFailingAloneAbortsTheGroupInsteadOfHanging) {
  std::unique_ptr<FailingOps> failing;
  auto runner = make_runner(
      2,
      [&](int rank, dsv4::Ops* ops) -> dsv4::Ops* {
        if (rank != 1) return nullptr;
        failing = std::make_unique<FailingOps>(ops, 3);
        return failing.get();
      },
      /*grace_s=*/0.5);
  ASSERT_NE(runner, nullptr);
  SequenceState s = runner->new_sequence();
  const std::vector<int32_t> tokens = random_tokens(40, 5);
  std::vector<ChunkOutput> out;
  for (int step = 1; step <= 2; ++step) {
    std::vector<SequenceChunk> batch = {
        {&s, std::span<const int32_t>(tokens.data() + step * 10, 10), {9}}};
    ASSERT_TRUE(runner->run(std::span<SequenceChunk>(batch), &out).ok()) << step;
  }
  std::vector<SequenceChunk> batch = {{&s, std::span<const int32_t>(tokens.data() + 30, 1), {0}}};
  const Status st = runner->run(std::span<SequenceChunk>(batch), &out);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("injected device fault"), std::string::npos) << st.message();
  // Every later call fails the same way, at once.
  const Status again = runner->run(std::span<SequenceChunk>(batch), &out);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runner->checkpoint(&s, false, 1).code(), StatusCode::kFailedPrecondition);
  runner->release_sequence(&s);  // no hang, nothing to do
}

// `deepserve profile --tp 2` on CPU ranks: the per-component times are rank 0's and include the
// all-reduces ("collectives"); the per-rank floors halve the split components (attention
// projections, MoE) and keep the replicated ones; --graphs reports the step time only.
TEST(ModelRunner, ProfileThroughTwoRanksTimesTheCollectives) {
  auto profile = [](int world, bool step_only) {
    std::vector<std::unique_ptr<dsv4::ProfilingOps>> timers(static_cast<size_t>(world));
    ParallelConfig p;
    p.tensor_parallel_size = world;
    auto runner = make_model_runner("cpu", tiny_model(), options(), BackendLimits{}, p,
                                    [&](int rank, dsv4::Ops* ops) -> dsv4::Ops* {
                                      timers[size_t(rank)] =
                                          std::make_unique<dsv4::ProfilingOps>(ops);
                                      return timers[size_t(rank)].get();
                                    });
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
    dsv4::ProfileTarget target;
    ModelRunner& r = **runner;
    target.new_sequence = [&r] { return r.new_sequence(); };
    target.run = [&r](std::span<SequenceChunk> b, std::vector<ChunkOutput>* o) {
      return r.run(b, o);
    };
    target.timer = timers[0].get();
    target.world_size = world;
    dsv4::ProfileRequest req;
    req.batch = 2;
    req.context = 40;
    req.steps = 2;
    req.step_time_only = step_only;
    auto result = dsv4::run_profile(tiny_model().config(), target, "cpu", req);
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    return std::move(result).value();
  };
  const dsv4::ProfileResult one = profile(1, false), two = profile(2, false);
  auto row = [](const dsv4::ProfileResult& r, dsv4::Component c) {
    return r.decode.components[size_t(c)];
  };
  EXPECT_EQ(row(one, dsv4::Component::kCollective).ranges, 0);
  EXPECT_GT(row(two, dsv4::Component::kCollective).ranges, 0);
  EXPECT_GT(row(two, dsv4::Component::kCollective).seconds, 0);
  for (auto c : {dsv4::Component::kAttentionProjections, dsv4::Component::kMoe}) {
    EXPECT_DOUBLE_EQ(row(two, c).bytes, row(one, c).bytes / 2) << dsv4::component_name(c);
  }
  EXPECT_DOUBLE_EQ(row(two, dsv4::Component::kMhc).bytes, row(one, dsv4::Component::kMhc).bytes);
  EXPECT_LT(two.decode.floor_s, one.decode.floor_s);
  EXPECT_EQ(two.world_size, 2);
  const std::string text = dsv4::format_profile_report(two, "tiny");
  EXPECT_NE(text.find("ranks: 2"), std::string::npos) << text;
  EXPECT_NE(text.find("collectives"), std::string::npos) << text;

  const dsv4::ProfileResult fast = profile(2, true);
  const std::string brief = dsv4::format_profile_report(fast, "tiny");
  EXPECT_EQ(brief.find("time/floor"), std::string::npos) << brief;
  EXPECT_NE(brief.find("components not timed"), std::string::npos) << brief;
  const auto json = nlohmann::json::parse(dsv4::profile_to_json(fast, "tiny"));
  EXPECT_FALSE(json["components_timed"].get<bool>());
  EXPECT_FALSE(json["decode"].contains("components"));
  EXPECT_GT(json["decode"]["step_s"].get<double>(), 0);
}

TEST(ModelRunner, SplitsTheModelOrMachineCannotTakeAreClearErrors) {
  ParallelConfig p;
  for (int world : {0, -1, 65}) {
    p.tensor_parallel_size = world;
    auto r = make_model_runner("cpu", tiny_model(), options(), BackendLimits{}, p);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--tensor-parallel-size"), std::string::npos);
  }
  p.tensor_parallel_size = 3;  // tiny: heads and experts do not divide by 3
  auto three = make_model_runner("cpu", tiny_model(), options(), BackendLimits{}, p);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(three.status().message().find("--tensor-parallel-size 3"), std::string::npos)
      << three.status().message();
  p.tensor_parallel_size = 2;
  auto tpu = make_model_runner("tpu", tiny_model(), options(), BackendLimits{}, p);
  ASSERT_FALSE(tpu.ok());
  EXPECT_EQ(tpu.status().code(), StatusCode::kInvalidArgument);
  // 64 GPU ranks: the split, the GPU count or a build without CUDA refuses it, before anything
  // is allocated.
  p.tensor_parallel_size = 64;
  auto cuda = make_model_runner("cuda", tiny_model(), options(), BackendLimits{}, p);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kInvalidArgument) << cuda.status().to_string();
}

}  // namespace
}  // namespace ds::runtime
