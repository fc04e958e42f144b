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
  // The next window starts from zero spent.
  EXPECT_EQ(b.Update(1100 * kMs, 9'000), Action::kNone);
  EXPECT_EQ(b.Update(1200 * kMs, 10'100), Action::kPause);
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
