// Rotary position embedding on the GPU (dsv4-model.md §7.3): the interleaved (GPT-J) rotation of
// the last rope_dim dims of every head at each token's own position, forward (e^{+i pos f}) or
// inverse (the conjugate, the attention output de-rotation). The frequency table comes from
// ds::cpu::rope_inv_freq (computed once at load). CPU reference: ds::cpu::rope_rotate
// (src/kernels/cpu/rope.h); the angle is fp32(position) * f_i in fp32 and cos/sin are evaluated
// in double and rounded to fp32, as there, so outputs match it bit for bit except where the
// device's double sin/cos and libm's round differently (not seen in the tests).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda {

struct RopeParams {
  float* x = nullptr;                  // [num_tokens, num_heads, head_dim], tokens token_stride
                                       // elements apart; rotated in place (8-byte aligned)
  const float* inv_freq = nullptr;     // [rope_dim / 2]
  const int64_t* positions = nullptr;  // [num_tokens] device memory
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;   // even
  int64_t rope_dim = 64;  // even, <= head_dim; the rotated slice is [head_dim - rope_dim, head_dim)
  int64_t token_stride = 0;  // elements (num_heads * head_dim for a dense tensor; even)
  bool inverse = false;      // rotate by the conjugate
  bool round_bf16 = false;   // round the rotated values to bf16 values
};

// One block per token: the token's cos/sin table goes to shared memory, then every (head, pair)
// is rotated. No allocation, no host sync, graph-capturable.
void launch_rope(const RopeParams& params, cudaStream_t stream);

// The same rotation for an input held as bf16 bits (the attention kernel's output): reads
// src [num_tokens, token_stride] bf16, writes every dim of x (fp32; the unrotated dims as they
// are, the rotated slice as launch_rope computes it) and, when dst is not null, the same values
// as bf16 bits (dst may be src: in place). With round_bf16 the two outputs hold the same values,
// the bits launch_rope + a f32 -> bf16 conversion would give. Needs head_dim, rope_dim and
// token_stride multiples of 8 and 16-byte aligned x, src and dst. Blocks of 256 threads take 256
// 8-dim vectors of one token, so one token spreads over num_heads * head_dim / 2048 blocks.
// (rope_bf16_supported says whether a shape qualifies.)
bool rope_bf16_supported(const RopeParams& params, const void* src, const void* dst);
void launch_rope_bf16(const RopeParams& params, const uint16_t* src, uint16_t* dst,
                      cudaStream_t stream);

}  // namespace ds::cuda
