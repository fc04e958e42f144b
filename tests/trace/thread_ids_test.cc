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

TEST(ThreadIds, AGvlReadingNamesOnlyThreadsAlreadySeen) {
  ThreadIds ids(kPid);
  EXPECT_EQ(IdOf(ids, EventName::kGvlAcquired, 0xa0, kPid), 1u);
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xb0, std::nullopt), 2u);
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xc0, std::nullopt), 3u);
  EXPECT_EQ(IdOf(ids, EventName::kThreadExited, 0xc0, 503), 3u);
  // The hog 0xd0 was never seen before its own sample: the sample numbers it, then its reading names it holder.
  rv_gvl_reading r{};
  r.holder = 0xd0;
  r.waiting = 4;
  r.nqueued = 4;
  r.queued[0] = 0xb0;
  r.queued[1] = 0xa0;
  r.queued[2] = 0xc0;  // exited: its pointer may be reused, never revived from a reading
  r.queued[3] = 0xe0;  // never seen: not invented
  TraceEvent sample = Ev(EventName::kSample, 0xd0, 504);
  sample.gvl = GvlReadingFromRecord(r);
  ids.Assign(&sample);
  EXPECT_EQ(sample.ruby_thread, std::optional<uint32_t>(4));
  ASSERT_NE(sample.gvl, nullptr);
  EXPECT_TRUE(sample.gvl->held);
  EXPECT_EQ(sample.gvl->holder, std::optional<uint32_t>(4));
  EXPECT_EQ(sample.gvl->queued, (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(sample.gvl->waiting, 4u) << "the count stays the VM's: unnamed threads still waited";
  EXPECT_EQ(IdOf(ids, EventName::kThreadStarted, 0xe0, std::nullopt), 5u) << "a reading numbers no thread";
}

TEST(GvlReadingFromRecord, TheCountIsAtLeastTheListAndEmptySlotsAreSkipped) {
  rv_gvl_reading r{};
  r.holder = 0;  // nobody holds it
  r.waiting = 1;  // read before two more threads were queued
  r.nqueued = 3;
  r.queued[0] = 0xb0;
  r.queued[1] = 0;
  r.queued[2] = 0xc0;
  std::shared_ptr<GvlReading> g = GvlReadingFromRecord(r);
  EXPECT_FALSE(g->held);
  EXPECT_EQ(g->queued_th, (std::vector<uint64_t>{0xb0, 0xc0}));
  EXPECT_EQ(g->waiting, 3u);
  r.nqueued = 1000;  // beyond the array: only RV_GVL_MAX_QUEUED entries exist
  EXPECT_EQ(GvlReadingFromRecord(r)->waiting, uint32_t{RV_GVL_MAX_QUEUED});
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

// Issue 46: the processes of a followed tree number their threads in one sequence, each with its own main thread; a
// forked child has its parent's rb_thread_t pointers (the same memory layout), which name its own threads.
TEST(ThreadIdsShared, ProcessesShareOneSequenceWithTheirOwnMains) {
  auto next = std::make_shared<uint32_t>(2);
  ThreadIds parent(kPid, ThreadIds::kMainThread, next);
  EXPECT_EQ(IdOf(parent, EventName::kGvlAcquired, 0xa0, kPid), 1u);
  EXPECT_EQ(IdOf(parent, EventName::kThreadStarted, 0xb0, std::nullopt), 2u);
  const uint32_t child_main = (*next)++;  // 3: given when the child appears
  ThreadIds child(kPid + 10, child_main, next);
  EXPECT_EQ(IdOf(child, EventName::kGvlAcquired, 0xa0, kPid + 10), 3u);  // the parent's main pointer: its own main
  EXPECT_EQ(IdOf(child, EventName::kThreadStarted, 0xb0, std::nullopt), 4u);
  EXPECT_EQ(IdOf(parent, EventName::kThreadStarted, 0xc0, std::nullopt), 5u);
  EXPECT_EQ(IdOf(parent, EventName::kGvlAcquired, 0xb0, kPid + 1), 2u);
  EXPECT_EQ(IdOf(child, EventName::kGvlAcquired, 0xb0, kPid + 11), 4u);
  EXPECT_EQ(parent.threads_seen(), 3u);
  EXPECT_EQ(child.threads_seen(), 2u);
}

}  // namespace
}  // namespace rvbpfd
