// Arrival-time generator of the benchmark (definition in arrivals.h).
#include "bench/arrivals.h"

#include <cmath>
#include <random>
#include <string>

namespace ds::bench {

Result<std::vector<double>> arrival_times(int64_t num_requests, double request_rate,
                                          double burstiness, uint64_t seed) {
  if (num_requests < 0) return invalid_argument("negative number of requests");
  if (!(request_rate > 0)) return invalid_argument("--request-rate must be > 0 (or inf)");
  if (!(burstiness > 0) || std::isnan(burstiness))
    return invalid_argument("--burstiness must be > 0, got " + std::to_string(burstiness));
  std::vector<double> t(size_t(num_requests), 0.0);
  if (std::isinf(request_rate) || num_requests == 0) return t;
  std::mt19937_64 gen(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double acc = 0;
  for (auto& v : t) {
    acc += std::isinf(burstiness) ? 1.0 / request_rate : gap(gen);
    v = acc;
  }
  if (acc > 0) {
    const double scale = double(num_requests) / request_rate / acc;
    for (auto& v : t) v *= scale;
  }
  return t;
}

}  // namespace ds::bench
