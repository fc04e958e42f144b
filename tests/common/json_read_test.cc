#include "common/json_read.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>

namespace rvbpfd {
namespace {

using nlohmann::json;

TEST(JsonIntegerTest, AcceptsOnlyIntegersTheTypeHoldsExactly) {
  EXPECT_EQ(JsonInteger<uint64_t>(json(UINT64_MAX)), UINT64_MAX);
  EXPECT_EQ(JsonInteger<uint32_t>(json(4294967295u)), 4294967295u);
  EXPECT_EQ(JsonInteger<int32_t>(json(-2147483648LL)), INT32_MIN);
  EXPECT_EQ(JsonInteger<int64_t>(json(7u)), 7);
  EXPECT_EQ(JsonInteger<uint8_t>(json(255)), 255);

  EXPECT_FALSE(JsonInteger<uint32_t>(json(4294967296u)));  // would wrap to 0
  EXPECT_FALSE(JsonInteger<uint8_t>(json(258)));           // would wrap to 2
  EXPECT_FALSE(JsonInteger<uint64_t>(json(-1)));           // would become UINT64_MAX
  EXPECT_FALSE(JsonInteger<int32_t>(json(-2147483649LL)));
  EXPECT_FALSE(JsonInteger<int64_t>(json(UINT64_MAX)));
}

TEST(JsonIntegerTest, RefusesFloatsStringsBoolsAndNull) {
  // A float beyond uint64's range: nlohmann's get<uint64_t>() would be undefined behaviour.
  EXPECT_FALSE(JsonInteger<uint64_t>(json(8.09049e19)));
  EXPECT_FALSE(JsonInteger<uint64_t>(json(1.0)));
  EXPECT_FALSE(JsonInteger<int32_t>(json(1e300)));
  EXPECT_FALSE(JsonInteger<uint64_t>(json("12")));
  EXPECT_FALSE(JsonInteger<uint64_t>(json(true)));
  EXPECT_FALSE(JsonInteger<uint64_t>(json(nullptr)));
  EXPECT_FALSE(JsonInteger<uint64_t>(json::array({1})));
  // Parsed text takes the same path as constructed values.
  EXPECT_FALSE(JsonInteger<uint64_t>(json::parse("80904900000000000000")));  // parsed as a float: too big for uint64
  EXPECT_EQ(JsonInteger<uint64_t>(json::parse("18446744073709551615")), UINT64_MAX);
}

}  // namespace
}  // namespace rvbpfd
