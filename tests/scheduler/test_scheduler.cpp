// Continuous-batching scheduler on a hand-sized KV cache: token budget and chunked prefill,
// decode before prefill, max_num_seqs, preemption of the newest sequence with re-queueing at the
// front and recomputation, all pools back to baseline after remove().
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "model/config.h"
#include "scheduler/scheduler.h"

namespace ds::sched {
namespace {

std::unique_ptr<SchedSeq> make_seq(uint64_t id, int64_t prompt) {
  auto s = std::make_unique<SchedSeq>();
  s->id = id;
  s->tokens.resize(size_t(prompt));
  std::iota(s->tokens.begin(), s->tokens.end(), 100 + int32_t(id));
  s->num_prompt = prompt;
  return s;
}

// What the engine does after a step: commit, then append a token to every sampled sequence.
void finish_step(Scheduler* s, const StepPlan& plan) {
  s->commit(plan);
  for (const auto& c : plan.chunks) {
    if (c.samples) c.seq->tokens.push_back(7);
  }
}

runtime::KvGeometry geo() {
  return runtime::KvGeometry::from_config(tiny_config());
}

TEST(Scheduler, ChunkedPrefillUnderTokenBudget) {
  runtime::KvCacheManager kv(geo(), {100, 100, 100}, 8);
  Scheduler s({8, 256}, &kv);
  auto a = make_seq(1, 300), b = make_seq(2, 100);
  s.add(a.get());
  s.add(b.get());
  StepPlan p1 = s.schedule();
  ASSERT_EQ(p1.chunks.size(), 1u);  // a takes the whole budget
  EXPECT_EQ(p1.chunks[0].seq, a.get());
  EXPECT_EQ(p1.chunks[0].count, 256);
  EXPECT_FALSE(p1.chunks[0].samples);
  EXPECT_EQ(p1.num_tokens, 256);
  finish_step(&s, p1);
  StepPlan p2 = s.schedule();
  ASSERT_EQ(p2.chunks.size(), 2u);  // a finishes its prompt, b starts
  EXPECT_EQ(p2.chunks[0].seq, a.get());
  EXPECT_EQ(p2.chunks[0].start, 256);
  EXPECT_EQ(p2.chunks[0].count, 44);
  EXPECT_TRUE(p2.chunks[0].samples);
  EXPECT_EQ(p2.chunks[1].seq, b.get());
  EXPECT_EQ(p2.chunks[1].count, 100);
  EXPECT_TRUE(p2.chunks[1].samples);
  finish_step(&s, p2);
  StepPlan p3 = s.schedule();  // both decode one token
  ASSERT_EQ(p3.chunks.size(), 2u);
  for (const auto& c : p3.chunks) EXPECT_EQ(c.count, 1);
  EXPECT_EQ(p3.chunks[0].start, 300);
}

TEST(Scheduler, DecodeBeforePrefillAndMaxNumSeqs) {
  runtime::KvCacheManager kv(geo(), {100, 100, 100}, 8);
  Scheduler s({2, 64}, &kv);
  auto a = make_seq(1, 10), b = make_seq(2, 200), c = make_seq(3, 5);
  s.add(a.get());
  StepPlan p = s.schedule();
  finish_step(&s, p);  // a now decodes
  s.add(b.get());
  s.add(c.get());
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].seq, a.get());  // decode first
  EXPECT_EQ(p.chunks[0].count, 1);
  EXPECT_EQ(p.chunks[1].seq, b.get());  // then a prefill chunk of what is left of the budget
  EXPECT_EQ(p.chunks[1].count, 63);
  EXPECT_EQ(s.num_running(), 2);  // max_num_seqs = 2: c waits
  EXPECT_EQ(s.num_waiting(), 1);
  finish_step(&s, p);
  s.remove(a.get());  // a finishes: a slot is free, but b's chunk takes the whole budget
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, b.get());
  EXPECT_EQ(p.chunks[0].count, 64);
  EXPECT_EQ(s.num_waiting(), 1);
  finish_step(&s, p);
  p = s.schedule();  // b has 73 left: 64 of them, c still waits (budget spent)
  ASSERT_EQ(p.chunks.size(), 1u);
  finish_step(&s, p);
  p = s.schedule();  // b: 9 tokens, then c is admitted with its 5
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].count, 9);
  EXPECT_TRUE(p.chunks[0].samples);
  EXPECT_EQ(p.chunks[1].seq, c.get());
  EXPECT_EQ(p.chunks[1].count, 5);
  EXPECT_EQ(s.num_waiting(), 0);
}

