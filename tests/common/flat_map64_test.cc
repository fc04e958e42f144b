#include "common/flat_map64.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

// Every key of `m` maps to `want`'s value, and nothing else is in it.
void ExpectSame(const FlatMap64<int>& m, const std::map<uint64_t, int>& want) {
  ASSERT_EQ(m.size(), want.size());
  for (const auto& [k, v] : want) {
    const int* got = m.find(k);
    ASSERT_NE(got, nullptr) << k;
    EXPECT_EQ(*got, v) << k;
  }
  size_t seen = 0;
  for (const auto& [k, v] : m) {
    auto it = want.find(k);
    ASSERT_NE(it, want.end()) << k;
    EXPECT_EQ(v, it->second);
    ++seen;
  }
  EXPECT_EQ(seen, want.size());
}

TEST(FlatMap64, EmptyFindsNothing) {
  FlatMap64<int> m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.find(0), nullptr);
  EXPECT_FALSE(m.contains(42));
  EXPECT_FALSE(m.erase(42));
  EXPECT_EQ(m.slot_count(), 0u);
}

TEST(FlatMap64, TryEmplaceInsertsOnceAndValueInitializes) {
  FlatMap64<int> m;
  auto [v, fresh] = m.try_emplace(7);
  EXPECT_TRUE(fresh);
  EXPECT_EQ(*v, 0);
  *v = 5;
  auto [again, fresh2] = m.try_emplace(7);
  EXPECT_FALSE(fresh2);
  EXPECT_EQ(*again, 5);
  m[7] += 1;
  EXPECT_EQ(*m.find(7), 6);
  EXPECT_EQ(m.size(), 1u);
}

TEST(FlatMap64, KeyZeroAndMaxAreOrdinaryKeys) {
  FlatMap64<int> m;
  m[0] = 1;
  m[UINT64_MAX] = 2;
  EXPECT_EQ(*m.find(0), 1);
  EXPECT_EQ(*m.find(UINT64_MAX), 2);
  EXPECT_TRUE(m.erase(0));
  EXPECT_EQ(m.find(0), nullptr);
  EXPECT_EQ(*m.find(UINT64_MAX), 2);
}

TEST(FlatMap64, GrowsKeepingEveryEntryAndStaysAtMostHalfFull) {
  FlatMap64<int> m;
  std::map<uint64_t, int> want;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t key = 0x7f0000001000ull + static_cast<uint64_t>(i) * 0x100;  // thread pointers
    m[key] = i;
    want[key] = i;
    ASSERT_LE(2 * m.size(), m.slot_count());
  }
  ExpectSame(m, want);
}

TEST(FlatMap64, IteratesInInsertionOrderUntilAnErase) {
  FlatMap64<int> m;
  for (uint64_t k : {50u, 10u, 40u, 20u, 30u}) m[k] = static_cast<int>(k);
  std::vector<uint64_t> order;
  for (const auto& [k, v] : m) order.push_back(k);
  EXPECT_EQ(order, (std::vector<uint64_t>{50, 10, 40, 20, 30}));
  // The last entry takes the erased one's place.
  m.erase(10);
  order.clear();
  for (const auto& [k, v] : m) order.push_back(k);
  EXPECT_EQ(order, (std::vector<uint64_t>{50, 30, 40, 20}));
  EXPECT_EQ(*m.find(30), 30);
}

// Keys whose home slot is the same (they differ only above the bits the index uses) form one probe run; erasing
// from its middle or its start must leave the rest reachable, also when the run wraps around the index's end.
TEST(FlatMap64, EraseInsideCollidingRunsKeepsTheRestReachable) {
  for (int start = 0; start < 5; ++start) {
    FlatMap64<int> m;
    std::map<uint64_t, int> want;
    std::vector<uint64_t> colliding;
    m[1] = 1;
    want[1] = 1;
    const size_t slots = m.slot_count();
    // Keys sharing key 1's home slot in an index of this size.
    auto home = [slots](uint64_t k) { return FlatMap64<int>::home_slot(k, slots); };
    for (uint64_t k = 2; colliding.size() < 3; ++k) {
      if (home(k) == home(1)) colliding.push_back(k);
    }
    for (uint64_t k : colliding) {
      m[k] = static_cast<int>(k);
      want[k] = static_cast<int>(k);
    }
    ASSERT_EQ(m.slot_count(), slots);  // no growth: the run is what was built above
    const uint64_t victim = start == 0 ? 1 : colliding[static_cast<size_t>(start - 1) % colliding.size()];
    EXPECT_TRUE(m.erase(victim));
    want.erase(victim);
    ExpectSame(m, want);
    // Reinsert and erase everything one by one.
    m[victim] = 9;
    want[victim] = 9;
    ExpectSame(m, want);
    while (!want.empty()) {
      const uint64_t k = want.begin()->first;
      EXPECT_TRUE(m.erase(k));
      want.erase(k);
      ExpectSame(m, want);
    }
  }
}

