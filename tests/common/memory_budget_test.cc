// MemoryBudget: fair shares, eviction of the largest holder first, refusals, and a total that never passes the budget.
#include "common/memory_budget.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace rvbpfd {
namespace {

// A cache that holds what it was granted and gives it all back when evicted.
struct FakeCache {
  std::unique_ptr<MemoryBudget::Account> account;
  size_t bytes = 0;
  int evicted = 0;
  explicit FakeCache(MemoryBudget* b) : account(b->Open()) {
    account->set_evictor([this] {
      account->Release(bytes);
      bytes = 0;
      ++evicted;
    });
  }
  bool Add(size_t n) {
    if (!account->Charge(n)) return false;
    bytes += n;
    return true;
  }
};

TEST(MemoryBudget, ShareIsTheBudgetOverOpenAccounts) {
  MemoryBudget b(1200);
  EXPECT_EQ(b.share(), 1200u);
  FakeCache x(&b), y(&b), z(&b);
  EXPECT_EQ(b.share(), 400u);
  EXPECT_TRUE(x.Add(400));
  EXPECT_FALSE(x.Add(401)) << "more than a share is never granted";
  EXPECT_TRUE(x.Add(1));  // past its share: its own cache goes first
  EXPECT_EQ(x.evicted, 1);
  EXPECT_EQ(x.bytes, 1u);
  EXPECT_EQ(y.evicted + z.evicted, 0);
}

TEST(MemoryBudget, AnAccountPastItsShareEvictsItselfFirst) {
  MemoryBudget b(1000);
  FakeCache x(&b), y(&b);
  ASSERT_TRUE(x.Add(500));
  ASSERT_TRUE(y.Add(300));
  EXPECT_TRUE(x.Add(100));  // 600 > share 500: x's own cache goes, then 100 fits
  EXPECT_EQ(x.evicted, 1);
  EXPECT_EQ(y.evicted, 0);
  EXPECT_EQ(x.account->held(), 100u);
  EXPECT_EQ(b.held(), 400u);
  EXPECT_EQ(b.evictions(), 1u);
  EXPECT_EQ(b.evicted_bytes(), 500u);
}

TEST(MemoryBudget, ANewAccountIsMadeRoomForByTheLargestHolder) {
  MemoryBudget b(900);
  FakeCache x(&b), y(&b);
  ASSERT_TRUE(x.Add(450));
  ASSERT_TRUE(y.Add(400));
  FakeCache z(&b);  // shares are 300 now; 850 held
  EXPECT_TRUE(z.Add(200));
  EXPECT_EQ(x.evicted, 1) << "the largest holder goes first";
  EXPECT_EQ(y.evicted, 0);
  EXPECT_EQ(b.held(), 600u);
  EXPECT_LE(b.held(), b.budget());
}

TEST(MemoryBudget, EqualHoldersLoseTheOldestFirst) {
  MemoryBudget b(900);
  FakeCache x(&b), y(&b);
  ASSERT_TRUE(x.Add(400));
  ASSERT_TRUE(y.Add(400));
  FakeCache z(&b);
  EXPECT_TRUE(z.Add(200));
  EXPECT_EQ(x.evicted, 1);
  EXPECT_EQ(y.evicted, 0);
}

TEST(MemoryBudget, WhatCannotBeEvictedIsRefused) {
  MemoryBudget b(1000);
  auto fixed = b.Open();  // no evictor: a reservation
  ASSERT_TRUE(fixed->Charge(500));
  FakeCache x(&b);
  ASSERT_TRUE(x.Add(450));
  FakeCache y(&b);  // share 333: fixed is past it but cannot give anything back
  EXPECT_FALSE(y.Add(334)) << "more than a share";
  EXPECT_TRUE(y.Add(40));   // 990 held: fits without eviction
  EXPECT_TRUE(y.Add(40));   // 1030 > 1000: x (450, the largest evictable) is evicted
  EXPECT_EQ(x.evicted, 1);
  EXPECT_EQ(b.held(), 580u);
  EXPECT_FALSE(fixed->Charge(1)) << "fixed is past its share and has no evictor";
  EXPECT_GE(b.refused(), 2u);
  EXPECT_EQ(b.held(), 580u) << "a refused charge charges nothing";
}

TEST(MemoryBudget, NoEvictionOfItselfWhenTheCallerForbidsIt) {
  MemoryBudget b(1000);
  FakeCache x(&b);
  ASSERT_TRUE(x.Add(900));
  EXPECT_FALSE(x.account->Charge(200, /*may_evict_self=*/false));
  EXPECT_EQ(x.evicted, 0);
  EXPECT_EQ(x.account->held(), 900u);
}

TEST(MemoryBudget, ClosingAnAccountReturnsItsBytes) {
  MemoryBudget b(1000);
  {
    FakeCache x(&b);
    ASSERT_TRUE(x.Add(700));
    EXPECT_EQ(b.held(), 700u);
  }
  EXPECT_EQ(b.held(), 0u);
  EXPECT_EQ(b.accounts(), 0u);
  EXPECT_EQ(b.peak_held(), 700u);
}

TEST(MemoryBudget, ManyGreedyCachesNeverHoldMoreThanTheBudget) {
  // Hostile consumers: each keeps charging as much as it is given, accounts come and go; after every step the
  // caches' real bytes (not the budget's counter alone) are within the budget.
  MemoryBudget b(64 << 10);
  std::vector<std::unique_ptr<FakeCache>> caches;
  size_t evictions = 0;
  for (int step = 0; step < 20000; ++step) {
    if (step % 997 == 0 && caches.size() < 12) caches.push_back(std::make_unique<FakeCache>(&b));
    if (step % 2503 == 0 && caches.size() > 3) caches.erase(caches.begin() + 1);
    FakeCache& c = *caches[static_cast<size_t>(step * 7) % caches.size()];
    c.Add(static_cast<size_t>(100 + (step * 131) % 3000));
    size_t real = 0;
    for (const auto& k : caches) real += k->bytes;
    ASSERT_LE(real, b.budget()) << "at step " << step;
    ASSERT_EQ(real, b.held()) << "at step " << step;
  }
  for (const auto& k : caches) evictions += static_cast<size_t>(k->evicted);
  EXPECT_GT(evictions, 0u);
}

}  // namespace
}  // namespace rvbpfd
