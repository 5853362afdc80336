// Reference of backend sampling (see sampling.h): readable, one full sort per truncated row.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace ds::cpu {

bool sample_row(const float* w, int64_t n, const RowSampling& s, int32_t* token) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(w[i])) return false;
    if (w[i] > w[best]) best = i;  // strict: the lowest index among maxima
  }
  if (s.temperature <= 0) {
    *token = int32_t(best);
    return true;
  }
  const float mx = w[best];
  const float inv_t = float(1.0 / s.temperature);
  std::vector<float> p(static_cast<size_t>(n));
  std::vector<uint64_t> mass(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    p[size_t(i)] = sampling_prob(w[i], mx, inv_t);
    mass[size_t(i)] = sampling_mass_of(p[size_t(i)]);
  }
  const bool use_top_k = s.top_k > 0 && s.top_k < n;
  const bool use_top_p = s.top_p < 1.0;
  const bool use_min_p = s.min_p > 0.0;
  if (!use_top_k && !use_top_p) {
    // Every token, in id order; min-p drops p < min_p (the maximum's p is exactly 1).
    if (use_min_p) {
      for (int64_t i = 0; i < n; ++i) {
        if (double(p[size_t(i)]) < s.min_p) mass[size_t(i)] = 0;
      }
    }
    const uint64_t total = std::accumulate(mass.begin(), mass.end(), uint64_t{0});
    const uint64_t target = sampling_draw_target(s.uniform, total);
    uint64_t cum = 0;
    for (int64_t i = 0; i < n; ++i) {
      cum += mass[size_t(i)];
      if (cum > target) {
        *token = int32_t(i);
        return true;
      }
    }
    *token = int32_t(best);  // unreachable: target < total
    return true;
  }
  // Descending order of w, ties to the lower id.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const uint32_t ka = sampling_key(w[a]), kb = sampling_key(w[b]);
    return ka != kb ? ka < kb : a < b;
  });
  auto prefix_mass = [&](int64_t count) {
    uint64_t m = 0;
    for (int64_t j = 0; j < count; ++j) m += mass[size_t(order[size_t(j)])];
    return m;
  };
  int64_t keep = use_top_k ? s.top_k : n;
  if (use_top_p) {
    const uint64_t target = sampling_top_p_target(s.top_p, prefix_mass(keep));
    uint64_t cum = 0;
    int64_t j = 0;
    while (j < keep) {
      cum += mass[size_t(order[size_t(j++)])];
      if (cum >= target) break;
    }
    keep = std::max<int64_t>(1, j);
  }
  if (use_min_p) {
    int64_t j = 1;
    while (j < keep && double(p[size_t(order[size_t(j)])]) >= s.min_p) ++j;
    keep = j;
  }
  const uint64_t target = sampling_draw_target(s.uniform, prefix_mass(keep));
  uint64_t cum = 0;
  for (int64_t j = 0; j < keep; ++j) {
    cum += mass[size_t(order[size_t(j)])];
    if (cum > target) {
      *token = order[size_t(j)];
      return true;
    }
  }
  *token = order[size_t(keep - 1)];  // unreachable: target < the kept mass
  return true;
}

void sample_rows(const float* x, int64_t rows, int64_t n, const RowSampling* params, int32_t* ids,
                 uint8_t* finite) {
  for (int64_t r = 0; r < rows; ++r) {
    int32_t token = 0;
    finite[r] = sample_row(x + r * n, n, params[r], &token) ? 1 : 0;
    ids[r] = token;
  }
}

}  // namespace ds::cpu
