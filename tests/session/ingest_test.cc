#include "session/ingest.h"

#include <gtest/gtest.h>

#include <vector>

#include "session/reorder.h"

namespace rvbpfd {
namespace {

TEST(GcEpoch, AdvancesAtGcEnterLossesAndWhileGcIsUnseen) {
  GcEpoch epoch;
  EXPECT_EQ(epoch.ForStack(false), 0u);
  epoch.OnRecord(RV_EV_THREAD_SUSPENDED);
  epoch.OnRecord(RV_EV_GC_EXIT);
  EXPECT_EQ(epoch.ForStack(false), 0u) << "only a GC_ENTER can have moved objects";
  epoch.OnRecord(RV_EV_GC_ENTER);
  EXPECT_EQ(epoch.ForStack(false), 1u);
  EXPECT_EQ(epoch.ForStack(false), 1u) << "stacks between GCs share the cache";
  epoch.OnLoss();
  EXPECT_EQ(epoch.value(), 2u);
  // GC sites detached: every stack is a new generation, and so is the reattach.
  EXPECT_EQ(epoch.ForStack(true), 3u);
  EXPECT_EQ(epoch.ForStack(true), 4u);
  epoch.OnGcSitesReattached();
  EXPECT_EQ(epoch.ForStack(false), 5u);
}

TEST(ExitedThreads, DropsSamplesOfAnExitedThreadUntilItIsSeenAgain) {
  ExitedThreads exited;
  EXPECT_TRUE(exited.Keep(0x10, /*sample=*/true, /*exited=*/false));
  EXPECT_TRUE(exited.Keep(0x10, false, /*exited=*/true));
  EXPECT_FALSE(exited.Keep(0x10, /*sample=*/true, false)) << "a stale current_th after the exit";
  EXPECT_TRUE(exited.Keep(0x20, true, false)) << "other threads are not affected";
  EXPECT_TRUE(exited.Keep(0, true, false)) << "a sample of no known thread is kept";
  EXPECT_EQ(exited.size(), 1u);
  EXPECT_TRUE(exited.Keep(0x10, false, false)) << "a scheduler event of the th: live again";
  EXPECT_TRUE(exited.Keep(0x10, true, false));
  EXPECT_EQ(exited.size(), 0u);
}

TEST(DrainRing, StopsAtAnEmptyRingAnErrorOrTheRoundLimit) {
  int calls = 0;
  DrainRing([&] { return ++calls < 3 ? 5 : 0; });
  EXPECT_EQ(calls, 3);
  calls = 0;
  DrainRing([&] {
    ++calls;
    return -1;
  });
  EXPECT_EQ(calls, 1);
  calls = 0;
  DrainRing([&] {
    ++calls;
    return 1;  // a flood: never empty
  });
  EXPECT_EQ(calls, 64);
}

struct Item {
  uint64_t t_ns = 0;
  int tag = 0;
};

TEST(Reorderer, PopThroughReleasesByTimeInclusiveAndStable) {
  Reorderer<Item> r(1'000);
  for (Item it : {Item{30, 1}, Item{10, 2}, Item{20, 3}, Item{20, 4}, Item{40, 5}}) r.Push(it);
  std::vector<int> tags;
  r.PopThrough(20, [&](Item&& it) { tags.push_back(it.tag); });
  EXPECT_EQ(tags, (std::vector<int>{2, 3, 4})) << "t <= 20, equal times in push order";
  EXPECT_EQ(r.held(), 2u);
  r.Push(Item{15, 6});  // older than what was released: still released, counted late
  EXPECT_EQ(r.late(), 1u);
  r.PopThrough(UINT64_MAX, [&](Item&& it) { tags.push_back(it.tag); });
  EXPECT_EQ(tags, (std::vector<int>{2, 3, 4, 6, 1, 5}));
  EXPECT_EQ(r.held(), 0u);
}

}  // namespace
}  // namespace rvbpfd
