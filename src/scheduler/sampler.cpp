// Per-request sampler (see sampler.h for the order of operations).
#include "scheduler/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "scheduler/fast_exp.h"

namespace ds::sched {

namespace {

// Descending by value, ties to the lower id (a strict weak order, deterministic).
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

bool in_range(double v, double lo, double hi) {
  return std::isfinite(v) && v >= lo && v <= hi;
}

// The largest value of w [n] (NaNs are never the largest; -inf when all are NaN) and, in the same
// pass, whether every value is finite: a float is NaN or infinite iff its exponent bits are all
// ones, i.e. iff adding one to the exponent field carries into bit 31. One branch-free pass over
// independent lanes that the compiler vectorizes (max is exact in any order).
float finite_max(const float* w, int64_t n, bool* finite) {
  constexpr int kLanes = 16;
  const float ninf = -std::numeric_limits<float>::infinity();
  float lane[kLanes];
  uint32_t carry[kLanes] = {};
  std::fill(lane, lane + kLanes, ninf);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      uint32_t bits;
      std::memcpy(&bits, w + i + l, sizeof(bits));
      carry[l] |= (bits & 0x7f800000u) + 0x00800000u;
      lane[l] = w[i + l] > lane[l] ? w[i + l] : lane[l];
    }
  }
  uint32_t c = 0;
  float mx = ninf;
  for (int l = 0; l < kLanes; ++l) {
    c |= carry[l];
    mx = lane[l] > mx ? lane[l] : mx;
  }
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, w + i, sizeof(bits));
    c |= (bits & 0x7f800000u) + 0x00800000u;
    mx = w[i] > mx ? w[i] : mx;
  }
  *finite = (c & 0x80000000u) == 0;
  return mx;
}

float max_value(const float* w, int64_t n) {
  bool finite = false;
  return finite_max(w, n, &finite);
}

// The first index holding v (0 when none does).
int32_t first_of(const float* w, int64_t n, float v) {
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] == v) return int32_t(j);
  }
  return 0;
}

// Index of the largest value, ties to the lowest id (NaNs are never the largest; all NaN: 0): the
// maximum, then its first occurrence (bench_sampler: greedy sample() of a 129280-logit row
// 584 -> 168 us, with the copy of the row that it no longer makes).
int32_t argmax_first(const float* w, int64_t n) {
  return first_of(w, n, max_value(w, n));
}

// How many of w [n] are >= t, four lanes at a time (a compare yields -1 per lane that passes).
int64_t count_at_least(const float* w, int64_t n, float t) {
  const Float4 tv = {t, t, t, t};
  Int4 acc = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    Float4 x;
    std::memcpy(&x, w + i, sizeof(x));
    acc -= x >= tv;
  }
  int64_t c = int64_t(acc[0]) + acc[1] + acc[2] + acc[3];
  for (; i < n; ++i) c += w[i] >= t ? 1 : 0;
  return c;
}

}  // namespace

std::string validate_sampling(const deepserve::SamplingParams& p, int64_t vocab,
                              std::string* param) {
  auto bad = [&](const char* name, std::string msg) {
    *param = name;
    return msg;
  };
  if (!in_range(p.temperature, 0.0, 100.0))
    return bad("temperature", "temperature must be in [0, 100]");
  if (!(std::isfinite(p.top_p) && p.top_p > 0.0 && p.top_p <= 1.0))
    return bad("top_p", "top_p must be in (0, 1]");
  if (p.top_k < -1) return bad("top_k", "top_k must be -1, 0 (off) or a positive integer");
  if (!in_range(p.min_p, 0.0, 1.0)) return bad("min_p", "min_p must be in [0, 1]");
  if (!in_range(p.presence_penalty, -2.0, 2.0))
    return bad("presence_penalty", "presence_penalty must be in [-2, 2]");
  if (!in_range(p.frequency_penalty, -2.0, 2.0))
    return bad("frequency_penalty", "frequency_penalty must be in [-2, 2]");
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0 &&
        p.repetition_penalty <= 2.0))
    return bad("repetition_penalty", "repetition_penalty must be in (0, 2]");
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || int64_t(id) >= vocab)
      return bad("logit_bias", "logit_bias: token id " + std::to_string(id) + " is outside [0, " +
                                   std::to_string(vocab) + ")");
    if (!in_range(bias, -100.0, 100.0))
      return bad("logit_bias",
                 "logit_bias: the bias of token " + std::to_string(id) + " must be in [-100, 100]");
  }
  if (p.max_tokens == 0 || p.max_tokens < -1)
    return bad("max_tokens", "max_tokens must be at least 1");
  if (p.min_tokens < 0) return bad("min_tokens", "min_tokens must be non-negative");
  if (p.max_tokens > 0 && p.min_tokens > p.max_tokens)
    return bad("min_tokens", "min_tokens must not exceed max_tokens");
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || int64_t(id) >= vocab)
      return bad("stop_token_ids", "stop_token_ids: token id " + std::to_string(id) +
                                       " is outside [0, " + std::to_string(vocab) + ")");
  }
  if (p.logprobs < -1 || p.logprobs > 20)
    return bad("logprobs", "logprobs must be between 0 and 20");
  return "";
}

