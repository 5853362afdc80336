// FP8 block-scaled and BF16 linears on the GPU (kernels/cuda/gemm) against the CPU oracle
// ds::cpu::linear, on fresh random inputs, at tiny shapes and at every DeepSeek-V4-Flash dense
// linear shape for M in {1, 2, 3, 4, 8, 16, 64, 512, 4096}, in both numerics (with and without FP8
// activation quantization), with outputs poisoned before each run.
//
// Tolerances (per output element, S = sum_k |x_k * w_k| over the exact operands the GPU sees):
//  - every path: |y - ref| <= 1e-4 * S (+ 2^-8 |ref| for bf16 outputs). The products are exact on
//    both sides (e4m3 x e4m3, bf16 x e4m3 fit in fp32); what differs is the summation: order,
//    fp32 rounding, the tensor cores' accumulator inside a 128-K block (Hopper's FP8 MMA keeps
//    ~14 mantissa bits there, DeepSeek-V3 report §3.3.2) before the fp32 promotion per block.
//    Worst case ~4 * 2^-14 per block, random-signed over K/128 blocks: ~1e-5 * S; 1e-4 keeps a
//    margin of ~10x while a dropped or doubled 128-K block (>= 1.4e-3 * S at K = 8192) or a wrong
//    scale (a factor 2) fails.
//  - activation quantization: the codes and scales the GPU used are compared bit for bit with
//    ds::cpu::quantize_fp8_blocks.
// Large shapes check a subsample of the tokens (first, last, and a spread) to keep CPU time small.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/gemm/linear_fp8.h"
#include "kernels/cuda/quant/quant_fp8.h"
#include "kernels/cuda_test_util.h"

namespace ds {
namespace {

constexpr double kTol = 1e-4;
// cuBLASLt's FP8 block-scaled GEMM (Hopper WGMMA) accumulates in reduced precision inside the
// tensor core: measured up to 1.4e-3 * S on the H200 (NOTES.md). Its elementwise bound is looser;
// a relative Frobenius bound over all checked elements catches systematic errors (a wrong scale
// on one 128-K block of 32 gives ~0.18).
constexpr double kTolCublasLt = 4e-3;
constexpr double kFrobCublasLt = 2e-2;
// kWgmma (wgmma e4m3 from shared memory) sums each 128-K block inside the tensor core in the same
// reduced precision as cuBLASLt (and as REF's fp8_gemm does on Hopper) before its fp32 promotion
// per block: measured up to 6.1e-4 * S elementwise and 3.1e-4 relative Frobenius (H100, session
// 27, NOTES.md). Bounds: 2e-3 * S and 1e-3; a wrong scale on one 128-K block of 64 (~1.6e-2 * S)
// or a dropped block fails either.
constexpr double kTolWgmma = 2e-3;
constexpr double kFrobWgmma = 1e-3;

struct LinearShape {
  const char* name;
  int64_t n, k;
  int groups;
};

// DeepSeek-V4-Flash dense FP8 linears (dsv4-model.md §10 table).
const LinearShape kFlashShapes[] = {
    {"wq_a", 1024, 4096, 1},      {"wq_b", 32768, 1024, 1},        {"wkv", 512, 4096, 1},
    {"wo_a", 1024, 4096, 8},      {"wo_b", 4096, 8192, 1},         {"shared_w1", 2048, 4096, 1},
    {"shared_w2", 4096, 2048, 1}, {"indexer_wq_b", 8192, 1024, 1}, {"mtp_e_proj", 4096, 4096, 1},
};
// Tiny configuration (§14): hidden 256, q_lora 128, 4 heads x 128, o_groups 2 x o_lora 128.
const LinearShape kTinyShapes[] = {
    {"tiny_wq_a", 128, 256, 1}, {"tiny_wq_b", 512, 128, 1}, {"tiny_wkv", 128, 256, 1},
    {"tiny_wo_a", 128, 256, 2}, {"tiny_wo_b", 256, 256, 1}, {"tiny_n16", 16, 128, 1},
};

struct HostWeight {
  std::vector<uint8_t> data, scale;
  std::vector<float> scale_f32;
};

// Random e4m3 codes (no NaN codes) and e8m0 scales around 2^-8 (realistic weight magnitudes).
HostWeight random_weight(Rng& rng, const LinearShape& s) {
  HostWeight w;
  const int64_t rows = s.n * s.groups;
  w.data.resize(size_t(rows * s.k));
  for (size_t i = 0; i < w.data.size(); i += 8) {
    uint64_t r = rng.next_u64();
    for (size_t j = 0; j < 8 && i + j < w.data.size(); ++j) {
      uint8_t c = uint8_t(r >> (8 * j));
      if ((c & 0x7F) == 0x7F) c ^= 0x01;  // NaN -> 448 neighbour
      w.data[i + j] = c;
    }
  }
  const int64_t srows = (rows + 127) / 128, scols = s.k / 128;
  w.scale.resize(size_t(srows * scols));
  w.scale_f32.resize(w.scale.size());
  for (size_t i = 0; i < w.scale.size(); ++i) {
    w.scale[i] = uint8_t(127 - 12 + int(rng.below(9)));
    w.scale_f32[i] = e8m0_to_float(w.scale[i]);
  }
  return w;
}

// Random bf16 activations with a per-128-block magnitude spread (so activation scales vary).
std::vector<uint16_t> random_activations(Rng& rng, int64_t m, int64_t cols) {
  std::vector<uint16_t> x(size_t(m * cols));
  float mag = 1.0f;
  for (int64_t i = 0; i < m * cols; ++i) {
    if (i % 128 == 0) mag = std::ldexp(1.0f, int(rng.below(13)) - 6);
    x[size_t(i)] = float_to_bf16(rng.normal() * mag);
  }
  return x;
}

std::vector<int64_t> sample_tokens(int64_t m) {
  if (m <= 16) {
    std::vector<int64_t> all(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) all[size_t(i)] = i;
    return all;
  }
  std::vector<int64_t> t = {0, 1, m / 3, m / 2, m - 2, m - 1};
  for (int64_t i = 7; t.size() < 10; i += m / 5) t.push_back(i % m);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

// CPU reference for the sampled tokens; also returns S = sum |x w| per element.
void reference(const HostWeight& w, const LinearShape& s, const std::vector<uint16_t>& x,
               int64_t cols, const std::vector<int64_t>& toks, bool quantize,
               std::vector<float>& ref, std::vector<float>& abs_sum) {
  const int64_t nt = int64_t(toks.size()), gk = s.k * s.groups, gn = s.n * s.groups;
  ref.assign(size_t(nt * gn), 0.f);
  abs_sum.assign(size_t(nt * gn), 0.f);
  std::vector<float> xg(size_t(nt * s.k)), xa(size_t(nt * s.k)), yg(size_t(nt * s.n)),
      ya(size_t(nt * s.n));
  std::vector<uint8_t> abs_codes(w.data);
  for (auto& c : abs_codes) c &= 0x7F;
  for (int g = 0; g < s.groups; ++g) {
    for (int64_t t = 0; t < nt; ++t) {
      for (int64_t c = 0; c < s.k; ++c)
        xg[size_t(t * s.k + c)] = bf16_to_float(x[size_t(toks[size_t(t)] * cols + g * s.k + c)]);
      if (quantize) cpu::simulate_fp8_blocks(&xg[size_t(t * s.k)], s.k, 128);
    }
    cpu::LinearWeight lw{
        cpu::WeightFormat::kFp8Block, s.n * s.groups, s.k, w.data.data(), w.scale.data(), 1.0f};
    cpu::LinearWeight gw = cpu::slice_rows(lw, g * s.n, s.n);
    // y with the already-simulated input (quantize=false: do not quantize twice).
    cpu::linear(xg.data(), nt, gw, false, yg.data());
    // S = |x| @ |W|^T through the same oracle: |W| is W with the e4m3 sign bits cleared.
    for (size_t i = 0; i < xa.size(); ++i) xa[i] = std::fabs(xg[i]);
    cpu::LinearWeight aw = gw;
    aw.data = abs_codes.data() + (g * s.n) * s.k;
    cpu::linear(xa.data(), nt, aw, false, ya.data());
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t n = 0; n < s.n; ++n) {
        ref[size_t(t * gn + g * s.n + n)] = yg[size_t(t * s.n + n)];
        abs_sum[size_t(t * gn + g * s.n + n)] = ya[size_t(t * s.n + n)];
      }
  }
  (void)gk;
}

struct DeviceWeight {
  test::DeviceBuffer<uint8_t> data, scale;
  test::DeviceBuffer<float> scale_f32;
  explicit DeviceWeight(const HostWeight& h)
      : data(h.data.size()), scale(h.scale.size()), scale_f32(h.scale_f32.size()) {}
};

// Small-M kernel layout for a test case (0 = the heuristic's choice).
struct SmallMConfig {
  int row_warps = 0, k_split = 0, max_ctas = 0, stages = 0;
  int pdl = -1;  // -1: on for odd M
  cuda::SmallMKernel kernel = cuda::SmallMKernel::kAuto;
  bool tiled = false;  // also hand the kernel the tile-ordered copy (launch_fp8_weight_to_tiles)
  int k_parts = 0;     // kBulk: K partitions per CTA
};

class GemmCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
    ws_bytes_ = cuda::GemmRunner::workspace_bytes(kMaxTokens, kMaxCols);
    ws_ = std::make_unique<test::DeviceBuffer<uint8_t>>(ws_bytes_);
    ASSERT_TRUE(ws_->ok());
    auto r = cuda::GemmRunner::create(ws_->get(), ws_bytes_, kMaxTokens, kMaxCols);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    runner_ = std::move(r).value();
  }
  static constexpr int64_t kMaxTokens = 4096, kMaxCols = 32768;
  bool f32_input_ = false;  // run_fp8_case through the runner: quantized cases read fp32 input

