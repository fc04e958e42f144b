// The release-reason rule on hand-made stacks (leaf first), as docs/design.md "Release reasons" states it.
#include "record/release_reason.h"

#include <gtest/gtest.h>

#include <vector>

namespace rvbpfd {
namespace {

FrameInfo C(const char* label) { return FrameInfo{label, "<cfunc>", 0, FrameKind::kCfunc}; }
FrameInfo R(const char* label, const char* path = "/app/x.rb", int line = 3) {
  return FrameInfo{label, path, line, FrameKind::kRuby};
}
FrameInfo Internal(const char* label, const char* file) { return FrameInfo{label, file, 10, FrameKind::kRuby}; }

ReleaseReason Derive(const std::vector<FrameInfo>& frames, ReleaseSite site = ReleaseSite::kOther) {
  return DeriveReleaseReason(frames, site);
}

TEST(ReleaseReasonTest, BlockingLibraryCallOnTopDecides) {
  EXPECT_EQ(Derive({C("Kernel#sleep"), R("Object#sleeper"), R("block in <main>")}), ReleaseReason::kSleeping);
  EXPECT_EQ(Derive({C("IO#read"), R("Object#reader")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("IO#write"), C("Kernel#puts"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("IO.select"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({Internal("IO#readline", "<internal:io>"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("BasicSocket#recv"), R("<main>")}), ReleaseReason::kIo);
  EXPECT_EQ(Derive({C("Thread::Mutex#lock"), R("Object#m")}), ReleaseReason::kWaitingMutex);
  EXPECT_EQ(Derive({C("Thread::Mutex#synchronize"), R("Object#m")}), ReleaseReason::kWaitingMutex);
  EXPECT_EQ(Derive({Internal("Thread::Queue#pop", "<internal:thread_sync>"), R("Object#w")}), ReleaseReason::kQueue);
  EXPECT_EQ(Derive({C("Thread::Queue#pop"), R("Object#w")}), ReleaseReason::kQueue);
  EXPECT_EQ(Derive({C("Thread::SizedQueue#push"), R("Object#w")}), ReleaseReason::kQueue);
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), R("Object#w")}),
            ReleaseReason::kConditionVariable);
  EXPECT_EQ(Derive({C("Thread::ConditionVariable#wait"), R("Object#w")}), ReleaseReason::kConditionVariable);
  EXPECT_EQ(Derive({C("Thread#join"), R("<main>")}), ReleaseReason::kJoin);
  EXPECT_EQ(Derive({C("Thread#value"), C("Array#map"), R("<main>")}), ReleaseReason::kJoin);
  EXPECT_EQ(Derive({C("Process.wait"), R("<main>")}), ReleaseReason::kProcessWait);
  EXPECT_EQ(Derive({C("Process.waitpid2"), R("<main>")}), ReleaseReason::kProcessWait);
}

TEST(ReleaseReasonTest, OnlyFramesAboveTheProgramsCodeCount) {
  // A sleep further down, under program code, is not what the thread is blocked in now.
  EXPECT_EQ(Derive({C("Digest::SHA256#update"), R("Object#hash_it"), C("Kernel#sleep")}), ReleaseReason::kUnknown);
  // The innermost known call wins (Mutex#sleep inside ConditionVariable#wait inside Mutex#synchronize).
  EXPECT_EQ(Derive({C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), C("Thread::Mutex#synchronize")}),
            ReleaseReason::kConditionVariable);
  // A label that merely contains a known name is not it.
  EXPECT_EQ(Derive({C("MyIO#read"), R("<main>")}), ReleaseReason::kUnknown);
  EXPECT_EQ(Derive({R("Kernel#sleep", "/app/shadow.rb")}), ReleaseReason::kUnknown);
  EXPECT_EQ(Derive({}), ReleaseReason::kUnknown);
}

TEST(ReleaseReasonTest, SitesDecideYieldAndExit) {
  EXPECT_EQ(Derive({C("Thread.pass"), R("<main>")}, ReleaseSite::kYield), ReleaseReason::kPass);
  EXPECT_EQ(Derive({R("Object#spin"), R("<main>")}, ReleaseSite::kYield), ReleaseReason::kTimeslice);
  EXPECT_EQ(Derive({}, ReleaseSite::kYield), ReleaseReason::kTimeslice);
  EXPECT_EQ(Derive({C("Kernel#sleep")}, ReleaseSite::kThreadEnd), ReleaseReason::kExit);
  EXPECT_EQ(Derive({}, ReleaseSite::kThreadEnd), ReleaseReason::kExit);
  // A pass frame outside the yield site is a plain (unknown) release.
  EXPECT_EQ(Derive({R("Object#spin")}, ReleaseSite::kOther), ReleaseReason::kUnknown);
}

TEST(ReleaseReasonTest, SiteClassificationAndNames) {
  EXPECT_EQ(ClassifyReleaseSite("rb_thread_schedule_limits"), ReleaseSite::kYield);
  EXPECT_EQ(ClassifyReleaseSite("thread_start_func_2"), ReleaseSite::kThreadEnd);
  EXPECT_EQ(ClassifyReleaseSite("rb_nogvl"), ReleaseSite::kOther);
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kConditionVariable), "condition_variable");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kProcessWait), "process_wait");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kTimeslice), "timeslice");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kUnknown), "unknown");
}

}  // namespace
}  // namespace rvbpfd
