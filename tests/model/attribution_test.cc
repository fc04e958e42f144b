#include "model/attribution.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <numeric>
#include <random>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace rvbpfd {
namespace {

constexpr uint64_t kA = 11, kB = 12, kC = 13;  // thread keys

// Feeds events and samples through one SpanTracker into one Attribution, as the exporters do.
class Feed {
 public:
  explicit Feed(AttributionOptions options = {})
      : attribution_(options), tracker_([this](const Span& s) { attribution_.OnSpan(s); }) {}

  void Ev(uint64_t t, EventName event, uint64_t thread = 0, uint32_t stack = 0, uint32_t vm = 0,
          ReleaseReason reason = ReleaseReason::kUnknown) {
    end_ = std::max(end_, t);
    attribution_.OnThreadEvent(t, thread, event);
    if (event == EventName::kTracingPaused) attribution_.OnPause(t);
    if (event == EventName::kTracingResumed) attribution_.OnResume(t);
    tracker_.OnEvent(TrackerEvent{t, event, thread, vm, stack, reason, reason != ReleaseReason::kUnknown});
  }
  void Sample(uint64_t t, uint64_t thread, uint32_t stack) {
    end_ = std::max(end_, t);
    attribution_.OnThreadEvent(t, thread, EventName::kSample);
    tracker_.OnSample(thread, stack, false);
    attribution_.OnSample(t, thread, stack, false);
  }
  // A READY at t found `holder` running `stack` (fed after the READY's own event, as the exporters do).
  void Contention(uint64_t t, uint64_t holder, uint32_t stack) { attribution_.OnContention(t, holder, stack); }
  // A sample of `thread` on `stack` that read the GVL: held by `holder` (0 with held: a thread the trace does not
  // name), `queued` named in the queue, `waiting` queued in all (default: the named ones).
  void Reading(uint64_t t, uint64_t thread, uint32_t stack, uint64_t holder, std::vector<uint64_t> queued,
               std::optional<uint32_t> waiting = std::nullopt, bool in_gc = false, bool held = true) {
    Sample(t, thread, stack);
    GvlSample g{.t_ns = t, .sampled = thread, .stack = stack, .in_gc = in_gc, .held = held, .holder = holder};
    g.waiting = waiting.value_or(static_cast<uint32_t>(queued.size()));
    g.queued = std::move(queued);
    attribution_.OnGvlReading(std::move(g));
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

// Options of an attribution that estimates paused windows, at a sample period of 10 ns.
AttributionOptions Estimating() { return AttributionOptions{.estimate_paused = true, .sample_period_ns = 10}; }

// Blame estimated from GVL readings (provenance inferred).
uint64_t Estimated(const AttributionResult& r, uint64_t waiter, uint64_t holder, uint32_t stack, BlameSource source,
                   bool gc = false) {
  auto it = r.blame_ns.find(BlameKey{waiter, holder, stack, gc, source, Provenance::kInferred});
  return it == r.blame_ns.end() ? 0 : it->second;
}

uint64_t InferredTotal(const AttributionResult& r) {
  uint64_t n = 0;
  for (const auto& [k, v] : r.blame_ns) n += k.provenance == Provenance::kInferred ? v : 0;
  return n;
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

// A holds from 0; B's READY at 10 finds A running stack 20; A is sampled at 30 on 7 and releases at 60 with 9: the
// observation stands for [10, 30), the sample for [30, 60), the release stack for nothing.
TEST(Attribution, AContentionObservationStandsForTheTimeUpToTheHoldersNextSample) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(5, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Contention(10, kA, 20);
  run.Sample(30, kA, 7);
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 20, BlameSource::kContention), 20u);
  EXPECT_EQ(Blame(r, kB, kA, 7, BlameSource::kSampled), 30u);
  EXPECT_EQ(Blame(r, kB, kA, 9, BlameSource::kReleaseStack), 0u);
  EXPECT_EQ(BlameTotal(r), 50u);
  EXPECT_EQ(BlameSourceName(BlameSource::kContention), "contention");
}

// Without a sample after it, the observation stands for the whole rest of the hold: where the holder released the
// lock (after its work) is not what it ran while others waited.
TEST(Attribution, WithAContentionObservationTheReleaseStackCoversNothingAfterIt) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(5, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Contention(10, kA, 20);
  run.Sample(8, kA, 6);  // before the wait: nothing of it
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 20, BlameSource::kContention), 50u);
  EXPECT_EQ(BlameTotal(r), 50u);
}

// Another waiter's READY during the same hold is an observation of the same holder: each stands for its stretch,
// and a sample between them for the rest of the first stretch.
TEST(Attribution, EveryWaitersObservationOfTheHolderCounts) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(2, EventName::kGvlReleased, kC);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Contention(10, kA, 20);
  run.Sample(20, kA, 7);
  run.Ev(30, EventName::kWantsGvl, kC);
  run.Contention(30, kA, 21);
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  run.Ev(70, EventName::kGvlReleased, kB, 5);
  run.Ev(70, EventName::kGvlAcquired, kC);
  AttributionResult r = run.Done(80);
  EXPECT_EQ(Blame(r, kB, kA, 20, BlameSource::kContention), 10u);
  EXPECT_EQ(Blame(r, kB, kA, 7, BlameSource::kSampled), 10u);
  EXPECT_EQ(Blame(r, kB, kA, 21, BlameSource::kContention), 30u);
  EXPECT_EQ(Blame(r, kC, kA, 21, BlameSource::kContention), 30u);
  EXPECT_EQ(Blame(r, kC, kB, 5, BlameSource::kReleaseStack), 10u);  // B's hold was not observed: as before
  EXPECT_EQ(BlameTotal(r), 50u + 40u);
}

// An observation names one thread: it is never read for another holder's span (a READY can find a thread that was
// handed the GVL but has not resumed yet).
TEST(Attribution, AnObservationOfAnotherThreadIsNotUsed) {
  Feed run;
  HolderAndWaiter(run, /*release_stack=*/9);
  run.Contention(10, kC, 20);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 9, BlameSource::kReleaseStack), 50u);
  EXPECT_EQ(BlameTotal(r), 50u);
}