  // Runs one case through GemmRunner::linear_fp8 (which picks the path by M) and checks the
  // sampled tokens. Returns the worst |err| / S seen.
  enum class Path { kAuto, kSmallM, kCublasLt };
  double run_fp8_case(const LinearShape& s, int64_t m, bool quantize, cuda::OutType out,
                      uint64_t seed, bool direct_small_m = false, Path path = Path::kAuto,
                      SmallMConfig cfg = {}) {
    if (direct_small_m) path = Path::kSmallM;
    const char* kn[] = {"auto", "mma", "stream", "bulk", "wgmma"};
    SCOPED_TRACE(std::string(direct_small_m ? kn[int(cfg.kernel)] : "") +
                 (cfg.tiled ? " tiled" : "") + " rw " + std::to_string(cfg.row_warps) + " ks " +
                 std::to_string(cfg.k_split) + " stages " + std::to_string(cfg.stages) + " pdl " +
                 std::to_string(cfg.pdl));
    SCOPED_TRACE(std::string(s.name) + " M=" + std::to_string(m) +
                 (quantize ? " quantized" : " bf16-act") +
                 (out == cuda::OutType::kF32      ? " f32-out"
                  : out == cuda::OutType::kF32Bf16 ? " f32-rounded-out"
                                                   : " bf16-out"));
    Rng rng(seed);
    HostWeight hw = random_weight(rng, s);
    const int64_t gk = s.k * s.groups, gn = s.n * s.groups;
    const int64_t x_stride = gk + (s.groups == 1 && m % 2 ? 8 : 0);  // exercise a padded stride
    std::vector<uint16_t> x = random_activations(rng, m, x_stride);
    DeviceWeight dw(hw);
    test::DeviceBuffer<uint16_t> dx(x.size());
    test::DeviceBuffer<float> dx32(f32_input_ && quantize ? x.size() : 1);
    const size_t esz = cuda::out_is_f32(out) ? 4 : 2;
    test::DeviceBuffer<uint8_t> dy(size_t(m * gn) * esz);
    EXPECT_TRUE(dw.data.ok() && dw.scale.ok() && dw.scale_f32.ok() && dx.ok() && dy.ok());
    EXPECT_EQ(dw.data.upload(hw.data), cudaSuccess);
    EXPECT_EQ(dw.scale.upload(hw.scale), cudaSuccess);
    EXPECT_EQ(dw.scale_f32.upload(hw.scale_f32), cudaSuccess);
    EXPECT_EQ(dx.upload(x), cudaSuccess);
    EXPECT_EQ(dy.poison(), cudaSuccess);

    cuda::Fp8WeightView wv{dw.data.get(), dw.scale.get(), dw.scale_f32.get(), s.n, s.k, s.groups};
    Status st;
    test::DeviceBuffer<uint8_t> pre_codes(size_t(m * gk)), pre_scales(size_t(m * gk / 128));
    if (path == Path::kCublasLt) {
      // The cuBLASLt block-scaled GEMM alone, on activations quantized by the quant kernel.
      cuda::QuantFp8Params q{dx.get(), pre_codes.get(), pre_scales.get(), m, gk, x_stride};
      cuda::launch_quantize_fp8_blocks(q, nullptr);
      cuda::Fp8LinearParams p;
      p.w = wv;
      p.num_tokens = m;
      p.x.codes = pre_codes.get();
      p.x.scales = pre_scales.get();
      p.y = dy.get();
      p.y_type = out;
      p.y_row_stride = gn;
      (void)(st = runner_->linear_fp8_cublaslt(p, nullptr));
    } else if (direct_small_m) {
      // The small-M kernel on bf16 input (hf numerics) or on codes from the quant kernel.
      test::DeviceBuffer<uint8_t> codes(size_t(m * gk)), scales(size_t(m * gk / 128));
      test::DeviceBuffer<uint8_t> tiles(cfg.tiled ? hw.data.size() : 16);
      EXPECT_TRUE(tiles.ok());
      cuda::Fp8SmallMParams p;
      p.w = wv;
      if (cfg.tiled) {
        EXPECT_EQ(tiles.poison(), cudaSuccess);
        const Status ts =
            cuda::launch_fp8_weight_to_tiles(dw.data.get(), tiles.get(), gn, s.k, nullptr);
        EXPECT_TRUE(ts.ok()) << ts.to_string();
        p.w.tiled = tiles.get();
      }
      p.num_tokens = m;
      if (quantize) {
        cuda::QuantFp8Params q{dx.get(), codes.get(), scales.get(), m, gk, x_stride};
        cuda::launch_quantize_fp8_blocks(q, nullptr);
        p.x_codes = codes.get();
        p.x_scales = scales.get();
      } else {
        p.x_bf16 = dx.get();
        p.x_row_stride = x_stride;
      }
      p.y = dy.get();
      p.y_type = out;
      p.y_row_stride = gn;
      p.kernel = cfg.kernel;
      p.row_warps = cfg.row_warps;
      p.k_split = cfg.k_split;
      p.max_ctas = cfg.max_ctas;
      p.stages = cfg.stages;
      p.k_parts = cfg.k_parts;
      p.pdl = cfg.pdl < 0 ? m % 2 == 1 : cfg.pdl != 0;
      (void)(st = cuda::launch_fp8_linear_small_m(p, nullptr));
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    } else {
      cuda::Fp8LinearParams p;
      p.w = wv;
      p.num_tokens = m;
      p.x.bf16 = dx.get();
      p.x.x_row_stride = x_stride;
      if (f32_input_ && quantize) {
        // The same (bf16-valued) activations as fp32: quantized from fp32, no bf16 input.
        std::vector<float> x32(x.size());
        for (size_t i = 0; i < x.size(); ++i) x32[i] = bf16_to_float(x[i]);
        EXPECT_EQ(dx32.upload(x32), cudaSuccess);
        p.x.bf16 = nullptr;
        p.x.f32 = dx32.get();
      }
      p.quantize_activations = quantize;
      p.y = dy.get();
      p.y_type = out;
      p.y_row_stride = gn;
      (void)(st = runner_->linear_fp8(p, nullptr));
    }
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    const std::vector<int64_t> toks = sample_tokens(m);
    if (quantize && path != Path::kSmallM) {
      // The quantized input the GPU used, bit for bit against the CPU reference.
      std::vector<uint8_t> codes(size_t(m * gk)), scales(size_t(m * gk / 128));
      const bool pre = path == Path::kCublasLt;
      EXPECT_EQ(cudaMemcpy(codes.data(), pre ? pre_codes.get() : runner_->act_codes(), codes.size(),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(cudaMemcpy(scales.data(), pre ? pre_scales.get() : runner_->act_scales(),
                           scales.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<float> row(static_cast<size_t>(gk));
      std::vector<uint8_t> rc(static_cast<size_t>(gk)), rs(static_cast<size_t>(gk / 128));
      int64_t bad = 0;
      for (int64_t t : toks) {
        for (int64_t c = 0; c < gk; ++c)
          row[size_t(c)] = bf16_to_float(x[size_t(t * x_stride + c)]);
        cpu::quantize_fp8_blocks(row.data(), gk, 128, rc.data(), rs.data(), nullptr);
        for (int64_t c = 0; c < gk; ++c) bad += rc[size_t(c)] != codes[size_t(t * gk + c)];
        for (int64_t c = 0; c < gk / 128; ++c)
          bad += rs[size_t(c)] != scales[size_t(t * gk / 128 + c)];
      }
      EXPECT_EQ(bad, 0) << "quantized activations differ from the CPU reference";
    }

    std::vector<uint8_t> ybytes;
    EXPECT_EQ(dy.download(ybytes), cudaSuccess);
    std::vector<float> ref, abs_sum;
    reference(hw, s, x, x_stride, toks, quantize, ref, abs_sum);
    // The small-M kernels (what GemmRunner runs unless fp8_linear_uses_wgmma or
    // fp8_linear_uses_cublaslt: hf numerics, small decode shapes, shapes neither takes) are held
    // to the tight bound; kWgmma and cuBLASLt to their own.
    // kWgmma on bf16 activations (bf16 wgmma on the converted weights) keeps fp32 sums: tight.
    const bool runner_wgmma =
        path == Path::kAuto && quantize && cuda::fp8_linear_uses_wgmma(wv, m, true);
    const bool wgmma = quantize && ((path == Path::kSmallM &&
                                     cfg.kernel == cuda::SmallMKernel::kWgmma) || runner_wgmma);
    const bool runner_lt =
        path == Path::kAuto && quantize && !runner_wgmma && cuda::fp8_linear_uses_cublaslt(wv, m);
    const bool tight =
        (path == Path::kSmallM && !wgmma) || (path == Path::kAuto && !runner_wgmma && !runner_lt);
    const double tol_s = tight ? kTol : wgmma ? kTolWgmma : kTolCublasLt;
    double worst = 0, err2 = 0, ref2 = 0;
    int64_t bad = 0;
    for (size_t ti = 0; ti < toks.size(); ++ti) {
      for (int64_t n = 0; n < gn; ++n) {
        const size_t gi = size_t(toks[ti] * gn + n), ri = ti * size_t(gn) + size_t(n);
        float got;
        if (cuda::out_is_f32(out))
          std::memcpy(&got, &ybytes[gi * 4], 4);
        else
          got = bf16_to_float(uint16_t(ybytes[gi * 2] | (ybytes[gi * 2 + 1] << 8)));
        // kF32Bf16: fp32 elements that are bf16 values.
        if (out == cuda::OutType::kF32Bf16 && !(bf16_to_float(float_to_bf16(got)) == got)) {
          if (bad < 5) ADD_FAILURE() << "token " << toks[ti] << " row " << n << ": " << got
                                     << " is not a bf16 value";
          ++bad;
        }
        const double err = std::fabs(double(got) - double(ref[ri]));
        const double tol =
            tol_s * abs_sum[ri] +
            (out != cuda::OutType::kF32 ? std::ldexp(std::fabs(ref[ri]), -8) : 0.0) + 1e-30;
        err2 += err * err;
        ref2 += double(ref[ri]) * ref[ri];
        if (!(err <= tol)) {  // NaN (poison) fails too
          if (bad < 5)
            ADD_FAILURE() << "token " << toks[ti] << " row " << n << ": got " << got << " want "
                          << ref[ri] << " (S " << abs_sum[ri] << ")";
          ++bad;
        }
        // Reported error: beyond the bf16 output rounding (half an ulp), relative to S.
        const double excess =
            err - (out != cuda::OutType::kF32 ? std::ldexp(std::fabs(ref[ri]), -9) : 0.0);
        if (abs_sum[ri] > 0) worst = std::max(worst, std::max(0.0, excess) / abs_sum[ri]);
      }
    }
    EXPECT_EQ(bad, 0);
    const double frob_tol = wgmma   ? std::max(kFrobWgmma, out != cuda::OutType::kF32 ? 5e-3 : 0.0)
                            : !tight ? kFrobCublasLt
                            : out != cuda::OutType::kF32 ? 5e-3
                                                         : 1e-4;
    EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-30)), frob_tol) << "relative Frobenius error";
    return worst;
  }

  size_t ws_bytes_ = 0;
  std::unique_ptr<test::DeviceBuffer<uint8_t>> ws_;
  std::unique_ptr<cuda::GemmRunner> runner_;
};

TEST_F(GemmCudaTest, TinyShapesBothNumerics) {
  uint64_t seed = 100;
  for (const LinearShape& s : kTinyShapes)
    for (int64_t m : {1, 3, 16, 64, 512})
      for (bool q : {true, false}) run_fp8_case(s, m, q, cuda::OutType::kF32, ++seed);
}

TEST_F(GemmCudaTest, SmallMKernelFp32Output) {
  // The small-M kernel alone (also at M > 64, in chunks), fp32 output: the tightest check.
  uint64_t seed = 200;
  for (const LinearShape& s : {kFlashShapes[0], kFlashShapes[2], kFlashShapes[3], kTinyShapes[3]})
    for (int64_t m : {1, 8, 16, 33, 64, 100})
      for (bool q : {true, false}) {
        const double worst = run_fp8_case(s, m, q, cuda::OutType::kF32, ++seed, true);
        std::printf("small-M %-10s M=%-4lld %s worst |err|/S = %.3g\n", s.name, (long long)m,
                    q ? "fp8-act " : "bf16-act", worst);
      }
}

TEST_F(GemmCudaTest, SmallMConfigurations) {
  // Every (row_warps, k_split) layout, with grids small enough that CTAs and clusters loop over
  // several work items, with and without programmatic dependent launch.
  uint64_t seed = 250;
  const LinearShape shapes[] = {kFlashShapes[0], kFlashShapes[3], kTinyShapes[1]};
  for (const LinearShape& s : shapes)
    for (int rw : {1, 2, 4, 8})
      for (int ks : {1, 2, 4, 8}) {
        if (s.k / 128 < ks) continue;
        SmallMConfig c;
        c.kernel = cuda::SmallMKernel::kMma;
        c.row_warps = rw;
        c.k_split = ks;
        c.max_ctas = (rw + ks) % 3 == 0 ? 0 : 3 * ks;
        c.pdl = (rw * ks) % 2;
        const int64_t m = (rw + ks) % 2 ? 16 : 37;
        run_fp8_case(s, m, (rw + ks) % 4 != 1, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
      }
}

TEST_F(GemmCudaTest, StreamKernelDecodeShapes) {
  // The kStream kernel (what M <= 16 with FP8 activations runs) at every Flash and tiny shape, at
  // the decode batch sizes, fp32 output (tolerance kTol = 1e-4 * S, see the top of the file).
  uint64_t seed = 600;
  SmallMConfig c;
  c.kernel = cuda::SmallMKernel::kStream;
  for (const LinearShape& s : kFlashShapes)
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const double worst =
          run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
      std::printf("stream %-12s M=%-3lld worst |err|/S = %.3g\n", s.name, (long long)m, worst);
    }
  for (const LinearShape& s : kTinyShapes)
    for (int64_t m : {1, 2, 5, 8, 13, 16})
      run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
}

TEST_F(GemmCudaTest, StreamKernelConfigurations) {
  // Every (row_warps, k_split) layout of kStream, with and without programmatic dependent launch,
  // bf16 and fp32 output, and M > 16 (16-token chunks re-reading the weights).
  uint64_t seed = 700;
  const LinearShape shapes[] = {kFlashShapes[0], kFlashShapes[3], kFlashShapes[4], kTinyShapes[1],
                                kTinyShapes[5]};
  for (const LinearShape& s : shapes)
    for (int rw : {1, 2, 4})
      for (int ks : {1, 2, 4, 8}) {
        if (s.k / 128 < ks) continue;
        SmallMConfig c;
        c.kernel = cuda::SmallMKernel::kStream;
        c.row_warps = rw;
        c.k_split = ks;
        c.pdl = (rw + ks) % 2;
        const int64_t m = (rw * 3 + ks) % 4 == 0 ? 37 : (rw * 3 + ks) % 4 == 1 ? 1 : 6 + rw + ks;
        run_fp8_case(s, m, true, ks % 2 ? cuda::OutType::kBF16 : cuda::OutType::kF32, ++seed, true,
                     Path::kSmallM, c);
      }
}

TEST_F(GemmCudaTest, BulkKernelDecodeShapes) {
  // The kBulk kernel (TMA bulk copies into a shared-memory ring; kStream on pre-sm_90 devices)
  // at every Flash and tiny shape, at the decode batch sizes, fp32 output (kTol = 1e-4 * S).
  uint64_t seed = 900;
  SmallMConfig c;
  c.kernel = cuda::SmallMKernel::kBulk;
  for (const LinearShape& s : kFlashShapes)
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const double worst =
          run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
      std::printf("bulk %-12s M=%-3lld worst |err|/S = %.3g\n", s.name, (long long)m, worst);
    }
  for (const LinearShape& s : kTinyShapes)
    for (int64_t m : {1, 2, 5, 8, 13, 16})
      run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
}

