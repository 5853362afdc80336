// Benchmark of the FP8 block-scaled linears (kernels/cuda/gemm) at DeepSeek-V4-Flash shapes.
// Ceilings measured in the same run: the device-to-device copy bandwidth (bench_util) and the
// cuBLASLt FP8 rate (an 8192^3 e4m3 GEMM with per-tensor scales, bf16 output).
//  - decode (M = 1, 2, 4, 8, 16, 64): the small-M kernels on pre-quantized activations, timed
//  inside
//    a CUDA graph that runs one launch per weight copy, the copies together larger than 2x L2 (each
//    launch reads its weight from HBM); time = graph time / copies. Every (row_warps, k_split)
//    layout of both kernels (kMma, kStream) is timed and the heuristic's choice (kernel and
//    layout, as GemmRunner runs it) is reported next to the best of each. Also
//    the full linear (quantization + GEMM) and the hf-numerics (bf16 activation) variant.
//    floor = (weight + scale + activation + output bytes) / copy bandwidth.
//  - prefill (M = 4096, 8192) on the five attention projections: the cuBLASLt block-scaled GEMM
//    (pre-quantized input; includes the activation-scale transpose), the full linear (with the
//    quantization), and cuBLASLt with per-tensor scales on the same shape;
//    floor = max(bytes / copy bandwidth, flops / measured cuBLASLt FP8 rate).
// Correctness of the same run: max |y - ref| / S against ds::cpu::linear on a few tokens, where
// S = sum |x w| (see tests/kernels/test_gemm_cuda.cu for the tolerance argument).
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/gemm/linear_fp8.h"
#include "kernels/cuda/quant/quant_fp8.h"

#define LT_CHECK(expr)                                                                           \
  do {                                                                                           \
    cublasStatus_t s_ = (expr);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, int(s_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define ST_CHECK(expr)                                                                 \
  do {                                                                                 \
    ::ds::Status s_ = (expr);                                                          \
    if (!s_.ok()) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, s_.to_string().c_str()); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

using namespace ds;

constexpr double kFp8DatasheetTflops = 1979.0;  // H100/H200 SXM dense FP8

struct Shape {
  const char* name;
  int64_t n, k;
  int groups;
};

struct Rec {
  std::string kernel, shape, mode, config;
  double time_us = 0, bytes = 0, flops = 0, floor_us = 0, ratio = 0, gbps = 0, tflops = 0;
  double hbm_fraction = 0, fp8_rate_fraction = 0, same_shape_fraction = 0, err = -1;
};

// Per-tensor-scaled cuBLASLt FP8 GEMM D[N, M] = A[K, N]^T B[K, M] (bf16 out); returns a launcher.
struct LtTensorScaled {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // cuBLASLt's heuristic list (first = algo); a plain array: a std::vector of this type crashes
  // nvcc 13.0's front end (internal error in lexical.c).
  cublasLtMatmulAlgo_t cands[8] = {};
  int n_cands = 0;
  float* one = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = size_t(32) << 20;
  bool ok = false;
  LtTensorScaled(cublasLtHandle_t h, int64_t m, int64_t n, int64_t k, int64_t ldb) : lt(h) {
    DS_BENCH_CHECK(cudaMalloc(&one, sizeof(float)));
    const float f1 = 1.0f;
    DS_BENCH_CHECK(cudaMemcpy(one, &f1, sizeof f1, cudaMemcpyHostToDevice));
    DS_BENCH_CHECK(cudaMalloc(&ws, ws_bytes));
    LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &one,
                                            sizeof one));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &one,
                                            sizeof one));
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, n, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, m, ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur[8] = {};
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, 8, heur, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
      algo = heur[0].algo;
      for (int i = 0; i < found; ++i)
        if (heur[i].state == CUBLAS_STATUS_SUCCESS) cands[n_cands++] = heur[i].algo;
      ok = true;
    }
    cublasLtMatmulPreferenceDestroy(pref);
  }
  // Keeps the fastest of the heuristic list (median of 5 runs each): the tuned reference.
  void autotune(const void* A, const void* B, void* D, cudaStream_t s) {
    double best = 1e30;
    cublasLtMatmulAlgo_t keep = algo;
    for (int i = 0; i < n_cands; ++i) {
      const cublasLtMatmulAlgo_t cand = cands[i];
      algo = cand;
      const double us = bench::time_us([&](cudaStream_t st) { run(A, B, D, st); }, s, 5, 1);
      if (us < best) {
        best = us;
        keep = cand;
      }
    }
    algo = keep;
  }
  void run(const void* A, const void* B, void* D, cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    LT_CHECK(
        cublasLtMatmul(lt, desc, &alpha, A, a, B, b, &beta, D, c, D, c, &algo, ws, ws_bytes, s));
  }
  ~LtTensorScaled() {
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(one);
    cudaFree(ws);
  }
};

// Reads n 16-byte words (4 loads in flight per thread per iteration); writes only if the XOR of
// everything is a magic value, so the loads cannot be removed.
__global__ void read_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

void launch_read(const uint8_t* p, size_t bytes, int sms, uint32_t* sink, cudaStream_t st) {
  read_kernel<<<unsigned(sms * 4), 512, 0, st>>>(reinterpret_cast<const uint4*>(p),
                                                  int64_t(bytes / 16), sink);
  DS_BENCH_CHECK(cudaGetLastError());
}

void fill_random_bytes(std::vector<uint8_t>& v, Rng& rng, bool e4m3) {
  for (size_t i = 0; i < v.size(); i += 8) {
    uint64_t r = rng.next_u64();
    for (size_t j = 0; j < 8 && i + j < v.size(); ++j) {
      uint8_t c = uint8_t(r >> (8 * j));
      if (e4m3 && (c & 0x7F) == 0x7F) c ^= 1;
      v[i + j] = c;
    }
  }
}

// Device copies of one random FP8 weight (+ e8m0 and fp32 scales).
struct Weights {
  Shape s;
  int copies = 1;
  size_t data_bytes = 0, scale_count = 0;
  uint8_t* data = nullptr;
  uint8_t* scale = nullptr;
  float* scale_f32 = nullptr;
  uint8_t* tiled = nullptr;  // the copies in the small-M tile order (with_tiles)
  std::vector<uint8_t> h_data, h_scale;
  Weights(const Shape& shape, int n_copies, uint64_t seed, bool with_tiles = false)
      : s(shape), copies(n_copies) {
    const int64_t rows = s.n * s.groups;
    data_bytes = size_t(rows * s.k);
    scale_count = size_t((rows + 127) / 128 * (s.k / 128));
    Rng rng(seed);
    h_data.resize(data_bytes);
    fill_random_bytes(h_data, rng, true);
    h_scale.resize(scale_count);
    for (auto& v : h_scale) v = uint8_t(115 + rng.below(9));
    DS_BENCH_CHECK(cudaMalloc(&data, data_bytes * copies));
    DS_BENCH_CHECK(cudaMalloc(&scale, scale_count * copies));
    DS_BENCH_CHECK(cudaMalloc(&scale_f32, scale_count * sizeof(float) * copies));
    for (int c = 0; c < copies; ++c) {
      DS_BENCH_CHECK(
          cudaMemcpy(data + data_bytes * c, h_data.data(), data_bytes, cudaMemcpyHostToDevice));
      DS_BENCH_CHECK(
          cudaMemcpy(scale + scale_count * c, h_scale.data(), scale_count, cudaMemcpyHostToDevice));
      ST_CHECK(cuda::launch_e8m0_to_f32(scale + scale_count * c, scale_f32 + scale_count * c,
                                        int64_t(scale_count), nullptr));
    }
    if (with_tiles) {
      DS_BENCH_CHECK(cudaMalloc(&tiled, data_bytes * copies));
      for (int c = 0; c < copies; ++c)
        ST_CHECK(cuda::launch_fp8_weight_to_tiles(data + data_bytes * c, tiled + data_bytes * c,
                                                  rows, s.k, nullptr));
    }
    DS_BENCH_CHECK(cudaDeviceSynchronize());
  }
  cuda::Fp8WeightView view(int c, bool use_tiles = false) const {
    return {data + data_bytes * c,
            scale + scale_count * c,
            scale_f32 + scale_count * c,
            s.n,
            s.k,
            s.groups,
            use_tiles ? tiled + data_bytes * c : nullptr};
  }
  ~Weights() {
    cudaFree(tiled);
    cudaFree(data);
    cudaFree(scale);
    cudaFree(scale_f32);
  }
};

