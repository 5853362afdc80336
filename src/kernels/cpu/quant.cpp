// FP8 block quantization reference (REF kernel.py act_quant semantics, power-of-two scales).
#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

namespace ds::cpu {

void quantize_fp8_blocks(const float* x, int64_t n, int block, uint8_t* codes, uint8_t* scales,
                         float* dequant_out) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    int64_t b1 = std::min<int64_t>(n, b0 + block);
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    uint8_t scale_bits = e8m0_ceil_pow2(std::max(amax, 1e-4f) / kE4M3Max);
    float scale = e8m0_to_float(scale_bits);
    if (scales) scales[b0 / block] = scale_bits;
    for (int64_t i = b0; i < b1; ++i) {
      float v = std::clamp(x[i] / scale, -kE4M3Max, kE4M3Max);
      uint8_t code = float_to_e4m3(v);
      if (codes) codes[i] = code;
      if (dequant_out) dequant_out[i] = e4m3_to_float(code) * scale;
    }
  }
}

}  // namespace ds::cpu