TEST_F(GemmCudaTest, BulkKernelConfigurations) {
  // Every (row_warps, k_split) layout of kBulk with ring depths 2, 3 and 8 (more stages than a
  // CTA has, fewer, and a ring that wraps), with and without programmatic dependent launch, bf16
  // and fp32 output, and M > 16 (16-token chunks re-reading the weights).
  uint64_t seed = 1000;
  const LinearShape shapes[] = {kFlashShapes[0], kFlashShapes[3], kFlashShapes[4], kTinyShapes[1],
                                kTinyShapes[5]};
  for (const LinearShape& s : shapes)
    for (int rw : {1, 2, 4})
      for (int ks : {1, 2, 4, 8}) {
        if (s.k / 128 < ks) continue;
        SmallMConfig c;
        c.kernel = cuda::SmallMKernel::kBulk;
        c.row_warps = rw;
        c.k_split = ks;
        c.stages = (rw + ks) % 3 == 0 ? 2 : (rw + ks) % 3 == 1 ? 3 : 8;
        c.pdl = (rw + ks) % 2;
        const int64_t m = (rw * 3 + ks) % 4 == 0 ? 37 : (rw * 3 + ks) % 4 == 1 ? 1 : 6 + rw + ks;
        run_fp8_case(s, m, true, ks % 2 ? cuda::OutType::kBF16 : cuda::OutType::kF32, ++seed, true,
                     Path::kSmallM, c);
      }
}

