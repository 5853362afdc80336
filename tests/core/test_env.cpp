// Environment A/B switches (core/env.h).
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.h"

namespace ds {
namespace {

constexpr const char* kVar = "DEEPSERVE_TEST_ENV_SWITCH";

TEST(EnvSwitch, OnlyZeroTurnsOff) {
  ::unsetenv(kVar);
  EXPECT_FALSE(env_switched_off(kVar));
  for (const char* on : {"", "1", "00", "0 ", "off", "false"}) {
    ASSERT_EQ(::setenv(kVar, on, 1), 0);
    EXPECT_FALSE(env_switched_off(kVar)) << "'" << on << "'";
  }
  ASSERT_EQ(::setenv(kVar, "0", 1), 0);
  EXPECT_TRUE(env_switched_off(kVar));
  ::unsetenv(kVar);
  EXPECT_FALSE(env_switched_off(kVar));
}

}  // namespace
}  // namespace ds