TEST(Scheduler, PreemptsNewestAndRecomputes) {
  // 3 pages per pool: a (400 tokens, 2 pages) and b (10 tokens, 1 page) fill the cache.
  runtime::KvCacheManager kv(geo(), {3, 3, 3}, 4);
  Scheduler s({4, 1024}, &kv);
  auto a = make_seq(1, 400), b = make_seq(2, 10);
  s.add(a.get());
  s.add(b.get());
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  finish_step(&s, p);
  // Decode until a crosses 512 positions and needs a third page that b holds.
  int steps = 0;
  while (a->num_computed + 1 <= 512) {
    p = s.schedule();
    ASSERT_TRUE(p.preempted.empty());
    finish_step(&s, p);
    ++steps;
  }
  EXPECT_EQ(steps, 112);
  const int64_t b_tokens = int64_t(b->tokens.size());
  p = s.schedule();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], b.get());  // the newest is the victim
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(s.num_preemptions(), 1);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.waiting().front(), b.get());
  ASSERT_EQ(p.chunks.size(), 1u);  // b does not run this step
  EXPECT_EQ(p.chunks[0].seq, a.get());
  EXPECT_EQ(kv.pages_free(runtime::KvPool::kCompressed4), 0);
  finish_step(&s, p);
  // a finishes: b is re-admitted and recomputes prompt + generated tokens in one chunk.
  s.remove(a.get());
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, b.get());
  EXPECT_EQ(p.chunks[0].start, 0);
  EXPECT_EQ(p.chunks[0].count, b_tokens);
  EXPECT_TRUE(p.chunks[0].samples);
  finish_step(&s, p);
  s.remove(b.get());
  for (const auto& st : kv.stats()) EXPECT_EQ(st.free, st.total) << st.name;
}

TEST(Scheduler, SelfPreemptionWhenNewestCannotGrow) {
  runtime::KvCacheManager kv(geo(), {2, 2, 2}, 4);
  Scheduler s({4, 4096}, &kv);
  auto a = make_seq(1, 300), b = make_seq(2, 100);
  s.add(a.get());
  s.add(b.get());
  StepPlan p = s.schedule();  // a: 2 pages, b: no page left -> waits
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(s.num_waiting(), 1);
  finish_step(&s, p);
  s.remove(a.get());
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, b.get());
  s.remove(b.get());
  // A lone sequence that outgrows the cache preempts itself (the engine refuses such requests
  // at arrival: fits_alone).
  EXPECT_FALSE(s.fits_alone(513));
  EXPECT_TRUE(s.fits_alone(512));
  auto c = make_seq(3, 512);
  s.add(c.get());
  p = s.schedule();
  finish_step(&s, p);
  p = s.schedule();  // position 512 needs a third page
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], c.get());
  EXPECT_TRUE(p.chunks.empty());
  s.remove(c.get());
  for (const auto& st : kv.stats()) EXPECT_EQ(st.free, st.total) << st.name;
}

TEST(Scheduler, RemoveWaitingAndRunningIsIdempotent) {
  runtime::KvCacheManager kv(geo(), {10, 10, 10}, 1);
  Scheduler s({1, 100}, &kv);
  auto a = make_seq(1, 10), b = make_seq(2, 10);
  s.add(a.get());
  s.add(b.get());
  StepPlan p = s.schedule();
  EXPECT_EQ(s.num_running(), 1);
  s.remove(b.get());  // waiting
  s.remove(b.get());
  s.remove(a.get());  // running
  s.remove(a.get());
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_TRUE(s.schedule().empty());
  for (const auto& st : kv.stats()) EXPECT_EQ(st.free, st.total) << st.name;
}

}  // namespace
}  // namespace ds::sched