// kWgmma runs on compute capability 9.0 only (the sm_90a image's wgmma).
bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

TEST_F(GemmCudaTest, WgmmaKernelDecodeShapes) {
  // The kWgmma kernel (wgmma over all tokens in one pass) at every Flash and tiny shape and decode
  // batch sizes that round up to each token tile (8, 16, 32, 64), both numerics (e4m3 and, with
  // bf16 activations, bf16 on the converted weights), fp32 output, the heuristic layout
  // (tolerance kTolWgmma: the tensor core sums each 128-K block, see the top of the file).
  if (!device_is_sm90()) GTEST_SKIP() << "kWgmma needs a compute capability 9.0 device";
  uint64_t seed = 2000;
  SmallMConfig c;
  c.kernel = cuda::SmallMKernel::kWgmma;
  for (const LinearShape& s : kFlashShapes)
    for (int64_t m : {1, 5, 9, 16, 33, 64}) {
      const double worst =
          run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
      std::printf("wgmma %-12s M=%-3lld worst |err|/S = %.3g\n", s.name, (long long)m, worst);
    }
  // hf numerics: bf16 activations, the weights converted to bf16 in shared memory.
  for (const LinearShape& s : kFlashShapes)
    for (int64_t m : {1, 9, 33, 64}) {
      const double worst =
          run_fp8_case(s, m, false, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
      std::printf("wgmma-bf16 %-12s M=%-3lld worst |err|/S = %.3g\n", s.name, (long long)m, worst);
    }
  for (const LinearShape& s : kTinyShapes)
    for (int64_t m : {1, 3, 8, 13, 16, 40, 64})
      run_fp8_case(s, m, m % 2 == 0, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
}

TEST_F(GemmCudaTest, WgmmaKernelConfigurations) {
  // Every (warpgroups, k_split, stages) layout of kWgmma: K ranges per cluster rank
  // shorter than the ring (wq_a at k_split 8: 4 blocks) and longer (wo_b at k_split 1: 64
  // blocks, the ring wraps), odd block counts (tiny_wo_a: 1 or 2), row tiles past N (tiny_n16: 16
  // rows of 64 or 128), with and without programmatic dependent launch, every output type.
  if (!device_is_sm90()) GTEST_SKIP() << "kWgmma needs a compute capability 9.0 device";
  uint64_t seed = 2100;
  const LinearShape shapes[] = {kFlashShapes[0], kFlashShapes[3], kFlashShapes[4], kTinyShapes[3],
                                kTinyShapes[5]};
  const cuda::OutType outs[] = {cuda::OutType::kF32, cuda::OutType::kBF16,
                                cuda::OutType::kF32Bf16};
  int i = 0;
  for (const LinearShape& s : shapes)
    for (int wgs : {1, 2})
      for (int ks : {1, 2, 4, 8})
        for (int stages : {4, 6}) {
          if (s.k / 128 < ks) continue;
          SmallMConfig c;
          c.kernel = cuda::SmallMKernel::kWgmma;
          c.row_warps = wgs;
          c.k_split = ks;
          c.stages = stages;
          c.pdl = (wgs + ks + stages / 2) % 2;
          const int64_t ms[] = {1, 7, 12, 16, 30, 47, 64};
          const int64_t m = ms[++i % 7];
          run_fp8_case(s, m, i % 4 != 0, outs[i % 3], ++seed, true, Path::kSmallM, c);
        }
}

TEST_F(GemmCudaTest, TileOrderMatchesItsDefinition) {
  // launch_fp8_weight_to_tiles against fp8_tile_offset, byte for byte, on random codes (tiny,
  // wq_b and wo_a's stacked groups: K = 128 .. 8192, up to 8192 rows), poisoned output.
  const struct {
    int64_t rows, k;
  } cases[] = {{16, 128}, {48, 384}, {512, 128}, {32768, 1024}, {8192, 4096}, {64, 8192}};
  Rng rng(4242);
  for (const auto& c : cases) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " K " + std::to_string(c.k));
    std::vector<uint8_t> w(size_t(c.rows * c.k));
    for (auto& b : w) b = uint8_t(rng.below(256));
    test::DeviceBuffer<uint8_t> dw(w.size()), dt(w.size());
    ASSERT_TRUE(dw.ok() && dt.ok());
    ASSERT_EQ(dw.upload(w), cudaSuccess);
    ASSERT_EQ(dt.poison(), cudaSuccess);
    const Status st = cuda::launch_fp8_weight_to_tiles(dw.get(), dt.get(), c.rows, c.k, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<uint8_t> t;
    ASSERT_EQ(dt.download(t), cudaSuccess);
    int64_t bad = 0;
    std::vector<uint8_t> seen(w.size(), 0);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t col = 0; col < c.k; ++col) {
        const int64_t off = cuda::fp8_tile_offset(r, col, c.k);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, int64_t(w.size()));
        seen[size_t(off)]++;
        bad += t[size_t(off)] != w[size_t(r * c.k + col)];
      }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), uint8_t(1)), int64_t(seen.size()))
        << "fp8_tile_offset is not a permutation";
  }
}

