#include "model/attribution.h"

#include <gtest/gtest.h>

#include <numeric>

namespace rvbpfd {
namespace {

constexpr uint64_t kA = 11, kB = 12, kC = 13;  // thread keys

// Feeds events and samples through one SpanTracker into one Attribution, as the exporters do.
class Feed {
 public:
  Feed() : tracker_([this](const Span& s) { attribution_.OnSpan(s); }) {}

  void Ev(uint64_t t, EventName event, uint64_t thread = 0, uint32_t stack = 0, uint32_t vm = 0,
          ReleaseReason reason = ReleaseReason::kUnknown) {
    end_ = std::max(end_, t);
    attribution_.OnThreadEvent(t, thread, event == EventName::kThreadExited);
    tracker_.OnEvent(TrackerEvent{t, event, thread, vm, stack, reason});
  }
  void Sample(uint64_t t, uint64_t thread, uint32_t stack) {
    end_ = std::max(end_, t);
    attribution_.OnThreadEvent(t, thread, false);
    tracker_.OnSample(thread, stack, false);
    attribution_.OnSample(t, thread, stack, false);
  }
  AttributionResult Done(uint64_t end) {
    end_ = std::max(end_, end);
    tracker_.Finish(end_);
    return attribution_.Compute(end_);
  }

 private:
  Attribution attribution_;
  SpanTracker tracker_;
  uint64_t end_ = 0;
};

uint64_t Blame(const AttributionResult& r, uint64_t waiter, uint64_t holder, uint32_t stack, BlameSource source,
               bool gc = false) {
  auto it = r.blame_ns.find(BlameKey{waiter, holder, stack, gc, source});
  return it == r.blame_ns.end() ? 0 : it->second;
}

uint64_t BlameTotal(const AttributionResult& r) {
  uint64_t n = 0;
  for (const auto& [k, v] : r.blame_ns) n += v;
  return n;
}

uint64_t WallOf(const AttributionResult& r, uint64_t thread) {
  uint64_t n = 0;
  for (const auto& [k, v] : r.wall_ns) {
    if (k.thread == thread) n += v;
  }
  return n;
}

// A holds the GVL from 0; B wants it at 10 and gets it at 60 when A releases.
void HolderAndWaiter(Feed& run, uint32_t release_stack = 0) {
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(5, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(60, EventName::kGvlReleased, kA, release_stack);
  run.Ev(60, EventName::kGvlAcquired, kB);
}

TEST(Attribution, WaitIsBlamedOnTheHoldersSamplesInsideIt) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(5, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Sample(8, kA, 6);  // before the wait: not the holder's work during it
  run.Sample(20, kA, 7);
  run.Sample(40, kA, 8);
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(r.total_gvl_wait_ns, 50u);
  EXPECT_EQ(Blame(r, kB, kA, 7, BlameSource::kSampled), 25u);
  EXPECT_EQ(Blame(r, kB, kA, 8, BlameSource::kSampled), 25u);
  EXPECT_EQ(Blame(r, kB, kA, 6, BlameSource::kSampled), 0u);
  EXPECT_EQ(BlameTotal(r), 50u);
}

TEST(Attribution, WithoutSamplesTheHoldersReleaseStackIsBlamed) {
  Feed run;
  HolderAndWaiter(run, /*release_stack=*/9);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 9, BlameSource::kReleaseStack), 50u);
  EXPECT_EQ(BlameTotal(r), 50u);
}

TEST(Attribution, HolderKnownButNothingOfWhatItRan) {
  Feed run;
  HolderAndWaiter(run, /*release_stack=*/0);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 0, BlameSource::kNoStack), 50u);
}

TEST(Attribution, HolderChangeMidWaitSplitsTheBlame) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(2, EventName::kGvlReleased, kC);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(12, EventName::kWantsGvl, kC);
  run.Ev(50, EventName::kGvlReleased, kA, 4);
  run.Ev(50, EventName::kGvlAcquired, kC);
  run.Ev(80, EventName::kGvlReleased, kC, 5);
  run.Ev(80, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(90);
  EXPECT_EQ(Blame(r, kB, kA, 4, BlameSource::kReleaseStack), 40u);
  EXPECT_EQ(Blame(r, kB, kC, 5, BlameSource::kReleaseStack), 30u);
  // Overlapping waiters: C's own wait is blamed on A only.
  EXPECT_EQ(Blame(r, kC, kA, 4, BlameSource::kReleaseStack), 38u);
  EXPECT_EQ(r.total_gvl_wait_ns, 70u + 38u);
  EXPECT_EQ(BlameTotal(r), r.total_gvl_wait_ns);
}

TEST(Attribution, TimeNobodyHeldTheLockIsGvlFree) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(50, EventName::kGvlReleased, kA, 4);
  run.Ev(57, EventName::kGvlAcquired, kB);  // the scheduler took 7 ns to hand it over
  AttributionResult r = run.Done(60);
  EXPECT_EQ(Blame(r, kB, kA, 4, BlameSource::kReleaseStack), 40u);
  EXPECT_EQ(Blame(r, kB, 0, 0, BlameSource::kGvlFree), 7u);
}

