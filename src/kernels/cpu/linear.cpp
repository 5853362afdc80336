// Linear-layer references: dequantize one weight row at a time (fp32), dot it with every token's
// input in fp32. Parallel over output rows when OpenMP is available.
#include "kernels/cpu/linear.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant.h"

namespace ds::cpu {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Decode tables (the same values as core/dtype.h's conversions, looked up instead of recomputed
// for every weight element).
struct DecodeTables {
  float e4m3[256];
  float e2m1[16];
  DecodeTables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_float(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_float(uint8_t(i));
  }
};
const DecodeTables& decode_tables() {
  static const DecodeTables tables;
  return tables;
}

float e2m1_element(const uint8_t* packed_row, int64_t k) {
  uint8_t byte = packed_row[k / 2];
  return decode_tables().e2m1[(k % 2 == 0) ? e2m1_low(byte) : e2m1_high(byte)];
}

}  // namespace

bool is_quantized_format(WeightFormat format) {
  return format == WeightFormat::kFp8Block || format == WeightFormat::kMxfp4 ||
         format == WeightFormat::kNvfp4;
}

LinearWeight slice_rows(const LinearWeight& w, int64_t row0, int64_t rows) {
  LinearWeight s = w;
  s.out_features = rows;
  const int64_t k = w.in_features;
  switch (w.format) {
    case WeightFormat::kF32:
      s.data = static_cast<const float*>(w.data) + row0 * k;
      break;
    case WeightFormat::kBF16:
      s.data = static_cast<const uint16_t*>(w.data) + row0 * k;
      break;
    case WeightFormat::kFp8Block:
      assert(row0 % kFp8WeightBlock == 0 && "FP8 row slices must start on a 128-row block");
      s.data = static_cast<const uint8_t*>(w.data) + row0 * k;
      s.scale = w.scale + (row0 / kFp8WeightBlock) * ceil_div(k, kFp8WeightBlock);
      break;
    case WeightFormat::kMxfp4:
      s.data = static_cast<const uint8_t*>(w.data) + row0 * (k / 2);
      s.scale = w.scale + row0 * (k / kMxfp4Block);
      break;
    case WeightFormat::kNvfp4:
      s.data = static_cast<const uint8_t*>(w.data) + row0 * (k / 2);
      s.scale = w.scale + row0 * (k / kNvfp4Block);
      break;
  }
  return s;
}

void dequantize_weight_row(const LinearWeight& w, int64_t row, float* out) {
  const int64_t k_dim = w.in_features;
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* src = static_cast<const float*>(w.data) + row * k_dim;
      for (int64_t k = 0; k < k_dim; ++k) out[k] = src[k];
      break;
    }
    case WeightFormat::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + row * k_dim;
      int64_t k = 0;
#if defined(__GNUC__)
      // Four at a time through vector extensions (the same bit shift as bf16_to_float).
      typedef uint16_t H4 __attribute__((vector_size(8)));
      typedef uint32_t U4 __attribute__((vector_size(16)));
      for (; k + 4 <= k_dim; k += 4) {
        H4 h;
        std::memcpy(&h, src + k, sizeof(h));
        const U4 bits = __builtin_convertvector(h, U4) << 16;
        std::memcpy(out + k, &bits, sizeof(bits));
      }
#endif
      for (; k < k_dim; ++k) out[k] = bf16_to_float(src[k]);
      break;
    }
    case WeightFormat::kFp8Block: {
      // §10: W[n,k] = e4m3(W[n,k]) * 2^(scale[n/128][k/128] - 127).
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + row * k_dim;
      const uint8_t* scale_row =
          w.scale + (row / kFp8WeightBlock) * ceil_div(k_dim, kFp8WeightBlock);
      const float* e4m3 = decode_tables().e4m3;
      for (int64_t k0 = 0; k0 < k_dim; k0 += kFp8WeightBlock) {
        const float scale = e8m0_to_float(scale_row[k0 / kFp8WeightBlock]);
        const int64_t k1 = std::min<int64_t>(k_dim, k0 + kFp8WeightBlock);
        for (int64_t k = k0; k < k1; ++k) out[k] = e4m3[src[k]] * scale;
      }
      break;
    }
    case WeightFormat::kMxfp4: {
      // §10.1: W = e2m1 * 2^(byte-127), one scale per 32 K-elements.
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + row * (k_dim / 2);
      const uint8_t* scale_row = w.scale + row * (k_dim / kMxfp4Block);
      for (int64_t k0 = 0; k0 < k_dim; k0 += kMxfp4Block) {
        const float scale = e8m0_to_float(scale_row[k0 / kMxfp4Block]);
        for (int64_t k = k0; k < k0 + kMxfp4Block; ++k) out[k] = e2m1_element(src, k) * scale;
      }
      break;
    }
    case WeightFormat::kNvfp4: {
      // §10.3: W = e2m1 * e4m3(weight_scale) * weight_scale_2.
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + row * (k_dim / 2);
      const uint8_t* scale_row = w.scale + row * (k_dim / kNvfp4Block);
      for (int64_t k0 = 0; k0 < k_dim; k0 += kNvfp4Block) {
        const float scale = decode_tables().e4m3[scale_row[k0 / kNvfp4Block]];
        for (int64_t k = k0; k < k0 + kNvfp4Block; ++k) {
          out[k] = e2m1_element(src, k) * scale * w.global_scale;
        }
      }
      break;
    }
  }
}

