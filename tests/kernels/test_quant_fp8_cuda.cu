// FP8 block activation quantization on the GPU against the CPU reference
// (ds::cpu::quantize_fp8_blocks): bit-exact codes and scales on fresh random bf16 inputs with a
// wide dynamic range, at tiny and DeepSeek-V4-Flash shapes, with outputs poisoned before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/quant/quant_fp8.h"
#include "kernels/cuda_test_util.h"

namespace ds {
namespace {

struct Shape {
  int64_t rows, row_len, stride;
};

// Random bf16 activations: normal values with a per-block magnitude spread over ~2^-20..2^20 so
// that scales cover many exponents, plus exact zeros, subnormal-range values and outliers.
std::vector<uint16_t> random_activations(Rng& rng, int64_t n) {
  std::vector<uint16_t> x(static_cast<size_t>(n));
  float block_mag = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 128 == 0) block_mag = std::ldexp(1.0f, int(rng.below(41)) - 20);
    float v = rng.normal() * block_mag;
    uint64_t r = rng.below(1000);
    if (r == 0) v = 0.0f;
    if (r == 1) v *= 1000.0f;
    x[size_t(i)] = float_to_bf16(v);
  }
  return x;
}

// f32_input: the kernel reads fp32 values that are not bf16 values (x_f32), the reference rounds
// them to bf16 first (ds::float_to_bf16), as the bf16 copy of launch_f32_to_bf16 would hold.
void check_against_reference(const Shape& s, uint64_t seed, bool f32_input = false) {
  Rng rng(seed);
  std::vector<uint16_t> x = random_activations(rng, s.rows * s.stride);
  std::vector<float> x32;
  if (f32_input) {
    // Each value moved off its bf16 value by 0, 1/2 or 1 times |v| 2^-8 either way: about half a
    // bf16 step at most (ties where v is a power of two).
    x32.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = bf16_to_float(x[i]);
      const float half_step = std::ldexp(std::fabs(v), -8);
      const float off = float(int(rng.below(5)) - 2) * 0.5f * half_step;  // -1..1 half steps
      x32[i] = v + off;
      x[i] = float_to_bf16(x32[i]);
    }
  }
  // CPU reference on the same (bf16-rounded) values, row by row.
  std::vector<uint8_t> ref_codes(size_t(s.rows * s.row_len)), ref_scales(size_t(s.rows * s.row_len / 128));
  std::vector<float> row(size_t(s.row_len));
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t c = 0; c < s.row_len; ++c) row[size_t(c)] = bf16_to_float(x[size_t(r * s.stride + c)]);
    cpu::quantize_fp8_blocks(row.data(), s.row_len, 128, &ref_codes[size_t(r * s.row_len)],
                             &ref_scales[size_t(r * s.row_len / 128)], nullptr);
  }
  test::DeviceBuffer<uint16_t> d_x(x.size());
  test::DeviceBuffer<float> d_x32(f32_input ? x32.size() : 1);
  test::DeviceBuffer<uint8_t> d_codes(ref_codes.size()), d_scales(ref_scales.size());
  ASSERT_TRUE(d_x.ok() && d_x32.ok() && d_codes.ok() && d_scales.ok());
  DS_CUDA_ASSERT(d_x.upload(x));
  if (f32_input) DS_CUDA_ASSERT(d_x32.upload(x32));
  DS_CUDA_ASSERT(d_codes.poison());
  DS_CUDA_ASSERT(d_scales.poison());
  cuda::QuantFp8Params p;
  p.x = f32_input ? nullptr : d_x.get();
  p.x_f32 = f32_input ? d_x32.get() : nullptr;
  p.codes = d_codes.get();
  p.scales = d_scales.get();
  p.num_rows = s.rows;
  p.row_len = s.row_len;
  p.x_row_stride = s.stride;
  cuda::launch_quantize_fp8_blocks(p, nullptr);
  DS_CUDA_ASSERT(cudaGetLastError());
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint8_t> codes, scales;
  DS_CUDA_ASSERT(d_codes.download(codes));
  DS_CUDA_ASSERT(d_scales.download(scales));
  int64_t bad_codes = 0, bad_scales = 0;
  for (size_t i = 0; i < codes.size(); ++i) bad_codes += codes[i] != ref_codes[i];
  for (size_t i = 0; i < scales.size(); ++i) bad_scales += scales[i] != ref_scales[i];
  EXPECT_EQ(bad_codes, 0) << "of " << codes.size();
  EXPECT_EQ(bad_scales, 0) << "of " << scales.size();
}

TEST(QuantFp8Cuda, TinyShapes) {
  DS_REQUIRE_GPU();
  check_against_reference({1, 128, 128}, 11);
  check_against_reference({3, 256, 256}, 12);
  check_against_reference({5, 256, 384}, 13);  // strided rows
}

TEST(QuantFp8Cuda, FlashShapes) {
  DS_REQUIRE_GPU();
  check_against_reference({1, 4096, 4096}, 21);     // decode, hidden
  check_against_reference({64, 4096, 4096}, 22);    // decode batch 64
  check_against_reference({37, 2048, 2048}, 23);    // expert down-projection input
  check_against_reference({2048, 8192, 8192}, 24);  // prefill chunk, wo_b input (o_groups*o_lora)
}

TEST(QuantFp8Cuda, Fp32InputRoundsToBf16First) {
  DS_REQUIRE_GPU();
  check_against_reference({3, 256, 256}, 31, true);
  check_against_reference({5, 256, 384}, 32, true);     // strided rows
  check_against_reference({1, 4096, 4096}, 33, true);   // decode, hidden (wq_a, wkv input)
  check_against_reference({64, 1024, 1024}, 34, true);  // decode batch 64, wq_b input
  check_against_reference({300, 8192, 8192}, 35, true); // prefill, wo_b input
}

TEST(QuantFp8Cuda, NanPropagates) {
  DS_REQUIRE_GPU();
  std::vector<uint16_t> x(128, float_to_bf16(1.0f));
  x[5] = 0x7FC0;  // NaN
  test::DeviceBuffer<uint16_t> d_x(128);
  test::DeviceBuffer<uint8_t> d_codes(128), d_scales(1);
  DS_CUDA_ASSERT(d_x.upload(x));
  DS_CUDA_ASSERT(d_codes.poison());
  cuda::QuantFp8Params p{d_x.get(), d_codes.get(), d_scales.get(), 1, 128, 128};
  cuda::launch_quantize_fp8_blocks(p, nullptr);
  DS_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint8_t> codes, scales;
  DS_CUDA_ASSERT(d_codes.download(codes));
  DS_CUDA_ASSERT(d_scales.download(scales));
  EXPECT_EQ(codes[5] & 0x7F, 0x7F);
  EXPECT_EQ(scales[0], e8m0_ceil_pow2(1.0f / 448.0f));  // NaN ignored by the amax, as on the CPU
  EXPECT_EQ(codes[0], float_to_e4m3(1.0f / e8m0_to_float(scales[0])));
}

}  // namespace
}  // namespace ds
