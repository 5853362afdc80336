// Helpers for the op kernel tests (test_ops_cuda): random inputs, one-call device upload /
// download, and comparison summaries (largest error, how many elements differ at all, how many
// exceed a tolerance) printed with each check so a failure says how far off it is.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cuda_test_util.h"

namespace ds::test {

inline std::vector<float> random_normal(Rng& rng, size_t n, float scale = 1.0f, float mean = 0.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = mean + rng.normal() * scale;
  return v;
}

// Values a bf16 tensor holds (the forward's activations are bf16-valued).
inline std::vector<float> random_bf16_valued(Rng& rng, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_float(float_to_bf16(rng.normal() * scale));
  return v;
}

template <typename T>
struct Dev {
  DeviceBuffer<T> buf;
  explicit Dev(size_t n) : buf(n) {}
  explicit Dev(const std::vector<T>& host) : buf(host.size()) {
    EXPECT_TRUE(buf.ok());
    EXPECT_EQ(buf.upload(host), cudaSuccess);
  }
  T* get() const { return buf.get(); }
  std::vector<T> host() const {
    std::vector<T> out;
    EXPECT_EQ(buf.download(out), cudaSuccess);
    return out;
  }
};

// Distance in bf16 ulps of two bf16-valued floats (same sign assumed when close).
inline int64_t bf16_ulps(float a, float b) {
  const int32_t ia = int32_t(float_to_bf16(a)), ib = int32_t(float_to_bf16(b));
  const int32_t sa = ia & 0x8000 ? -(ia & 0x7FFF) : ia, sb = ib & 0x8000 ? -(ib & 0x7FFF) : ib;
  return std::abs(int64_t(sa) - int64_t(sb));
}

struct Diff {
  int64_t count = 0;   // elements compared
  int64_t differ = 0;  // not bit-identical
  int64_t beyond = 0;  // outside the tolerance (or NaN on one side)
  double max_abs = 0;  // largest |got - want|
  int64_t first_bad = -1;
  double got_bad = 0, want_bad = 0;  // values at first_bad
};

// |got - want| <= atol + rtol * |want| per element.
inline Diff compare(const std::vector<float>& got, const std::vector<float>& want, double atol,
                    double rtol) {
  Diff d;
  d.count = int64_t(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (g != w) ++d.differ;
    const double e = std::fabs(g - w);
    if (!(e <= atol + rtol * std::fabs(w))) {
      ++d.beyond;
      if (d.first_bad < 0) {
        d.first_bad = int64_t(i);
        d.got_bad = g;
        d.want_bad = w;
      }
    }
    if (e > d.max_abs) d.max_abs = e;
  }
  return d;
}

// bf16-valued outputs: at most `ulps` bf16 ulps apart.
inline Diff compare_bf16(const std::vector<float>& got, const std::vector<float>& want,
                         int64_t ulps) {
  Diff d;
  d.count = int64_t(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) ++d.differ;
    if (std::isnan(got[i]) || bf16_ulps(got[i], want[i]) > ulps) {
      ++d.beyond;
      if (d.first_bad < 0) {
        d.first_bad = int64_t(i);
        d.got_bad = got[i];
        d.want_bad = want[i];
      }
    }
    d.max_abs = std::max(d.max_abs, double(std::fabs(got[i] - want[i])));
  }
  return d;
}

inline std::string describe(const Diff& d) {
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%lld elements, %lld not bit-identical, %lld beyond tolerance (first %lld: got %.9g "
      "want %.9g), max |err| %.3g",
      (long long)d.count, (long long)d.differ, (long long)d.beyond, (long long)d.first_bad,
      d.got_bad, d.want_bad, d.max_abs);
  return buf;
}

}  // namespace ds::test
