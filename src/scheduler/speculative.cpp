// The adaptive speculation policy (see speculative.h).
#include "scheduler/speculative.h"

#include <algorithm>

namespace ds::sched {

namespace {
constexpr double kAlpha = 0.08;  // EWMA weight of a new sample: half-life ~8 samples
}  // namespace

SpecPolicy::SpecPolicy(int64_t max_k, bool adaptive)
    : max_k_(std::max<int64_t>(0, max_k)),
      adaptive_(adaptive),
      cells_(kBuckets, std::vector<Cell>(size_t(max_k_ + 1))),
      choices_(kBuckets, 0) {}

int SpecPolicy::bucket(int64_t batch) {
  int b = 0;
  while (b + 1 < kBuckets && (int64_t(2) << b) <= batch) ++b;
  return b;
}

int64_t SpecPolicy::choose(int64_t batch) {
  if (!adaptive_ || max_k_ == 0) return max_k_;
  const int b = bucket(batch);
  std::vector<Cell>& cells = cells_[size_t(b)];
  const int64_t choice = ++choices_[size_t(b)];
  // 1. Too few measurements: max_k, then 0, then the others.
  if (cells[size_t(max_k_)].samples < kMinSamples) return max_k_;
  if (cells[0].samples < kMinSamples) return 0;
  for (int64_t k = 1; k < max_k_; ++k) {
    if (cells[size_t(k)].samples < kMinSamples) return k;
  }
  // 2. Periodic re-measurement of the stalest k.
  if (choice % kExploreEvery == 0) {
    int64_t stalest = 0;
    for (int64_t k = 1; k <= max_k_; ++k) {
      if (cells[size_t(k)].last_choice < cells[size_t(stalest)].last_choice) stalest = k;
    }
    return stalest;
  }
  // 3. The best measured tokens/s (ties to the smaller k: less work for the same speed).
  int64_t best = 0;
  for (int64_t k = 1; k <= max_k_; ++k) {
    if (cells[size_t(k)].tokens_per_s > cells[size_t(best)].tokens_per_s) best = k;
  }
  return best;
}

void SpecPolicy::record(int64_t batch, int64_t k, int64_t tokens, double seconds) {
  if (k < 0 || k > max_k_ || !(seconds > 0)) return;
  const int b = bucket(batch);
  Cell& c = cells_[size_t(b)][size_t(k)];
  const double v = double(tokens) / seconds;
  c.tokens_per_s = c.samples == 0 ? v : (1 - kAlpha) * c.tokens_per_s + kAlpha * v;
  ++c.samples;
  c.last_choice = choices_[size_t(b)];
}

double SpecPolicy::goodput(int64_t batch, int64_t k) const {
  if (k < 0 || k > max_k_) return 0;
  return cells_[size_t(bucket(batch))][size_t(k)].tokens_per_s;
}

}  // namespace ds::sched