// A wait that began before its first observation (queued before the holder took the lock; C's READY at 40 observes
// A): the time before it goes to A's samples there, else to that observation, never to the release after it.
TEST(Attribution, BeforeTheFirstObservationTheSamplesThereElseThatObservation) {
  auto feed = [](Feed& run, bool sampled) {
    run.Ev(0, EventName::kGvlAcquired, kA);
    run.Ev(1, EventName::kGvlReleased, kB);
    run.Ev(2, EventName::kGvlReleased, kC);
    run.Ev(10, EventName::kWantsGvl, kB);
    if (sampled) run.Sample(20, kA, 7);
    run.Ev(40, EventName::kWantsGvl, kC);
    run.Contention(40, kA, 20);
    run.Ev(60, EventName::kGvlReleased, kA, 9);
    run.Ev(60, EventName::kGvlAcquired, kB);
  };
  Feed unsampled;
  feed(unsampled, false);
  AttributionResult u = unsampled.Done(70);
  EXPECT_EQ(Blame(u, kB, kA, 20, BlameSource::kContention), 50u);
  EXPECT_EQ(Blame(u, kB, kA, 9, BlameSource::kReleaseStack), 0u);
  Feed sampled;
  feed(sampled, true);
  AttributionResult s = sampled.Done(70);
  EXPECT_EQ(Blame(s, kB, kA, 7, BlameSource::kSampled), 30u);
  EXPECT_EQ(Blame(s, kB, kA, 20, BlameSource::kContention), 20u);
}

// A GC the holder ran inside an observed stretch is the GC's, as everywhere.
TEST(Attribution, AGcInsideAnObservedStretchIsBlamedAsGc) {
  Feed run;
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(5, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Contention(10, kA, 20);
  run.Ev(20, EventName::kGcEnter, kA);
  run.Ev(35, EventName::kGcExit, kA);
  run.Ev(60, EventName::kGvlReleased, kA, 9);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 20, BlameSource::kContention), 35u);
  uint64_t gc = 0;
  for (const auto& [k, v] : r.blame_ns) gc += k.gc ? v : 0;
  EXPECT_EQ(gc, 15u);
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

