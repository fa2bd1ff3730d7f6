// core/text.h: the split behind the tuning settings, and the on/off switches of the environment
// (ZIMAGE_FUSED_*, ZIMAGE_GEMM_AUTOTUNE; env_switch reads them), where a value other than 1 or 0
// is an error naming it.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/text.h"

namespace zimage {
namespace {

TEST(Text, SplitKeepsEmptyParts) {
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
  EXPECT_EQ(split("x,", ','), (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(split("coop", ','), (std::vector<std::string>{"coop"}));
}

TEST(Text, SwitchIsOneOrZeroAndNamesABadValue) {
  auto on = parse_switch("ZIMAGE_FUSED_ADALN", "1");
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(*on);
  auto off = parse_switch("ZIMAGE_FUSED_ADALN", "0");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(*off);
  for (const char* bad : {"true", "", "yes", "2", " 1"}) {
    auto r = parse_switch("ZIMAGE_GEMM_AUTOTUNE", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("ZIMAGE_GEMM_AUTOTUNE='" + std::string(bad) + "'"),
              std::string::npos)
        << r.status().to_string();
  }
}

// env_switch: unset leaves the setting alone (true stays true, false stays false), 1 and 0 set it,
// a bad value is parse_switch's error and leaves the setting as it was.
TEST(Text, EnvSwitchKeepsSetsOrRefuses) {
  const char* name = "ZIMAGE_TEST_ENV_SWITCH";
  unsetenv(name);
  for (const bool start : {true, false}) {
    bool on = start;
    ASSERT_TRUE(env_switch(name, on).ok());
    EXPECT_EQ(on, start) << "unset";
  }
  bool on = false;
  setenv(name, "1", 1);
  ASSERT_TRUE(env_switch(name, on).ok());
  EXPECT_TRUE(on);
  setenv(name, "0", 1);
  ASSERT_TRUE(env_switch(name, on).ok());
  EXPECT_FALSE(on);
  setenv(name, "on", 1);
  const Status st = env_switch(name, on);
  unsetenv(name);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ZIMAGE_TEST_ENV_SWITCH='on'"), std::string::npos) << st.to_string();
  EXPECT_FALSE(on) << "a bad value changes nothing";
}

}  // namespace
}  // namespace zimage
