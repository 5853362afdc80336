// A small deterministic random number generator (xoshiro256** seeded through splitmix64) for
// synthetic checkpoints and tests: the same seed gives the same bytes on every machine, which
// std::normal_distribution does not promise.
#pragma once

#include <cmath>
#include <cstdint>

namespace ds {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      s = z ^ (z >> 31);
    }
  }

  uint64_t next_u64() {
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1).
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
  float uniform(float lo, float hi) { return lo + float(uniform()) * (hi - lo); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }

  // Standard normal (Box-Muller; the second value is cached).
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = float(r * std::sin(6.283185307179586 * u2));
    has_spare_ = true;
    return float(r * std::cos(6.283185307179586 * u2));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

}  // namespace ds