TEST(Attribution, AReleaseWithoutAStackIsNotCalledTheReleaseStack) {
  // A's release carried no stack: its hold ends on its latest sample's stack (before the wait), which is what the
  // blame says, and the segment names no release stack.
  Feed run(AttributionOptions{.per_wait = true});
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Sample(5, kA, 6);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(60, EventName::kGvlReleased, kA, 0);
  run.Ev(60, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(70);
  EXPECT_EQ(Blame(r, kB, kA, 6, BlameSource::kLastSample), 50u);
  EXPECT_EQ(Blame(r, kB, kA, 6, BlameSource::kReleaseStack), 0u);
  ASSERT_EQ(r.wait_segments.size(), 1u);
  EXPECT_EQ(r.wait_segments[0].release_ns, 60u);
  EXPECT_EQ(r.wait_segments[0].release_stack, 0u);
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

// Agent-style: the tracker is cut at each interval's end and the attribution drained into that interval's result.
class Intervals {
 public:
  Intervals() : attribution_(AttributionOptions{.blame_cut_waits = true, .wall = false}),
                tracker_([this](const Span& s) { attribution_.OnSpan(s); }) {}

  void Ev(uint64_t t, EventName event, uint64_t thread = 0, uint32_t stack = 0) {
    now_ = t;
    tracker_.OnEvent(TrackerEvent{t, event, thread, 0, stack, ReleaseReason::kUnknown});
  }
  void Sample(uint64_t t, uint64_t thread, uint32_t stack) {
    now_ = t;
    tracker_.OnSample(thread, stack, false);
    attribution_.OnSample(t, thread, stack, false);
  }
  void Contention(uint64_t t, uint64_t holder, uint32_t stack) { attribution_.OnContention(t, holder, stack); }
  // Blames what the interval holds without ending it (as the agent does when its kept spans pile up).
  void Drain() { attribution_.DrainBlame(tracker_.oldest_open_wait_ns(now_), &current_); }
  // Ends the interval at t.
  void Cut(uint64_t t) {
    now_ = t;
    tracker_.Cut(t);
    Drain();
    done.push_back(std::move(current_));
    current_ = AttributionResult{};
  }
  size_t kept() const { return attribution_.kept(); }

  std::vector<AttributionResult> done;

 private:
  Attribution attribution_;
  SpanTracker tracker_;
  AttributionResult current_;
  uint64_t now_ = 0;
};

// ns blamed on (waiter, holder), any stack.
uint64_t Between(const AttributionResult& r, uint64_t waiter, uint64_t holder) {
  uint64_t n = 0;
  for (const auto& [k, v] : r.blame_ns) {
    if (k.waiter == waiter && k.holder == holder) n += v;
  }
  return n;
}

TEST(Attribution, PerWaitSegmentsSayWhoHeldTheLockAndWhatTheyRan) {
  Feed run(AttributionOptions{.per_wait = true});
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(2, EventName::kGvlReleased, kC);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Sample(20, kA, 7);
  run.Sample(30, kA, 7);
  run.Sample(35, kA, 8);
  run.Ev(50, EventName::kGvlReleased, kA, 4);
  run.Ev(53, EventName::kGvlAcquired, kC);  // 3 ns nobody held it
  run.Ev(80, EventName::kGvlReleased, kC, 5);
  run.Ev(80, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(90);
  ASSERT_EQ(r.wait_blame.size(), 1u);
  const WaitBlame& w = r.wait_blame[0];
  EXPECT_EQ(w.waiter, kB);
  EXPECT_EQ(w.start_ns, 10u);
  EXPECT_EQ(w.end_ns, 80u);
  ASSERT_EQ(w.segments, 3u);
  const BlameSegment* seg = &r.wait_segments[w.first_segment];
  // A over [10, 50): its three samples, two of one stack (merged, 2 samples); its hold ended by a release at 50.
  EXPECT_EQ(seg[0].holder, kA);
  EXPECT_EQ(seg[0].from_ns, 10u);
  EXPECT_EQ(seg[0].to_ns, 50u);
  EXPECT_EQ(seg[0].release_stack, 4u);
  EXPECT_EQ(seg[0].release_ns, 50u);
  ASSERT_EQ(seg[0].parts, 2u);
  const BlamePart& p7 = r.wait_parts[seg[0].first_part];
  EXPECT_EQ(p7.stack, 7u);
  EXPECT_EQ(p7.source, BlameSource::kSampled);
  EXPECT_EQ(p7.samples, 2u);
  EXPECT_EQ(p7.ns, Blame(r, kB, kA, 7, BlameSource::kSampled));
  EXPECT_EQ(r.wait_parts[seg[0].first_part + 1].stack, 8u);
  EXPECT_EQ(p7.ns + r.wait_parts[seg[0].first_part + 1].ns, 40u);
  // Nobody over [50, 53).
  EXPECT_EQ(seg[1].holder, 0u);
  ASSERT_EQ(seg[1].parts, 1u);
  EXPECT_EQ(r.wait_parts[seg[1].first_part].source, BlameSource::kGvlFree);
  EXPECT_EQ(r.wait_parts[seg[1].first_part].ns, 3u);
  // C over [53, 80): no sample, its release stack.
  EXPECT_EQ(seg[2].holder, kC);
  EXPECT_EQ(seg[2].release_stack, 5u);
  ASSERT_EQ(seg[2].parts, 1u);
  EXPECT_EQ(r.wait_parts[seg[2].first_part].source, BlameSource::kReleaseStack);
  EXPECT_EQ(r.wait_parts[seg[2].first_part].ns, 27u);
  // Every wait's parts sum to its duration; all waits' to the total.
  uint64_t parts = 0;
  for (const BlamePart& p : r.wait_parts) parts += p.ns;
  EXPECT_EQ(parts, r.total_gvl_wait_ns);
  EXPECT_EQ(parts, BlameTotal(r));
}

TEST(Attribution, CutAcrossAnOpenWaitBlamesEachIntervalItsPartAndThePartsSumToTheWhole) {
  auto feed = [](auto& run, auto cut) {
    run.Ev(0, EventName::kGvlAcquired, kA);
    run.Ev(5, EventName::kGvlReleased, kB);
    run.Ev(10, EventName::kWantsGvl, kB);
    run.Sample(20, kA, 7);
    cut(30);
    cut(50);
    run.Sample(55, kA, 8);
    run.Ev(60, EventName::kGvlReleased, kA, 9);
    run.Ev(60, EventName::kGvlAcquired, kB);
  };
  Intervals cut;
  feed(cut, [&](uint64_t t) { cut.Cut(t); });
  cut.Cut(70);
  ASSERT_EQ(cut.done.size(), 3u);
  // [10, 30): A's sample at 20; [30, 50): no sample, A's hold so far (cut: its latest sample's stack); [50, 60):
  // the sample at 55.
  EXPECT_EQ(cut.done[0].total_gvl_wait_ns, 20u);
  EXPECT_EQ(Blame(cut.done[0], kB, kA, 7, BlameSource::kSampled), 20u);
  EXPECT_EQ(cut.done[1].total_gvl_wait_ns, 20u);
  EXPECT_EQ(Blame(cut.done[1], kB, kA, 7, BlameSource::kLastSample), 20u);
  EXPECT_EQ(cut.done[2].total_gvl_wait_ns, 10u);
  EXPECT_EQ(Blame(cut.done[2], kB, kA, 8, BlameSource::kSampled), 10u);
  // Without the holder's part cut with the wait's, the middle interval would have no holder span: holder_unknown.
  for (const AttributionResult& r : cut.done) {
    EXPECT_EQ(Blame(r, kB, 0, 0, BlameSource::kHolderUnknown), 0u);
    EXPECT_EQ(BlameTotal(r), r.total_gvl_wait_ns);
  }
  Feed whole;
  feed(whole, [](uint64_t) {});
  const AttributionResult r = whole.Done(70);
  EXPECT_EQ(r.total_gvl_wait_ns, 50u);
  EXPECT_EQ(Between(cut.done[0], kB, kA) + Between(cut.done[1], kB, kA) + Between(cut.done[2], kB, kA),
            Between(r, kB, kA));
}

TEST(Attribution, HolderChangeMidWaitAcrossCutsKeepsEachHoldersShare) {
  // A holds until 40, C (waiting since 12) until 80, then B (waiting since 10); cuts at 30 and 60.
  auto feed = [](auto& run, auto cut) {
    run.Ev(0, EventName::kGvlAcquired, kA);
    run.Ev(1, EventName::kGvlReleased, kB);
    run.Ev(2, EventName::kGvlReleased, kC);
    run.Ev(10, EventName::kWantsGvl, kB);
    run.Ev(12, EventName::kWantsGvl, kC);
    cut(30);
    run.Ev(40, EventName::kGvlReleased, kA, 4);
    run.Ev(40, EventName::kGvlAcquired, kC);
    cut(60);
    run.Ev(80, EventName::kGvlReleased, kC, 5);
    run.Ev(80, EventName::kGvlAcquired, kB);
  };
  Intervals cut;
  feed(cut, [&](uint64_t t) { cut.Cut(t); });
  cut.Cut(90);
  Feed whole;
  feed(whole, [](uint64_t) {});
  const AttributionResult r = whole.Done(90);
  ASSERT_EQ(cut.done.size(), 3u);
  EXPECT_EQ(Between(cut.done[0], kB, kA), 20u);
  EXPECT_EQ(Between(cut.done[0], kC, kA), 18u);
  EXPECT_EQ(Between(cut.done[1], kB, kA), 10u);
  EXPECT_EQ(Between(cut.done[1], kB, kC), 20u);
  EXPECT_EQ(Between(cut.done[1], kC, kA), 10u);
  EXPECT_EQ(Between(cut.done[2], kB, kC), 20u);
  for (auto [waiter, holder] : {std::pair{kB, kA}, std::pair{kB, kC}, std::pair{kC, kA}}) {
    uint64_t sum = 0;
    for (const AttributionResult& part : cut.done) sum += Between(part, waiter, holder);
    EXPECT_EQ(sum, Between(r, waiter, holder)) << waiter << " waiting on " << holder;
  }
  uint64_t total = 0;
  for (const AttributionResult& part : cut.done) total += part.total_gvl_wait_ns;
  EXPECT_EQ(total, r.total_gvl_wait_ns);
}

TEST(Attribution, DrainingKeepsOnlyWhatOpenWaitsNeedAndBlamesAsIfWhole) {
  // A and C hand the GVL to each other every 10 ns, each waiting for the other; from 505 B waits to the end.
  // Draining after each hand-off forgets what closed waits needed, keeps what B's open wait needs, and blames
  // exactly as one attribution of the whole.
  auto feed = [](auto& run, auto drain) {
    run.Ev(0, EventName::kGvlAcquired, kA);
    run.Ev(1, EventName::kGvlReleased, kB);
    run.Ev(2, EventName::kGvlReleased, kC);
    run.Ev(5, EventName::kWantsGvl, kC);
    for (uint64_t t = 10; t < 1010; t += 10) {
      const bool a_holds = (t / 10) % 2 == 1;
      const uint64_t holder = a_holds ? kA : kC, next = a_holds ? kC : kA;
      run.Sample(t + 5, holder, a_holds ? 7 : 8);
      if (t == 500) run.Ev(505, EventName::kWantsGvl, kB);
      run.Ev(t + 10, EventName::kGvlReleased, holder, 3);
      run.Ev(t + 10, EventName::kWantsGvl, holder);
      run.Ev(t + 10, EventName::kGvlAcquired, next);
      drain(t);
    }
    run.Ev(1020, EventName::kGvlReleased, kA, 3);
    run.Ev(1020, EventName::kGvlAcquired, kB);
  };
  Intervals drained;
  size_t kept_before_b = 0, kept_at_end = 0;
  feed(drained, [&](uint64_t t) {
    drained.Drain();
    if (t < 500) kept_before_b = std::max(kept_before_b, drained.kept());
    kept_at_end = drained.kept();
  });
  drained.Cut(1030);
  Feed whole(AttributionOptions{.blame_cut_waits = true});  // C's wait open at the end is blamed in both
  feed(whole, [](uint64_t) {});
  const AttributionResult r = whole.Done(1030);
  ASSERT_EQ(drained.done.size(), 1u);
  const AttributionResult& d = drained.done[0];
  EXPECT_EQ(d.total_gvl_wait_ns, r.total_gvl_wait_ns);
  EXPECT_EQ(d.waits, r.waits);
  EXPECT_EQ(d.blame_ns, r.blame_ns);
  EXPECT_EQ(Between(d, kB, kA) + Between(d, kB, kC), 1020u - 505u);
  // Only the open wait's needs are kept: a few spans while every wait is short, B's ~50 hand-offs later.
  EXPECT_LE(kept_before_b, 8u);
  EXPECT_GT(kept_at_end, 100u);
}

// The agent's drains keep the observations open waits need: drained, the blame is the whole trace's.
TEST(Attribution, DrainingKeepsTheContentionObservationsOpenWaitsNeed) {
  auto feed = [](auto& run, auto drain) {
    run.Ev(0, EventName::kGvlAcquired, kA);
    run.Ev(1, EventName::kGvlReleased, kB);
    run.Ev(2, EventName::kGvlReleased, kC);
    for (uint64_t t = 10; t < 410; t += 40) {
      // A holds; B waits from t observing A on 20 + t/40; A is sampled once in every second hold; then B holds and
      // A waits, observing B.
      run.Ev(t, EventName::kWantsGvl, kB);
      run.Contention(t, kA, static_cast<uint32_t>(20 + t / 40));
      drain();
      if ((t / 40) % 2 == 0) run.Sample(t + 10, kA, 7);
      run.Ev(t + 20, EventName::kGvlReleased, kA, 9);
      run.Ev(t + 20, EventName::kGvlAcquired, kB);
      run.Ev(t + 25, EventName::kWantsGvl, kA);
      run.Contention(t + 25, kB, 8);
      drain();
      run.Ev(t + 40, EventName::kGvlReleased, kB, 9);
      run.Ev(t + 40, EventName::kGvlAcquired, kA);
    }
  };
  Intervals drained;
  feed(drained, [&] { drained.Drain(); });
  drained.Cut(420);
  Feed whole(AttributionOptions{.blame_cut_waits = true});
  feed(whole, [] {});
  const AttributionResult r = whole.Done(420);
  ASSERT_EQ(drained.done.size(), 1u);
  EXPECT_EQ(drained.done[0].blame_ns, r.blame_ns);
  EXPECT_EQ(Blame(r, kB, kA, 20, BlameSource::kContention), 10u);  // sampled at 20: the sample has [20, 30)
  EXPECT_EQ(Blame(r, kB, kA, 21, BlameSource::kContention), 20u);
  EXPECT_EQ(Blame(r, kB, kA, 9, BlameSource::kReleaseStack), 0u);
  EXPECT_EQ(drained.kept(), 0u);
}

TEST(Attribution, DrainingReusesALiveThreadsMemoryAndGivesBackAnIdleThreadsAndABursts) {
  Attribution a(AttributionOptions{.blame_cut_waits = true, .wall = false});
  AttributionResult r;
  uint64_t t = 0;
  // n holds of `thread`, each with its holder span, all ended before the next drain's keep_from.
  auto holds = [&](uint64_t thread, int n) {
    for (int i = 0; i < n; ++i, t += 10) {
      a.OnSpan(Span{.kind = SpanKind::kGvlHold, .end = SpanEnd::kReleased, .thread = thread, .start_ns = t,
                    .end_ns = t + 5, .stack = 1});
      a.OnSpan(Span{.kind = SpanKind::kHolder, .end = SpanEnd::kReleased, .thread = thread, .start_ns = t,
                    .end_ns = t + 5});
    }
  };
  const size_t empty = a.approx_memory_bytes();
  // Threads 1 and 2 hold 100 times each between drains: their emptied vectors keep their memory for the next period
  // instead of growing again from nothing.
  holds(1, 100);
  holds(2, 100);
  a.DrainBlame(t, &r);
  EXPECT_EQ(a.kept(), 0u);
  const size_t live = a.approx_memory_bytes();
  EXPECT_GT(live, empty + 400 * sizeof(uint64_t) * 2);  // at least the 200 holds and 200 holder spans' worth
  // Thread 2 stays idle for a whole period: its vector goes; thread 1's is reused.
  holds(1, 100);
  a.DrainBlame(t, &r);
  const size_t one_live = a.approx_memory_bytes();
  EXPECT_LT(one_live, live);
  EXPECT_GT(one_live, empty);
  // A burst of thread 1, then an ordinary period: the burst's memory is given back.
  holds(1, 20000);
  a.DrainBlame(t, &r);
  const size_t after_burst = a.approx_memory_bytes();
  EXPECT_GT(after_burst, one_live + 20000 * sizeof(uint64_t) * 2);
  holds(1, 100);
  a.DrainBlame(t, &r);
  EXPECT_LT(a.approx_memory_bytes(), one_live + 4096);
  // Nothing at all for a period: back to empty.
  a.DrainBlame(t, &r);
  a.DrainBlame(t, &r);
  EXPECT_LE(a.approx_memory_bytes(), empty + 1024);
}

// ---- Estimates from GVL readings while the scheduler probes were paused --------------------------------------------

TEST(AttributionEstimate, ACompleteRecordingKeepsItsExactAttributionWhateverItsReadingsSay) {
  auto run_it = [](bool readings) {
    Feed run(Estimating());
    run.Ev(0, EventName::kGvlAcquired, kA);
    run.Ev(1, EventName::kGvlReleased, kB);
    run.Ev(10, EventName::kWantsGvl, kB);
    if (readings) {  // what they say would be an estimate in a paused window
      run.Reading(20, kA, 7, kA, {kB});
      run.Reading(40, kA, 8, kA, {kB, kC}, /*waiting=*/5);
    } else {
      run.Sample(20, kA, 7);
      run.Sample(40, kA, 8);
    }
    run.Ev(60, EventName::kGvlReleased, kA, 9);
    run.Ev(60, EventName::kGvlAcquired, kB);
    return run.Done(70);
  };
  const AttributionResult with = run_it(true), without = run_it(false);
  EXPECT_EQ(with.blame_ns, without.blame_ns);
  EXPECT_EQ(with.wall_ns, without.wall_ns);
  EXPECT_EQ(with.total_gvl_wait_ns, 50u);
  EXPECT_EQ(with.estimated_gvl_wait_ns, 0u);
  EXPECT_TRUE(with.estimated_wait_ns.empty());
  EXPECT_EQ(with.paused_ns, 0u);
}

TEST(AttributionEstimate, AWaitAcrossAPausedWindowIsEstimatedFromTheReadings) {
  // B waits from 10 to 110; the probes are paused from 20 to 105, so the wait itself is not counted. The holder A is
  // sampled every 10 ns (the period), each sample reading B in the queue.
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Sample(1, kB, 3);  // what B last ran before it waits
  run.Ev(2, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Ev(20, EventName::kTracingPaused);
  for (uint64_t t = 10; t <= 100; t += 10) run.Reading(t, kA, t % 20 == 0 ? 7 : 8, kA, {kB});
  run.Ev(105, EventName::kTracingResumed);
  run.Ev(110, EventName::kGvlReleased, kA, 9);
  run.Ev(110, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(120);
  EXPECT_EQ(r.total_gvl_wait_ns, 0u);  // observed: nothing
  // B is queued at every reading: it waited from its wants_gvl (its last event before the pause, an exact start) to
  // its gvl_acquired (its first after the resume, an exact end), the whole wait. Each gap between two readings is
  // blamed half on each reading's stack; the last one also carries [100, 110).
  EXPECT_EQ(r.estimated_gvl_wait_ns, 100u);
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 55u);
  EXPECT_EQ(Estimated(r, kB, kA, 8, BlameSource::kSampled), 45u);
  EXPECT_EQ(Blame(r, kB, kA, 7, BlameSource::kSampled), 0u) << "an estimate is never derived blame";
  EXPECT_EQ(r.estimated_wait_ns.at(WaitKey{kB, 3}), 100u);  // at B's own latest stack
  EXPECT_EQ(r.estimate_readings, 10u);
  EXPECT_EQ(r.paused_ns, 85u);
  EXPECT_EQ(BlameTotal(r), r.total_gvl_wait_ns + r.estimated_gvl_wait_ns);
  // The wall clock takes the estimated wait out of B's unknown time, labelled inferred; the rest stays unknown.
  EXPECT_EQ(WallOf(r, kB), r.lifetime_ns.at(kB));
  const WallKey estimated{.thread = kB, .state = WallState::kGvlWait, .stack = 3, .provenance = Provenance::kInferred};
  ASSERT_TRUE(r.wall_ns.contains(estimated));
  EXPECT_EQ(r.wall_ns.at(estimated), 100u);
  for (const auto& [k, ns] : r.wall_ns) {
    if (k.thread == kB && k.state == WallState::kGvlWait && k.provenance == Provenance::kObserved) ADD_FAILURE() << ns;
  }
}

TEST(AttributionEstimate, AHolderChangeInsideAPauseSplitsTheEstimate) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(2, EventName::kGvlReleased, kC);
  run.Ev(5, EventName::kWantsGvl, kB);
  run.Ev(6, EventName::kWantsGvl, kC);
  run.Ev(8, EventName::kTracingPaused);
  run.Reading(10, kA, 7, kA, {kB, kC});
  run.Reading(20, kA, 7, kA, {kB, kC});
  run.Reading(30, kC, 5, kC, {kB});  // A gave the lock to C, B still queued
  run.Reading(40, kC, 5, kC, {kB});
  run.Ev(45, EventName::kTracingResumed);
  run.Ev(50, EventName::kGvlReleased, kC, 5);
  run.Ev(50, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(60);
  // B: [5, 10) (from its wants_gvl) and [10, 25) next to A's readings, [25, 50) next to C's (the last one up to B's
  // gvl_acquired).
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 20u);
  EXPECT_EQ(Estimated(r, kB, kC, 5, BlameSource::kSampled), 25u);
  // C: [6, 20), then queued at 20 but holding at 30: it got the lock in between, half the gap.
  EXPECT_EQ(Estimated(r, kC, kA, 7, BlameSource::kSampled), 14u + 5u);
  EXPECT_EQ(r.estimated_gvl_wait_ns, 64u);
  EXPECT_EQ(InferredTotal(r), 64u);
}

TEST(AttributionEstimate, AHolderThatDidNotTakeTheReadingIsBlamedWithItsLatestSample) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(5, EventName::kWantsGvl, kB);
  run.Ev(8, EventName::kTracingPaused);
  run.Sample(9, kA, 6);
  run.Reading(10, kC, 2, kA, {kB});  // C, off the GVL in a blocking call, took the reading
  run.Ev(20, EventName::kTracingResumed);
  run.Ev(20, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(30);
  EXPECT_EQ(Estimated(r, kB, kA, 6, BlameSource::kLastSample), 15u);  // B's whole wait [5, 20)
}

TEST(AttributionEstimate, GcDuringAPausedWaitIsBlamedAsTheHoldersGc) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(5, EventName::kWantsGvl, kB);
  run.Ev(8, EventName::kTracingPaused);  // the GC sites are paused too: no gc_enter / gc_exit
  run.Reading(10, kA, 7, kA, {kB});
  run.Reading(20, kA, 4, kA, {kB}, std::nullopt, /*in_gc=*/true);  // A collects garbage; B still waits
  run.Reading(30, kA, 7, kA, {kB});
  run.Ev(40, EventName::kTracingResumed);
  run.Ev(40, EventName::kGvlReleased, kA, 9);
  run.Ev(40, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(50);
  // [15, 25) lies next to the reading taken in GC.
  EXPECT_EQ(Estimated(r, kB, kA, 4, BlameSource::kSampled, /*gc=*/true), 10u);
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 25u);
  EXPECT_EQ(r.estimated_gvl_wait_ns, 35u);
}

TEST(AttributionEstimate, QueuedAtTwoReadingsItWaitedAllBetweenAtOneOnlyHalfTheGapAtMostFourPeriods) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(2, EventName::kGvlReleased, kC);
  run.Ev(5, EventName::kWantsGvl, kB);
  run.Ev(6, EventName::kWantsGvl, kC);
  run.Ev(8, EventName::kTracingPaused);
  run.Reading(10, kA, 7, kA, {kB, kC});
  run.Reading(500, kA, 7, kA, {kB});  // nothing read for 490 ns (the holder was descheduled); C left the queue
  run.Ev(505, EventName::kTracingResumed);
  run.Ev(505, EventName::kGvlAcquired, kB);
  run.Ev(520, EventName::kGvlAcquired, kC);
  AttributionResult r = run.Done(600);
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 5u + 490u + 5u);  // queued at both: all of it
  // C: [6, 10), then half the 490 ns gap, at most four periods; not queued at the last reading, so nothing after.
  EXPECT_EQ(Estimated(r, kC, kA, 7, BlameSource::kSampled), 4u + Attribution::kMaxReadingPeriods * 10);
}