TEST_F(GemmCudaTest, StreamAndBulkKernelsOnTiledWeights) {
  // kStream and kBulk reading the tile-ordered copy instead of the row-major weight: every Flash
  // and tiny shape at the decode batch sizes (fp32 output, kTol), and every layout of both kernels
  // (with and without PDL, bf16 and fp32 output) on three shapes. The copy is read at <= 8 tokens
  // per chunk only; M = 16 and 37 check that larger M is still right with a copy given.
  uint64_t seed = 1300;
  for (cuda::SmallMKernel kern : {cuda::SmallMKernel::kStream, cuda::SmallMKernel::kBulk}) {
    SmallMConfig c;
    c.kernel = kern;
    c.tiled = true;
    for (const LinearShape& s : kFlashShapes)
      for (int64_t m : {1, 3, 8, 16}) {
        const double worst =
            run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
        std::printf("tiled %s %-12s M=%-3lld worst |err|/S = %.3g\n",
                    kern == cuda::SmallMKernel::kBulk ? "bulk" : "stream", s.name, (long long)m,
                    worst);
      }
    for (const LinearShape& s : kTinyShapes)
      for (int64_t m : {1, 5, 16})
        run_fp8_case(s, m, true, cuda::OutType::kF32, ++seed, true, Path::kSmallM, c);
    const LinearShape shapes[] = {kFlashShapes[1], kFlashShapes[3], kTinyShapes[5]};
    for (const LinearShape& s : shapes)
      for (int rw : {1, 2, 4})
        for (int ks : {1, 2, 4, 8}) {
          if (s.k / 128 < ks) continue;
          c.row_warps = rw;
          c.k_split = ks;
          c.stages = kern == cuda::SmallMKernel::kBulk ? 2 + (rw + ks) % 3 : 0;
          c.pdl = (rw + ks) % 2;
          const int64_t m = (rw * 3 + ks) % 4 == 0 ? 37 : (rw * 3 + ks) % 4 == 1 ? 1 : rw + ks;
          run_fp8_case(s, m, true, ks % 2 ? cuda::OutType::kBF16 : cuda::OutType::kF32, ++seed,
                       true, Path::kSmallM, c);
        }
  }
}

// The same small-M launch on the row-major weight and on its tile-ordered copy: the outputs are
// identical bit for bit (the kernels' arithmetic and its order do not depend on the layout).
TEST_F(GemmCudaTest, TiledWeightsGiveTheRowMajorOutputsBitForBit) {
  struct Case {
    LinearShape s;
    int64_t m;
    cuda::SmallMKernel kern;
    int rw, ks, stages;
    bool auto_tiled = false;  // kAuto: the plan should take the tiled copy
  };
  const Case cases[] = {
      {kFlashShapes[1], 1, cuda::SmallMKernel::kBulk, 4, 1, 2},
      {kFlashShapes[3], 1, cuda::SmallMKernel::kBulk, 1, 1, 2},
      {kFlashShapes[4], 2, cuda::SmallMKernel::kBulk, 1, 2, 2},
      {kFlashShapes[3], 8, cuda::SmallMKernel::kBulk, 2, 2, 3},
      {kFlashShapes[3], 5, cuda::SmallMKernel::kBulk, 4, 4, 4},
      {kFlashShapes[3], 7, cuda::SmallMKernel::kBulk, 4, 8, 8},
      {kFlashShapes[1], 8, cuda::SmallMKernel::kStream, 4, 1, 0},
      {kFlashShapes[4], 3, cuda::SmallMKernel::kStream, 1, 2, 0},
      {kTinyShapes[3], 5, cuda::SmallMKernel::kBulk, 2, 2, 3},
      {kFlashShapes[1], 8, cuda::SmallMKernel::kAuto, 0, 0, 0, true},
      {kFlashShapes[4], 1, cuda::SmallMKernel::kAuto, 0, 0, 0, true},
      {kFlashShapes[4], 8, cuda::SmallMKernel::kAuto, 0, 0, 0, true},
      {kTinyShapes[1], 1, cuda::SmallMKernel::kAuto, 0, 0, 0, false},
      {kFlashShapes[0], 1, cuda::SmallMKernel::kAuto, 0, 0, 0, false},
  };
  Rng rng(777);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.s.name) + " M=" + std::to_string(c.m) + " kernel " +
                 std::to_string(int(c.kern)) + " rw " + std::to_string(c.rw) + " ks " +
                 std::to_string(c.ks) + " stages " + std::to_string(c.stages));
    HostWeight hw = random_weight(rng, c.s);
    const int64_t gk = c.s.k * c.s.groups, gn = c.s.n * c.s.groups;
    std::vector<uint16_t> x = random_activations(rng, c.m, gk);
    DeviceWeight dw(hw);
    test::DeviceBuffer<uint8_t> tiles(hw.data.size()), codes(size_t(c.m * gk)),
        scales(size_t(c.m * gk / 128));
    test::DeviceBuffer<uint16_t> dx(x.size());
    test::DeviceBuffer<float> y0(size_t(c.m * gn)), y1(size_t(c.m * gn));
    ASSERT_TRUE(dw.data.ok() && dw.scale.ok() && tiles.ok() && codes.ok() && scales.ok() &&
                dx.ok() && y0.ok() && y1.ok());
    ASSERT_EQ(dw.data.upload(hw.data), cudaSuccess);
    ASSERT_EQ(dw.scale.upload(hw.scale), cudaSuccess);
    ASSERT_EQ(dx.upload(x), cudaSuccess);
    ASSERT_EQ(y0.poison(), cudaSuccess);
    ASSERT_EQ(y1.poison(), cudaSuccess);
    ASSERT_TRUE(
        cuda::launch_fp8_weight_to_tiles(dw.data.get(), tiles.get(), gn, c.s.k, nullptr).ok());
    cuda::QuantFp8Params q{dx.get(), codes.get(), scales.get(), c.m, gk, gk};
    cuda::launch_quantize_fp8_blocks(q, nullptr);
    cuda::Fp8SmallMParams p;
    p.w = {dw.data.get(), dw.scale.get(), nullptr, c.s.n, c.s.k, c.s.groups};
    p.num_tokens = c.m;
    p.x_codes = codes.get();
    p.x_scales = scales.get();
    p.y_type = cuda::OutType::kF32;
    p.y_row_stride = gn;
    p.kernel = c.kern;
    p.row_warps = c.rw;
    p.k_split = c.ks;
    p.stages = c.stages;
    p.y = y0.get();
    if (c.kern == cuda::SmallMKernel::kAuto) {
      // kAuto picks its plan from the weight (a tiled copy may change it): force the plan the
      // tiled weight gets onto the row-major run.
      cuda::Fp8SmallMParams pt = p;
      pt.w.tiled = tiles.get();
      int sms = 0;
      ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
      const cuda::Fp8SmallMPlan plan = cuda::fp8_small_m_plan(pt, sms);
      int major = 0;
      ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
      // The tiled kBulk plan (fp8_small_m_plan, sessions 12-13): wq_b and wo_b (2 K partitions
      // per CTA) at M <= 8; not for short rings (tiny, wq_a).
      EXPECT_EQ(plan.tiled, major >= 9 && c.auto_tiled);
      if (plan.tiled) EXPECT_EQ(plan.kernel, cuda::SmallMKernel::kBulk);
      if (plan.tiled && c.s.n == 4096) EXPECT_EQ(plan.k_parts, 2);
      p.kernel = plan.kernel;
      p.row_warps = plan.row_warps;
      p.k_split = plan.k_split;
      p.stages = plan.stages;
      p.k_parts = plan.k_parts;
    }
    ASSERT_TRUE(cuda::launch_fp8_linear_small_m(p, nullptr).ok());
    p.w.tiled = tiles.get();
    p.y = y1.get();
    ASSERT_TRUE(cuda::launch_fp8_linear_small_m(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> a, b;
    ASSERT_EQ(y0.download(a), cudaSuccess);
    ASSERT_EQ(y1.download(b), cudaSuccess);
    int64_t diff = 0, nan = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff += std::memcmp(&a[i], &b[i], 4) != 0;
      nan += std::isnan(a[i]);
    }
    EXPECT_EQ(nan, 0) << "poison left in the row-major output";
    EXPECT_EQ(diff, 0) << "of " << a.size() << " outputs";
  }
}

