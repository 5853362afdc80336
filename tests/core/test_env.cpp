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

TEST(EnvSwitch, OneOrZeroForceElseFallback) {
  ::unsetenv(kVar);
  EXPECT_TRUE(env_switch(kVar, true));
  EXPECT_FALSE(env_switch(kVar, false));
  for (const char* other : {"", "2", "on", "01"}) {
    ASSERT_EQ(::setenv(kVar, other, 1), 0);
    EXPECT_TRUE(env_switch(kVar, true)) << "'" << other << "'";
    EXPECT_FALSE(env_switch(kVar, false)) << "'" << other << "'";
  }
  ASSERT_EQ(::setenv(kVar, "1", 1), 0);
  EXPECT_TRUE(env_switch(kVar, false));
  ASSERT_EQ(::setenv(kVar, "0", 1), 0);
  EXPECT_FALSE(env_switch(kVar, true));
  ::unsetenv(kVar);
}

}  // namespace
}  // namespace ds