TEST(AttributionEstimate, UnnamedQueuedThreadsCountOnlyInsideThePauseAndNobodyHoldingIsGvlFree) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(5, EventName::kWantsGvl, kB);
  run.Reading(6, kA, 7, kA, {kB}, /*waiting=*/3);  // before the pause, inside B's wait the pause will cut
  run.Ev(10, EventName::kTracingPaused);
  run.Reading(10, kA, 7, kA, {kB}, /*waiting=*/3);  // two queued threads the trace does not name
  run.Reading(20, kC, 2, 0, {kB}, /*waiting=*/1, false, /*held=*/false);  // hand-off: nobody holds it
  run.Reading(30, kC, 2, 0, {kB}, /*waiting=*/1, false, /*held=*/true);   // held by a thread not named
  run.Ev(40, EventName::kTracingResumed);
  run.Ev(40, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(50);
  // The two unnamed ones were queued at 10 and not at 20: half that gap each.
  EXPECT_EQ(Estimated(r, 0, kA, 7, BlameSource::kSampled), 2u * 5);
  EXPECT_EQ(r.estimated_wait_ns.at(WaitKey{0, 0}), 10u);
  // B: its unobserved stretch starts at its wants_gvl (5), so the reading at 6 counts for it: [5, 15) next to A's
  // readings, [15, 25) next to the free lock, [25, 40) next to the unnamed holder (up to B's gvl_acquired).
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 10u);
  EXPECT_EQ(Estimated(r, kB, 0, 0, BlameSource::kGvlFree), 10u);
  EXPECT_EQ(Estimated(r, kB, 0, 0, BlameSource::kHolderUnknown), 15u);
}

