// Per-request sampler (see sampler.h for the order of operations).
#include "scheduler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

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
  // Sum of x - x is 0 for finite x and NaN otherwise; one branch-free pass.
  float acc = 0;
  for (int64_t i = 0; i < vocab; ++i) acc += logits[i] - logits[i];
  return acc == 0.0f;
}

float token_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top,
                    std::vector<LogprobEntry>* best) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - double(mx));
  const double lse = double(mx) + std::log(sum);
  if (best != nullptr) {
    best->clear();
    const int64_t k = std::min<int64_t>(std::max<int64_t>(top, 0), vocab);
    if (k > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), ByValueDesc{logits});
      for (int64_t i = 0; i < k; ++i) {
        best->push_back({ids[size_t(i)], float(double(logits[ids[size_t(i)]]) - lse)});
      }
    }
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

int32_t Sampler::argmax_adjusted() const {
  const float* w = work_.data();
  int32_t best = 0;
  for (int64_t i = 1; i < vocab_; ++i) {
    if (w[i] > w[best]) best = int32_t(i);
  }
  return best;
}

int32_t Sampler::sample(const float* logits) {
  const int64_t V = vocab_;
  adjust(logits);
  float* w = work_.data();
  // 4. greedy.
  if (greedy()) return argmax_adjusted();
  // Softmax of w / T (unnormalized; the draw renormalizes).
  const double T = params_.temperature;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, w[i]);
  prob_.resize(size_t(V));
  double* p = prob_.data();
  const float inv_t = float(1.0 / T);
  // Single-precision exp (a third of the cost of double over a 129k vocabulary); sums in double.
  for (int64_t i = 0; i < V; ++i) p[i] = double(std::exp((w[i] - mx) * inv_t));
  const bool use_top_k = params_.top_k > 0 && params_.top_k < V;
  const bool use_top_p = params_.top_p < 1.0;
  const bool use_min_p = params_.min_p > 0.0;
  if (!use_top_k && !use_top_p) {
    // Every token is a candidate; draw in id order (no sort needed).
    double cut = 0;
    if (use_min_p) cut = params_.min_p;  // p_max is exp(0) = 1 here
    double total = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (p[i] < cut) p[i] = 0;
      total += p[i];
    }
    double u = rng_.uniform() * total;
    int32_t last = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (p[i] <= 0) continue;
      last = int32_t(i);
      u -= p[i];
      if (u < 0) return int32_t(i);
    }
    return last;
  }
  // Candidates in descending order of w (= of p), sorted only as far as needed.
  order_.resize(size_t(V));
  std::iota(order_.begin(), order_.end(), 0);
  const ByValueDesc cmp{w};
  int64_t keep = V;
  if (use_top_k) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), cmp);
  }
  if (use_top_p) {
    double kept_mass = 0;  // mass of the first `keep` candidates (renormalization base)
    if (use_top_k) {
      for (int64_t i = 0; i < keep; ++i) kept_mass += p[order_[size_t(i)]];
    } else {
      for (int64_t i = 0; i < V; ++i) kept_mass += p[i];
    }
    const double target = params_.top_p * kept_mass;
    int64_t sorted = use_top_k ? keep : 0;
    int64_t m = use_top_k ? keep : std::min<int64_t>(V, 64);
    double mass = 0;
    int64_t n = 0;
    while (true) {
      if (!use_top_k && m > sorted) {
        std::partial_sort(order_.begin() + sorted, order_.begin() + m, order_.end(), cmp);
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
  adjust(logits);
  out->assign(size_t(V), 0.0);
  if (greedy()) {
    (*out)[size_t(argmax_adjusted())] = 1.0;
    return;
  }
  // The same values and candidate set as sample(): p = exp((w - max) / T) in float, then top-k,
  // top-p and min-p over the descending order (ties to the lower id), renormalized.
  const float* w = work_.data();
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, w[i]);
  const float inv_t = float(1.0 / params_.temperature);
  std::vector<double> p(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) p[size_t(i)] = double(std::exp((w[i] - mx) * inv_t));
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), ByValueDesc{w});
  int64_t keep = V;
  if (params_.top_k > 0 && params_.top_k < V) keep = params_.top_k;
  if (params_.top_p < 1.0) {
    double kept_mass = 0;
    for (int64_t i = 0; i < keep; ++i) kept_mass += p[size_t(order[size_t(i)])];
    const double target = params_.top_p * kept_mass;
    double mass = 0;
    int64_t n = 0;
    while (n < keep) {
      mass += p[size_t(order[size_t(n++)])];
      if (mass >= target) break;
    }
    keep = std::max<int64_t>(1, n);
  }
  if (params_.min_p > 0.0) {
    const double cut = params_.min_p * p[size_t(order[0])];
    int64_t n = 1;
    while (n < keep && p[size_t(order[size_t(n)])] >= cut) ++n;
    keep = n;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[size_t(order[size_t(i)])];
  for (int64_t i = 0; i < keep; ++i) {
    const int32_t id = order[size_t(i)];
    (*out)[size_t(id)] = p[size_t(id)] / total;
  }
}

namespace {

// A draw from weights p (not necessarily normalized; the last positive one absorbs rounding).
int32_t draw_from(const std::vector<double>& p, double u01) {
  double total = 0;
  for (double v : p) total += v;
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
  if (greedy()) {
    adjust(logits);
    return argmax_adjusted();
  }
  distribution(logits, q);
  return draw_from(*q, rng_.uniform());
}

int32_t Sampler::verify(const float* logits, int32_t draft, const std::vector<double>& q,
                        bool* accepted) {
  if (greedy()) {
    adjust(logits);
    const int32_t best = argmax_adjusted();
    *accepted = best == draft;
    return best;
  }
  std::vector<double>& p = prob_;
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