TEST_F(GemmCudaTest, BulkKernelTwoKPartitionsPerCta) {
  // kBulk with 2 K partitions per CTA (two producer warps and rings, 8 consumer warps) against
  // the CPU oracle: every row_warps and k_split, row-major and tiled weights, ring depths 2-4,
  // with and without PDL, M = 1 .. 8, bf16 and fp32 output.
  uint64_t seed = 1700;
  const LinearShape shapes[] = {kFlashShapes[4], kFlashShapes[3], kFlashShapes[0], kTinyShapes[1],
                                kTinyShapes[5]};
  for (const LinearShape& s : shapes)
    for (int rw : {1, 2, 4})
      for (int ks : {1, 2, 4}) {
        if (s.k / 128 < 2 * ks) continue;
        SmallMConfig c;
        c.kernel = cuda::SmallMKernel::kBulk;
        c.k_parts = 2;
        c.row_warps = rw;
        c.k_split = ks;
        c.stages = 2 + (rw + ks) % 3;
        c.pdl = (rw + ks) % 2;
        c.tiled = (rw + ks) % 2 == 0;
        const int64_t m = (rw * 3 + ks) % 3 == 0 ? 1 : (rw * 3 + ks) % 3 == 1 ? 8 : 3;
        run_fp8_case(s, m, true, ks % 2 ? cuda::OutType::kF32 : cuda::OutType::kBF16, ++seed,
                     true, Path::kSmallM, c);
      }
}

TEST_F(GemmCudaTest, BulkKernelRingsAroundTheDefaultSharedMemoryLimit) {
  // kBulk at 4 row-warps with 4..6 ring slots: 48 KB of ring (4 slots) plus the kernel's static
  // shared memory passes the 48 KB a kernel gets without opting in; the launcher refused exactly
  // this layout with cudaErrorInvalidValue until session 10 (bench_gemm_fp8's wq_a sweep).
  uint64_t seed = 1050;
  for (int stages : {4, 5, 6}) {
    SmallMConfig c;
    c.kernel = cuda::SmallMKernel::kBulk;
    c.row_warps = 4;
    c.k_split = 1;
    c.stages = stages;
    c.pdl = stages % 2 == 0;
    for (int64_t m : {1, 16})
      run_fp8_case(kFlashShapes[0], m, true, cuda::OutType::kBF16, ++seed, true, Path::kSmallM,
                   c);
  }
}

TEST_F(GemmCudaTest, CublasLtAutotunedAttentionShapes) {
  // The opt-in cuBLASLt autotuning (timed candidates of both orientations and split-K variants);
  // the other cuBLASLt tests run the default, cuBLASLt's first heuristic answer.
  runner_->set_autotune(true);
  uint64_t seed = 1100;
  for (int i : {0, 2, 4})
    run_fp8_case(kFlashShapes[i], 1024, true, cuda::OutType::kBF16, ++seed, false,
                 Path::kCublasLt);
}

TEST_F(GemmCudaTest, DecodeCublasLtRangeThroughRunner) {
  // GemmRunner::linear_fp8 where it routes decode batches to cuBLASLt (wq_b at M > 8, wo_b at
  // M > 16: fp8_linear_uses_cublaslt) and next to it on the small-M side (wo_b M = 9, 16; wq_a,
  // wo_a at M = 33), reference numerics, bf16 and fp32 output; each case is held to the tolerance
  // of the path it took (run_fp8_case) and the quantized input is checked bit for bit.
  uint64_t seed = 1500;
  const float* f32 = reinterpret_cast<const float*>(16);  // non-null: only the predicate reads it
  EXPECT_TRUE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, f32, 32768, 1024, 1}, 9));
  EXPECT_FALSE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, f32, 32768, 1024, 1}, 8));
  EXPECT_TRUE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, f32, 4096, 8192, 1}, 17));
  EXPECT_FALSE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, f32, 4096, 8192, 1}, 16));
  EXPECT_FALSE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, f32, 1024, 4096, 8}, 64));
  EXPECT_FALSE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, nullptr, 32768, 1024, 1}, 64));
  EXPECT_TRUE(cuda::fp8_linear_uses_cublaslt({nullptr, nullptr, f32, 1024, 4096, 1}, 65));
  for (int i : {1, 4})
    for (int64_t m : {9, 16, 17, 33, 63})
      run_fp8_case(kFlashShapes[i], m, true, m == 33 ? cuda::OutType::kF32 : cuda::OutType::kBF16,
                   ++seed);
  for (int i : {0, 3}) run_fp8_case(kFlashShapes[i], 33, true, cuda::OutType::kBF16, ++seed);
}

TEST_F(GemmCudaTest, DecodeWgmmaRangeThroughRunner) {
  // Where GemmRunner::linear_fp8 routes decode batches to kWgmma (fp8_linear_uses_wgmma, compute
  // capability 9.0 only): quantized wq_b at M <= 32, wo_b at 9..32, the grouped wo_a at 9..64;
  // with bf16 activations wo_a and wq_b from M = 16; never the small weights. The cases on both
  // sides of the bounds run through the runner (each held to the tolerance of the path it took),
  // fp32 and rounded output.
  const bool sm90 = device_is_sm90();
  auto uses = [](int64_t n, int64_t k, int g, int64_t m, bool q = true) {
    return cuda::fp8_linear_uses_wgmma({nullptr, nullptr, nullptr, n, k, g}, m, q);
  };
  EXPECT_EQ(uses(32768, 1024, 1, 1), sm90);
  EXPECT_EQ(uses(32768, 1024, 1, 32), sm90);
  EXPECT_FALSE(uses(32768, 1024, 1, 33));
  EXPECT_FALSE(uses(4096, 8192, 1, 8));
  EXPECT_EQ(uses(4096, 8192, 1, 9), sm90);
  EXPECT_FALSE(uses(4096, 8192, 1, 33));
  EXPECT_FALSE(uses(1024, 4096, 8, 8));
  EXPECT_EQ(uses(1024, 4096, 8, 64), sm90);
  EXPECT_FALSE(uses(1536, 4096, 1, 16));  // the wq_a + wkv pair: 6 MB
  EXPECT_FALSE(uses(32768, 1024, 1, 0));
  // bf16 activations (hf numerics, the engine's wo_a): wo_a and wq_b from 16 tokens, not wo_b.
  EXPECT_FALSE(uses(1024, 4096, 8, 15, false));
  EXPECT_EQ(uses(1024, 4096, 8, 16, false), sm90);
  EXPECT_EQ(uses(32768, 1024, 1, 64, false), sm90);
  EXPECT_FALSE(uses(4096, 8192, 1, 32, false));
  // The slices under tensor parallelism of 2 (16.8 MB): wq_b and wo_b as the full weights; wo_a
  // up to 32 tokens when quantized, never with bf16 input.
  EXPECT_EQ(uses(16384, 1024, 1, 1), sm90);
  EXPECT_EQ(uses(4096, 4096, 1, 16), sm90);
  EXPECT_EQ(uses(1024, 4096, 4, 32), sm90);
  EXPECT_FALSE(uses(1024, 4096, 4, 64));
  EXPECT_FALSE(uses(1024, 4096, 4, 16, false));
  uint64_t seed = 1550;
  for (int i : {1, 3, 4})
    for (int64_t m : {8, 9, 32, 33})
      run_fp8_case(kFlashShapes[i], m, true,
                   m % 2 ? cuda::OutType::kF32 : cuda::OutType::kF32Bf16, ++seed);
  run_fp8_case(kFlashShapes[3], 64, true, cuda::OutType::kF32, ++seed);
  for (int64_t m : {15, 16, 37, 64})
    run_fp8_case(kFlashShapes[3], m, false, cuda::OutType::kF32Bf16, ++seed);
  run_fp8_case(kFlashShapes[1], 20, false, cuda::OutType::kF32, ++seed);
  const LinearShape wo_a_tp2{"wo_a/tp2", 1024, 4096, 4};
  for (int64_t m : {32, 33, 64}) run_fp8_case(wo_a_tp2, m, true, cuda::OutType::kF32, ++seed);
}