TEST(AttributionEstimate, TimeAlreadyObservedIsNeverEstimatedAgain) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(10, EventName::kWantsGvl, kB);
  run.Reading(15, kA, 7, kA, {kB});  // inside B's counted wait
  run.Reading(25, kA, 7, kA, {kB});
  run.Ev(30, EventName::kGvlReleased, kA, 9);
  run.Ev(30, EventName::kGvlAcquired, kB);
  run.Ev(35, EventName::kGvlReleased, kB, 3);
  run.Ev(35, EventName::kGvlAcquired, kA);
  run.Ev(50, EventName::kTracingPaused);
  run.Reading(60, kA, 8, kA, {kB});  // B wanted the lock again during the pause
  run.Reading(70, kA, 8, kA, {kB});
  run.Ev(80, EventName::kTracingResumed);
  run.Ev(90, EventName::kGvlAcquired, kB);
  AttributionResult r = run.Done(100);
  EXPECT_EQ(r.total_gvl_wait_ns, 20u);
  EXPECT_EQ(Blame(r, kB, kA, 7, BlameSource::kSampled), 20u);
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 0u) << "the counted wait was estimated twice";
  // B was blocked at the pause: it joined the queue between 50 and 60 (half of it), then [60, 90) to its gvl_acquired.
  EXPECT_EQ(Estimated(r, kB, kA, 8, BlameSource::kSampled), 5u + 30u);
}

