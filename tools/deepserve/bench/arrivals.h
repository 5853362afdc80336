// Request arrival times of the benchmark, as vLLM's get_request (vllm/benchmarks/serve.py)
// draws them: at an infinite rate every request arrives at 0; otherwise the gaps are
// Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) (burstiness 1 = exponential gaps =
// a Poisson process), the first request also waits one gap, and the cumulative times are then
// scaled so the last arrival lands exactly at n / rate (vLLM does this to make throughput
// stable across seeds). Seeded and deterministic (std::mt19937_64 + libstdc++ distributions).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace ds::bench {

// Seconds since the benchmark start at which request i arrives (non-decreasing).
Result<std::vector<double>> arrival_times(int64_t num_requests, double request_rate,
                                          double burstiness, uint64_t seed);

}  // namespace ds::bench
