// Per-request token sampler (docs/engine.md "Sampling order"). Each request owns one Sampler with
// its own seeded generator, so a request's tokens do not depend on its batch neighbours or on
// preemption (recomputation never draws). On the raw logits of one row, in this order:
//   1. logit_bias is added;
//   2. before min_tokens outputs, EOS (unless ignore_eos) and the stop_token_ids get -inf;
//   3. repetition penalty (prompt and output tokens: positive logits divided, negative
//      multiplied), then frequency (x output count) and presence (x [count > 0]) penalties;
//   4. temperature 0: argmax (ties to the lowest id), nothing drawn;
//      otherwise logits / temperature -> softmax, then top-k, then top-p (the smallest prefix of
//      the descending order whose mass reaches top_p), then min-p (drop p < min_p * p_max), then
//      one uniform draw from the generator over the kept tokens (renormalized).
// Logprobs are the log-softmax of the raw logits (before any of the above), with the top-k
// alternatives by raw logit (ties to the lowest id).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/rng.h"
#include "deepserve/engine.h"
#include "kernels/cpu/sampling.h"

namespace ds::sched {

// Range checks of the sampling fields; returns "" when valid, else a message, with `param` set
// to the field's name.
std::string validate_sampling(const deepserve::SamplingParams& p, int64_t vocab_size,
                              std::string* param);

struct LogprobEntry {
  int32_t token_id = 0;
  float logprob = 0;
};

// Log-softmax of `logits` [vocab] at `token`, plus the `top` best tokens (top may be 0).
float token_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top,
                    std::vector<LogprobEntry>* best);

// True when every value of logits [vocab] is finite.
bool all_finite(const float* logits, int64_t vocab);

class Sampler {
 public:
  Sampler(const deepserve::SamplingParams& params, uint64_t seed, int64_t vocab_size,
          int32_t eos_token_id, std::span<const int32_t> prompt);

  // Picks the next token from raw logits [vocab] given `num_output` tokens generated so far.
  int32_t sample(const float* logits);
  // all_finite(logits) and then, when true, *token = sample(logits), with one read of the row
  // fewer for requests that nothing adjusts (the check and the maximum in one pass).
  // Returns false, drawing nothing and leaving *token alone, when a value is NaN or infinite.
  bool sample_finite(const float* logits, int32_t* token);
  // Records a generated token (for the penalties and min_tokens).
  void accept(int32_t token);

  // Sizes the buffers the next sample() / verify() (when `verify`) / propose() will use, so that
  // such a call allocates nothing: the engine makes it on a worker thread, and large buffers that
  // a worker allocates would stay in that thread's malloc arena (RSS growth across requests).
  void reserve_buffers(bool verify);

  int64_t num_output() const { return num_output_; }
  bool greedy() const { return params_.temperature <= 0; }
  // The next sample() is the argmax of the raw row (greedy and nothing adjusts the logits now):
  // the engine then asks the backend for the argmax alone (SequenceChunk::argmax_only).
  bool raw_argmax() const { return greedy() && !adjusts(); }
  // A random draw that nothing adjusts: the backend may make it from the raw row
  // (cpu::sample_row with backend_draw()'s parameters; docs/engine.md "Backend sampling").
  bool raw_draw() const { return !greedy() && !adjusts(); }
  // The parameters of that draw, with the uniform taken from this request's generator: the one
  // draw sample() would have made, so the generator stays in step whichever side samples.
  cpu::RowSampling backend_draw();

  // ---- Speculative decoding (docs/speculative.md) ----
  // The distribution sample() draws from for raw logits [vocab] (steps 1-4, normalized; greedy:
  // all mass on the argmax).  p [vocab]
  void distribution(const float* logits, std::vector<double>* p);
  // Proposes a draft token from draft logits [vocab] with this request's generator. Greedy: the
  // argmax after steps 1-3, q left empty (a point mass); otherwise a draw from q =
  // distribution(logits), kept in *q for verify().
  int32_t propose(const float* logits, std::vector<double>* q);
  // The standard speculative rejection rule for a draft token proposed from q (empty q: a point
  // mass on `draft`) against the target's raw logits [vocab] at the same position, with p =
  // distribution(logits): accept with probability min(1, p[draft] / q[draft]) (greedy: iff draft
  // is the argmax); on rejection draw from max(0, p - q) renormalized. The emitted token is then
  // distributed exactly as p. Returns the token to emit (== draft when *accepted). Does not call
  // accept().
  int32_t verify(const float* logits, int32_t draft, const std::vector<double>& q, bool* accepted);

 private:
  // Steps 1-3 into work_ (the adjusted logits).
  void adjust(const float* logits);
  int32_t argmax_adjusted() const;
  // Whether steps 1-3 can change any logit of this request now.
  bool adjusts() const;
  // Step 4 for temperature 0: the argmax after steps 1-3 (ties to the lowest id).
  int32_t greedy_token(const float* logits);
  // The logits after steps 1-3: `logits` itself when nothing adjusts them, else work_.
  const float* adjusted(const float* logits);
  // Step 4 after steps 1-3 for temperature > 0 (sample() and distribution() share it) on the
  // adjusted logits w [vocab] with maximum mx: prob_ = exp((w - mx) / T) for every token, then
  // the candidates. Returns how many are kept, listed in order_ in descending order; or -1 when
  // every token is a candidate in id order (no top-k, no top-p; prob_ below the min-p cut is
  // zeroed). order_ is sorted by w, which must stay alive until the draw.
  int64_t candidates(const float* w, float mx);
  // One uniform draw over candidates()' result (renormalized).
  int32_t draw(int64_t keep);
  // order_[0, m) = the m best ids of w [vocab] (maximum mx) in descending order, ties to the
  // lower id (ByValueDesc); m <= vocab. order_ may hold fewer than vocab ids after it.
  void best_sorted(const float* w, float mx, int64_t m);

  deepserve::SamplingParams params_;
  int64_t vocab_;
  int32_t eos_;
  Rng rng_;
  std::unordered_set<int32_t> prompt_tokens_;
  std::unordered_map<int32_t, int64_t> output_counts_;
  int64_t num_output_ = 0;
  std::vector<float> work_;     // [vocab] adjusted logits
  std::vector<int32_t> order_;  // candidate ids
  std::vector<double> prob_;    // [vocab] candidates()' unnormalized probabilities
  std::vector<double> target_;  // [vocab] verify()'s target distribution
};

}  // namespace ds::sched
