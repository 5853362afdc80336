// Status / Result / checked arithmetic.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/checked_math.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ds {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value must be positive");
  return v;
}

Status use_two(int a, int b, int* out) {
  DS_ASSIGN_OR_RETURN(int x, parse_positive(a));
  DS_ASSIGN_OR_RETURN(int y, parse_positive(b));
  *out = x + y;
  return ok_status();
}

TEST(Status, PropagatesFirstError) {
  int out = 0;
  EXPECT_TRUE(use_two(1, 2, &out).ok());
  EXPECT_EQ(out, 3);
  Status s = use_two(1, -2, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "INVALID_ARGUMENT: value must be positive");
  EXPECT_EQ(s.with_context("field x").message(), "field x: value must be positive");
}

TEST(Result, OkStatusBecomesInternalError) {
  Result<int> r{Status()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(CheckedMath, DetectsOverflow) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(checked_add(kMax - 1, 1), kMax);
  EXPECT_FALSE(checked_add(kMax, 1).has_value());
  EXPECT_FALSE(checked_mul(uint64_t(1) << 32, uint64_t(1) << 32).has_value());
  std::vector<uint64_t> dims = {129280, 4096};
  EXPECT_EQ(checked_product(dims), uint64_t(129280) * 4096);
  std::vector<uint64_t> huge = {uint64_t(1) << 40, uint64_t(1) << 30};
  EXPECT_FALSE(checked_product(huge).has_value());
  EXPECT_EQ(checked_product({}), 1u);
}

TEST(TensorView, ContiguousShapes) {
  float buf[24];
  auto v = TensorView::contiguous(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96u);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "F32[2, 3, 4]");
  v.strides[0] = 13;
  EXPECT_FALSE(v.is_contiguous());
}

}  // namespace
}  // namespace ds
