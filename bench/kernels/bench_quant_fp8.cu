// Benchmark of the FP8 block activation quantization kernel at DeepSeek-V4-Flash shapes: decode
// rows (inside a CUDA graph, where launch cost would otherwise dominate) and prefill chunks.
// Floor = (bf16 input read + e4m3 codes + e8m0 scales written) / measured copy bandwidth.
// Correctness of the same run: codes and scales compared with the CPU reference on the first rows.
#include <cstdio>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/quant/quant_fp8.h"

int main(int argc, char** argv) {
  using namespace ds;
  std::string out = argc > 1 ? argv[1] : "bench/results/quant_fp8.json";
  cudaStream_t stream;
  DS_BENCH_CHECK(cudaStreamCreate(&stream));
  bench::DeviceInfo dev = bench::device_info();
  double copy_gbps = bench::measure_copy_bandwidth_gbps(stream);

  struct Case { int64_t rows, cols; bool graph; };
  std::vector<Case> cases = {{1, 4096, true},    {16, 4096, true},    {64, 4096, true},
                             {64, 8192, true},   {4096, 4096, false}, {8192, 4096, false},
                             {8192, 8192, false}, {16384, 2048, false}};
  std::vector<bench::Record> records;
  for (const Case& c : cases) {
    // Rotate over enough copies that the inputs exceed the L2 (60 MB) for the large cases.
    const int64_t elems = c.rows * c.cols;
    const int copies = elems * 2 < (int64_t(256) << 20) ? int(std::max<int64_t>(1, (int64_t(256) << 20) / (elems * 2))) : 1;
    const int used_copies = std::min(copies, 64);
    std::vector<uint16_t> host(static_cast<size_t>(elems));
    Rng rng(uint64_t(c.rows * 131 + c.cols));
    for (auto& v : host) v = float_to_bf16(rng.normal() * 3.0f);
    uint16_t* x;
    uint8_t *codes, *scales;
    DS_BENCH_CHECK(cudaMalloc(&x, size_t(elems) * 2 * used_copies));
    DS_BENCH_CHECK(cudaMalloc(&codes, size_t(elems) * used_copies));
    DS_BENCH_CHECK(cudaMalloc(&scales, size_t(elems / 128) * used_copies));
    for (int k = 0; k < used_copies; ++k)
      DS_BENCH_CHECK(cudaMemcpy(x + size_t(k) * elems, host.data(), size_t(elems) * 2, cudaMemcpyHostToDevice));
    int iter = 0;
    auto launch = [&](cudaStream_t s) {
      int k = c.graph ? 0 : (iter++ % used_copies);
      cuda::QuantFp8Params p{x + size_t(k) * elems, codes + size_t(k) * elems,
                             scales + size_t(k) * (elems / 128), c.rows, c.cols, c.cols};
      cuda::launch_quantize_fp8_blocks(p, s);
    };
    double us = bench::time_us(launch, stream, 50, 5, c.graph);
    // Correctness of this run: compare the first copy against the CPU reference (up to 64 rows).
    DS_BENCH_CHECK(cudaMemsetAsync(codes, 0xFF, size_t(elems), stream));
    iter = 0;
    launch(stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(stream));
    int64_t check_rows = std::min<int64_t>(c.rows, 64);
    std::vector<uint8_t> got(size_t(check_rows * c.cols)), ref(got.size()), ref_scales(got.size() / 128);
    DS_BENCH_CHECK(cudaMemcpy(got.data(), codes, got.size(), cudaMemcpyDeviceToHost));
    std::vector<float> xf(got.size());
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_float(host[i]);
    for (int64_t r = 0; r < check_rows; ++r)
      cpu::quantize_fp8_blocks(&xf[size_t(r * c.cols)], c.cols, 128, &ref[size_t(r * c.cols)],
                               &ref_scales[size_t(r * c.cols / 128)], nullptr);
    double mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != ref[i];

    bench::Record r;
    r.kernel = "quantize_fp8_blocks";
    r.shape = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " bf16";
    r.mode = c.graph ? "graph" : "eager";
    r.bytes = double(elems) * 2 + double(elems) + double(elems / 128);
    r.floor_us = r.bytes / (copy_gbps * 1e9) * 1e6;
    r.set_time(us);
    r.error_metric = "mismatching e4m3 codes vs CPU reference (first 64 rows)";
    r.max_error = mismatches;
    records.push_back(r);
    DS_BENCH_CHECK(cudaFree(x));
    DS_BENCH_CHECK(cudaFree(codes));
    DS_BENCH_CHECK(cudaFree(scales));
  }
  bench::write_results(out, "quant_fp8", dev, copy_gbps, records);
  return 0;
}