bool all_finite(const float* logits, int64_t vocab) {
  bool finite = false;
  finite_max(logits, vocab, &finite);  // the maximum comes free: the pass is memory-bound
  return finite;
}

float token_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top,
                    std::vector<LogprobEntry>* best) {
  const float mx = logits[argmax_first(logits, vocab)];
  // Single-precision exp of x - max <= 0 (as sample() does: fast_exp.h, under 2e-7 relative),
  // summed in double: the log-sum-exp and every logprob are off by under 2e-7 absolute.
  const double lse = double(mx) + std::log(sum_exp_shifted(logits, vocab, mx));
  if (best != nullptr) {
    best->clear();
    const int64_t k = std::min<int64_t>(std::max<int64_t>(top, 0), vocab);
    // The k best by ByValueDesc in one pass: a sorted list that a token enters only when it
    // beats the list's last (ids increase, so an equal value never displaces an earlier id).
    std::vector<int32_t> ids;
    ids.reserve(size_t(k) + 1);
    const ByValueDesc cmp{logits};
    for (int64_t i = 0; i < vocab && k > 0; ++i) {
      const int32_t id = int32_t(i);
      if (int64_t(ids.size()) == k && !cmp(id, ids.back())) continue;
      ids.insert(std::upper_bound(ids.begin(), ids.end(), id, cmp), id);
      if (int64_t(ids.size()) > k) ids.pop_back();
    }
    for (int32_t id : ids) best->push_back({id, float(double(logits[id]) - lse)});
  }
  return float(double(logits[token]) - lse);
}

Sampler::Sampler(const deepserve::SamplingParams& params, uint64_t seed, int64_t vocab_size,
                 int32_t eos_token_id, std::span<const int32_t> prompt)
    : params_(params), vocab_(vocab_size), eos_(eos_token_id), rng_(seed) {
  if (params_.repetition_penalty != 1.0) prompt_tokens_.insert(prompt.begin(), prompt.end());
}

void Sampler::accept(int32_t token) {
  ++output_counts_[token];
  ++num_output_;
}

void Sampler::adjust(const float* logits) {
  const int64_t V = vocab_;
  work_.assign(logits, logits + V);
  float* w = work_.data();
  // 1. logit bias.
  for (const auto& [id, bias] : params_.logit_bias) w[id] = float(double(w[id]) + bias);
  // 2. min_tokens.
  if (num_output_ < params_.min_tokens) {
    const float ninf = -std::numeric_limits<float>::infinity();
    if (!params_.ignore_eos && eos_ >= 0 && eos_ < V) w[eos_] = ninf;
    for (int32_t id : params_.stop_token_ids) w[id] = ninf;
  }
  // 3. penalties.
  if (params_.repetition_penalty != 1.0) {
    const float rp = float(params_.repetition_penalty);
    auto apply = [&](int32_t id) {
      if (id < 0 || id >= V) return;
      w[id] = w[id] > 0 ? w[id] / rp : w[id] * rp;
    };
    std::unordered_set<int32_t> seen = prompt_tokens_;
    for (const auto& [id, n] : output_counts_) seen.insert(id);
    for (int32_t id : seen) apply(id);
  }
  if (params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0) {
    for (const auto& [id, n] : output_counts_) {
      w[id] = float(double(w[id]) - params_.frequency_penalty * double(n) -
                    (n > 0 ? params_.presence_penalty : 0.0));
    }
  }
}

void Sampler::reserve_buffers(bool verify) {
  const size_t V = size_t(vocab_);
  if (!greedy() || adjusts()) work_.reserve(V);
  if (greedy()) return;
  prob_.reserve(V);
  if ((params_.top_k > 0 && params_.top_k < vocab_) || params_.top_p < 1.0) order_.reserve(V);
  if (verify) target_.reserve(V);
}

int32_t Sampler::argmax_adjusted() const {
  return argmax_first(work_.data(), vocab_);
}

