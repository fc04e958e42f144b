// The time bound for work on one target: results come back, stuck work is abandoned and counted, exceptions caught.
#include "common/deadline.h"

#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

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

TEST(RunWithDeadlineTest, ACancelFlagEndsTheWaitForStuckWork) {
  // The work sets the flag (as a SIGINT handler would while it is stuck) and then blocks until released: the wait
  // must end on the flag, long before the bound.
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> gate = release->get_future().share();
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  const int before = StuckDeadlineThreads().load();
  DeadlineResult<int> r = RunWithDeadline<int>(
      std::chrono::hours(1),
      [gate, cancel] {
        cancel->store(true);
        gate.wait();
        return 1;
      },
      cancel.get());
  EXPECT_EQ(r.status, DeadlineStatus::kCancelled);
  EXPECT_FALSE(r.value.has_value());
  EXPECT_EQ(StuckDeadlineThreads().load(), before + 1);
  release->set_value();
  for (int i = 0; i < 1000 && StuckDeadlineThreads().load() > before; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(StuckDeadlineThreads().load(), before);
}

TEST(RunWithDeadlineTest, ASetCancelFlagRunsNothing) {
  std::atomic<bool> cancel{true};
  auto ran = std::make_shared<std::atomic<bool>>(false);
  DeadlineResult<int> r = RunWithDeadline<int>(
      milliseconds(10'000),
      [ran] {
        ran->store(true);
        return 1;
      },
      &cancel);
  EXPECT_EQ(r.status, DeadlineStatus::kCancelled);
  EXPECT_FALSE(ran->load());
  // Unset, the same call runs the work.
  cancel.store(false);
  r = RunWithDeadline<int>(milliseconds(10'000), [] { return 7; }, &cancel);
  EXPECT_EQ(r.status, DeadlineStatus::kDone);
  EXPECT_EQ(r.value, 7);
}

TEST(RunBoundedTest, EachEndBecomesOneErrorNamingTheStep) {
  Result<int> ok = RunBounded<int>("step", milliseconds(10'000), nullptr, []() -> Result<int> { return 3; });
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);
  Result<int> failed = RunBounded<int>("step", milliseconds(10'000), nullptr,
                                       []() -> Result<int> { return Error(ErrorCode::kNotRuby, "no VM"); });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), ErrorCode::kNotRuby);
  std::atomic<bool> cancel{true};
  Result<int> cancelled = RunBounded<int>("reading pid 7", milliseconds(10'000), &cancel,
                                          []() -> Result<int> { return 1; });
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.error().code(), ErrorCode::kIo);
  EXPECT_EQ(cancelled.error().message(), "reading pid 7: stopped by a signal");
  Result<int> threw = RunBounded<int>("step", milliseconds(10'000), nullptr,
                                      []() -> Result<int> { throw std::runtime_error("bad"); });
  ASSERT_FALSE(threw.ok());
  EXPECT_EQ(threw.error().code(), ErrorCode::kInternal);
}

TEST(RunBoundedTest, StuckWorkIsATimeoutErrorNamingTheStep) {
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> gate = release->get_future().share();
  const int before = StuckDeadlineThreads().load();
  Result<int> r = RunBounded<int>("reading the files of pid 9", milliseconds(20), nullptr, [gate]() -> Result<int> {
    gate.wait();
    return 1;
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIo);
  EXPECT_NE(r.error().message().find("reading the files of pid 9 took more than 20 ms"), std::string::npos)
      << r.error().message();
  release->set_value();
  for (int i = 0; i < 1000 && StuckDeadlineThreads().load() > before; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(StuckDeadlineThreads().load(), before);
}

TEST(DeadlineWorkerTest, OneThreadRunsOneJobAfterAnother) {
  DeadlineWorker worker;
  std::vector<std::thread::id> ran_on;
  for (int i = 0; i < 3; ++i) {
    DeadlineResult<std::thread::id> r =
        worker.Run<std::thread::id>(milliseconds(10'000), [] { return std::this_thread::get_id(); });
    ASSERT_EQ(r.status, DeadlineStatus::kDone);
    ran_on.push_back(*r.value);
  }
  EXPECT_NE(ran_on[0], std::this_thread::get_id());
  EXPECT_EQ(ran_on[1], ran_on[0]);
  EXPECT_EQ(ran_on[2], ran_on[0]);
  // An exception ends the job, not the thread.
  DeadlineResult<int> threw = worker.Run<int>(milliseconds(10'000), []() -> int { throw std::runtime_error("x"); });
  EXPECT_EQ(threw.status, DeadlineStatus::kThrew);
  DeadlineResult<std::thread::id> after =
      worker.Run<std::thread::id>(milliseconds(10'000), [] { return std::this_thread::get_id(); });
  ASSERT_EQ(after.status, DeadlineStatus::kDone);
  EXPECT_EQ(*after.value, ran_on[0]);
}

TEST(DeadlineWorkerTest, AbandonedWorkTakesItsThreadAlongAndTheNextJobGetsANewOne) {
  DeadlineWorker worker;
  DeadlineResult<std::thread::id> first =
      worker.Run<std::thread::id>(milliseconds(10'000), [] { return std::this_thread::get_id(); });
  ASSERT_EQ(first.status, DeadlineStatus::kDone);
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> gate = release->get_future().share();
  const int before = StuckDeadlineThreads().load();
  DeadlineResult<int> stuck = worker.Run<int>(milliseconds(20), [gate] {
    gate.wait();
    return 1;
  });
  EXPECT_EQ(stuck.status, DeadlineStatus::kTimedOut);
  EXPECT_EQ(StuckDeadlineThreads().load(), before + 1);
  // The stuck thread is not waited for: the next job runs at once, elsewhere.
  DeadlineResult<std::thread::id> next =
      worker.Run<std::thread::id>(milliseconds(10'000), [] { return std::this_thread::get_id(); });
  ASSERT_EQ(next.status, DeadlineStatus::kDone);
  EXPECT_NE(*next.value, *first.value);
  release->set_value();
  for (int i = 0; i < 1000 && StuckDeadlineThreads().load() > before; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(StuckDeadlineThreads().load(), before);
}

}  // namespace
}  // namespace rvbpfd
