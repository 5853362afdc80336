// Orthonormal Walsh-Hadamard transform (dsv4-model.md §7.7): y = H_n x * n^-0.5 with H_n the
// Sylvester (natural-order) Hadamard matrix, H[i][j] = (-1)^popcount(i & j), as REF's
// rotate_activation (fast_hadamard_transform with scale n^-0.5). The transform is symmetric and
// orthonormal, hence its own inverse.
#pragma once

#include <cstdint>

namespace ds::cpu {

// In place, one transform per vector; n must be a power of two.
//   x [num_vectors, n]
void hadamard_transform(float* x, int64_t num_vectors, int64_t n);

}  // namespace ds::cpu