TEST(AttributionEstimate, AThreadThatExitsInsideAPauseWaitsNoLonger) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(1, EventName::kGvlReleased, kB);
  run.Ev(5, EventName::kWantsGvl, kB);
  run.Ev(8, EventName::kTracingPaused);
  run.Reading(10, kA, 7, kA, {kB, kA});  // a reading that lists its own holder (torn): no wait of A estimated
  run.Ev(15, EventName::kThreadExited, kB);  // thread exits stay attached while paused
  run.Reading(20, kA, 7, kA, {kB});          // a stale pointer to B after its exit
  run.Ev(40, EventName::kTracingResumed);
  AttributionResult r = run.Done(50);
  EXPECT_EQ(Estimated(r, kB, kA, 7, BlameSource::kSampled), 10u);  // [5, 15): from its wants_gvl to its exit
  EXPECT_EQ(r.estimated_gvl_wait_ns, 10u);
}

TEST(AttributionEstimate, AThreadStartedInsideAPauseIsUnobservedFromItsStart) {
  Feed run(Estimating());
  run.Ev(0, EventName::kGvlAcquired, kA);
  run.Ev(8, EventName::kTracingPaused);
  run.Reading(10, kA, 7, kA, {kC});  // before C exists: a stale or reused pointer, not C's wait
  run.Ev(12, EventName::kThreadStarted, kC);
  run.Reading(20, kA, 7, kA, {kC});
  run.Ev(30, EventName::kTracingResumed);
  run.Ev(35, EventName::kGvlAcquired, kC);
  AttributionResult r = run.Done(40);
  // Started at 12, not waiting then: it joined the queue between 12 and 20 (half of it), then [20, 35) up to its
  // gvl_acquired.
  EXPECT_EQ(Estimated(r, kC, kA, 7, BlameSource::kSampled), 4u + 15u);
  EXPECT_EQ(r.estimated_gvl_wait_ns, 19u);
}


