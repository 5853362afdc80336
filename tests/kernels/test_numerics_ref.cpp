// Numerics modes (dsv4-model.md §2): the flags of each mode are exactly the rows of the §2 table.
#include <gtest/gtest.h>

#include "kernels/cpu/numerics.h"

namespace ds::cpu {
namespace {

TEST(NumericsFlags, ReferenceMode) {
  constexpr NumericsFlags f = numerics_flags(NumericsMode::kReference);
  EXPECT_TRUE(f.fp8_kv_simulation);
  EXPECT_TRUE(f.indexer_fp4_simulation);
  EXPECT_TRUE(f.activation_quantization);
  EXPECT_FALSE(f.shared_expert_clamp);
  EXPECT_EQ(f.router_renorm_epsilon, 0.0f);
}

TEST(NumericsFlags, HfMode) {
  constexpr NumericsFlags f = numerics_flags(NumericsMode::kHf);
  EXPECT_FALSE(f.fp8_kv_simulation);
  EXPECT_FALSE(f.indexer_fp4_simulation);
  EXPECT_FALSE(f.activation_quantization);
  EXPECT_TRUE(f.shared_expert_clamp);
  EXPECT_EQ(f.router_renorm_epsilon, 1e-20f);
}

TEST(NumericsMode, Names) {
  EXPECT_EQ(numerics_mode_name(NumericsMode::kReference), "reference");
  EXPECT_EQ(numerics_mode_from_name("hf"), NumericsMode::kHf);
  EXPECT_EQ(numerics_mode_from_name("reference"), NumericsMode::kReference);
  EXPECT_FALSE(numerics_mode_from_name("fp8").has_value());
}

}  // namespace
}  // namespace ds::cpu