bool Sampler::adjusts() const {
  return !params_.logit_bias.empty() ||
         (num_output_ < params_.min_tokens &&
          ((!params_.ignore_eos && eos_ >= 0 && eos_ < vocab_) ||
           !params_.stop_token_ids.empty())) ||
         params_.repetition_penalty != 1.0 ||
         ((params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0) &&
          !output_counts_.empty());
}

int32_t Sampler::greedy_token(const float* logits) {
  // Steps 1-3 change nothing for most requests: then the argmax of the raw row, without a copy.
  if (!adjusts()) return argmax_first(logits, vocab_);
  adjust(logits);
  return argmax_adjusted();
}

void Sampler::best_sorted(const float* w, float mx, int64_t m) {
  const int64_t V = vocab_;
  // The m best by ByValueDesc are among the ids with w >= t for any t at or below the m-th
  // largest value (ties at t included): widen t = mx - delta until at least m ids pass, collect
  // them in id order, and sort only those (a partial_sort over all V ids compares each of them
  // against the heap's top through w: most of a top-p row's time).
  int64_t count = V;
  float t = -std::numeric_limits<float>::infinity();
  if (m * 16 < V) {
    for (float delta = 4.0f;; delta *= 4.0f) {
      t = mx - delta;  // -inf once delta overflows: every id passes
      const int64_t c = count_at_least(w, V, t);
      if (c >= m || !(t > -std::numeric_limits<float>::infinity())) {
        count = c;
        break;
      }
    }
  }
  order_.resize(size_t(count));
  int32_t* ids = order_.data();
  if (count == V) {
    for (int64_t i = 0; i < V; ++i) ids[i] = int32_t(i);
  } else {
    int64_t k = 0;
    for (int64_t i = 0; i < V; ++i)
      if (w[i] >= t) ids[k++] = int32_t(i);
  }
  std::partial_sort(order_.begin(), order_.begin() + std::min(m, count), order_.end(),
                    ByValueDesc{w});
}

const float* Sampler::adjusted(const float* logits) {
  if (!adjusts()) return logits;
  adjust(logits);
  return work_.data();
}

int64_t Sampler::candidates(const float* w, float mx) {
  const int64_t V = vocab_;
  // Softmax of w / T (unnormalized; the draw renormalizes).
  prob_.resize(size_t(V));
  double* p = prob_.data();
  const float inv_t = float(1.0 / params_.temperature);
  // Single-precision exp, four lanes at a time (fast_exp.h); sums in double.
  exp_shifted(w, V, mx, inv_t, p);
  const bool use_top_k = params_.top_k > 0 && params_.top_k < V;
  const bool use_top_p = params_.top_p < 1.0;
  const bool use_min_p = params_.min_p > 0.0;
  if (!use_top_k && !use_top_p) {
    // Every token is a candidate, in id order (no sort needed); min-p zeroes the rest (p_max is
    // exp(0) = 1 here).
    if (use_min_p) {
      for (int64_t i = 0; i < V; ++i) {
        if (p[i] < params_.min_p) p[i] = 0;
      }
    }
    return -1;
  }
  // Candidates in descending order of w (= of p), sorted only as far as needed.
  int64_t keep = V;
  if (use_top_k) {
    keep = params_.top_k;
    best_sorted(w, mx, keep);
  }
  if (use_top_p) {
    double kept_mass = 0;  // mass of the first `keep` candidates (renormalization base)
    if (use_top_k) {
      for (int64_t i = 0; i < keep; ++i) kept_mass += p[order_[size_t(i)]];
    } else {
      kept_mass = sum_lanes(p, V);
    }
    const double target = params_.top_p * kept_mass;
    int64_t sorted = use_top_k ? keep : 0;
    int64_t m = use_top_k ? keep : std::min<int64_t>(V, 64);
    double mass = 0;
    int64_t n = 0;
    while (true) {
      if (!use_top_k && m > sorted) {
        best_sorted(w, mx, m);  // the first `sorted` stay where they were: the order is total
        sorted = m;
      }
      while (n < m) {
        mass += p[order_[size_t(n++)]];
        if (mass >= target) break;
      }
      if (mass >= target || m >= keep) break;
      m = std::min<int64_t>(keep, m * 4);
    }
    keep = std::max<int64_t>(1, n);
  }
  if (use_min_p) {
    const double cut = params_.min_p * p[order_[0]];
    int64_t n = 1;
    while (n < keep && p[order_[size_t(n)]] >= cut) ++n;
    keep = n;
  }
  return keep;
}