TEST_F(GemmCudaTest, DecodeBatchSizesThroughRunner) {
  // GemmRunner::linear_fp8 at the decode batch sizes (kStream / kBulk for FP8 activations, kMma
  // for bf16; M = 1, 16, 64 are in FlashShapesDecode).
  uint64_t seed = 800;
  for (int i : {0, 1, 2, 3, 4})
    for (int64_t m : {2, 4, 8})
      for (bool q : {true, false})
        run_fp8_case(kFlashShapes[i], m, q, cuda::OutType::kBF16, ++seed);
}

TEST_F(GemmCudaTest, Fp32InputThroughRunner) {
  // What CudaOps passes for quantized FP8 linears: fp32 activations, quantized by the runner
  // (small-M kernels at M <= 64, cuBLASLt above and in its decode range).
  f32_input_ = true;
  uint64_t seed = 850;
  for (int i : {0, 1, 2, 3, 4})
    for (int64_t m : {1, 5, 16, 64, 300}) run_fp8_case(kFlashShapes[i], m, true,
                                                       cuda::OutType::kF32, ++seed);
}

TEST_F(GemmCudaTest, RoundedFp32Output) {
  // OutType::kF32Bf16 (what CudaOps asks for at the forward's bf16 rounding points): fp32
  // elements holding bf16 values within the bf16 bound, from each small-M kernel's epilogue and
  // through the runner (cuBLASLt above M = 64 and in its decode range: the GEMM, then the
  // rounding pass). The bf16 linear's form is in Bf16Linear.
  uint64_t seed = 870;
  for (cuda::SmallMKernel k :
       {cuda::SmallMKernel::kMma, cuda::SmallMKernel::kStream, cuda::SmallMKernel::kBulk}) {
    SmallMConfig c;
    c.kernel = k;
    for (int64_t m : {1, 7, 16})
      run_fp8_case(kFlashShapes[1], m, true, cuda::OutType::kF32Bf16, ++seed, true,
                   Path::kSmallM, c);
  }
  for (int i : {0, 1, 2, 3, 4})
    for (int64_t m : {1, 33, 200}) {
      run_fp8_case(kFlashShapes[i], m, true, cuda::OutType::kF32Bf16, ++seed);
      run_fp8_case(kFlashShapes[i], m, false, cuda::OutType::kF32Bf16, ++seed);
    }
}

TEST_F(GemmCudaTest, FlashShapesDecode) {
  uint64_t seed = 300;
  for (const LinearShape& s : kFlashShapes)
    for (int64_t m : {1, 16, 64})
      for (bool q : {true, false}) run_fp8_case(s, m, q, cuda::OutType::kBF16, ++seed);
}

TEST_F(GemmCudaTest, FlashShapesPrefill) {
  uint64_t seed = 400;
  for (const LinearShape& s : kFlashShapes)
    for (int64_t m : {512, 4096}) {
      const double worst = run_fp8_case(s, m, true, cuda::OutType::kBF16, ++seed);
      std::printf("prefill %-12s M=%-5lld worst |err|/S = %.3g\n", s.name, (long long)m, worst);
    }
  // hf numerics at prefill sizes run the small-M kernel in chunks (two shapes keep it short).
  run_fp8_case(kFlashShapes[0], 512, false, cuda::OutType::kBF16, ++seed);
  run_fp8_case(kFlashShapes[3], 4096, false, cuda::OutType::kBF16, ++seed);
  // fp32 output at a prefill size (cuBLASLt, or the small-M kernel where cuBLASLt has no algo).
  run_fp8_case(kFlashShapes[4], 512, true, cuda::OutType::kF32, ++seed);
}

TEST_F(GemmCudaTest, CublasLtBlockScaledAttentionShapes) {
  // The prefill path itself (no fallback): 1x128 activation and 128x128 weight block scales.
  uint64_t seed = 450;
  for (int i : {0, 1, 2, 3, 4})
    for (int64_t m : {256, 4096}) {
      const double worst = run_fp8_case(kFlashShapes[i], m, true, cuda::OutType::kBF16, ++seed,
                                        false, Path::kCublasLt);
      std::printf("cublaslt %-6s M=%-5lld worst |err|/S = %.3g\n", kFlashShapes[i].name,
                  (long long)m, worst);
    }
}

