// exp of non-positive single-precision values, four at a time, for the sampler's softmax passes
// over a whole vocabulary (129280 logits a row): glibc's expf costs ~3.5 ns a value, about half of
// a temperature-sampled row (bench_sampler); this runs at ~1.7 ns on SSE2 (GCC/Clang vector
// extensions, so the same code builds for any target they support).
#pragma once

#include <cstdint>
#include <cstring>

namespace ds::sched {

typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));
typedef double Double4 __attribute__((vector_size(32)));

// e^x per lane for x <= 0: exactly 1 at 0, exactly 0 at -inf and below -87 (std::exp gives values
// under 1.7e-38 there). x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite, ln2 in two parts), e^r by
// its degree-7 Taylor polynomial, times 2^n built in the exponent field. Relative error under
// 2e-7 for x in [-87, 0] (test_sampler FastExp bounds it).
inline Float4 exp_nonpositive4(Float4 x) {
  const Float4 lo = {-87.0f, -87.0f, -87.0f, -87.0f};
  const Int4 keep = x >= lo;  // all ones where x >= -87 (false for -inf and NaN)
  const Float4 xc = keep ? x : lo;
  const Int4 n = __builtin_convertvector(xc * 1.44269504088896341f - 0.5f, Int4);  // nearest
  const Float4 fn = __builtin_convertvector(n, Float4);
  const Float4 r = (xc - fn * 0.693145751953125f) - fn * 1.42860682030941723e-6f;
  Float4 p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Int4 scale_bits = (n + 127) << 23;  // 2^n, n >= -126
  Float4 scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  const Float4 y = p * scale;
  Int4 bits;
  std::memcpy(&bits, &y, sizeof(bits));
  bits &= keep;
  Float4 out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// One value through the same lanes (the tails of the loops below give what a full block would).
inline float exp_nonpositive(float x) {
  const Float4 v = {x, x, x, x};
  return exp_nonpositive4(v)[0];
}

// out[i] = e^((w[i] - mx) * scale) for i < n, as double (the sums run in double); mx >= every
// w[i], scale > 0.
inline void exp_shifted(const float* w, int64_t n, float mx, float scale, double* out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    Float4 x;
    std::memcpy(&x, w + i, sizeof(x));
    const Double4 d = __builtin_convertvector(exp_nonpositive4((x - mx) * scale), Double4);
    std::memcpy(out + i, &d, sizeof(d));
  }
  for (; i < n; ++i) out[i] = double(exp_nonpositive((w[i] - mx) * scale));
}

// Sums of a vocabulary's worth of doubles without one serial chain of additions (a chain costs
// an add's latency per value: ~0.2 ms for 129280 values): eight running sums, value i into sum
// i % 8, combined pairwise at the end, then the tail past the last block of 8 in index order.
// As accurate as the serial sum (each sum holds n/8 terms); a fixed order, so deterministic.
inline double sum_lanes(const double* p, int64_t n) {
  Double4 a = {0, 0, 0, 0}, b = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Double4 x, y;
    std::memcpy(&x, p + i, sizeof(x));
    std::memcpy(&y, p + i + 4, sizeof(y));
    a += x;
    b += y;
  }
  const Double4 s = a + b;
  double sum = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < n; ++i) sum += p[i];
  return sum;
}

// sum over i < n of e^(w[i] - mx) (mx >= every w[i]) in double: value i into running sum i % 4,
// combined pairwise, then the tail in index order (sum_lanes' reasoning).
inline double sum_exp_shifted(const float* w, int64_t n, float mx) {
  Double4 acc = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    Float4 x;
    std::memcpy(&x, w + i, sizeof(x));
    acc += __builtin_convertvector(exp_nonpositive4(x - mx), Double4);
  }
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) sum += double(exp_nonpositive(w[i] - mx));
  return sum;
}

}  // namespace ds::sched