// ---- The agent's streaming estimate: drains sum to the whole trace's ---------------------------------------------

// Feeds one event stream both to an Attribution computed at the end and to one drained at random points, as the agent
// drains it (DrainEstimate, then DrainBlame).
class EstimateBothWays {
 public:
  explicit EstimateBothWays(uint32_t seed)
      : rng_(seed),
        whole_(Estimating()),
        drained_(AttributionOptions{.blame_cut_waits = true, .wall = false, .estimate_paused = true,
                                    .sample_period_ns = 10}),
        tracker_([this](const Span& s) { drained_.OnSpan(s); }),
        whole_tracker_([this](const Span& s) { whole_.OnSpan(s); }) {}

  void Ev(uint64_t t, EventName event, uint64_t thread) {
    now_ = t;
    for (Attribution* a : {&whole_, &drained_}) {
      a->OnThreadEvent(t, thread, event);
      if (event == EventName::kTracingPaused) a->OnPause(t);
      if (event == EventName::kTracingResumed) a->OnResume(t);
    }
    const TrackerEvent e{t, event, thread, 0, 0, ReleaseReason::kUnknown};
    tracker_.OnEvent(e);
    whole_tracker_.OnEvent(e);
    MaybeDrain();
  }
  void Reading(uint64_t t, uint64_t sampled, uint32_t stack, bool in_gc, bool held, uint64_t holder,
               std::vector<uint64_t> queued, uint32_t unnamed) {
    now_ = t;
    GvlSample g{.t_ns = t, .sampled = sampled, .stack = stack, .in_gc = in_gc, .held = held, .holder = holder};
    g.waiting = static_cast<uint32_t>(queued.size()) + unnamed;
    g.queued = std::move(queued);
    for (Attribution* a : {&whole_, &drained_}) {
      a->OnThreadEvent(t, sampled, EventName::kSample);
      a->OnSample(t, sampled, stack, in_gc);
      a->OnGvlReading(g);
    }
    tracker_.OnSample(sampled, stack, in_gc);
    whole_tracker_.OnSample(sampled, stack, in_gc);
    MaybeDrain();
  }
  // Compute()'s estimate and the drains' (a last drain after everything).
  std::pair<AttributionResult, AttributionResult> Finish() {
    whole_tracker_.Finish(now_);
    Drain(now_ + 1);
    return {whole_.Compute(now_), std::move(drained_sum_)};
  }
  std::mt19937& rng() { return rng_; }
  uint64_t drains() const { return drains_; }

 private:
  void MaybeDrain() {
    if (std::uniform_int_distribution<int>(0, 9)(rng_) != 0) return;
    Drain(now_ + std::uniform_int_distribution<uint64_t>(0, 1)(rng_));  // before or after the readings at now
  }
  void Drain(uint64_t at) {
    ++drains_;
    drained_.DrainEstimate(at, &drained_sum_);
    drained_.DrainBlame(tracker_.oldest_open_wait_ns(now_), &drained_sum_);
  }

  std::mt19937 rng_;
  Attribution whole_, drained_;
  SpanTracker tracker_, whole_tracker_;
  AttributionResult drained_sum_;
  uint64_t now_ = 0;
  uint64_t drains_ = 0;
};

std::map<BlameKey, uint64_t> InferredOnly(const AttributionResult& r) {
  std::map<BlameKey, uint64_t> out;
  for (const auto& [k, v] : r.blame_ns) {
    if (k.provenance == Provenance::kInferred) out[k] += v;
  }
  return out;
}