TEST_F(GemmCudaTest, Bf16Linear) {
  uint64_t seed = 500;
  struct S {
    int64_t n, k, m;
  };
  for (S s : {S{256, 4096, 1}, S{256, 4096, 64}, S{1024, 4096, 16}, S{64, 4096, 512},
              S{512, 4096, 4096}, S{128, 256, 3}})
    for (cuda::OutType out :
         {cuda::OutType::kF32, cuda::OutType::kBF16, cuda::OutType::kF32Bf16}) {
      SCOPED_TRACE("bf16 linear N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                   " M=" + std::to_string(s.m));
      Rng rng(++seed);
      std::vector<uint16_t> w(size_t(s.n * s.k));
      for (auto& v : w) v = float_to_bf16(rng.normal() * 0.02f);
      std::vector<uint16_t> x = random_activations(rng, s.m, s.k);
      test::DeviceBuffer<uint16_t> dw(w.size()), dx(x.size());
      const size_t esz = cuda::out_is_f32(out) ? 4 : 2;
      test::DeviceBuffer<uint8_t> dy(size_t(s.m * s.n) * esz);
      ASSERT_EQ(dw.upload(w), cudaSuccess);
      ASSERT_EQ(dx.upload(x), cudaSuccess);
      ASSERT_EQ(dy.poison(), cudaSuccess);
      cuda::Bf16LinearParams p;
      p.w = dw.get();
      p.out_features = s.n;
      p.in_features = s.k;
      p.num_tokens = s.m;
      p.x = dx.get();
      p.x_row_stride = s.k;
      p.y = dy.get();
      p.y_type = out;
      p.y_row_stride = s.n;
      Status st = runner_->linear_bf16(p, nullptr);
      ASSERT_TRUE(st.ok()) << st.to_string();
      DS_CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<uint8_t> yb;
      DS_CUDA_ASSERT(dy.download(yb));
      const std::vector<int64_t> toks = sample_tokens(s.m);
      std::vector<float> xs(toks.size() * size_t(s.k)), ref(toks.size() * size_t(s.n));
      for (size_t t = 0; t < toks.size(); ++t)
        for (int64_t c = 0; c < s.k; ++c)
          xs[t * size_t(s.k) + size_t(c)] = bf16_to_float(x[size_t(toks[t] * s.k + c)]);
      cpu::linear_bf16(xs.data(), int64_t(toks.size()), w.data(), s.n, s.k, ref.data());
      int64_t bad = 0;
      for (size_t t = 0; t < toks.size(); ++t)
        for (int64_t n = 0; n < s.n; ++n) {
          double asum = 0;
          for (int64_t c = 0; c < s.k; ++c)
            asum += std::fabs(double(xs[t * size_t(s.k) + size_t(c)]) *
                              bf16_to_float(w[size_t(n * s.k + c)]));
          const size_t gi = size_t(toks[t] * s.n + n);
          float got;
          if (cuda::out_is_f32(out))
            std::memcpy(&got, &yb[gi * 4], 4);
          else
            got = bf16_to_float(uint16_t(yb[gi * 2] | (yb[gi * 2 + 1] << 8)));
          const float r = ref[t * size_t(s.n) + size_t(n)];
          const double tol =
              kTol * asum + (out != cuda::OutType::kF32 ? std::ldexp(std::fabs(r), -8) : 0.0);
          if (!(std::fabs(double(got) - r) <= tol)) ++bad;
          // kF32Bf16: fp32 elements that are bf16 values.
          if (out == cuda::OutType::kF32Bf16 && !(bf16_to_float(float_to_bf16(got)) == got))
            ++bad;
        }
      EXPECT_EQ(bad, 0);
    }
}

// Two linears that share their input as one GEMM over the concatenated weights (CudaOps'
// wq_a + wkv at decode sizes): with split_features the first rows go to y and the rest to y2,
// each with its own row stride, bit for bit the columns of the unsplit output (the same plan and
// arithmetic; only the store address differs). The unsplit fused shape against the CPU
// reference too; and the split's argument checks.
TEST_F(GemmCudaTest, SplitOutputGivesTheUnsplitColumnsBitForBit) {
  const LinearShape fused_flash{"wq_a+wkv", 1536, 4096, 1}, fused_tiny{"tiny pair", 256, 256, 1};
  uint64_t seed = 1900;
  for (int64_t m : {1, 8}) run_fp8_case(fused_flash, m, true, cuda::OutType::kF32Bf16, ++seed);
  struct Case {
    LinearShape s;
    int64_t split, m;
  };
  for (const Case& c : {Case{fused_flash, 1024, 1}, Case{fused_flash, 1024, 2},
                        Case{fused_flash, 1024, 5}, Case{fused_flash, 1024, 8},
                        Case{fused_flash, 1024, 16}, Case{fused_flash, 1024, 37},
                        Case{fused_tiny, 128, 1}, Case{fused_tiny, 128, 3}}) {
    SCOPED_TRACE(std::string(c.s.name) + " M=" + std::to_string(c.m));
    Rng rng(++seed);
    HostWeight hw = random_weight(rng, c.s);
    const std::vector<uint16_t> xb = random_activations(rng, c.m, c.s.k);
    std::vector<float> x(xb.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i]);
    DeviceWeight dw(hw);
    ASSERT_EQ(dw.data.upload(hw.data), cudaSuccess);
    ASSERT_EQ(dw.scale.upload(hw.scale), cudaSuccess);
    ASSERT_EQ(dw.scale_f32.upload(hw.scale_f32), cudaSuccess);
    test::DeviceBuffer<float> dx(x.size());
    ASSERT_EQ(dx.upload(x), cudaSuccess);
    const int64_t n = c.s.n, n0 = c.split, n1 = n - c.split, s0 = n0 + 8, s1 = n1 + 16;
    test::DeviceBuffer<float> full(size_t(c.m * n)), y0(size_t(c.m * s0)), y1(size_t(c.m * s1));
    for (auto* b : {&full, &y0, &y1}) ASSERT_EQ(b->poison(), cudaSuccess);
    cuda::Fp8LinearParams p;
    p.w = {dw.data.get(), dw.scale.get(), dw.scale_f32.get(), n, c.s.k, 1};
    p.num_tokens = c.m;
    p.x.f32 = dx.get();
    p.x.x_row_stride = c.s.k;
    p.y = full.get();
    p.y_type = cuda::OutType::kF32Bf16;
    p.y_row_stride = n;
    p.pdl = c.m % 2 == 1;
    Status st = runner_->linear_fp8(p, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    p.y = y0.get();
    p.y_row_stride = s0;
    p.y2 = y1.get();
    p.y2_row_stride = s1;
    p.split_features = n0;
    (void)(st = runner_->linear_fp8(p, nullptr));
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> f, a, b;
    ASSERT_EQ(full.download(f), cudaSuccess);
    ASSERT_EQ(y0.download(a), cudaSuccess);
    ASSERT_EQ(y1.download(b), cudaSuccess);
    int64_t differ = 0, pad_written = 0;
    for (int64_t t = 0; t < c.m; ++t) {
      for (int64_t j = 0; j < n0; ++j)
        differ += std::memcmp(&a[size_t(t * s0 + j)], &f[size_t(t * n + j)], 4) != 0;
      for (int64_t j = 0; j < n1; ++j)
        differ += std::memcmp(&b[size_t(t * s1 + j)], &f[size_t(t * n + n0 + j)], 4) != 0;
      for (int64_t j = n0; j < s0; ++j) pad_written += !std::isnan(a[size_t(t * s0 + j)]);
      for (int64_t j = n1; j < s1; ++j) pad_written += !std::isnan(b[size_t(t * s1 + j)]);
    }
    EXPECT_EQ(differ, 0);
    EXPECT_EQ(pad_written, 0) << "a split output wrote past its width";
  }
  // Bad splits: at N, negative, without y2, y2's stride too small, and more than one group.
  test::DeviceBuffer<uint8_t> w(256 * 256), sc(4);
  test::DeviceBuffer<float> x(256), y(1024), y2(1024);
  cuda::Fp8LinearParams p;
  p.w = {w.get(), sc.get(), nullptr, 256, 256, 1};
  p.num_tokens = 1;
  p.x.f32 = x.get();
  p.x.x_row_stride = 256;
  p.y = y.get();
  p.y_type = cuda::OutType::kF32;
  p.y_row_stride = 256;
  p.y2 = y2.get();
  p.y2_row_stride = 256;
  for (int64_t split : {int64_t(256), int64_t(-16)}) {
    p.split_features = split;
    EXPECT_EQ(runner_->linear_fp8(p, nullptr).code(), StatusCode::kInvalidArgument) << split;
  }
  p.split_features = 128;
  p.y2 = nullptr;
  EXPECT_EQ(runner_->linear_fp8(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.y2 = y2.get();
  p.y2_row_stride = 64;
  EXPECT_EQ(runner_->linear_fp8(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.y2_row_stride = 256;
  p.w = {w.get(), sc.get(), nullptr, 128, 128, 2};
  p.x.x_row_stride = 256;
  EXPECT_EQ(runner_->linear_fp8(p, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST_F(GemmCudaTest, RejectsBadShapes) {
  test::DeviceBuffer<uint8_t> w(256 * 200), s(4), y(1024);
  test::DeviceBuffer<uint16_t> x(1024);
  cuda::Fp8LinearParams p;
  p.w = {w.get(), s.get(), nullptr, 256, 200, 1};  // K not a multiple of 128
  p.num_tokens = 1;
  p.x.bf16 = x.get();
  p.x.x_row_stride = 200;
  p.y = y.get();
  p.y_row_stride = 256;
  Status st = runner_->linear_fp8(p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  p.w = {w.get(), s.get(), nullptr, 100, 128, 1};  // N not a multiple of 16
  (void)(st = runner_->linear_fp8(p, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  p.w = {w.get(), s.get(), nullptr, 128, 128, 1};
  p.num_tokens = kMaxTokens + 1;  // larger than the workspace
  p.x.x_row_stride = 128;
  (void)(st = runner_->linear_fp8(p, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  cuda::Fp8SmallMParams sp;
  sp.w = {w.get(), s.get(), nullptr, 128, 128, 1};
  sp.num_tokens = 1;
  sp.x_bf16 = x.get();
  sp.x_row_stride = 128;
  sp.y = y.get();
  sp.y_row_stride = 128;
  sp.row_warps = 3;
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.row_warps = 0;
  sp.kernel = cuda::SmallMKernel::kStream;  // needs FP8 activations
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.kernel = cuda::SmallMKernel::kBulk;  // needs FP8 activations too
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.x_codes = w.get();
  sp.x_scales = s.get();
  sp.stages = 9;  // ring depth out of range
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.stages = 0;
  sp.k_parts = 3;  // K partitions per CTA: 1 or 2
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.k_parts = 0;
  sp.w.tiled = w.get() + 8;  // a misaligned tile-ordered copy
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.w.tiled = nullptr;
  // kWgmma: more than 64 tokens, a ring depth other than 4 or 6, more cluster ranks than K
  // blocks, 3 warpgroups, misaligned bf16 input; refused on devices other than compute
  // capability 9.0.
  sp.kernel = cuda::SmallMKernel::kWgmma;
  sp.num_tokens = 65;
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.num_tokens = 1;
  sp.stages = 5;
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.stages = 0;
  sp.k_split = 2;  // K = 128: one block
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.k_split = 0;
  sp.row_warps = 3;
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  sp.row_warps = 0;
  sp.x_codes = nullptr;
  sp.x_scales = nullptr;
  sp.x_bf16 = x.get() + 4;  // 8 bytes past a 16-byte boundary
  (void)(st = cuda::launch_fp8_linear_small_m(sp, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  // The tile reorder: rows not a multiple of 16, K not a multiple of 128, misaligned, null.
  (void)(st = cuda::launch_fp8_weight_to_tiles(w.get(), y.get(), 8, 128, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  (void)(st = cuda::launch_fp8_weight_to_tiles(w.get(), y.get(), 16, 64, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  (void)(st = cuda::launch_fp8_weight_to_tiles(w.get() + 8, y.get(), 16, 128, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  (void)(st = cuda::launch_fp8_weight_to_tiles(nullptr, y.get(), 16, 128, nullptr));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

}  // namespace
}  // namespace ds
