// CPU reference for the quantization simulations of the reference numerics (dsv4-model.md
// §7.2, §10.2): FP8 e4m3 activation quantization with power-of-two (ue8m0) block scales.
#pragma once

#include <cstdint>

namespace ds::cpu {

// Quantizes x in blocks of `block` consecutive elements to e4m3 with scale
// s = 2^ceil(log2(max(amax, 1e-4) / 448)), then (when dequant_out != nullptr) writes the
// dequantized values e4m3(clamp(x/s, ±448)) * s. Returns nothing else; codes/scales optional.
//   x           [n]
//   codes       [n] e4m3 bits, nullable
//   scales      [n / block] e8m0 bits, nullable
//   dequant_out [n], nullable (may alias x)
void quantize_fp8_blocks(const float* x, int64_t n, int block, uint8_t* codes, uint8_t* scales,
                         float* dequant_out);

}  // namespace ds::cpu
