// Overflow-checked unsigned arithmetic for sizes computed from untrusted input (reliability.md
// rule 10: the checked value is the one used for allocation and copying).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace ds {

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of all dimensions (1 for rank 0), or nullopt on overflow.
inline std::optional<uint64_t> checked_product(std::span<const uint64_t> dims) {
  uint64_t p = 1;
  for (uint64_t d : dims) {
    auto next = checked_mul(p, d);
    if (!next) return std::nullopt;
    p = *next;
  }
  return p;
}

}  // namespace ds
