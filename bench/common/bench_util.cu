// Ceiling measurement and result writing for the kernel benchmarks.
#include "common/bench_util.h"

#include <cstdint>
#include <fstream>
#include <sstream>

namespace ds::bench {
namespace {

__global__ void copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (uint8_t(c) < 0x20) out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

double measure_copy_bandwidth_gbps(cudaStream_t stream) {
  const size_t bytes = size_t(2) << 30;  // 2 GiB each way, far beyond the 60 MB L2
  const size_t n = bytes / sizeof(int4);
  int4 *src, *dst;
  DS_BENCH_CHECK(cudaMalloc(&src, bytes));
  DS_BENCH_CHECK(cudaMalloc(&dst, bytes));
  DS_BENCH_CHECK(cudaMemsetAsync(src, 1, bytes, stream));
  int sms = 0;
  DS_BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double us = time_us([&](cudaStream_t s) { copy_kernel<<<sms * 8, 512, 0, s>>>(src, dst, n); },
                      stream, 20, 3);
  DS_BENCH_CHECK(cudaFree(src));
  DS_BENCH_CHECK(cudaFree(dst));
  return 2.0 * double(bytes) / (us * 1e-6) / 1e9;
}

void write_results(const std::string& path, const std::string& bench_name, const DeviceInfo& dev,
                   double copy_gbps, const std::vector<Record>& records) {
  std::ostringstream js;
  js << "{\n  \"benchmark\": \"" << json_escape(bench_name) << "\",\n"
     << "  \"gpu\": \"" << json_escape(dev.name) << "\",\n"
     << "  \"sm_count\": " << dev.sm_count << ",\n"
     << "  \"driver_version\": " << dev.driver_version << ",\n"
     << "  \"commit\": \"" << json_escape(env_or("DS_COMMIT", "unknown")) << "\",\n"
     << "  \"date\": \"" << iso_date() << "\",\n"
     << "  \"ceilings\": {\"copy_gbps\": " << copy_gbps << "},\n"
     << "  \"records\": [\n";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    js << "    {\"kernel\": \"" << json_escape(r.kernel) << "\", \"shape\": \"" << json_escape(r.shape)
       << "\", \"mode\": \"" << r.mode << "\", \"time_us\": " << r.time_us
       << ", \"bytes\": " << r.bytes << ", \"flops\": " << r.flops
       << ", \"floor_us\": " << r.floor_us << ", \"ratio_to_floor\": " << r.ratio
       << ", \"achieved_gbps\": " << r.achieved_gbps
       << ", \"achieved_tflops\": " << r.achieved_tflops << ", \"error_metric\": \""
       << json_escape(r.error_metric) << "\", \"max_error\": " << r.max_error << "}"
       << (i + 1 < records.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  std::ofstream(path) << js.str();
  std::printf("\n%s on %s (%d SMs), copy ceiling %.0f GB/s\n", bench_name.c_str(), dev.name.c_str(),
              dev.sm_count, copy_gbps);
  std::printf("%-22s %-26s %-6s %10s %10s %8s %9s %9s %10s\n", "kernel", "shape", "mode", "time_us",
              "floor_us", "ratio", "GB/s", "TFLOP/s", "max_err");
  for (const Record& r : records)
    std::printf("%-22s %-26s %-6s %10.2f %10.2f %8.2f %9.0f %9.2f %10.3g\n", r.kernel.c_str(),
                r.shape.c_str(), r.mode.c_str(), r.time_us, r.floor_us, r.ratio, r.achieved_gbps,
                r.achieved_tflops, r.max_error);
  std::printf("results written to %s\n", path.c_str());
}

}  // namespace ds::bench
