// The fp32 dot product every CPU reference kernel uses: 8 partial sums (lane l takes the products
// k = l mod 8 of each full block of 8, the tail goes to lane 0), combined as
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). The result depends only on this order, never
// on how the loop is compiled: with GCC/Clang vector extensions the 8 lanes are one 8-wide vector
// (elementwise multiply, then add, exactly the scalar operations; two SSE registers, or one AVX
// register where the caller is compiled for AVX), otherwise plain loops.
// dot_f32_x4 computes four dot products against one shared vector with the same per-product
// order, so each of its results equals dot_f32 bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace ds::cpu {

#if defined(__GNUC__)
namespace dot_detail {
// The 8 lanes as one vector (two SSE registers, or one AVX register where the caller is compiled
// for AVX); elementwise multiply then add, exactly the scalar operations.
typedef float F8 __attribute__((vector_size(32)));
// *v = p[0..8) (through memcpy: p need not be aligned; no vector crosses a call boundary).
inline void load8(F8* v, const float* p) {
  std::memcpy(v, p, sizeof(F8));
}
// tail0 is lane 0 after the tail.
inline float combine(const F8& v, float tail0) {
  return ((tail0 + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
}  // namespace dot_detail

inline float dot_f32(const float* a, const float* b, int64_t n) {
  using namespace dot_detail;
  F8 acc = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    F8 av, bv;
    load8(&av, a + k);
    load8(&bv, b + k);
    acc += av * bv;
  }
  float l0 = acc[0];
  for (; k < n; ++k) l0 += a[k] * b[k];
  return combine(acc, l0);
}

inline void dot_f32_x4(const float* const a[4], const float* b, int64_t n, float out[4]) {
  using namespace dot_detail;
  F8 acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    F8 bv, v0, v1, v2, v3;
    load8(&bv, b + k);
    load8(&v0, a0 + k);
    load8(&v1, a1 + k);
    load8(&v2, a2 + k);
    load8(&v3, a3 + k);
    acc0 += v0 * bv;
    acc1 += v1 * bv;
    acc2 += v2 * bv;
    acc3 += v3 * bv;
  }
  const F8* acc[4] = {&acc0, &acc1, &acc2, &acc3};
  for (int j = 0; j < 4; ++j) {
    float l0 = (*acc[j])[0];
    for (int64_t t = k; t < n; ++t) l0 += a[j][t] * b[t];
    out[j] = combine(*acc[j], l0);
  }
}
#else
inline float dot_f32(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[k + l] * b[k + l];
  }
  for (; k < n; ++k) lanes[0] += a[k] * b[k];
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

inline void dot_f32_x4(const float* const a[4], const float* b, int64_t n, float out[4]) {
  for (int j = 0; j < 4; ++j) out[j] = dot_f32(a[j], b, n);
}
#endif

}  // namespace ds::cpu