TEST(Attribution, AHolderNotSeenAcquiringIsUnknownNotGuessed) {
  Feed run;
  // A held the GVL since before tracing began: no gvl_acquired of A was seen.
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(50, EventName::kGvlReleased, kA, 4);
  run.Ev(50, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(60);
  EXPECT_EQ(Blame(r, kB, 0, 0, BlameSource::kHolderUnknown), 40u);
  EXPECT_EQ(Blame(r, kB, kA, 4, BlameSource::kReleaseStack), 0u);
}

TEST(Attribution, GcOfTheHolderDuringAWaitIsBlamedAsGc) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Sample(15, kA, 7);
  run.Ev(20, EventName::kGcEnter, kA);
  run.Ev(40, EventName::kGcExit, kA);
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  uint64_t gc = 0;
  for (const auto& [k, v] : r.blame_ns) {
    if (k.gc) {
      EXPECT_EQ(k.holder, kA);
      gc += v;
    }
  }
  EXPECT_EQ(gc, 20u);
  EXPECT_EQ(Blame(r, kB, kA, 7, BlameSource::kSampled), 30u);
  EXPECT_EQ(BlameTotal(r), 50u);
}

TEST(Attribution, AWaitAcrossAPausedWindowIsNotCounted) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(20, EventName::kTracingPaused);
  run.Ev(40, EventName::kTracingResumed);
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(r.total_gvl_wait_ns, 0u);
  EXPECT_EQ(BlameTotal(r), 0u);
  // B's wait is not a fact: its wall time there is unknown, and the states still sum to its life.
  uint64_t unknown = 0;
  for (const auto& [k, v] : r.wall_ns) {
    if (k.thread == kB && k.state == WallState::kUnknown) unknown += v;
  }
  EXPECT_GE(unknown, 50u);
  EXPECT_EQ(WallOf(r, kB), r.lifetime_ns.at(kB));
}

TEST(Attribution, EachVmsWaitsAreBlamedOnlyOnThatVmsHolder) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA, 0, /*vm=*/0);
  run.Ev(0, EventName::kGvlAcquired, kC, 0, /*vm=*/1);
  run.Ev(1, EventName::kGvlReleased, kB, 0, 1);
  run.Ev(10, EventName::kWantsGvl, kB, 0, 1);
  run.Ev(30, EventName::kGvlReleased, kC, 5, 1);
  run.Ev(30, EventName::kGvlAcquired, kB, 0, 1);
  AttributionResult r = run.Done(40);
  EXPECT_EQ(Blame(r, kB, kC, 5, BlameSource::kReleaseStack), 20u);
  EXPECT_EQ(BlameTotal(r), 20u);
}

TEST(Attribution, MnThreadsAreRubyThreadsWhateverNativeThreadTheyShare) {
  // Under RUBY_MN_THREADS=1 the tracker's keys are Ruby threads: two of them sharing one native thread hand the GVL
  // over like any two threads.
  Feed run;
  HolderAndWaiter(run, 3);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 3, BlameSource::kReleaseStack), 50u);
}

TEST(Attribution, WallStatesSumToEachThreadsLifetime) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(0, EventName::kThreadStarted, kB);
  run.Ev(3, EventName::kWantsGvl, kB);
  run.Sample(5, kA, 7);
  run.Ev(10, EventName::kGcEnter, kA);
  run.Ev(14, EventName::kGcExit, kA);
  run.Ev(20, EventName::kGvlReleased, kA, 8, 0, ReleaseReason::kSleeping);
  run.Ev(20, EventName::kGvlAcquired, kB);
  run.Ev(30, EventName::kWantsGvl, kA);
  run.Ev(45, EventName::kThreadExited, kB);
  run.Ev(45, EventName::kGvlAcquired, kA);
  AttributionResult r = run.Done(50);
  EXPECT_EQ(r.lifetime_ns.at(kA), 50u);
  EXPECT_EQ(r.lifetime_ns.at(kB), 45u);
  EXPECT_EQ(WallOf(r, kA), 50u);
  EXPECT_EQ(WallOf(r, kB), 45u);
  auto at = [&](uint64_t th, WallState st, uint32_t stack, ReleaseReason reason = ReleaseReason::kUnknown) {
    auto it = r.wall_ns.find(WallKey{th, st, reason, stack});
    return it == r.wall_ns.end() ? 0 : it->second;
  };
  // 20 ns held, 4 of them in GC, at the sample inside; then 5 ns held until the end with no sample inside: the
  // hold's own stack, which is the latest sample's.
  EXPECT_EQ(at(kA, WallState::kRunning, 7), 16u + 5u);
  uint64_t gc = 0;
  for (const auto& [k, v] : r.wall_ns) {
    if (k.thread == kA && k.state == WallState::kGc) gc += v;
  }
  EXPECT_EQ(gc, 4u);
  EXPECT_EQ(at(kA, WallState::kBlocked, 8, ReleaseReason::kSleeping), 10u);
  EXPECT_EQ(at(kB, WallState::kGvlWait, 0) + at(kB, WallState::kGvlWait, 8), 17u);
}

}  // namespace
}  // namespace rvbpfd
