// Random sampling of one logits row, as a backend runs it for the engine's requests that nothing
// adjusts (docs/engine.md "Backend sampling"): the oracle of the CUDA sampling kernel, which
// follows it bit for bit. The distribution is the host sampler's (scheduler/sampler.h): softmax
// of w / T, then top-k, then top-p (the smallest prefix of the descending order whose mass reaches
// top_p of the kept mass), then min-p, one uniform draw over the kept tokens; untruncated rows
// draw in id order, truncated ones in descending order (ties to the lower id). What differs is
// the arithmetic, chosen so that a GPU gets the same token from the same logits and draw:
// - p = exp((w - max) * float(1 / T)) by sampling_exp below (fp32, explicit FMAs, no library
//   call), and a token's mass is p in fixed point, floor(p * 2^40) as an integer: every sum is
//   exact, so no summation order exists to differ. Tokens with p < 2^-40 get mass 0 and are never
//   drawn (the host sampler draws them with probability under 2^-40 each).
// - Targets in that fixed point: top-p's is ceil(top_p * kept) and the draw's
//   min(floor(u * total), total - 1), both computed in double from the integer sums.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DS_SAMPLING_HD __host__ __device__
#else
#define DS_SAMPLING_HD
#endif

namespace ds::cpu {

// One row's sampling parameters (the engine's SamplingParams after validation).
struct RowSampling {
  double temperature = 0;  // <= 0: greedy (the argmax, ties to the lowest id)
  int64_t top_k = 0;       // <= 0 or >= vocab: off
  double top_p = 1;        // >= 1: off
  double min_p = 0;        // <= 0: off
  double uniform = 0;      // the request's draw in [0, 1)
};

inline constexpr float kSamplingMassScale = 1099511627776.0f;  // 2^40
inline constexpr float kSamplingMinExponent = -28.0f;          // e^-28 < 2^-40: mass 0 below

DS_SAMPLING_HD inline uint32_t sampling_float_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

DS_SAMPLING_HD inline float sampling_bits_float(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// e^x for x <= 0 (0 below kSamplingMinExponent): 2^n * e^r with n = rint(x / ln 2), r by a
// two-constant reduction and a degree-7 Taylor polynomial (relative error ~1e-8 on |r| <= 0.35).
// Only correctly rounded operations (fmaf, *, rintf), so the host and a GPU agree bit for bit.
DS_SAMPLING_HD inline float sampling_exp(float x) {
  if (!(x >= kSamplingMinExponent)) return 0.0f;
  const float n = rintf(x * 1.44269502f);
  float r = fmaf(n, -0.693145751953125f, x);
  r = fmaf(n, -1.42860677e-06f, r);
  float p = 1.98412698e-04f;  // 1/7!
  p = fmaf(p, r, 1.38888889e-03f);
  p = fmaf(p, r, 8.33333333e-03f);
  p = fmaf(p, r, 4.16666667e-02f);
  p = fmaf(p, r, 1.66666667e-01f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  // 2^n exactly (n in [-41, 0]).
  return p * sampling_bits_float(uint32_t(int32_t(n) + 127) << 23);
}

// The probability weight of logit w (row maximum mx, inverse temperature inv_t) and its mass.
DS_SAMPLING_HD inline float sampling_prob(float w, float mx, float inv_t) {
  return sampling_exp((w - mx) * inv_t);
}

DS_SAMPLING_HD inline uint64_t sampling_mass_of(float p) {
  return uint64_t(p * kSamplingMassScale);  // p * 2^40 is exact; the conversion truncates
}

// The descending-order key of a logit: a smaller key is a larger value (-0 and +0 equal).
DS_SAMPLING_HD inline uint32_t sampling_key(float w) {
  const uint32_t u = w == 0.0f ? 0u : sampling_float_bits(w);
  return (u & 0x80000000u) != 0 ? u : (~u & 0x7fffffffu);
}

// The logit whose key is k (sampling_key's inverse; +0 for the key of zero).
DS_SAMPLING_HD inline float sampling_key_value(uint32_t k) {
  return sampling_bits_float((k & 0x80000000u) != 0 ? k : (~k & 0x7fffffffu));
}

// The draw's target in fixed point: the token whose cumulative mass first exceeds it is drawn.
DS_SAMPLING_HD inline uint64_t sampling_draw_target(double uniform, uint64_t total) {
  const double t = uniform * double(total);
  const uint64_t v = t <= 0 ? 0 : uint64_t(t);
  return v < total ? v : total - 1;
}

// top-p's target: the kept prefix is the shortest whose cumulative mass reaches it (at most the
// mass `kept` of the prefix it truncates).
DS_SAMPLING_HD inline uint64_t sampling_top_p_target(double top_p, uint64_t kept) {
  const uint64_t t = uint64_t(ceil(top_p * double(kept)));
  return t < kept ? t : kept;
}

// The token for one row w [n] (finite logits): returns false, leaving *token alone, when a value
// is NaN or infinite.
bool sample_row(const float* w, int64_t n, const RowSampling& s, int32_t* token);

// sample_row over rows x [rows, n] with per-row parameters; finite[r] = 1 when row r is finite
// (ids[r] = 0 otherwise).
void sample_rows(const float* x, int64_t rows, int64_t n, const RowSampling* params, int32_t* ids,
                 uint8_t* finite);

}  // namespace ds::cpu
