// The time bound for work on one target: results come back, stuck work is abandoned and counted, exceptions caught.
#include "common/deadline.h"

#include <future>
#include <stdexcept>

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

using std::chrono::milliseconds;

TEST(RunWithDeadlineTest, ReturnsTheValue) {
  DeadlineResult<int> r = RunWithDeadline<int>(milliseconds(10'000), [] { return 42; });
  ASSERT_EQ(r.status, DeadlineStatus::kDone);
  EXPECT_EQ(r.value, 42);
}

TEST(RunWithDeadlineTest, ExceptionIsCaughtOnItsThread) {
  DeadlineResult<int> r =
      RunWithDeadline<int>(milliseconds(10'000), []() -> int { throw std::runtime_error("bad name"); });
  EXPECT_EQ(r.status, DeadlineStatus::kThrew);
  EXPECT_EQ(r.what, "bad name");
}

TEST(RunWithDeadlineTest, StuckWorkIsAbandonedCountedAndBounded) {
  // Work that blocks until the test releases it (a read a FUSE server never answers).
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> gate = release->get_future().share();
  const int before = StuckDeadlineThreads().load();
  DeadlineResult<int> r = RunWithDeadline<int>(milliseconds(20), [gate] {
    gate.wait();
    return 1;
  });
  EXPECT_EQ(r.status, DeadlineStatus::kTimedOut);
  EXPECT_FALSE(r.value.has_value());
  EXPECT_EQ(StuckDeadlineThreads().load(), before + 1);
  // Fill the stuck slots: the next call is refused without starting anything.
  std::vector<DeadlineResult<int>> more;
  while (StuckDeadlineThreads().load() < kMaxStuck) {
    more.push_back(RunWithDeadline<int>(milliseconds(1), [gate] {
      gate.wait();
      return 1;
    }));
  }
  bool ran = false;
  DeadlineResult<int> refused = RunWithDeadline<int>(milliseconds(10'000), [&ran] {
    ran = true;
    return 1;
  });
  EXPECT_EQ(refused.status, DeadlineStatus::kTooManyStuck);
  EXPECT_FALSE(ran);
  // Once the stuck work ends, the count goes back down.
  release->set_value();
  for (int i = 0; i < 1000 && StuckDeadlineThreads().load() > before; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(StuckDeadlineThreads().load(), before);
}

}  // namespace
}  // namespace rvbpfd
