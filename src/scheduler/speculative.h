// The adaptive speculation policy (docs/speculative.md "Adaptive policy"): chooses the number of
// MTP draft tokens k (0 = no speculation) for the next engine step from measurements, not from a
// model of the hardware. For each batch-size bucket (decoding sequences 1, 2-3, 4-7, ..., 128+)
// it keeps an exponentially weighted average of the output tokens per second of pure decode
// steps run with each k in [0, max_k] (verify + drafting time, half-life about 8 samples). Rule:
//   - a k with fewer than kMinSamples measurements in the bucket is tried first (max_k first,
//     then 0, then the others in order);
//   - otherwise every kExploreEvery-th choice in the bucket re-measures the least recently
//     measured k (the acceptance rate and the step costs drift with the text and the batch);
//   - otherwise the k with the best measured tokens/s runs.
// Speculation therefore turns itself off (k = 0) where its verify and draft cost is not paid
// back by the accepted tokens at the current batch size, and lowers k where a shorter draft pays
// better. Not thread-safe (the engine thread owns it).
#pragma once

#include <cstdint>
#include <vector>

namespace ds::sched {

class SpecPolicy {
 public:
  static constexpr int kBuckets = 8;
  static constexpr int64_t kMinSamples = 2;
  static constexpr int64_t kExploreEvery = 16;

  // adaptive false: always max_k.
  SpecPolicy(int64_t max_k, bool adaptive);

  // k for a step with `batch` decoding sequences.
  int64_t choose(int64_t batch);
  // A pure decode step at `batch` decoding sequences whose drafts had length k emitted `tokens`
  // output tokens in `seconds` (its verify plus the drafting that produced its drafts).
  void record(int64_t batch, int64_t k, int64_t tokens, double seconds);

  // The measured tokens/s of k in the bucket of `batch` (0 when never measured).
  double goodput(int64_t batch, int64_t k) const;
  int64_t max_k() const { return max_k_; }
  static int bucket(int64_t batch);

 private:
  struct Cell {
    double tokens_per_s = 0;
    int64_t samples = 0;
    int64_t last_choice = -1;  // choice counter of the bucket when last measured
  };
  int64_t max_k_;
  bool adaptive_;
  std::vector<std::vector<Cell>> cells_;  // [kBuckets][max_k + 1]
  std::vector<int64_t> choices_;          // [kBuckets]
};

}  // namespace ds::sched
