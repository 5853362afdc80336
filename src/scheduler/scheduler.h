// Continuous-batching scheduler (docs/engine.md "Scheduling policy"). Pure bookkeeping over the
// KV cache manager: it decides, once per engine step, which sequences advance by how many tokens;
// the engine runs the forward, then calls commit(). Per step, under max_num_batched_tokens and
// max_num_seqs:
//   1. running sequences that decode (one token left to feed, plus their speculative draft),
//      oldest first;
//   2. running sequences still prefilling, oldest first, each by a chunk up to the budget left;
//   3. waiting sequences, front first, admitted while a slot, the budget and the pages for their
//      first chunk are available (no preemption on behalf of a waiting sequence).
// When a running sequence cannot grow its pages, the newest running sequence is preempted (its
// KV freed, its chunk in this step dropped) and re-queued at the front of the waiting queue with
// num_computed = 0: it recomputes its prompt plus every token generated so far, so greedy output
// does not change. If the sequence that needs pages is itself the newest, it is preempted. The
// oldest running sequence is never preempted in favour of a newer one, so it always progresses
// (KV3); a sequence that cannot fit even alone is refused at arrival (see fits_alone).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "runtime/kv_cache.h"

namespace ds::sched {

// The scheduler's view of one request.
struct SchedSeq {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + generated so far
  int64_t num_prompt = 0;
  int64_t num_computed = 0;  // leading tokens whose KV is in the sequence state
  int64_t num_preemptions = 0;
  bool running = false;
  bool queued = false;  // in the waiting queue
  // Speculative decoding: draft tokens proposed after tokens.back() (not part of tokens). A
  // decoding sequence with a draft is scheduled as a verify chunk of 1 + draft.size() tokens
  // (fewer when the budget is short); preemption drops the draft.
  std::vector<int32_t> draft;

  int64_t remaining() const { return int64_t(tokens.size()) - num_computed; }
};

struct SchedulerConfig {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
};

struct ScheduledChunk {
  SchedSeq* seq = nullptr;
  int64_t start = 0;     // == seq->num_computed
  int64_t count = 0;     // tokens fed this step
  bool samples = false;  // the chunk reaches the end of seq->tokens: its last row is sampled
  // Speculative verify chunk: the last num_draft of the `count` tokens are seq->draft[0..); every
  // row is sampled. commit() counts only count - num_draft; the engine adds the accepted ones.
  int64_t num_draft = 0;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<SchedSeq*> preempted;  // their states must be reset before they run again
  int64_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, runtime::KvCacheManager* kv);

  // True when a sequence of `total_tokens` positions fits the KV cache alone.
  bool fits_alone(int64_t total_tokens) const { return kv_->can_ever_fit(total_tokens); }

  // Queues a new sequence at the back of the waiting queue.
  void add(SchedSeq* seq);
  // Removes a sequence wherever it is (waiting or running) and frees its KV. Idempotent.
  void remove(SchedSeq* seq);

  // Plans one step (may preempt, see the file comment).
  StepPlan schedule();
  // Marks the plan's tokens as computed (draft tokens excluded).
  void commit(const StepPlan& plan);

  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const std::vector<SchedSeq*>& running() const { return running_; }
  const std::deque<SchedSeq*>& waiting() const { return waiting_; }
  const runtime::KvCacheManager& kv() const { return *kv_; }

 private:
  void preempt(SchedSeq* victim, StepPlan* plan, int64_t* budget);

  SchedulerConfig config_;
  runtime::KvCacheManager* kv_;
  std::vector<SchedSeq*> running_;  // admission order: oldest first
  std::deque<SchedSeq*> waiting_;
  int64_t num_preemptions_ = 0;
};

}  // namespace ds::sched
