#include "trace/thread_ids.h"

#include <gtest/gtest.h>

namespace rvbpfd {
namespace {

constexpr uint32_t kPid = 500;

TraceEvent Ev(EventName name, uint64_t th, std::optional<uint32_t> tid) {
  TraceEvent e;
  e.event = name;
  e.th = th;
  e.native_tid = tid;
  return e;
}

uint32_t IdOf(ThreadIds& ids, EventName name, uint64_t th, std::optional<uint32_t> tid) {
  TraceEvent e = Ev(name, th, tid);
  ids.Assign(&e);
  EXPECT_TRUE(e.ruby_thread.has_value());
  return e.ruby_thread.value_or(0);
}

TEST(ThreadIds, MainIsOneOthersNumberedByFirstAppearance) {
  ThreadIds ids(kPid);
  EXPECT_EQ(IdOf(ids, EventName::kGvlAcquired, 0xa0, kPid), 1u);
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xb0, std::nullopt), 2u);
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xc0, std::nullopt), 3u);
  EXPECT_EQ(IdOf(ids, EventName::kGvlAcquired, 0xb0, 501), 2u);
  EXPECT_EQ(IdOf(ids, EventName::kWantsGvl, 0xa0, std::nullopt), 1u);
  EXPECT_EQ(IdOf(ids, EventName::kGvlReleased, 0xc0, 502), 3u);
}

TEST(ThreadIds, ReusedPointerAfterExitIsANewThread) {
  ThreadIds ids(kPid);
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xb0, std::nullopt), 2u);
  EXPECT_EQ(IdOf(ids, EventName::kThreadExited, 0xb0, 501), 2u);
  // The VM freed the thread and reused its rb_thread_t for the next one.
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xb0, std::nullopt), 3u);
  EXPECT_EQ(IdOf(ids, EventName::kGvlAcquired, 0xb0, 501), 3u);
  // Even without an EXITED (lost in a drop), a STARTED always opens a new number.
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xb0, std::nullopt), 4u);
}

TEST(ThreadIds, MainRecognisedLateTakesNumberOne) {
  ThreadIds ids(kPid);
  // Attach mode: main's first event is a READY fired by a waker, with its tid unknown.
  EXPECT_EQ(IdOf(ids, EventName::kWantsGvl, 0xa0, std::nullopt), 2u);
  EXPECT_EQ(IdOf(ids, EventName::kGvlAcquired, 0xa0, kPid), 1u);
  EXPECT_EQ(IdOf(ids, EventName::kGvlReleased, 0xa0, kPid), 1u);
  EXPECT_EQ(IdOf(ids, EventName::kGvlAcquired, 0xd0, 777), 3u);
}

TEST(ThreadIds, UnknownThOnTheInitialNativeThreadIsMain) {
  ThreadIds ids(kPid);
  TraceEvent boot = Ev(EventName::kGcEnter, 0, kPid);  // launch mode: GC during boot, before any RESUMED
  ids.Assign(&boot);
  EXPECT_EQ(boot.ruby_thread, std::optional<uint32_t>(1));
  TraceEvent other = Ev(EventName::kGvlReleased, 0, 777);
  ids.Assign(&other);
  EXPECT_FALSE(other.ruby_thread.has_value());
  TraceEvent no_tid = Ev(EventName::kWantsGvl, 0, std::nullopt);
  ids.Assign(&no_tid);
  EXPECT_FALSE(no_tid.ruby_thread.has_value());
}

}  // namespace
}  // namespace rvbpfd
