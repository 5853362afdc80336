// CPU reference for the quantization simulations of the reference numerics (dsv4-model.md
// §7.2, §7.6, §7.7, §10.2): FP8 e4m3 block quantization with power-of-two (ue8m0) scales, the
// FP8 simulation of the KV nope part, FP4 e2m1 block quantization with ue8m0 scales, and bf16
// rounding. "Simulation" means quantize then dequantize in place, as REF's kernels do with
// `inplace=True`.
#pragma once

#include <cstdint>

namespace ds::cpu {

inline constexpr int kActQuantBlock = 128;     // §10.2: activations, per 128 K-elements
inline constexpr int kKvFp8Block = 64;         // §7.2: KV nope part, per 64
inline constexpr int kFp4Block = 32;           // §7.7: indexer q/k, per 32
inline constexpr float kFp8AmaxFloor = 1e-4f;  // REF act_quant: amax = max(amax, 1e-4)

// Quantizes x in blocks of `block` consecutive elements to e4m3 with scale
// s = 2^ceil(log2(max(amax, 1e-4) / 448)), then (when dequant_out != nullptr) writes the
// dequantized values e4m3(clamp(x/s, ±448)) * s. A last partial block is its own block.
//   x           [n]
//   codes       [n] e4m3 bits, nullable
//   scales      [ceil(n / block)] e8m0 bits, nullable
//   dequant_out [n], nullable (may alias x)
void quantize_fp8_blocks(const float* x, int64_t n, int block, uint8_t* codes, uint8_t* scales,
                         float* dequant_out);

// FP8 simulation in place (REF act_quant(x, block, "ue8m0", inplace=True)).
//   x [n]
void simulate_fp8_blocks(float* x, int64_t n, int block);

// §7.2: FP8 simulation of the nope part of each vector, blocks of 64; the rope tail (the last
// rope_dim values) is left alone. Used for the window KV and the attention compressor entries.
//   kv [num_vectors, head_dim]
void simulate_fp8_kv_nope(float* kv, int64_t num_vectors, int64_t head_dim, int64_t rope_dim);

// §7.7: FP4 (e2m1) block quantization with scale s = 2^ceil(log2(max(amax, 6*2^-126) / 6)) and
// values e2m1(clamp(x/s, ±6)) (round to nearest even on the e2m1 grid).
//   x           [n]
//   packed      [ceil(n / 2)] e2m1 codes, element 2j in the low nibble, nullable
//   scales      [ceil(n / block)] e8m0 bits, nullable
//   dequant_out [n], nullable (may alias x)
void quantize_fp4_blocks(const float* x, int64_t n, int block, uint8_t* packed, uint8_t* scales,
                         float* dequant_out);

// FP4 simulation in place (REF fp4_act_quant(x, 32, inplace=True)).
//   x [n]
void simulate_fp4_blocks(float* x, int64_t n, int block);

// Rounds to the nearest bf16 (ties to even) and back: the value a bf16 tensor would hold.
float round_bf16(float value);
//   x [n], in place
void round_to_bf16(float* x, int64_t n);

// bf16 bits to fp32 (weights stored as bf16, e.g. norm weights).
//   bits [n], out [n]
void bf16_to_float_array(const uint16_t* bits, int64_t n, float* out);

}  // namespace ds::cpu