cpu::RowSampling Sampler::backend_draw() {
  cpu::RowSampling s;
  s.temperature = params_.temperature;
  s.top_k = params_.top_k;
  s.top_p = params_.top_p;
  s.min_p = params_.min_p;
  s.uniform = rng_.uniform();
  return s;
}

bool Sampler::sample_finite(const float* logits, int32_t* token) {
  if (!adjusts()) {
    // One pass over the raw row for the check and the maximum, which is the greedy answer's value
    // or the softmax's shift.
    bool finite = false;
    const float mx = finite_max(logits, vocab_, &finite);
    if (!finite) return false;
    *token = greedy() ? first_of(logits, vocab_, mx) : draw(candidates(logits, mx));
    return true;
  }
  if (!all_finite(logits, vocab_)) return false;
  *token = sample(logits);
  return true;
}

int32_t Sampler::sample(const float* logits) {
  // 4. greedy.
  if (greedy()) return greedy_token(logits);
  const float* w = adjusted(logits);
  return draw(candidates(w, max_value(w, vocab_)));
}

int32_t Sampler::draw(int64_t keep) {
  const double* p = prob_.data();
  if (keep < 0) {  // every token, in id order
    const double total = sum_lanes(p, vocab_);
    double u = rng_.uniform() * total;
    int32_t last = 0;
    for (int64_t i = 0; i < vocab_; ++i) {
      if (p[i] <= 0) continue;
      last = int32_t(i);
      u -= p[i];
      if (u < 0) return int32_t(i);
    }
    return last;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[order_[size_t(i)]];
  double u = rng_.uniform() * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= p[order_[size_t(i)]];
    if (u < 0) return order_[size_t(i)];
  }
  return order_[size_t(keep - 1)];
}

void Sampler::distribution(const float* logits, std::vector<double>* out) {
  const int64_t V = vocab_;
  out->assign(size_t(V), 0.0);
  if (greedy()) {
    (*out)[size_t(greedy_token(logits))] = 1.0;
    return;
  }
  // Exactly sample()'s values, candidate set and renormalization.
  const float* w = adjusted(logits);
  const int64_t keep = candidates(w, max_value(w, V));
  const double* p = prob_.data();
  double total = 0;
  if (keep < 0) {
    total = sum_lanes(p, V);
    for (int64_t i = 0; i < V; ++i) (*out)[size_t(i)] = p[i] / total;
    return;
  }
  for (int64_t i = 0; i < keep; ++i) total += p[order_[size_t(i)]];
  for (int64_t i = 0; i < keep; ++i) {
    const int32_t id = order_[size_t(i)];
    (*out)[size_t(id)] = p[id] / total;
  }
}

namespace {

// A draw from weights p (not necessarily normalized; the last positive one absorbs rounding).
int32_t draw_from(const std::vector<double>& p, double u01) {
  const double total = sum_lanes(p.data(), int64_t(p.size()));
  double u = u01 * total;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = int32_t(i);
    u -= p[i];
    if (u < 0) return int32_t(i);
  }
  return last;
}

}  // namespace

int32_t Sampler::propose(const float* logits, std::vector<double>* q) {
  q->clear();
  if (greedy()) return greedy_token(logits);
  distribution(logits, q);
  return draw_from(*q, rng_.uniform());
}

int32_t Sampler::verify(const float* logits, int32_t draft, const std::vector<double>& q,
                        bool* accepted) {
  if (greedy()) {
    const int32_t best = greedy_token(logits);
    *accepted = best == draft;
    return best;
  }
  std::vector<double>& p = target_;  // (distribution() uses prob_ as its scratch)
  distribution(logits, &p);
  const double qd = q.empty() ? 1.0 : q[size_t(draft)];
  const double pd = p[size_t(draft)];
  if (qd > 0 && rng_.uniform() * qd < pd) {  // u < p / q, without dividing
    *accepted = true;
    return draft;
  }
  *accepted = false;
  // Residual max(0, p - q); when it is empty (p <= q everywhere, so p == q) draw from p.
  double mass = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double qi = q.empty() ? (int32_t(i) == draft ? 1.0 : 0.0) : q[i];
    const double r = std::max(0.0, p[i] - qi);
    mass += r;
  }
  if (mass > 0) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double qi = q.empty() ? (int32_t(i) == draft ? 1.0 : 0.0) : q[i];
      p[i] = std::max(0.0, p[i] - qi);
    }
  }
  return draw_from(p, rng_.uniform());
}

}  // namespace ds::sched