// Compiled twice where the toolchain supports function multiversioning: for AVX2 (the 8 dot lanes
// in one register; no FMA, so every product and sum is rounded exactly as in the default build)
// and for the baseline ISA, chosen at load time by the CPU.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
void linear(const float* x, int64_t num_tokens, const LinearWeight& w, bool quantize_activations,
            float* y) {
  const int64_t n_dim = w.out_features, k_dim = w.in_features;
  // §10.2: the FP8/FP4 GEMMs see the FP8-simulated activations.
  std::vector<float> x_quant;
  if (quantize_activations && is_quantized_format(w.format)) {
    x_quant.assign(x, x + num_tokens * k_dim);
    for (int64_t t = 0; t < num_tokens; ++t) {
      simulate_fp8_blocks(x_quant.data() + t * k_dim, k_dim, kActQuantBlock);
    }
    x = x_quant.data();
  }
  DS_OMP_PARALLEL_FOR_IF(num_tokens * n_dim * k_dim >= kParallelMinWork)
  for (int64_t n = 0; n < n_dim; ++n) {
    thread_local std::vector<float> w_row;
    w_row.resize(size_t(k_dim));
    dequantize_weight_row(w, n, w_row.data());
    int64_t t = 0;
    for (; t + 4 <= num_tokens; t += 4) {  // four tokens per pass over the row (same sums)
      const float* xs[4] = {x + t * k_dim, x + (t + 1) * k_dim, x + (t + 2) * k_dim,
                            x + (t + 3) * k_dim};
      float out[4];
      dot_f32_x4(xs, w_row.data(), k_dim, out);
      for (int j = 0; j < 4; ++j) y[(t + j) * n_dim + n] = out[j];
    }
    for (; t < num_tokens; ++t) {
      const float* xt = x + t * k_dim;
      y[t * n_dim + n] = dot_f32(xt, w_row.data(), k_dim);
    }
  }
}

void linear_f32(const float* x, int64_t num_tokens, const float* weight, int64_t out_features,
                int64_t in_features, float* y) {
  linear(x, num_tokens, {WeightFormat::kF32, out_features, in_features, weight, nullptr, 1.0f},
         false, y);
}

void linear_bf16(const float* x, int64_t num_tokens, const uint16_t* weight, int64_t out_features,
                 int64_t in_features, float* y) {
  linear(x, num_tokens, {WeightFormat::kBF16, out_features, in_features, weight, nullptr, 1.0f},
         false, y);
}

void linear_fp8_block(const float* x, int64_t num_tokens, const uint8_t* weight,
                      const uint8_t* scale, int64_t out_features, int64_t in_features,
                      bool quantize_activations, float* y) {
  linear(x, num_tokens, {WeightFormat::kFp8Block, out_features, in_features, weight, scale, 1.0f},
         quantize_activations, y);
}

void linear_mxfp4(const float* x, int64_t num_tokens, const uint8_t* weight, const uint8_t* scale,
                  int64_t out_features, int64_t in_features, bool quantize_activations, float* y) {
  linear(x, num_tokens, {WeightFormat::kMxfp4, out_features, in_features, weight, scale, 1.0f},
         quantize_activations, y);
}

void linear_nvfp4(const float* x, int64_t num_tokens, const uint8_t* weight, const uint8_t* scale,
                  float global_scale, int64_t out_features, int64_t in_features,
                  bool quantize_activations, float* y) {
  linear(x, num_tokens,
         {WeightFormat::kNvfp4, out_features, in_features, weight, scale, global_scale},
         quantize_activations, y);
}

}  // namespace ds::cpu