// One random run: four threads share one GVL (a holder, a queue, blocked ones); the probes pause and resume; samples
// read the GVL (a ghost thread 99 that has no scheduler event appears in the queue, and unnamed ones are counted).
// At the end the probes are on and every thread has an event after the last resume, so no stretch is left open.
void RandomRun(EstimateBothWays& run) {
  std::mt19937& rng = run.rng();
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const std::vector<uint64_t> threads = {11, 12, 13, 14};
  uint64_t t = 1, holder = 11;
  std::deque<uint64_t> queue;
  std::vector<uint64_t> blocked = {12, 13, 14};
  bool paused = false;
  auto ev = [&](EventName e, uint64_t th) {
    if (!paused) run.Ev(t, e, th);
  };
  ev(EventName::kGvlAcquired, 11);
  for (uint64_t th : blocked) ev(EventName::kGvlReleased, th);
  for (int step = 0; step < 200; ++step) {
    t += 1 + pick(12);
    switch (pick(6)) {
      case 0:  // the holder releases; the next queued thread gets the lock (or nobody holds it)
        if (holder != 0) {
          ev(EventName::kGvlReleased, holder);
          blocked.push_back(holder);
          holder = 0;
        }
        if (!queue.empty() && pick(3) != 0) {
          holder = queue.front();
          queue.pop_front();
          ev(EventName::kGvlAcquired, holder);
        }
        break;
      case 1:  // a blocked thread wants the lock
        if (!blocked.empty()) {
          const size_t i = static_cast<size_t>(pick(static_cast<int>(blocked.size())));
          const uint64_t th = blocked[i];
          blocked.erase(blocked.begin() + static_cast<ptrdiff_t>(i));
          ev(EventName::kWantsGvl, th);
          if (holder == 0) {
            holder = th;
            ev(EventName::kGvlAcquired, th);
          } else {
            queue.push_back(th);
          }
        }
        break;
      case 2:
        if (pick(4) == 0) {  // pause or resume
          if (paused) {
            paused = false;
            run.Ev(t, EventName::kTracingResumed, 0);
          } else {
            run.Ev(t, EventName::kTracingPaused, 0);
            paused = true;
          }
        }
        break;
      default: {  // a sample, by the holder most of the time, reads the GVL
        const uint64_t sampled = holder != 0 && pick(4) != 0 ? holder : threads[static_cast<size_t>(pick(4))];
        std::vector<uint64_t> queued(queue.begin(), queue.end());
        if (paused && pick(5) == 0) queued.push_back(99);
        const bool unknown_holder = pick(10) == 0;
        run.Reading(t, sampled, 1 + static_cast<uint32_t>(pick(5)), pick(8) == 0, holder != 0 || unknown_holder,
                    unknown_holder ? 0 : holder, std::move(queued), static_cast<uint32_t>(pick(3)));
        break;
      }
    }
  }
  t += 5;
  if (paused) run.Ev(t, EventName::kTracingResumed, 0);
  paused = false;
  // Every thread's own event after the resume closes its stretch.
  for (uint64_t th : threads) {
    t += 3;
    if (th == holder) {
      run.Ev(t, EventName::kGvlReleased, th);
      holder = 0;
    } else {
      run.Ev(t, EventName::kWantsGvl, th);
      run.Ev(t + 1, EventName::kGvlAcquired, th);
      run.Ev(t + 2, EventName::kGvlReleased, th);
      t += 2;
    }
  }
}

TEST(AttributionStreamingEstimate, DrainsAtAnyPointsSumToTheWholeTracesEstimate) {
  uint64_t estimated = 0, drains = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    EstimateBothWays run(seed);
    RandomRun(run);
    auto [whole, drained] = run.Finish();
    drains += run.drains();
    estimated += whole.estimated_gvl_wait_ns;
    ASSERT_EQ(InferredOnly(drained), InferredOnly(whole)) << "seed " << seed;
    ASSERT_EQ(drained.estimated_wait_ns, whole.estimated_wait_ns) << "seed " << seed;
    ASSERT_EQ(drained.estimated_gvl_wait_ns, whole.estimated_gvl_wait_ns) << "seed " << seed;
    ASSERT_EQ(drained.estimate_readings, whole.estimate_readings) << "seed " << seed;
    ASSERT_EQ(drained.paused_ns, whole.paused_ns) << "seed " << seed;
  }
  // The runs did estimate, and were drained often.
  EXPECT_GT(estimated, 0u);
  EXPECT_GT(drains, 300u * 10);
}

TEST(AttributionStreamingEstimate, ReadingsAreKeptOnlyWhileAStretchOrAWaitNeedsThem) {
  Attribution a(AttributionOptions{.blame_cut_waits = true, .wall = false, .estimate_paused = true,
                                   .sample_period_ns = 10});
  AttributionResult r;
  a.OnThreadEvent(0, kA, EventName::kGvlAcquired);
  for (uint64_t t = 10; t < 1000; t += 10) {
    a.OnGvlReading(GvlSample{.t_ns = t, .sampled = kA, .held = true, .holder = kA});
  }
  a.DrainEstimate(1000, &r);
  EXPECT_EQ(a.kept(), 0u) << "no pause, no wait: no reading is needed";
  a.OnThreadEvent(1000, kB, EventName::kWantsGvl);
  for (uint64_t t = 1010; t < 2000; t += 10) {
    a.OnGvlReading(GvlSample{.t_ns = t, .sampled = kA, .held = true, .holder = kA, .waiting = 1, .queued = {kB}});
  }
  a.DrainEstimate(2000, &r);
  EXPECT_EQ(a.kept(), 99u) << "B's wait could still be cut by a pause: its readings stay";
  a.OnPause(2000);
  a.OnGvlReading(GvlSample{.t_ns = 2010, .sampled = kA, .held = true, .holder = kA, .waiting = 1, .queued = {kB}});
  a.DrainEstimate(2020, &r);
  EXPECT_EQ(r.estimated_gvl_wait_ns, 1010u) << "B's wait from its wants_gvl to the last reading";
  EXPECT_EQ(a.kept(), 1u) << "the stretch goes on from its last reading only";
  a.OnResume(2030);
  a.OnThreadEvent(2035, kA, EventName::kGvlReleased);
  a.OnThreadEvent(2040, kB, EventName::kGvlAcquired);
  a.DrainEstimate(2050, &r);
  EXPECT_EQ(r.estimated_gvl_wait_ns, 1040u) << "then up to B's gvl_acquired";
  EXPECT_EQ(r.paused_ns, 30u);
  EXPECT_EQ(a.kept(), 0u) << "both threads were seen after the resume: no stretch is open";
}

}  // namespace
}  // namespace rvbpfd
