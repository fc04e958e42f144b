#include "record/overhead_budget.h"

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

constexpr uint64_t kMs = 1'000'000;
using Action = OverheadBudget::Action;

TEST(OverheadBudget, PausesOnceTheWindowAllowanceIsSpentAndResumesAtTheNextWindow) {
  // 5% of a 1 s window = 50 ms of traps; at 10 us per hit that is 5,000 hits.
  OverheadBudget b(5.0, 10.0);
  EXPECT_EQ(b.Update(0, 0), Action::kNone);
  EXPECT_EQ(b.Update(100 * kMs, 4'999), Action::kNone);
  EXPECT_EQ(b.Update(105 * kMs, 5'000), Action::kPause);
  EXPECT_TRUE(b.paused());
  EXPECT_EQ(b.Update(500 * kMs, 5'100), Action::kNone);  // stays paused: no double pause
  EXPECT_EQ(b.Update(1000 * kMs, 5'100), Action::kResume);
  EXPECT_FALSE(b.paused());
  EXPECT_NEAR(b.last_window_pct(), 5'100 * 10e-6 / 1.0 * 100, 1e-9);
  // The next window starts from zero spent, and is twice as long (2 s: allowance 100 ms = 10,000 hits).
  EXPECT_EQ(b.window_ns(), 2000 * kMs);
  EXPECT_EQ(b.Update(1100 * kMs, 9'000), Action::kNone);
  EXPECT_EQ(b.Update(1200 * kMs, 15'099), Action::kNone);
  EXPECT_EQ(b.Update(1300 * kMs, 15'100), Action::kPause);
  EXPECT_EQ(b.Update(2999 * kMs, 15'100), Action::kNone) << "paused until the 2 s window ends";
  EXPECT_EQ(b.Update(3000 * kMs, 15'100), Action::kResume);
  EXPECT_EQ(b.window_ns(), 4000 * kMs);
}

TEST(OverheadBudget, BusyWindowsBackOffUpToEightTimesAndACalmWindowResets) {
  OverheadBudget b(5.0, 10.0);
  uint64_t t = 0, hits = 0;
  b.Update(t, hits);
  for (int i = 0; i < 6; ++i) {  // every window: allowance spent at once, then paused to its end
    hits += 1'000'000;
    EXPECT_EQ(b.Update(t + kMs, hits), Action::kPause);
    t += b.window_ns();
    EXPECT_EQ(b.Update(t, hits), Action::kResume);
  }
  EXPECT_EQ(b.window_ns(), 8000 * kMs);
  t += b.window_ns();  // a window with no probe hits ends without a pause
  EXPECT_EQ(b.Update(t, hits), Action::kNone);
  EXPECT_EQ(b.window_ns(), 1000 * kMs);
}

TEST(OverheadBudget, ZeroBudgetOnlyEstimates) {
  OverheadBudget b(0, 13.0);
  EXPECT_EQ(b.Update(0, 0), Action::kNone);
  EXPECT_EQ(b.Update(900 * kMs, 1'000'000), Action::kNone);
  EXPECT_FALSE(b.paused());
  EXPECT_NEAR(b.current_pct(1000 * kMs, 1'000'000), 1'000'000 * 13e-6 * 100, 1e-6);
  EXPECT_EQ(b.Update(1000 * kMs, 1'000'000), Action::kNone);
  EXPECT_NEAR(b.last_window_pct(), 1300.0, 1e-6);
}

TEST(OverheadBudget, QuietProgramNeverPauses) {
  OverheadBudget b(5.0, 10.0);
  uint64_t hits = 0;
  for (uint64_t t = 0; t < 10'000 * kMs; t += 5 * kMs) {
    hits += 20;  // 4,000 hits/s = 4% of wall time
    EXPECT_EQ(b.Update(t, hits), Action::kNone) << t;
  }
}

}  // namespace
}  // namespace rvbpfd