// The decode modes' input for one shape and M: random bf16 activations (magnitudes cycling over
// 2^-3 .. 2^3 per 128 columns), their FP8 codes and e8m0 scales from the quantization kernel, and
// a bf16 output buffer [M, G*N].
struct DecodeInput {
  std::vector<uint16_t> hx;
  uint16_t* x = nullptr;
  uint8_t* codes = nullptr;
  uint8_t* xs = nullptr;
  uint16_t* y = nullptr;
  DecodeInput(const Shape& s, int64_t m, cudaStream_t stream) {
    const int64_t gk = s.k * s.groups, gn = s.n * s.groups;
    hx.resize(size_t(m * gk));
    Rng rng(uint64_t(m * 977 + s.n));
    for (size_t i = 0; i < hx.size(); ++i)
      hx[i] = float_to_bf16(rng.normal() * std::ldexp(1.0f, int((i / 128) % 7) - 3));
    DS_BENCH_CHECK(cudaMalloc(&x, hx.size() * 2));
    DS_BENCH_CHECK(cudaMalloc(&codes, hx.size()));
    DS_BENCH_CHECK(cudaMalloc(&xs, hx.size() / 128));
    DS_BENCH_CHECK(cudaMalloc(&y, size_t(m * gn) * 2));
    DS_BENCH_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    cuda::QuantFp8Params qp{x, codes, xs, m, gk, gk};
    cuda::launch_quantize_fp8_blocks(qp, stream);
    DS_BENCH_CHECK(cudaStreamSynchronize(stream));
  }
  DecodeInput(const DecodeInput&) = delete;
  DecodeInput& operator=(const DecodeInput&) = delete;
  ~DecodeInput() {
    cudaFree(x);
    cudaFree(codes);
    cudaFree(xs);
    cudaFree(y);
  }
};

// The small-M launch of one weight copy on a DecodeInput (FP8 codes, bf16 output, PDL on).
cuda::Fp8SmallMParams small_m_params(const Weights& w, int c, bool tiled, const DecodeInput& in,
                                     int64_t m, cuda::SmallMKernel kern, int rw, int ks,
                                     int stages, int max_ctas) {
  cuda::Fp8SmallMParams p;
  p.w = w.view(c, tiled);
  p.num_tokens = m;
  p.x_codes = in.codes;
  p.x_scales = in.xs;
  p.y = in.y;
  p.y_type = cuda::OutType::kBF16;
  p.y_row_stride = w.s.n * w.s.groups;
  p.kernel = kern;
  p.row_warps = rw;
  p.k_split = ks;
  p.stages = stages;
  p.max_ctas = max_ctas;
  p.pdl = bench::env_or("DS_BENCH_PDL", "1") != "0";  // DS_BENCH_PDL=0: launches without PDL
  return p;
}

// A graph-mode record (the cuBLASLt rows reset mode): floor = max(bytes / copy bandwidth, flops /
// the FP8 rate).
Rec graph_rec(const std::string& shape, const std::string& kernel, const std::string& cfg,
              double us, double err, double bytes, double flops, double copy_gbps,
              double fp8_tflops) {
  Rec r;
  r.kernel = kernel;
  r.shape = shape;
  r.mode = "graph";
  r.config = cfg;
  r.time_us = us;
  r.bytes = bytes;
  r.flops = flops;
  r.floor_us = std::max(bytes / (copy_gbps * 1e3), flops / (fp8_tflops * 1e6));
  r.ratio = us / r.floor_us;
  r.gbps = bytes / (us * 1e3);
  r.tflops = flops / (us * 1e6);
  r.hbm_fraction = r.gbps / copy_gbps;
  r.err = err;
  return r;
}

// max |y - ref| / S over the first `check` tokens (y bf16 on device, x bf16 host).
double check_error(const Weights& w, const std::vector<uint16_t>& x, int64_t m, const void* d_y,
                   bool quantize, int64_t check) {
  const Shape& s = w.s;
  const int64_t gk = s.k * s.groups, gn = s.n * s.groups, t = std::min(m, check);
  std::vector<uint16_t> y(size_t(t * gn));
  DS_BENCH_CHECK(cudaMemcpy(y.data(), d_y, y.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> abs_codes(w.h_data);
  for (auto& c : abs_codes) c &= 0x7F;
  double worst = 0;
  std::vector<float> xg(size_t(t * s.k)), xa(xg.size()), yr(size_t(t * s.n)), ya(yr.size());
  for (int g = 0; g < s.groups; ++g) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t c = 0; c < s.k; ++c)
        xg[size_t(i * s.k + c)] = bf16_to_float(x[size_t(i * gk + g * s.k + c)]);
      if (quantize) cpu::simulate_fp8_blocks(&xg[size_t(i * s.k)], s.k, 128);
    }
    for (size_t i = 0; i < xg.size(); ++i) xa[i] = std::fabs(xg[i]);
    cpu::LinearWeight lw{
        cpu::WeightFormat::kFp8Block, s.n * s.groups, s.k, w.h_data.data(), w.h_scale.data(), 1.0f};
    cpu::LinearWeight gw = cpu::slice_rows(lw, g * s.n, s.n), aw = gw;
    aw.data = abs_codes.data() + size_t(g * s.n * s.k);
    cpu::linear(xg.data(), t, gw, false, yr.data());
    cpu::linear(xa.data(), t, aw, false, ya.data());
    for (int64_t i = 0; i < t; ++i)
      for (int64_t n = 0; n < s.n; ++n) {
        const double got = bf16_to_float(y[size_t(i * gn + g * s.n + n)]);
        const double ref = yr[size_t(i * s.n + n)], S = ya[size_t(i * s.n + n)];
        const double err =
            std::fabs(got - ref) - std::ldexp(std::fabs(ref), -9);  // minus bf16 rounding
        if (!(err <= 1e30)) return INFINITY;                        // NaN
        if (S > 0) worst = std::max(worst, std::max(0.0, err) / S);
      }
  }
  return worst;
}

