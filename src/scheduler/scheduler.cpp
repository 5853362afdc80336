// Continuous-batching scheduler (see scheduler.h).
#include "scheduler/scheduler.h"

#include <algorithm>

namespace ds::sched {

Scheduler::Scheduler(SchedulerConfig config, runtime::KvCacheManager* kv)
    : config_(config), kv_(kv) {
  config_.max_num_seqs = std::max<int64_t>(1, config_.max_num_seqs);
  config_.max_num_batched_tokens = std::max<int64_t>(1, config_.max_num_batched_tokens);
}

void Scheduler::add(SchedSeq* seq) {
  seq->queued = true;
  seq->running = false;
  waiting_.push_back(seq);
}

void Scheduler::remove(SchedSeq* seq) {
  if (seq->running) {
    running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
    seq->running = false;
  }
  if (seq->queued) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
    seq->queued = false;
  }
  kv_->free(seq->id);
}

void Scheduler::preempt(SchedSeq* victim, StepPlan* plan, int64_t* budget) {
  for (auto it = plan->chunks.begin(); it != plan->chunks.end(); ++it) {
    if (it->seq == victim) {
      *budget += it->count;
      plan->num_tokens -= it->count;
      plan->chunks.erase(it);
      break;
    }
  }
  running_.erase(std::remove(running_.begin(), running_.end(), victim), running_.end());
  kv_->free(victim->id);
  victim->running = false;
  victim->num_computed = 0;
  victim->draft.clear();
  ++victim->num_preemptions;
  ++num_preemptions_;
  victim->queued = true;
  waiting_.push_front(victim);
  plan->preempted.push_back(victim);
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  std::vector<SchedSeq*> done;  // scheduled this step
  auto scheduled = [&](SchedSeq* s) {
    return std::find(done.begin(), done.end(), s) != done.end();
  };

  for (int phase = 0; phase < 2; ++phase) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      SchedSeq* seq = running_[i];
      if (scheduled(seq)) continue;
      const int64_t remaining = seq->remaining();
      if (remaining <= 0) continue;
      const bool decode = remaining == 1;
      if ((phase == 0) != decode) continue;
      const int64_t want = decode ? 1 + int64_t(seq->draft.size()) : remaining;
      const int64_t n = std::min(want, budget);
      bool preempted_self = false;
      while (!kv_->grow(seq->id, seq->num_computed + n)) {
        SchedSeq* victim = running_.back();
        preempt(victim, &plan, &budget);
        if (victim == seq) {
          preempted_self = true;
          break;
        }
      }
      if (preempted_self) break;  // seq was the newest: nothing after it runs
      plan.chunks.push_back({seq, seq->num_computed, n, n >= remaining, decode ? n - 1 : 0});
      plan.num_tokens += n;
      budget -= n;
      done.push_back(seq);
    }
  }

  while (!waiting_.empty() && int64_t(running_.size()) < config_.max_num_seqs && budget > 0) {
    SchedSeq* seq = waiting_.front();
    const int64_t n = std::min(seq->remaining(), budget);
    if (n <= 0 || !kv_->can_admit(seq->num_computed + n)) break;
    kv_->allocate(seq->id);
    kv_->grow(seq->id, seq->num_computed + n);
    waiting_.pop_front();
    seq->queued = false;
    seq->running = true;
    running_.push_back(seq);
    plan.chunks.push_back({seq, seq->num_computed, n, n == seq->remaining()});
    plan.num_tokens += n;
    budget -= n;
  }
  return plan;
}

void Scheduler::commit(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) c.seq->num_computed += c.count - c.num_draft;
}

}  // namespace ds::sched