TEST(FlatMap64, WrappingRunSurvivesErase) {
  // Keys whose home is the last slot: their run wraps to slot 0 onwards.
  FlatMap64<int> m;
  m[1] = 1;
  const size_t slots = m.slot_count();
  auto home = [slots](uint64_t k) { return FlatMap64<int>::home_slot(k, slots); };
  std::map<uint64_t, int> want{{1, 1}};
  std::vector<uint64_t> last;
  for (uint64_t k = 2; last.size() < 2; ++k) {
    if (home(k) == slots - 1) last.push_back(k);
  }
  uint64_t first_home = 0;
  for (uint64_t k = 2;; ++k) {
    if (home(k) == 0 && k != last[0] && k != last[1]) {
      first_home = k;
      break;
    }
  }
  for (uint64_t k : {last[0], last[1], first_home}) {
    m[k] = static_cast<int>(k);
    want[k] = static_cast<int>(k);
  }
  ASSERT_EQ(m.slot_count(), slots);
  EXPECT_TRUE(m.erase(last[0]));
  want.erase(last[0]);
  ExpectSame(m, want);
  EXPECT_TRUE(m.erase(last[1]));
  want.erase(last[1]);
  ExpectSame(m, want);
}

TEST(FlatMap64, RandomOperationsMatchStdMap) {
  FlatMap64<int> m;
  std::map<uint64_t, int> want;
  uint64_t lcg = 1;
  auto next = [&lcg](uint64_t n) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (lcg >> 33) % n;
  };
  for (int i = 0; i < 20000; ++i) {
    const uint64_t key = next(300) * 0x100;  // few keys: many erases hit, runs form and break
    switch (next(4)) {
      case 0:
      case 1:
        m[key] = i;
        want[key] = i;
        break;
      case 2:
        EXPECT_EQ(m.erase(key), want.erase(key) == 1);
        break;
      case 3:
        EXPECT_EQ(m.contains(key), want.contains(key));
        break;
    }
    if (i % 1000 == 0) ExpectSame(m, want);
  }
  ExpectSame(m, want);
}

TEST(FlatMap64, EraseIfVisitsEveryEntryOnceAndRemovesTheChosen) {
  FlatMap64<int> m;
  for (int i = 1; i <= 100; ++i) m[static_cast<uint64_t>(i)] = 0;
  const size_t removed = m.erase_if([](uint64_t key, int& v) {
    ++v;  // visited
    return key % 3 == 0;
  });
  EXPECT_EQ(removed, 33u);
  EXPECT_EQ(m.size(), 67u);
  for (const auto& [k, v] : m) {
    EXPECT_NE(k % 3, 0u);
    EXPECT_EQ(v, 1) << k;
  }
}

TEST(FlatMap64, ShrinkIfSparseGivesMemoryBackAndKeepsEntries) {
  FlatMap64<std::string> m;
  for (uint64_t i = 0; i < 1000; ++i) m[i] = std::to_string(i);
  const size_t big = m.approx_memory_bytes();
  m.erase_if([](uint64_t key, std::string&) { return key >= 3; });
  m.shrink_if_sparse();
  EXPECT_LT(m.approx_memory_bytes(), big / 10);
  EXPECT_LE(m.slot_count(), 8u);
  ASSERT_EQ(m.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(*m.find(i), std::to_string(i));
  m.clear();
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.find(1), nullptr);
  m[5] = "x";
  EXPECT_EQ(*m.find(5), "x");
}

}  // namespace
}  // namespace rvbpfd