std::string shape_str(const Shape& s, int64_t m) {
  std::ostringstream o;
  o << s.name << " M=" << m << " N=" << s.n << (s.groups > 1 ? "x" + std::to_string(s.groups) : "")
    << " K=" << s.k;
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = argc > 1 ? argv[1] : "bench/results/gemm_fp8.json";
  // argv[2]: "quick" (heuristic layouts only, no extra shapes, prefill M = 4096 only),
  // "decode" (all decode shapes and layouts, no prefill) or "prefill" (no decode).
  const bool quick = argc > 2 && std::string(argv[2]) == "quick";
  const bool decode_only = argc > 2 && std::string(argv[2]) == "decode";
  const bool prefill_only = argc > 2 && std::string(argv[2]) == "prefill";
  // "batch": the session-7 decode comparison (engine path vs small-M kAuto vs cuBLASLt, M = 1..64).
  const bool batch_mode = argc > 2 && std::string(argv[2]) == "batch";
  // "tiled": row-major vs tile-ordered weights for kStream / kBulk (session 12), M = 1..16.
  const bool tiled_mode = argc > 2 && std::string(argv[2]) == "tiled";
  cudaStream_t stream;
  DS_BENCH_CHECK(cudaStreamCreate(&stream));
  bench::DeviceInfo dev = bench::device_info();
  const double copy_gbps = bench::measure_copy_bandwidth_gbps(stream);
  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));

  // FP8 ceiling: 8192^3 e4m3 GEMM, per-tensor scales, random data.
  double fp8_tflops = 0;
  {
    const int64_t n = 8192;
    std::vector<uint8_t> h(size_t(n * n));
    Rng rng(7);
    fill_random_bytes(h, rng, true);
    for (auto& c : h) c &= 0xBF;  // keep magnitudes moderate (clear the top exponent bit)
    uint8_t *a, *b;
    void* d;
    DS_BENCH_CHECK(cudaMalloc(&a, h.size()));
    DS_BENCH_CHECK(cudaMalloc(&b, h.size()));
    DS_BENCH_CHECK(cudaMalloc(&d, h.size() * 2));
    DS_BENCH_CHECK(cudaMemcpy(a, h.data(), h.size(), cudaMemcpyHostToDevice));
    DS_BENCH_CHECK(cudaMemcpy(b, h.data(), h.size(), cudaMemcpyHostToDevice));
    LtTensorScaled g(lt, n, n, n, n);
    if (!g.ok) std::fprintf(stderr, "no cuBLASLt FP8 algorithm for the 8192^3 ceiling\n");
    const double us = bench::time_us([&](cudaStream_t s) { g.run(a, b, d, s); }, stream, 20, 3);
    fp8_tflops = 2.0 * double(n) * n * n / (us * 1e-6) / 1e12;
    DS_BENCH_CHECK(cudaFree(a));
    DS_BENCH_CHECK(cudaFree(b));
    DS_BENCH_CHECK(cudaFree(d));
  }
  std::printf("ceilings: copy %.0f GB/s, cuBLASLt FP8 8192^3 %.0f TFLOP/s\n", copy_gbps,
              fp8_tflops);

  const int64_t max_tokens = 8192, max_cols = 32768;
  const size_t ws_bytes = cuda::GemmRunner::workspace_bytes(max_tokens, max_cols);
  void* ws;
  DS_BENCH_CHECK(cudaMalloc(&ws, ws_bytes));
  auto runner_r = cuda::GemmRunner::create(ws, ws_bytes, max_tokens, max_cols);
  ST_CHECK(runner_r.status());
  std::unique_ptr<cuda::GemmRunner> runner = std::move(runner_r).value();
  // "runner" autotunes cuBLASLt (opt-in; its records are "cublaslt fp8 block-scaled" and the
  // prefill "linear_fp8 quant+gemm"); "runner_nt" runs GemmRunner's default (cuBLASLt's first
  // heuristic answer), recorded as "cublaslt fp8 block-scaled untuned".
  runner->set_autotune(true);
  void* ws_nt;
  DS_BENCH_CHECK(cudaMalloc(&ws_nt, ws_bytes));
  auto runner_nt_r = cuda::GemmRunner::create(ws_nt, ws_bytes, max_tokens, max_cols);
  ST_CHECK(runner_nt_r.status());
  std::unique_ptr<cuda::GemmRunner> runner_nt = std::move(runner_nt_r).value();
  runner_nt->set_autotune(false);

  uint32_t* sink = nullptr;
  DS_BENCH_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
  std::vector<Rec> recs;
  // Rewritten after every decode shape so that a run cut short still leaves its records.
  auto write_json = [&]() {
    std::ostringstream js;
    int cublas_ver = 0;
    cublas_ver = int(cublasLtGetVersion());
    js << "{\n  \"benchmark\": \"gemm_fp8\",\n  \"gpu\": \"" << dev.name
       << "\",\n  \"sm_count\": " << dev.sm_count
       << ",\n  \"driver_version\": " << dev.driver_version
       << ",\n  \"cublaslt_version\": " << cublas_ver << ",\n  \"commit\": \""
       << bench::env_or("DS_COMMIT", "unknown") << "\",\n  \"date\": \"" << bench::iso_date()
       << "\",\n  \"ceilings\": {\"copy_gbps\": " << copy_gbps
       << ", \"fp8_tflops_cublaslt_8192\": " << fp8_tflops
       << ", \"fp8_tflops_datasheet\": " << kFp8DatasheetTflops << "},\n  \"records\": [\n";
    for (size_t i = 0; i < recs.size(); ++i) {
      const Rec& r = recs[i];
      js << "    {\"kernel\": \"" << r.kernel << "\", \"shape\": \"" << r.shape
         << "\", \"mode\": \"" << r.mode << "\", \"config\": \"" << r.config
         << "\", \"time_us\": " << r.time_us << ", \"bytes\": " << r.bytes
         << ", \"flops\": " << r.flops << ", \"floor_us\": " << r.floor_us
         << ", \"ratio_to_floor\": " << r.ratio << ", \"achieved_gbps\": " << r.gbps
         << ", \"achieved_tflops\": " << r.tflops << ", \"hbm_fraction\": " << r.hbm_fraction
         << ", \"fp8_rate_fraction\": " << r.fp8_rate_fraction
         << ", \"fraction_of_same_shape_tensor_scaled\": " << r.same_shape_fraction
         << ", \"fraction_of_datasheet_fp8\": " << r.tflops / kFp8DatasheetTflops
         << ", \"error_metric\": \"max(|y-ref| - bf16 half-ulp)/sum|x w|, first tokens\", "
            "\"max_error\": "
         << r.err << "}" << (i + 1 < recs.size() ? "," : "") << "\n";
    }
    js << "  ]\n}\n";
    std::ofstream(out) << js.str();
  };
  const Shape attn[] = {{"wq_a", 1024, 4096, 1},
                        {"wq_b", 32768, 1024, 1},
                        {"wkv", 512, 4096, 1},
                        {"wo_a", 1024, 4096, 8},
                        {"wo_b", 4096, 8192, 1}};
  const Shape extra[] = {{"wq_a+wkv", 1536, 4096, 1},
                         {"shared_w1", 2048, 4096, 1},
                         {"shared_w2", 4096, 2048, 1},
                         {"idx_wq_b", 8192, 1024, 1}};
  std::vector<Shape> decode_shapes(std::begin(attn), std::end(attn));
  if (!quick) decode_shapes.insert(decode_shapes.end(), std::begin(extra), std::end(extra));
  if (prefill_only) decode_shapes.clear();
  const size_t rotate_bytes = size_t(160) << 20;  // > 2x the 60 MB L2

  // ---------------- batch (session 7): engine path vs small-M kAuto vs cuBLASLt, M = 1..64 -----
  // Per shape and M: what GemmRunner::linear_fp8 runs on pre-quantized input (the small-M kAuto
  // plan, or cuBLASLt where fp8_linear_uses_cublaslt), the small-M kAuto plan itself, cuBLASLt's
  // block-scaled GEMM at M >= 16 (GemmRunner's default plan, incl. the activation-scale
  // transpose) and, at M = 1, the read ceiling of the weight bytes; PDL on for our kernels. All in
  // CUDA graphs of `copies` launches on distinct weight copies (> 2x L2). (Session 7's kPersist
  // sweeps ran in this mode at commits 3060ef2 / bbb9317; the kernel was removed, NOTES.md v6.)
  if (batch_mode) {
    struct Row {
      std::string shape;
      double ceil_us = 0, heur_us = 0, lt_us = 0, floor_us = 0, run_us = 0;
      std::string heur_cfg, run_cfg;
      double heur_err = -1, lt_err = -1, run_err = -1;
      double wg_us = 0, wg_best_us = 0, wg_err = -1;
      std::string wg_cfg, wg_best_cfg;
      // hf numerics (bf16 activations: what the engine runs for wo_a): kAuto vs kWgmma.
      double hf_us = 0, hf_err = -1, hfwg_us = 0, hfwg_err = -1, hfwg_best_us = 0;
      std::string hf_cfg, hfwg_cfg, hfwg_best_cfg;
    };
    // kWgmma needs a compute capability 9.0 device.
    const bool wgmma_ok = dev.cc_major == 9 && dev.cc_minor == 0;
    std::vector<Row> rows;
    std::vector<Shape> shapes(std::begin(attn), std::end(attn));
    shapes.push_back(extra[0]);  // wq_a+wkv fused
    // DS_BATCH_TP2=1: the per-rank slices of the three 33 MB projections under tensor parallelism
    // of 2 (docs/parallelism.md: wq_b rows by head, wo_a rows by group, wo_b input columns).
    if (bench::env_or("DS_BATCH_TP2", "0") == "1")
      shapes = {{"wq_b/tp2", 16384, 1024, 1}, {"wo_a/tp2", 1024, 4096, 4},
                {"wo_b/tp2", 4096, 4096, 1}};
    // DS_BATCH_SHAPES="wq_b,wo_b" / DS_BATCH_M="16,64": only these shapes / token counts.
    const std::string only_shapes = bench::env_or("DS_BATCH_SHAPES", "");
    const std::string only_m = "," + bench::env_or("DS_BATCH_M", "") + ",";
    for (const Shape& s : shapes) {
      if (!only_shapes.empty() &&
          ("," + only_shapes + ",").find("," + std::string(s.name) + ",") == std::string::npos)
        continue;
      const size_t wbytes = size_t(s.n * s.groups * s.k);
      const int copies = int(std::max<size_t>(20, (rotate_bytes + wbytes - 1) / wbytes));
      Weights w(s, copies, 11 + s.n + s.k);
      double ceil_us = 0;
      for (int64_t m : {1, 2, 4, 8, 16, 32, 64}) {
        if (only_m != ",," && only_m.find("," + std::to_string(m) + ",") == std::string::npos)
          continue;
        const int64_t gk = s.k * s.groups, gn = s.n * s.groups;
        const DecodeInput in(s, m, stream);
        const std::vector<uint16_t>& hx = in.hx;
        uint8_t* const codes = in.codes;
        uint8_t* const xs = in.xs;
        uint16_t* const y = in.y;
        // hf: the bf16 activations themselves (hf numerics, no quantization) instead of the codes.
        auto params = [&](int c, cuda::SmallMKernel kern, int rw, int ks, int st, int max_ctas,
                          bool hf = false) {
          cuda::Fp8SmallMParams p = small_m_params(w, c, false, in, m, kern, rw, ks, st, max_ctas);
          if (hf) {
            p.x_codes = nullptr;
            p.x_scales = nullptr;
            p.x_bf16 = in.x;
            p.x_row_stride = gk;
          }
          return p;
        };
        auto time_p = [&](cuda::SmallMKernel kern, int rw, int ks, int st, int max_ctas,
                          bool hf = false) {
          return bench::time_us(
                     [&](cudaStream_t sm) {
                       for (int c = 0; c < copies; ++c)
                         ST_CHECK(cuda::launch_fp8_linear_small_m(
                             params(c, kern, rw, ks, st, max_ctas, hf), sm));
                     },
                     stream, 20, 3, true) /
                 copies;
        };
        auto check_p = [&](cuda::SmallMKernel kern, int rw, int ks, int st, int max_ctas,
                           bool hf = false) {
          DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
          ST_CHECK(cuda::launch_fp8_linear_small_m(params(0, kern, rw, ks, st, max_ctas, hf),
                                                   stream));
          DS_BENCH_CHECK(cudaStreamSynchronize(stream));
          return check_error(w, hx, m, y, !hf, 3);
        };
        const double bytes = double(wbytes) + double(w.scale_count) + double(m * gk) +
                             double(m * gk / 128) + double(m * gn) * 2;
        const double flops = 2.0 * double(m) * double(gn) * double(s.k);
        auto make = [&](const std::string& kernel, const std::string& cfg, double us, double err) {
          return graph_rec(shape_str(s, m), kernel, cfg, us, err, bytes, flops, copy_gbps,
                           fp8_tflops);
        };
        Row row;
        row.shape = shape_str(s, m);
        row.floor_us = bytes / (copy_gbps * 1e3);
        const cuda::Fp8SmallMPlan plan =
            cuda::fp8_small_m_plan(params(0, cuda::SmallMKernel::kAuto, 0, 0, 0, 0), dev.sm_count);
        const char* pk = plan.kernel == cuda::SmallMKernel::kBulk     ? "bulk"
                         : plan.kernel == cuda::SmallMKernel::kStream ? "stream"
                                                                      : "mma";
        char cfg[128];
        std::snprintf(cfg, sizeof cfg, "%s rw=%d ks=%d stages=%d copies=%d", pk, plan.row_warps,
                      plan.k_split, plan.stages, copies);
        row.heur_cfg = cfg;
        row.heur_us = time_p(cuda::SmallMKernel::kAuto, 0, 0, 0, 0);
        row.heur_err = check_p(cuda::SmallMKernel::kAuto, 0, 0, 0, 0);
        recs.push_back(make("fp8_small_m heur+pdl", cfg, row.heur_us, row.heur_err));
        {
          // What the engine runs: GemmRunner::linear_fp8 on the pre-quantized input (PDL on): the
          // small-M kAuto plan, or cuBLASLt where fp8_linear_uses_cublaslt.
          auto rp = [&](int c) {
            cuda::Fp8LinearParams p;
            p.w = w.view(c);
            p.num_tokens = m;
            p.x.codes = codes;
            p.x.scales = xs;
            p.y = y;
            p.y_row_stride = gn;
            p.pdl = true;
            return p;
          };
          const bool lt = cuda::fp8_linear_uses_cublaslt(w.view(0), m);
          DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
          ST_CHECK(runner_nt->linear_fp8(rp(0), stream));
          DS_BENCH_CHECK(cudaStreamSynchronize(stream));
          row.run_err = check_error(w, hx, m, y, true, 3);
          row.run_us = bench::time_us(
                          [&](cudaStream_t sm) {
                            for (int c = 0; c < copies; ++c)
                              ST_CHECK(runner_nt->linear_fp8(rp(c), sm));
                          },
                          stream, 20, 3, true) /
                      copies;
          row.run_cfg = lt ? std::string("cublaslt") : row.heur_cfg;
          recs.push_back(make("GemmRunner linear_fp8 (pre-quantized)+pdl",
                              lt ? "cuBLASLt block-scaled" : row.heur_cfg, row.run_us, row.run_err));
        }
        // kWgmma (session 27): the heuristic layout (fw, fk, fs: 0 = heuristic), then, unless
        // DS_WG_SWEEP=0, every (warpgroups, k_split in `splits`, stages) layout; the fastest is
        // kept next to it. `tag` names the records ("" or " bf16-act").
        auto wgmma_rows = [&](bool hf, int fw, int fk, int fs, std::initializer_list<int> splits,
                              const std::string& tag, double& us_out, double& err_out,
                              std::string& cfg_out, double& best_us, std::string& best_cfg) {
          const cuda::Fp8SmallMPlan wp = cuda::fp8_small_m_plan(
              params(0, cuda::SmallMKernel::kWgmma, fw, fk, fs, 0, hf), dev.sm_count);
          char wcfg[128];
          std::snprintf(wcfg, sizeof wcfg, "wgmma wg=%d ks=%d st=%d", wp.row_warps, wp.k_split,
                        wp.stages);
          cfg_out = wcfg;
          us_out = time_p(cuda::SmallMKernel::kWgmma, fw, fk, fs, 0, hf);
          err_out = check_p(cuda::SmallMKernel::kWgmma, fw, fk, fs, 0, hf);
          recs.push_back(make("fp8_small_m wgmma" + tag + " heur+pdl", wcfg, us_out, err_out));
          best_us = us_out;
          best_cfg = wcfg;
          if (bench::env_or("DS_WG_SWEEP", "1") == "0") return;
          const int64_t kb = s.k / 128;
          for (int wgs : {1, 2})
            for (int ks : splits)
              for (int st : {4, 6}) {
                const int64_t ctas = (s.n + 64 * wgs - 1) / (64 * wgs) * s.groups * ks;
                if (ks > kb || (kb + ks - 1) / ks > 64 || ctas > 6 * dev.sm_count) continue;
                if (wgs == wp.row_warps && ks == wp.k_split && st == wp.stages) continue;
                const double us = time_p(cuda::SmallMKernel::kWgmma, wgs, ks, st, 0, hf);
                std::snprintf(wcfg, sizeof wcfg, "wgmma wg=%d ks=%d st=%d", wgs, ks, st);
                recs.push_back(make("fp8_small_m wgmma" + tag + " sweep+pdl", wcfg, us, -1));
                if (us < best_us) {
                  best_us = us;
                  best_cfg = wcfg;
                }
              }
        };
        if (wgmma_ok) {
          // DS_WG_CFG="wg,ks,stages" replaces the heuristic layout (profiling one layout).
          int fw = 0, fk = 0, fs = 0;
          std::sscanf(bench::env_or("DS_WG_CFG", "").c_str(), "%d,%d,%d", &fw, &fk, &fs);
          wgmma_rows(false, fw, fk, fs, {1, 2, 4, 8}, "", row.wg_us, row.wg_err, row.wg_cfg,
                     row.wg_best_us, row.wg_best_cfg);
        }
        if (bench::env_or("DS_BATCH_HF", "1") != "0") {
          // hf numerics: small-M kAuto (kMma) against kWgmma's bf16 variant.
          const cuda::Fp8SmallMPlan hp = cuda::fp8_small_m_plan(
              params(0, cuda::SmallMKernel::kAuto, 0, 0, 0, 0, true), dev.sm_count);
          char hcfg[128];
          std::snprintf(hcfg, sizeof hcfg, "mma rw=%d ks=%d", hp.row_warps, hp.k_split);
          row.hf_cfg = hcfg;
          row.hf_us = time_p(cuda::SmallMKernel::kAuto, 0, 0, 0, 0, true);
          row.hf_err = check_p(cuda::SmallMKernel::kAuto, 0, 0, 0, 0, true);
          recs.push_back(make("fp8_small_m bf16-act heur+pdl", hcfg, row.hf_us, row.hf_err));
          if (wgmma_ok)
            wgmma_rows(true, 0, 0, 0, {1, 2, 4}, " bf16-act", row.hfwg_us, row.hfwg_err,
                       row.hfwg_cfg, row.hfwg_best_us, row.hfwg_best_cfg);
        }
        if (m >= 16) {
          // cuBLASLt block-scaled (GemmRunner's default path for M > 64) at the same M.
          auto lt_params = [&](int c) {
            cuda::Fp8LinearParams p;
            p.w = w.view(c);
            p.num_tokens = m;
            p.x.codes = codes;
            p.x.scales = xs;
            p.y = y;
            p.y_row_stride = gn;
            return p;
          };
          DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
          const Status st = runner_nt->linear_fp8_cublaslt(lt_params(0), stream);
          DS_BENCH_CHECK(cudaStreamSynchronize(stream));
          if (st.ok()) {
            row.lt_err = check_error(w, hx, m, y, true, 3);
            row.lt_us = bench::time_us(
                            [&](cudaStream_t sm) {
                              for (int c = 0; c < copies; ++c)
                                ST_CHECK(runner_nt->linear_fp8_cublaslt(lt_params(c), sm));
                            },
                            stream, 20, 3, true) /
                        copies;
            recs.push_back(make("cublaslt fp8 block-scaled", "GemmRunner default", row.lt_us,
                                row.lt_err));
          } else {
            std::printf("  %s cuBLASLt: %s\n", row.shape.c_str(), st.to_string().c_str());
          }
        }
        if (m == 1) {
          ceil_us = bench::time_us(
                        [&](cudaStream_t sm) {
                          for (int c = 0; c < copies; ++c)
                            launch_read(w.data + w.data_bytes * c, w.data_bytes, dev.sm_count,
                                        sink, sm);
                        },
                        stream, 20, 3, true) /
                    copies;
          recs.push_back(make("read ceiling (weight bytes)", "sms*4 x 512", ceil_us, -1));
        }
        row.ceil_us = ceil_us;
        rows.push_back(row);
      }
      write_json();
    }
    write_json();
    std::printf("\nbatch summary (copy %.0f GB/s; %% = floor / time; ceiling = read kernel, M=1)\n",
                copy_gbps);
    std::printf("%-14s %6s %5s | %-24s %6s %3s | %-24s %6s %3s | %7s %3s | %7s %7s %7s\n", "shape",
                "floor", "ceil", "runner (engine)", "us", "%", "small-M kAuto", "us", "%", "cublas",
                "%", "e_run", "e_heur", "e_lt");
    auto shortcfg = [](const std::string& c) { return c.substr(0, c.find(" copies")); };
    if (wgmma_ok) {
      std::printf("\nkWgmma (%% = floor / time)\n%-14s %6s | %-24s %6s %3s %7s | %-24s %6s %3s\n",
                  "shape", "floor", "heuristic", "us", "%", "err", "best layout", "us", "%");
      for (const Row& r : rows) {
        const std::string sh = r.shape.substr(0, r.shape.find(" N="));
        std::printf("%-14s %6.2f | %-24s %6.2f %3.0f %7.2g | %-24s %6.2f %3.0f\n", sh.c_str(),
                    r.floor_us, r.wg_cfg.c_str(), r.wg_us, 100 * r.floor_us / r.wg_us, r.wg_err,
                    r.wg_best_cfg.c_str(), r.wg_best_us, 100 * r.floor_us / r.wg_best_us);
      }
    }
    if (bench::env_or("DS_BATCH_HF", "1") != "0") {
      std::printf("\nhf numerics, bf16 activations (%% = floor / time)\n%-14s %6s | %-16s %6s %3s "
                  "%7s | %-22s %6s %3s %7s | %-22s %6s\n",
                  "shape", "floor", "small-M kAuto", "us", "%", "err", "kWgmma heuristic", "us",
                  "%", "err", "kWgmma best", "us");
      for (const Row& r : rows) {
        const std::string sh = r.shape.substr(0, r.shape.find(" N="));
        std::printf("%-14s %6.2f | %-16s %6.2f %3.0f %7.2g | %-22s %6.2f %3.0f %7.2g | %-22s "
                    "%6.2f\n",
                    sh.c_str(), r.floor_us, r.hf_cfg.c_str(), r.hf_us, 100 * r.floor_us / r.hf_us,
                    r.hf_err, r.hfwg_cfg.c_str(), r.hfwg_us,
                    r.hfwg_us > 0 ? 100 * r.floor_us / r.hfwg_us : 0.0, r.hfwg_err,
                    r.hfwg_best_cfg.c_str(), r.hfwg_best_us);
      }
    }
    for (const Row& r : rows) {
      const std::string sh = r.shape.substr(0, r.shape.find(" N="));
      std::printf("%-14s %6.2f %5.2f | %-24s %6.2f %3.0f | %-24s %6.2f %3.0f | %7.2f %3.0f | %7.2g "
                  "%7.2g %7.2g\n",
                  sh.c_str(), r.floor_us, r.ceil_us, shortcfg(r.run_cfg).c_str(), r.run_us,
                  100 * r.floor_us / r.run_us, shortcfg(r.heur_cfg).c_str(), r.heur_us,
                  100 * r.floor_us / r.heur_us, r.lt_us,
                  r.lt_us > 0 ? 100 * r.floor_us / r.lt_us : 0.0, r.run_err, r.heur_err, r.lt_err);
    }
    std::printf("results written to %s\n", out.c_str());
    return 0;
  }

  // ---------------- tiled (session 12): row-major vs tile-ordered weights, kStream and kBulk ------
  // Per shape and M: the heuristic plan and the best kStream / kBulk layout on each weight layout,
  // in CUDA graphs of `copies` launches on distinct weight copies (> 2x L2), PDL on, FP8 input
  // pre-quantized; at M = 1 also the read ceiling of the weight bytes.
  if (tiled_mode) {
    std::printf("\ntiled summary (copy %.0f GB/s; %% = floor / time)\n", copy_gbps);
    std::vector<Shape> shapes(std::begin(attn), std::end(attn));
    shapes.insert(shapes.end(), std::begin(extra), std::end(extra));
    // DS_KPARTS: only the three 33 MB projections (CudaOps tiles them), with the k_parts sweep.
    auto tl_only_big = [](const Shape& s) { return s.n * s.groups * s.k >= (int64_t(32) << 20); };
    if (std::getenv("DS_KPARTS")) std::erase_if(shapes, [&](const Shape& s) { return !tl_only_big(s); });
    for (const Shape& s : shapes) {
      const size_t wbytes = size_t(s.n * s.groups * s.k);
      const int copies = int(std::max<size_t>(20, (rotate_bytes + wbytes - 1) / wbytes));
      Weights w(s, copies, 11 + s.n + s.k, true);
      for (int64_t m : {1, 2, 8, 16}) {
        const int64_t gk = s.k * s.groups, gn = s.n * s.groups;
        const DecodeInput in(s, m, stream);
        const std::vector<uint16_t>& hx = in.hx;
        uint16_t* const y = in.y;
        auto params = [&](int c, bool tl, cuda::SmallMKernel kern, int rw, int ks, int st) {
          return small_m_params(w, c, tl, in, m, kern, rw, ks, st, 0);
        };
        auto try_time = [&](bool tl, cuda::SmallMKernel kern, int rw, int ks, int st) {
          const ds::Status trial = cuda::launch_fp8_linear_small_m(params(0, tl, kern, rw, ks, st),
                                                                   stream);
          const cudaError_t sync = cudaStreamSynchronize(stream);
          if (!trial.ok() || sync != cudaSuccess) {
            (void)cudaGetLastError();
            return 1e30;
          }
          return bench::time_us(
                     [&](cudaStream_t sm) {
                       for (int c = 0; c < copies; ++c)
                         ST_CHECK(cuda::launch_fp8_linear_small_m(params(c, tl, kern, rw, ks, st),
                                                                  sm));
                     },
                     stream, 20, 3, true) /
                 copies;
        };
        auto check = [&](bool tl, cuda::SmallMKernel kern, int rw, int ks, int st) {
          DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
          ST_CHECK(cuda::launch_fp8_linear_small_m(params(0, tl, kern, rw, ks, st), stream));
          DS_BENCH_CHECK(cudaStreamSynchronize(stream));
          return check_error(w, hx, m, y, true, 3);
        };
        const double bytes = double(wbytes) + double(w.scale_count) + double(m * gk) +
                             double(m * gk / 128) + double(m * gn) * 2;
        const double flops = 2.0 * double(m) * double(gn) * double(s.k);
        const double floor_us = bytes / (copy_gbps * 1e3);
        auto make = [&](const std::string& kernel, const std::string& cfg, double us, double err) {
          return graph_rec(shape_str(s, m), kernel, cfg, us, err, bytes, flops, copy_gbps,
                           fp8_tflops);
        };
        std::printf("%-30s floor %.2f us", shape_str(s, m).c_str(), floor_us);
        for (bool tl : {false, true}) {
          const char* lay = tl ? "tiled" : "rowmajor";
          const cuda::Fp8SmallMPlan plan = cuda::fp8_small_m_plan(
              params(0, tl, cuda::SmallMKernel::kAuto, 0, 0, 0), dev.sm_count);
          const double heur = try_time(tl, cuda::SmallMKernel::kAuto, 0, 0, 0);
          char cfg[128];
          std::snprintf(cfg, sizeof cfg, "%s %s rw=%d ks=%d stages=%d copies=%d", lay,
                        plan.kernel == cuda::SmallMKernel::kBulk ? "bulk" : "stream",
                        plan.row_warps, plan.k_split, plan.stages, copies);
          recs.push_back(make("fp8_small_m heur+pdl", cfg,
                              heur, check(tl, cuda::SmallMKernel::kAuto, 0, 0, 0)));
          std::printf(" | %s heur %.2f (%.0f%%)", lay, heur, 100 * floor_us / heur);
          for (cuda::SmallMKernel kern : {cuda::SmallMKernel::kStream, cuda::SmallMKernel::kBulk}) {
            const bool bulk = kern == cuda::SmallMKernel::kBulk;
            double best = 1e30;
            int brw = 0, bks = 0, bst = 0;
            for (int rw : {1, 2, 4})
              for (int ks : {1, 2, 4, 8})
                for (int st : {2, 4}) {
                  if (s.k / 128 < ks || (!bulk && st != 2)) continue;
                  const double us = try_time(tl, kern, rw, ks, bulk ? st : 0);
                  if (us < best) best = us, brw = rw, bks = ks, bst = bulk ? st : 0;
                }
            if (best >= 1e30) continue;
            std::snprintf(cfg, sizeof cfg, "%s %s rw=%d ks=%d stages=%d copies=%d", lay,
                          bulk ? "bulk" : "stream", brw, bks, bst, copies);
            recs.push_back(make(bulk ? "fp8_bulk best+pdl" : "fp8_stream best+pdl", cfg, best,
                                check(tl, kern, brw, bks, bst)));
            std::printf(" | %s %s %d/%d/%d %.2f (%.0f%%)", lay, bulk ? "bulk" : "stream", brw,
                        bks, bst, best, 100 * floor_us / best);
          }
        }
        if (std::getenv("DS_KPARTS") && tl_only_big(s) && m <= 8) {
          // kBulk on the tiled copy with 2 K partitions per CTA (session 13) vs 1.
          for (int rw : {1, 2, 4})
            for (int ks : {1, 2})
              for (int kp : {1, 2}) {
                if (kp == 1 && ks == 1) continue;
                auto pp = [&](int c) {
                  cuda::Fp8SmallMParams p =
                      small_m_params(w, c, true, in, m, cuda::SmallMKernel::kBulk, rw, ks, 2, 0);
                  p.k_parts = kp;
                  return p;
                };
                if (!cuda::launch_fp8_linear_small_m(pp(0), stream).ok() ||
                    cudaStreamSynchronize(stream) != cudaSuccess) {
                  (void)cudaGetLastError();
                  continue;
                }
                const double us = bench::time_us(
                                      [&](cudaStream_t sm) {
                                        for (int c = 0; c < copies; ++c)
                                          ST_CHECK(cuda::launch_fp8_linear_small_m(pp(c), sm));
                                      },
                                      stream, 20, 3, true) /
                                  copies;
                DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
                ST_CHECK(cuda::launch_fp8_linear_small_m(pp(0), stream));
                DS_BENCH_CHECK(cudaStreamSynchronize(stream));
                const double err = check_error(w, hx, m, y, true, 3);
                char cfg[128];
                std::snprintf(cfg, sizeof cfg, "tiled bulk rw=%d ks=%d k_parts=%d stages=2 copies=%d",
                              rw, ks, kp, copies);
                recs.push_back(make("fp8_bulk k_parts+pdl", cfg, us, err));
                std::printf("\n  kparts %s M=%lld rw%d ks%d kp%d %.2f us (%.0f%%) err %.2g", s.name,
                            (long long)m, rw, ks, kp, us, 100 * floor_us / us, err);
              }
          std::printf("\n");
        }
        if (m == 1) {
          const double us = bench::time_us(
                                [&](cudaStream_t sm) {
                                  for (int c = 0; c < copies; ++c)
                                    launch_read(w.data + w.data_bytes * c, w.data_bytes,
                                                dev.sm_count, sink, sm);
                                },
                                stream, 20, 3, true) /
                            copies;
          recs.push_back(make("read ceiling (weight bytes)", "sms*4 x 512", us, -1));
          std::printf(" | read %.2f (%.0f%%)", us, 100 * floor_us / us);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
      write_json();
    }
    std::printf("results written to %s\n", out.c_str());
    return 0;
  }

  // ---------------- decode ----------------
  for (const Shape& s : decode_shapes) {
    const size_t wbytes = size_t(s.n * s.groups * s.k);
    // At least 20 launches per graph (amortizes the graph launch) and > 2x L2 of weights.
    const int copies = int(std::max<size_t>(20, (rotate_bytes + wbytes - 1) / wbytes));
    Weights w(s, copies, 11 + s.n + s.k);
    for (int64_t m : {1, 2, 4, 8, 16, 64}) {
      const int64_t gk = s.k * s.groups, gn = s.n * s.groups;
      const DecodeInput in(s, m, stream);
      const std::vector<uint16_t>& hx = in.hx;
      uint16_t* const x = in.x;
      uint8_t* const codes = in.codes;
      uint8_t* const xs = in.xs;
      uint16_t* const y = in.y;
      auto params = [&](int c, int rw, int ks, bool fp8, bool pdl = true,
                        cuda::SmallMKernel kern = cuda::SmallMKernel::kAuto, int stages = 0) {
        cuda::Fp8SmallMParams p;
        p.w = w.view(c);
        p.num_tokens = m;
        if (fp8) {
          p.x_codes = codes;
          p.x_scales = xs;
        } else {
          p.x_bf16 = x;
          p.x_row_stride = gk;
        }
        p.y = y;
        p.y_type = cuda::OutType::kBF16;
        p.y_row_stride = gn;
        p.kernel = kern;
        p.row_warps = rw;
        p.k_split = ks;
        p.pdl = pdl;
        p.stages = stages;
        return p;
      };
      const double bytes = double(wbytes) + double(w.scale_count) + double(m * gk) +
                           double(m * gk / 128) + double(m * gn) * 2;
      const double flops = 2.0 * double(m) * double(gn) * double(s.k);
      auto make = [&](const std::string& kernel, const std::string& cfg, double us, double err,
                      double extra_bytes) {
        return graph_rec(shape_str(s, m), kernel, cfg, us, err, bytes + extra_bytes, flops,
                         copy_gbps, fp8_tflops);
      };
      // The heuristic's plan (what GemmRunner::linear_fp8 runs on pre-quantized input).
      const cuda::Fp8SmallMPlan plan = cuda::fp8_small_m_plan(params(0, 0, 0, true), dev.sm_count);
      const bool plan_stream = plan.kernel == cuda::SmallMKernel::kStream ||
                               plan.kernel == cuda::SmallMKernel::kBulk;
      auto time_cfg = [&](cuda::SmallMKernel kern, int rw, int ks, bool fp8, bool pdl,
                          int stages = 0) {
        return bench::time_us(
                   [&](cudaStream_t st) {
                     for (int c = 0; c < copies; ++c)
                       ST_CHECK(cuda::launch_fp8_linear_small_m(
                           params(c, rw, ks, fp8, pdl, kern, stages), st));
                   },
                   stream, 20, 3, true) /
               copies;
      };
      // One eager launch before timing a layout: one the launch refuses is reported and skipped
      // rather than ending the whole sweep (sessions 7-9: cudaErrorInvalidValue, not debugged).
      const char* kname[] = {"auto", "mma", "stream", "bulk"};
      auto accepted = [&](cuda::SmallMKernel kern, int rw, int ks, int stages) {
        const ds::Status trial =
            cuda::launch_fp8_linear_small_m(params(0, rw, ks, true, true, kern, stages), stream);
        const cudaError_t sync = cudaStreamSynchronize(stream);
        if (trial.ok() && sync == cudaSuccess) return true;
        std::printf("  %s M=%lld %s rw=%d ks=%d stages=%d: %s / %s (skipped)\n", s.name,
                    (long long)m, kname[int(kern)], rw, ks, stages, trial.to_string().c_str(),
                    cudaGetErrorString(sync));
        (void)cudaGetLastError();
        return false;
      };
      // Sweep both kernels' layouts (with programmatic dependent launch, as the engine runs them).
      struct Best {
        double us = 1e30;
        int rw = 0, ks = 0, stages = 0;
      };
      Best best_mma, best_stream, best_bulk;
      const auto [mrw, mks] = cuda::fp8_small_m_config(params(0, 0, 0, true), dev.sm_count);
      for (int rw : {1, 2, 4, 8})
        for (int ks : {1, 2, 4, 8}) {
          if (s.k / 128 < ks) continue;
          if (!(rw == mrw && ks == mks)) continue;  // kMma: its heuristic layout only (v5)
          if (!accepted(cuda::SmallMKernel::kMma, rw, ks, 0)) continue;
          const double us = time_cfg(cuda::SmallMKernel::kMma, rw, ks, true, true);
          if (us < best_mma.us) best_mma = {us, rw, ks};
        }
      for (int rw : {1, 2, 4})
        for (int ks : {1, 2, 4, 8}) {
          if (s.k / 128 < ks) continue;
          if (quick && plan_stream && !(rw == plan.row_warps && ks == plan.k_split)) continue;
          if (!accepted(cuda::SmallMKernel::kStream, rw, ks, 0)) continue;
          const double us = time_cfg(cuda::SmallMKernel::kStream, rw, ks, true, true);
          if (us < best_stream.us) best_stream = {us, rw, ks};
          if (m == 1 && wbytes > (size_t(16) << 20))
            std::printf("  sweep %s M=1 stream rw=%d ks=%d %.2f us\n", s.name, rw, ks, us);
        }
      // kBulk (TMA bulk copies into a shared-memory ring): layouts x ring depths.
      for (int rw : {1, 2, 4})
        for (int ks : {1, 2, 4, 8})
          for (int st : {2, 4, 8}) {
            if (s.k / 128 < ks) continue;
            if (quick && !(rw == plan.row_warps && ks == plan.k_split && st == 4)) continue;
            if (!accepted(cuda::SmallMKernel::kBulk, rw, ks, st)) continue;
            const double us = time_cfg(cuda::SmallMKernel::kBulk, rw, ks, true, true, st);
            if (us < best_bulk.us) best_bulk = {us, rw, ks, st};
            if (m == 1 && wbytes > (size_t(16) << 20))
              std::printf("  sweep %s M=1 bulk rw=%d ks=%d st=%d %.2f us\n", s.name, rw, ks, st,
                          us);
          }
      const double heur =
          time_cfg(plan.kernel, plan.row_warps, plan.k_split, true, true, plan.stages);
      const double heur_nopdl =
          time_cfg(plan.kernel, plan.row_warps, plan.k_split, true, false, plan.stages);
      // Correctness of the heuristic configuration and of both best layouts.
      auto check = [&](cuda::SmallMKernel kern, int rw, int ks, int stages = 0) {
        DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
        ST_CHECK(cuda::launch_fp8_linear_small_m(params(0, rw, ks, true, false, kern, stages),
                                                 stream));
        DS_BENCH_CHECK(cudaStreamSynchronize(stream));
        return check_error(w, hx, m, y, true, 4);
      };
      const double err = check(plan.kernel, plan.row_warps, plan.k_split, plan.stages);
      const char* pk = plan.kernel == cuda::SmallMKernel::kBulk ? "bulk"
                       : plan_stream                               ? "stream"
                                                                   : "mma";
      char cfg[96];
      std::snprintf(cfg, sizeof cfg, "%s rw=%d ks=%d stages=%d copies=%d", pk, plan.row_warps,
                    plan.k_split, plan.stages, copies);
      recs.push_back(make("fp8_small_m heur", cfg, heur_nopdl, err, 0));
      recs.push_back(make("fp8_small_m heur+pdl", cfg, heur, err, 0));
      if (best_mma.us < 1e30) {  // none when the kMma launch was refused (printed above)
        std::snprintf(cfg, sizeof cfg, "mma rw=%d ks=%d copies=%d", best_mma.rw, best_mma.ks,
                      copies);
        recs.push_back(make("fp8_mma heur+pdl", cfg, best_mma.us,
                            check(cuda::SmallMKernel::kMma, best_mma.rw, best_mma.ks), 0));
      }
      if (best_stream.us < 1e30) {
        std::snprintf(cfg, sizeof cfg, "stream rw=%d ks=%d copies=%d", best_stream.rw,
                      best_stream.ks, copies);
        recs.push_back(make("fp8_stream best+pdl", cfg, best_stream.us,
                            check(cuda::SmallMKernel::kStream, best_stream.rw, best_stream.ks), 0));
      }
      if (best_bulk.us < 1e30) {
        std::snprintf(cfg, sizeof cfg, "bulk rw=%d ks=%d stages=%d copies=%d", best_bulk.rw,
                      best_bulk.ks, best_bulk.stages, copies);
        recs.push_back(make("fp8_bulk best+pdl", cfg, best_bulk.us,
                            check(cuda::SmallMKernel::kBulk, best_bulk.rw, best_bulk.ks,
                                  best_bulk.stages),
                            0));
      }
      if (m == 1) {
        // What a plain read of the same bytes costs in the same setting (graph of `copies`
        // launches on distinct weight copies, no PDL): the practical ceiling of this measurement.
        const double us =
            bench::time_us(
                [&](cudaStream_t st) {
                  for (int c = 0; c < copies; ++c)
                    launch_read(w.data + w.data_bytes * c, w.data_bytes, dev.sm_count, sink, st);
                },
                stream, 20, 3, true) /
            copies;
        recs.push_back(make("read ceiling (weight bytes)", "sms*4 x 512", us, -1, 0));
        std::printf("%-30s read-only kernel %.2f us (%.0f%% of copy BW)\n", shape_str(s, m).c_str(),
                    us, 100 * double(wbytes) / (copy_gbps * 1e3) / us);
      }
      // Full linear: quantization + GEMM (reference numerics from bf16 input).
      {
        const double us = bench::time_us(
                              [&](cudaStream_t st) {
                                for (int c = 0; c < copies; ++c) {
                                  cuda::Fp8LinearParams p;
                                  p.w = w.view(c);
                                  p.num_tokens = m;
                                  p.x.bf16 = x;
                                  p.x.x_row_stride = gk;
                                  p.y = y;
                                  p.y_row_stride = gn;
                                  p.pdl = true;
                                  ST_CHECK(runner->linear_fp8(p, st));
                                }
                              },
                              stream, 20, 3, true) /
                          copies;
        DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
        cuda::Fp8LinearParams p;
        p.w = w.view(0);
        p.num_tokens = m;
        p.x.bf16 = x;
        p.x.x_row_stride = gk;
        p.y = y;
        p.y_row_stride = gn;
        ST_CHECK(runner->linear_fp8(p, stream));
        DS_BENCH_CHECK(cudaStreamSynchronize(stream));
        const double e = check_error(w, hx, m, y, true, 4);
        recs.push_back(make("linear_fp8 quant+gemm", "heuristic", us, e, double(m * gk) * 2));
      }
      // hf numerics: bf16 activations, weights dequantized in registers.
      {
        const double us =
            bench::time_us(
                [&](cudaStream_t st) {
                  for (int c = 0; c < copies; ++c)
                    ST_CHECK(cuda::launch_fp8_linear_small_m(params(c, 0, 0, false, true), st));
                },
                stream, 20, 3, true) /
            copies;
        DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
        ST_CHECK(cuda::launch_fp8_linear_small_m(params(0, 0, 0, false), stream));
        DS_BENCH_CHECK(cudaStreamSynchronize(stream));
        const double e = check_error(w, hx, m, y, false, 4);
        recs.push_back(make("fp8_small_m bf16-act+pdl", "heuristic", us, e, double(m * gk)));
      }
      const double floor_us = bytes / (copy_gbps * 1e3);
      std::printf(
          "%-30s floor %.2f | mma best rw=%d ks=%d %.2f us (%.0f%%) | stream best rw=%d ks=%d "
          "%.2f us (%.0f%%) | bulk best rw=%d ks=%d st=%d %.2f us (%.0f%%) | heur %s rw=%d ks=%d "
          "%.2f us (%.0f%%), no pdl %.2f\n",
          shape_str(s, m).c_str(), floor_us, best_mma.rw, best_mma.ks, best_mma.us,
          100 * floor_us / best_mma.us, best_stream.rw, best_stream.ks, best_stream.us,
          100 * floor_us / best_stream.us, best_bulk.rw, best_bulk.ks, best_bulk.stages,
          best_bulk.us, 100 * floor_us / best_bulk.us, pk, plan.row_warps, plan.k_split, heur,
          100 * floor_us / heur, heur_nopdl);
    }
    write_json();
  }

  // ---------------- prefill ----------------
  for (const Shape& s : attn) {
    if (decode_only) break;
    Weights w(s, 2, 101 + s.n + s.k);
    for (int64_t m : {int64_t(4096), int64_t(8192)}) {
      if (quick && m == 8192) continue;
      const int64_t gk = s.k * s.groups, gn = s.n * s.groups;
      std::vector<uint16_t> hx(size_t(m * gk));
      Rng rng(uint64_t(m + s.n));
      for (size_t i = 0; i < hx.size(); ++i)
        hx[i] = float_to_bf16(float(rng.uniform(-2.0f, 2.0f)) *
                              std::ldexp(1.0f, int((i / 128) % 7) - 3));
      uint16_t* x;
      uint8_t *codes, *xs;
      uint16_t* y;
      DS_BENCH_CHECK(cudaMalloc(&x, hx.size() * 2));
      DS_BENCH_CHECK(cudaMalloc(&codes, hx.size()));
      DS_BENCH_CHECK(cudaMalloc(&xs, hx.size() / 128));
      DS_BENCH_CHECK(cudaMalloc(&y, size_t(m * gn) * 2));
      DS_BENCH_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
      cuda::QuantFp8Params qp{x, codes, xs, m, gk, gk};
      cuda::launch_quantize_fp8_blocks(qp, stream);
      DS_BENCH_CHECK(cudaStreamSynchronize(stream));
      const double flops = 2.0 * double(m) * double(gn) * double(s.k);
      const double bytes = double(w.data_bytes) + double(m * gk) + double(m * gn) * 2;
      int it = 0;
      auto lin = [&](bool full) {
        cuda::Fp8LinearParams p;
        p.w = w.view(it++ % 2);
        p.num_tokens = m;
        p.x.bf16 = x;
        p.x.x_row_stride = gk;
        if (!full) {
          p.x.codes = codes;
          p.x.scales = xs;
        }
        p.y = y;
        p.y_row_stride = gn;
        return p;
      };
      // Same-shape cuBLASLt with per-tensor scales (one GEMM per group): cuBLASLt's first
      // heuristic answer (the reference of NOTES.md's "% of same-shape" column) and the fastest
      // of its heuristic list (the tuned reference, reported alongside).
      double same_us = 0, same_tuned_us = 0;
      {
        LtTensorScaled g(lt, m, s.n, s.k, gk);
        if (g.ok) {
          auto run_all = [&](cudaStream_t st) {
            const int c = it++ % 2;
            for (int gi = 0; gi < s.groups; ++gi)
              g.run(w.data + w.data_bytes * c + size_t(gi) * s.n * s.k, codes + gi * s.k,
                    y + gi * s.n, st);
          };
          same_us = bench::time_us(run_all, stream, 20, 3);
          g.autotune(w.data, codes, y, stream);
          same_tuned_us = bench::time_us(run_all, stream, 20, 3);
        }
      }
      auto make = [&](const std::string& kernel, double us, double err, double extra) {
        Rec r = graph_rec(shape_str(s, m), kernel, "cuBLASLt", us, err, bytes + extra, flops,
                          copy_gbps, fp8_tflops);
        r.mode = "eager";
        r.fp8_rate_fraction = r.tflops / fp8_tflops;
        r.same_shape_fraction = same_us > 0 ? same_us / us : 0;
        return r;
      };
      const double gemm_us = bench::time_us(
          [&](cudaStream_t st) { ST_CHECK(runner->linear_fp8_cublaslt(lin(false), st)); }, stream,
          20, 3);
      DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
      it = 0;
      ST_CHECK(runner->linear_fp8_cublaslt(lin(false), stream));
      DS_BENCH_CHECK(cudaStreamSynchronize(stream));
      recs.push_back(
          make("cublaslt fp8 block-scaled", gemm_us, check_error(w, hx, m, y, true, 3), 0));
      {
        Rec r = make("cublaslt fp8 block-scaled tuned/tuned-ref", gemm_us, -1, 0);
        r.same_shape_fraction = same_tuned_us > 0 ? same_tuned_us / gemm_us : 0;
        recs.push_back(r);
        const double nt_us = bench::time_us(
            [&](cudaStream_t st) { ST_CHECK(runner_nt->linear_fp8_cublaslt(lin(false), st)); },
            stream, 20, 3);
        DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
        it = 0;
        ST_CHECK(runner_nt->linear_fp8_cublaslt(lin(false), stream));
        DS_BENCH_CHECK(cudaStreamSynchronize(stream));
        recs.push_back(make("cublaslt fp8 block-scaled untuned", nt_us,
                            check_error(w, hx, m, y, true, 3), 0));
        std::printf("%-30s block-scaled tuned %.1f us (%.0f%% of same-shape, %.0f%% of tuned "
                    "same-shape) | untuned %.1f us (%.0f%%) | tensor-scaled %.1f / tuned %.1f us\n",
                    shape_str(s, m).c_str(), gemm_us, 100 * same_us / gemm_us,
                    100 * same_tuned_us / gemm_us, nt_us, 100 * same_us / nt_us, same_us,
                    same_tuned_us);
      }
      const double full_us = bench::time_us(
          [&](cudaStream_t st) { ST_CHECK(runner->linear_fp8(lin(true), st)); }, stream, 20, 3);
      DS_BENCH_CHECK(cudaMemsetAsync(y, 0xFF, size_t(m * gn) * 2, stream));
      it = 0;
      ST_CHECK(runner->linear_fp8(lin(true), stream));
      DS_BENCH_CHECK(cudaStreamSynchronize(stream));
      recs.push_back(make("linear_fp8 quant+gemm", full_us, check_error(w, hx, m, y, true, 3),
                          double(m * gk) * 2));
      if (same_us > 0) {
        Rec r = make("cublaslt fp8 tensor-scaled", same_us, -1, 0);
        r.same_shape_fraction = 1.0;
        recs.push_back(r);
        Rec t = make("cublaslt fp8 tensor-scaled tuned", same_tuned_us, -1, 0);
        t.same_shape_fraction = same_us / same_tuned_us;
        recs.push_back(t);
      }
      DS_BENCH_CHECK(cudaFree(x));
      DS_BENCH_CHECK(cudaFree(codes));
      DS_BENCH_CHECK(cudaFree(xs));
      DS_BENCH_CHECK(cudaFree(y));
    }
  }

  // ---------------- JSON + table ----------------
  write_json();
  const int cublas_ver = int(cublasLtGetVersion());
  std::printf("\ngemm_fp8 on %s (%d SMs), copy %.0f GB/s, cuBLASLt FP8 %.0f TFLOP/s, cublasLt %d\n",
              dev.name.c_str(), dev.sm_count, copy_gbps, fp8_tflops, cublas_ver);
  std::printf("%-27s %-34s %-5s %9s %9s %6s %7s %6s %7s %6s %6s %8s\n", "kernel", "shape", "mode",
              "time_us", "floor_us", "ratio", "GB/s", "%HBM", "TFLOP/s", "%fp8", "%same", "err");
  for (const Rec& r : recs)
    std::printf("%-27s %-34s %-5s %9.2f %9.2f %6.2f %7.0f %6.1f %7.1f %6.1f %6.1f %8.2g\n",
                r.kernel.c_str(), r.shape.c_str(), r.mode.c_str(), r.time_us, r.floor_us, r.ratio,
                r.gbps, 100 * r.hbm_fraction, r.tflops, 100 * r.fp8_rate_fraction,
                100 * r.same_shape_fraction, r.err);
  std::printf("results written to %s\n", out.c_str());
  runner.reset();
  runner_nt.reset();
  cudaFree(ws);
  cudaFree(ws_nt);
  cudaFree(sink);
  cublasLtDestroy(lt);
  return 0;
}
