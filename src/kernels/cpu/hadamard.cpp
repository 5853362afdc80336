// Fast Walsh-Hadamard transform (butterflies in fp32, then the n^-0.5 scale).
#include "kernels/cpu/hadamard.h"

#include <cassert>
#include <cmath>

namespace ds::cpu {

void hadamard_transform(float* x, int64_t num_vectors, int64_t n) {
  assert(n > 0 && (n & (n - 1)) == 0 && "Hadamard size must be a power of two");
  const float scale = float(1.0 / std::sqrt(double(n)));
  for (int64_t v = 0; v < num_vectors; ++v) {
    float* y = x + v * n;
    // Stage with half-width h combines (i, i + h) within blocks of 2h: the Sylvester recursion
    // H_2n = [[H_n, H_n], [H_n, -H_n]].
    for (int64_t h = 1; h < n; h *= 2) {
      for (int64_t i0 = 0; i0 < n; i0 += 2 * h) {
        for (int64_t i = i0; i < i0 + h; ++i) {
          float a = y[i], b = y[i + h];
          y[i] = a + b;
          y[i + h] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) y[i] *= scale;
  }
}

}  // namespace ds::cpu
