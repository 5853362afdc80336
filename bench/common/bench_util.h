// Benchmark harness for CUDA kernels (performance.md "Recording results"): measures the copy
// bandwidth ceiling in the same run, times a launch with CUDA events (median of >= 20 runs after
// warm-up, optionally inside a CUDA graph), and writes one JSON record per case with the GPU,
// driver, commit, date, shape, ceilings, time, floor, ratio and the correctness error of the run.
// Needs only the CUDA runtime (the GPU machine has no JSON library), so JSON is written by hand.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#define DS_BENCH_CHECK(expr)                                                        \
  do {                                                                              \
    cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,            \
                   cudaGetErrorString(e_));                                         \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace ds::bench {

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int driver_version = 0;
  size_t l2_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};

inline DeviceInfo device_info() {
  DeviceInfo info;
  cudaDeviceProp prop{};
  DS_BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = size_t(prop.l2CacheSize);
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  DS_BENCH_CHECK(cudaDriverGetVersion(&info.driver_version));
  return info;
}

// Median time in microseconds of `fn` (which enqueues work on `stream`), after `warmup` runs.
// With use_graph, `fn` is captured once into a CUDA graph and the graph is replayed and timed,
// which removes the CPU launch cost that dominates kernels below ~5 us.
inline double time_us(const std::function<void(cudaStream_t)>& fn, cudaStream_t stream,
                      int iters = 50, int warmup = 5, bool use_graph = false) {
  cudaGraphExec_t exec = nullptr;
  if (use_graph) {
    cudaGraph_t graph;
    DS_BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    fn(stream);
    DS_BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    DS_BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    DS_BENCH_CHECK(cudaGraphDestroy(graph));
  }
  auto run = [&] {
    if (exec) DS_BENCH_CHECK(cudaGraphLaunch(exec, stream));
    else fn(stream);
  };
  for (int i = 0; i < warmup; ++i) run();
  DS_BENCH_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  DS_BENCH_CHECK(cudaEventCreate(&start));
  DS_BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    DS_BENCH_CHECK(cudaEventRecord(start, stream));
    run();
    DS_BENCH_CHECK(cudaEventRecord(stop, stream));
    DS_BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DS_BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0f);
  }
  DS_BENCH_CHECK(cudaGetLastError());
  DS_BENCH_CHECK(cudaEventDestroy(start));
  DS_BENCH_CHECK(cudaEventDestroy(stop));
  if (exec) DS_BENCH_CHECK(cudaGraphExecDestroy(exec));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Measured HBM ceiling: a large device-to-device copy (bytes read + written per second), the
// median of several runs on buffers far larger than L2.
double measure_copy_bandwidth_gbps(cudaStream_t stream);

inline std::string iso_date() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// One benchmark case, written as one JSON object.
struct Record {
  std::string kernel, shape, mode;  // mode: "eager" or "graph"
  double time_us = 0, bytes = 0, flops = 0;
  double floor_us = 0, ratio = 0, achieved_gbps = 0, achieved_tflops = 0;
  double max_error = 0;             // correctness error of the same run
  std::string error_metric;

  // time_us = us, and what follows from it: the ratio to floor_us (0 without a floor) and the
  // achieved rates of bytes and flops (set those three first).
  void set_time(double us) {
    time_us = us;
    ratio = floor_us > 0 ? us / floor_us : 0.0;
    achieved_gbps = bytes / (us * 1e-6) / 1e9;
    achieved_tflops = flops / (us * 1e-6) / 1e12;
  }
};

// Writes {"gpu":..., "records":[...]} to `path` and prints a table.
void write_results(const std::string& path, const std::string& bench_name, const DeviceInfo& dev,
                   double copy_gbps, const std::vector<Record>& records);

}  // namespace ds::bench
