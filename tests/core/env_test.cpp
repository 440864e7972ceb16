// Environment overrides: unset or empty is "no override", a whole number at
// or above the least is taken, anything else is an error naming the
// variable, the value and what it sets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/env.h"
#include "core/error.h"

namespace zt {
namespace {

std::string error_of(const char* value, int64_t least) {
  ::setenv("ZT_TEST_ENV_NUMBER", value, 1);
  try {
    env_whole_number("ZT_TEST_ENV_NUMBER", least, "a test knob");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Env, WholeNumbersAreTakenAndEverythingElseIsNamed) {
  ::unsetenv("ZT_TEST_ENV_NUMBER");
  EXPECT_FALSE(env_whole_number("ZT_TEST_ENV_NUMBER", 1, "a test knob").has_value());
  ::setenv("ZT_TEST_ENV_NUMBER", "", 1);
  EXPECT_FALSE(env_whole_number("ZT_TEST_ENV_NUMBER", 1, "a test knob").has_value());
  ::setenv("ZT_TEST_ENV_NUMBER", "1073741824", 1);
  EXPECT_EQ(env_whole_number("ZT_TEST_ENV_NUMBER", 1, "a test knob"), int64_t(1) << 30);
  ::setenv("ZT_TEST_ENV_NUMBER", "0", 1);
  EXPECT_EQ(env_whole_number("ZT_TEST_ENV_NUMBER", 0, "a test knob"), 0);
  EXPECT_EQ(error_of("0", 1), "ZT_TEST_ENV_NUMBER = '0' is not a positive whole number (a test knob); unset it for the "
                              "default");
  EXPECT_NE(error_of("-1", 0).find("is not a whole number >= 0 (a test knob)"), std::string::npos);
  for (const char* bad : {"2^28", "12 ", "1e6", "x", "99999999999999999999"})
    EXPECT_NE(error_of(bad, 1).find(std::string("ZT_TEST_ENV_NUMBER = '") + bad + "'"), std::string::npos) << bad;
  ::unsetenv("ZT_TEST_ENV_NUMBER");
}

TEST(Env, SwitchesAreZeroOrOne) {
  ::unsetenv("ZT_TEST_ENV_SWITCH");
  EXPECT_FALSE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch"));
  ::setenv("ZT_TEST_ENV_SWITCH", "1", 1);
  EXPECT_TRUE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch"));
  ::setenv("ZT_TEST_ENV_SWITCH", "0", 1);
  EXPECT_FALSE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch"));
  // A switch on by default: unset or empty is its default, 0 still turns it off.
  EXPECT_FALSE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch", true));
  ::setenv("ZT_TEST_ENV_SWITCH", "", 1);
  EXPECT_TRUE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch", true));
  EXPECT_FALSE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch"));
  ::unsetenv("ZT_TEST_ENV_SWITCH");
  EXPECT_TRUE(env_switch("ZT_TEST_ENV_SWITCH", "a test switch", true));
  for (const char* bad : {"2", "-1", "on", "yes"}) {
    ::setenv("ZT_TEST_ENV_SWITCH", bad, 1);
    try {
      env_switch("ZT_TEST_ENV_SWITCH", "a test switch");
      ADD_FAILURE() << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("ZT_TEST_ENV_SWITCH = '") + bad + "' is not"),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("ZT_TEST_ENV_SWITCH");
}

}  // namespace
}  // namespace zt
