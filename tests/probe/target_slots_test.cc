// TargetSlots: which pid_traps slot each recorded process counts its traps in, and the order freed slots come back. No
// root needed.
#include "probe/target_slots.h"

#include <gtest/gtest.h>

#include <set>

namespace rvbpfd {
namespace {

TEST(TargetSlotsTest, EachPidGetsItsOwnSlotAndKeepsIt) {
  TargetSlots slots(3);
  const std::optional<uint32_t> a = slots.Assign(100);
  const std::optional<uint32_t> b = slots.Assign(200);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(slots.Assign(100), a);  // added again: the same slot
  EXPECT_EQ(slots.assigned().size(), 2u);
  EXPECT_EQ(slots.assigned().at(200), *b);
}

TEST(TargetSlotsTest, AFullTableRefusesANewPidButNotOneItHolds) {
  TargetSlots slots(2);
  ASSERT_TRUE(slots.Assign(1).has_value());
  ASSERT_TRUE(slots.Assign(2).has_value());
  EXPECT_FALSE(slots.Assign(3).has_value());
  EXPECT_TRUE(slots.Assign(2).has_value());
  slots.Release(1);
  EXPECT_TRUE(slots.Assign(3).has_value());
  EXPECT_FALSE(slots.assigned().contains(1));
}

TEST(TargetSlotsTest, AFreedSlotIsReusedLast) {
  // A BPF program may still add a hit to the slot of a process that just left: the slot freed longest ago goes first,
  // so a just-freed one waits until every other free slot is taken.
  TargetSlots slots(3);
  const uint32_t first = *slots.Assign(1);
  slots.Release(1);
  std::set<uint32_t> taken;
  taken.insert(*slots.Assign(2));
  taken.insert(*slots.Assign(3));
  EXPECT_FALSE(taken.contains(first));
  EXPECT_EQ(*slots.Assign(4), first);
}

TEST(TargetSlotsTest, ReleaseIfFreesOnlyThePidsItNames) {
  TargetSlots slots(4);
  for (uint32_t pid : {10u, 11u, 12u, 13u}) ASSERT_TRUE(slots.Assign(pid).has_value());
  EXPECT_EQ(slots.ReleaseIf([](uint32_t pid) { return pid % 2 == 1; }), 2u);
  EXPECT_EQ(slots.assigned().size(), 2u);
  EXPECT_TRUE(slots.assigned().contains(10));
  EXPECT_TRUE(slots.assigned().contains(12));
  EXPECT_TRUE(slots.Assign(20).has_value());
  EXPECT_TRUE(slots.Assign(21).has_value());
  EXPECT_FALSE(slots.Assign(22).has_value());
}

TEST(TargetSlotsTest, ReleasingAPidWithoutASlotChangesNothing) {
  TargetSlots slots(1);
  slots.Release(5);
  ASSERT_TRUE(slots.Assign(6).has_value());
  slots.Release(5);
  EXPECT_FALSE(slots.Assign(7).has_value());
}

}  // namespace
}  // namespace rvbpfd
