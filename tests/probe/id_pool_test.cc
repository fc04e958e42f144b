#include "probe/id_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace rvbpfd {
namespace {

TEST(IdPool, HandsOutTheLowestFreeIdsAllOrNothing) {
  IdPool pool(5);
  std::optional<std::vector<uint32_t>> a = pool.Take(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.Take(3).has_value()) << "only 2 are free: none may be taken";
  EXPECT_EQ(pool.in_use(), 3u);
  const std::vector<uint64_t> back{1};
  pool.Give(std::span<const uint64_t>(back));
  std::optional<std::vector<uint32_t>> b = pool.Take(2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(pool.high_water(), 4u);
  EXPECT_EQ(pool.in_use(), 4u);
}

TEST(IdPool, GivingBackAnIdNotInUseChangesNothing) {
  IdPool pool(4);
  ASSERT_TRUE(pool.Take(2).has_value());
  pool.GiveOne(1);
  pool.GiveOne(1);  // twice
  pool.GiveOne(3);  // never taken
  pool.GiveOne(9);  // beyond the limit
  EXPECT_EQ(pool.in_use(), 1u);
  std::optional<std::vector<uint32_t>> all = pool.Take(3);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(pool.in_use(), 4u);
  EXPECT_FALSE(pool.Take(1).has_value());
}

}  // namespace
}  // namespace rvbpfd
